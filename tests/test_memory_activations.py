"""Saved-activation bytes: the calculator (pure Python) against a measurement of real transformers models.

The measurement (coursekit.measure.activations) records every tensor autograd saves during one forward, embedding to
loss, each storage once, parameters excluded. We compare like with like: measurements on the CPU against the
``hf`` + ``cpu`` profile, on the meta device against ``hf`` + ``meta``. Both sides count whole storages of known
shapes and dtypes — nothing here is noisy — so every comparison is to the byte: a wrong term (RoPE tables, rsqrt,
labels, the ``batch == 1`` views) of any size fails.
"""
from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.checkpoint import checkpoint
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from coursekit.measure.activations import saved_activation_bytes
from coursekit.memory import ModelShape, activation_bytes, preset, to_hf_config_dict

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _fresh_reports():
    """``activation_bytes`` is cached per process (grids and solvers repeat the same shapes): start each test with an
    empty cache, so that it checks what the code computes now, not a report an earlier test (or run) left there."""
    from coursekit.memory.activations import activation_bytes as cached
    cached.cache_clear()
    yield


def build(shape: ModelShape, attention: str, dtype: str, device: str = "cpu"):
    d = to_hf_config_dict(shape)
    cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(0)
    with torch.device(device):
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPES[dtype], attn_implementation=attention)
    return m.train()


def measure(model, batch: int, seq: int, vocab: int, device: str = "cpu", **kw) -> dict:
    ids = torch.randint(0, vocab, (batch, seq)) if device == "cpu" else torch.zeros(batch, seq, dtype=torch.long,
                                                                                   device=device)
    return saved_activation_bytes(model, ids, labels=ids, **kw)


def llama(h, a, k, f, *, L=2, drop=0.0, **kw):
    return ModelShape(arch="llama", layers=L, hidden=h, heads=a, kv_heads=k, ffn=f, vocab=256, max_positions=512,
                      attn_dropout=drop, **kw)


def gpt2(h, a, *, L=2, drop=0.0, act="gelu_new", **kw):
    return ModelShape(arch="gpt2", layers=L, hidden=h, heads=a, vocab=256, max_positions=512, activation=act,
                      attn_dropout=drop, resid_dropout=drop, embd_dropout=drop, **kw)


# (shape, attention, dtype, batch, seq): Llama and GPT-2 style; eager and SDPA; fp32, bf16, fp16; MHA, GQA and MQA;
# dropout 0 and 0.1 (CPU dropout saves a noise tensor; CPU SDPA with dropout takes the fp32 math path);
# several (b, s, h, a), including one sequence, where some reshapes become views that pin bigger storages.
GRID = [
    (llama(64, 4, 2, 176), "eager", "fp32", 2, 24),
    (llama(64, 4, 2, 176), "sdpa", "bf16", 2, 24),
    (llama(64, 4, 4, 176), "eager", "bf16", 3, 40),
    (llama(64, 4, 4, 176), "sdpa", "fp32", 1, 33),
    (llama(96, 6, 3, 256), "sdpa", "bf16", 2, 48),
    (llama(96, 6, 1, 256), "eager", "bf16", 1, 40),  # MQA, one sequence: K/V stay stride-0 views
    (llama(96, 6, 1, 256), "eager", "fp32", 2, 40),
    (llama(128, 8, 2, 344), "eager", "bf16", 2, 64),
    (llama(128, 8, 8, 344, drop=0.1), "eager", "fp32", 2, 32),
    (llama(64, 4, 2, 176, drop=0.1), "sdpa", "bf16", 2, 24),  # CPU SDPA with dropout: math path, fp32
    (llama(64, 4, 1, 176, head_dim=32, qkv_bias=True, tied_embeddings=True), "eager", "fp16", 1, 33),
    (llama(64, 4, 4, 176, activation="relu", mlp_bias=True), "sdpa", "fp32", 2, 17),
    (gpt2(64, 4), "eager", "fp32", 2, 24),
    (gpt2(64, 4), "sdpa", "bf16", 2, 24),
    (gpt2(96, 3, act="gelu"), "eager", "bf16", 1, 56),
    (gpt2(96, 3, act="gelu"), "sdpa", "fp32", 3, 56),
    (gpt2(128, 8), "sdpa", "bf16", 2, 64),
    (gpt2(64, 4, drop=0.1), "eager", "bf16", 2, 24),
    (gpt2(64, 4, drop=0.1), "sdpa", "bf16", 2, 24),
    (gpt2(96, 3, drop=0.1), "sdpa", "fp32", 1, 56),  # math path, fp32, one sequence: v pins c_attn's output
    (gpt2(64, 4, act="quick_gelu"), "eager", "fp32", 1, 17),
    (gpt2(64, 4, act="gelu_pytorch_tanh"), "sdpa", "bf16", 3, 17),
]


def _id(case):
    s, attn, dt, b, n = case
    extra = f"-kv{s.kv_heads}" if s.arch == "llama" else ""
    drop = "-drop" if s.attn_dropout else ""
    return f"{s.arch}-h{s.hidden}a{s.heads}{extra}-{attn}-{dt}-b{b}s{n}{drop}-{s.activation}"


@pytest.mark.parametrize("case", GRID, ids=[_id(c) for c in GRID])
def test_activation_bytes_match_cpu_measurement(case):
    shape, attention, dtype, b, s = case
    measured = measure(build(shape, attention, dtype), b, s, shape.vocab, breakdown=True)
    est = activation_bytes(shape, b, s, dtype=dtype, attention=attention, impl="hf", kernels="cpu")
    assert est.total_bytes == measured["total_bytes"], (est.per_layer, measured["by_layer"])
    # the structure too: a middle layer (no shared RoPE tables) holds exactly the per-layer terms
    layer = "layers.1" if shape.arch == "llama" else "h.1"
    assert est.layer_bytes == measured["by_layer"][layer]


def _selective(inner):
    """Checkpoint the attention core (QKᵀ, softmax, dropout, ·V): what selective recomputation means."""
    def attn(module, q, k, v, mask, **kw):
        return checkpoint(lambda q_, k_, v_: inner(module, q_, k_, v_, mask, **kw), q, k, v, use_reentrant=False)
    return attn


@pytest.mark.parametrize("recompute", ["selective", "full"])
@pytest.mark.parametrize("shape,attention,dtype,b,s", [
    (llama(64, 4, 2, 176, drop=0.1), "eager", "bf16", 2, 24),
    (llama(64, 4, 4, 176), "sdpa", "fp32", 1, 24),
    (gpt2(64, 4, drop=0.1), "eager", "fp32", 2, 24),
    (gpt2(96, 3), "sdpa", "bf16", 1, 40),
], ids=["llama-eager-bf16", "llama-sdpa-fp32", "gpt2-eager-fp32", "gpt2-sdpa-bf16"])
def test_recompute_matches_measurement(recompute, shape, attention, dtype, b, s):
    model = build(shape, attention, dtype)
    if recompute == "full":
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()  # transformers 5 renamed gradient_checkpointing_enable
    else:
        from transformers.models.gpt2 import modeling_gpt2
        from transformers.models.llama import modeling_llama
        mod = modeling_llama if shape.arch == "llama" else modeling_gpt2
        inner = mod.eager_attention_forward if attention == "eager" else ALL_ATTENTION_FUNCTIONS["sdpa"]
        name = f"coursekit_selective_{shape.arch}_{attention}"
        ALL_ATTENTION_FUNCTIONS[name] = _selective(inner)
        model.config._attn_implementation = name
    measured = measure(model, b, s, shape.vocab)["total_bytes"]
    est = activation_bytes(shape, b, s, dtype=dtype, attention=attention, kernels="cpu", recompute=recompute)
    assert est.total_bytes == measured


@pytest.mark.parametrize("name,layers,attention,dtype,b,s", [
    ("llama3-8b", 2, "sdpa", "bf16", 1, 4096),
    ("llama3-70b", 2, "eager", "bf16", 1, 2048),
    ("gpt2", 12, "eager", "bf16", 2, 1024),  # the real config: dropout 0.1
    ("gpt2-xl", 4, "sdpa", "fp32", 1, 1024),
])
def test_real_shapes_on_meta_device(name, layers, attention, dtype, b, s):
    """Real model shapes (layers cut to keep it quick) measured on the meta device, where SDPA takes the math
    path and LayerNorm statistics are fp32: the ``meta`` profile."""
    shape = preset(name).with_(layers=layers)
    measured = measure(build(shape, attention, dtype, device="meta"), b, s, shape.vocab, device="meta")
    est = activation_bytes(shape, b, s, dtype=dtype, attention=attention, kernels="meta")
    assert est.total_bytes == measured["total_bytes"]


def test_textbook_formula_for_a_gpt3_block_on_cuda():
    """Korthikanti et al. 2022, eq. 1: a GPT-3 block (fp16, eager attention, dropout with 1-byte masks, one GELU
    input saved) saves s·b·h·(34 + 5·a·s/h) bytes, LayerNorm statistics aside (2 × fp32 mean and rstd)."""
    s, b = 2048, 4
    shape = preset("gpt3-175b").with_(activation="gelu")
    h, a = shape.hidden, shape.heads
    est = activation_bytes(shape, b, s, dtype="fp16", attention="eager", impl="hf", kernels="cuda")
    assert est.layer_bytes == s * b * h * (34 + 5 * a * s / h) + 2 * 8 * s * b
    # ...and HF's default GPT-2 GELU (gelu_new) saves three more b·s·4h tensors
    est_new = activation_bytes(shape.with_(activation="gelu_new"), b, s, dtype="fp16", attention="eager")
    assert est_new.layer_bytes - est.layer_bytes == 3 * 2 * b * s * 4 * h


def test_profiles_differ_where_kernels_do():
    shape = gpt2(64, 4, drop=0.1)
    cpu = activation_bytes(shape, 2, 64, attention="sdpa", kernels="cpu")
    cuda = activation_bytes(shape, 2, 64, attention="sdpa", kernels="cuda")
    assert (cpu.attention_kernel, cuda.attention_kernel) == ("math", "flash")
    assert cuda.per_layer["mlp_dropout.mask"] * 2 == cpu.per_layer["mlp_dropout.mask"]  # bool vs bf16 noise
    assert cuda.total_bytes < cpu.total_bytes
    # nn.LayerNorm already is a fused kernel on CUDA; HF's Python RMSNorm is not (it saves fp32 copies)
    assert activation_bytes(shape, 2, 64, impl="fused").total_bytes == cuda.total_bytes
    ll = llama(64, 4, 2, 176)
    assert activation_bytes(ll, 2, 64, impl="fused").total_bytes < activation_bytes(ll, 2, 64).total_bytes



def test_saved_bytes_per_cp_rank_equal_coursekit_memory_cp_impl(tmp_path, no_orphans):
    """2 CP ranks, the trainer's tiny Llama (4 query heads) with 4, 2 and 1 K/V heads, ring and Ulysses, fed by the
    trainer's data path and loss: each rank's measured saved bytes, embedding to loss, equal ``coursekit memory --cp 2
    --cp-impl IMPL --position-ids per-sequence`` to the byte, and a middle block equals its per-layer terms. Ulysses
    keeps more than ring (the output twice), and more again with 1 K/V head (< C: replicated over all s tokens)."""
    import json

    from coursekit.launch import launch
    from coursekit.memory.cli import build_parser, run

    b, s = 2, 32
    res = launch("coursekit.cp.probe", ["--seq", str(s), "--micro-batch", str(b)], nproc=2, timeout=300,
                 stream=False).results
    layer = {}
    for rec in res:
        assert len(rec["runs"]) == 6
        for r in rec["runs"]:
            cfg = tmp_path / f"llama-kv{r['kv_heads']}.json"
            cfg.write_text(json.dumps(to_hf_config_dict(preset("tiny-llama").with_(kv_heads=r["kv_heads"]))))
            est = run(build_parser().parse_args([
                "--model", str(cfg), "--micro-batch", str(b), "--seq", str(s), "--dtype", "fp32", "--kernels", "cpu",
                "--cp", "2", "--cp-impl", r["impl"], "--position-ids", "per-sequence", "--json"]))
            per_layer = sum(est["activation_terms"]["per_layer"].values())
            assert r["total_bytes"] == est["activations_bytes"], (rec["rank"], r, est["activation_terms"])
            assert r["by_layer"]["layers.1"] == per_layer
            layer[(rec["rank"], r["impl"], r["kv_heads"])] = per_layer
    n = b * s // 2  # tokens per CP rank
    for rank in (0, 1):
        for kv in (4, 2):  # the output saved twice: n·a·d fp32 more
            assert layer[(rank, "ulysses", kv)] - layer[(rank, "ring", kv)] == n * 64 * 4
        # one K/V head over all s tokens instead of s/2: K and V each b·(s − s/2)·d more
        assert layer[(rank, "ulysses", 1)] - layer[(rank, "ring", 1)] == n * 64 * 4 + 2 * b * (s - s // 2) * 16 * 4


def family(fam, h, a, k, f, *, L=2, d=None, **kw):
    return ModelShape(arch="llama", family=fam, layers=L, hidden=h, heads=a, kv_heads=k, ffn=f, vocab=256,
                      max_positions=512, head_dim=d, **({"qkv_bias": True} if fam == "qwen2" else {}), **kw)


# The families of the MoE issue: Qwen2 (q/k/v biases), Qwen3 (q/k norms), Qwen3-MoE and Mixtral (router, top-1 /
# top-2 / top-8, renormalised weights or not, GQA). A random router sends uneven numbers of tokens to the experts;
# transformers' grouped_mm path saves per (token, choice) row, so the bytes do not depend on the split.
FAMILY_GRID = [
    (family("qwen2", 64, 4, 2, 176), "sdpa", "fp32", 2, 24),
    (family("qwen3", 64, 4, 2, 176, d=16), "sdpa", "fp32", 2, 24),
    (family("qwen3", 64, 4, 4, 176, d=32), "eager", "bf16", 1, 33),
    (family("qwen3_moe", 64, 4, 2, 176, d=16, experts=4, top_k=2, expert_ffn=32, norm_topk=True), "sdpa", "fp32",
     2, 24),
    (family("qwen3_moe", 64, 4, 2, 176, d=16, experts=4, top_k=1, expert_ffn=48), "sdpa", "fp32", 1, 40),
    (family("qwen3_moe", 96, 6, 3, 64, d=16, experts=8, top_k=8, expert_ffn=24, norm_topk=True), "eager", "fp32",
     2, 16),
    (family("mixtral", 64, 4, 2, 40, experts=8, top_k=2), "sdpa", "fp32", 2, 24),
    (family("mixtral", 64, 4, 1, 40, experts=4, top_k=2), "eager", "fp32", 3, 17),
]


@pytest.mark.parametrize("shape,attention,dtype,b,s", FAMILY_GRID,
                         ids=[f"{x[0].family}-e{x[0].experts}k{x[0].top_k}-{x[1]}-{x[2]}-b{x[3]}s{x[4]}"
                              for x in FAMILY_GRID])
def test_families_equal_measurement(shape, attention, dtype, b, s):
    meas = measure(build(shape, attention, dtype), b, s, shape.vocab)["total_bytes"]
    est = activation_bytes(shape, b, s, dtype=dtype, attention=attention, impl="hf", kernels="cpu")
    assert est.total_bytes == meas, (est.total_bytes, meas, est.per_layer)
