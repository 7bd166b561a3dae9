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


# -- pure-Python terms worked out by hand (the profiles the CPU cannot measure: CUDA, fused, CP, EP, TP) ---------------
# Toy sizes: h 64, 4 query heads of 16, b 2, s 32 -> n = 64 tokens, an attention score matrix b·a·s² = 8,192 elements.
def qwen3(**kw):
    return family("qwen3", 64, 4, 2, 128, d=16, **kw)


def test_fused_qwen3_layer_term_by_term():
    """impl fused, bf16 (2 B): fused RMSNorms keep input + one fp32 rstd per token; flash keeps q, k, v (2 K/V heads),
    its output and fp32 log-sum-exp (b·a·s rows); Qwen3's q/k norms keep their input and one rstd per head."""
    r = activation_bytes(qwen3(), 2, 32, impl="fused")
    norm = lambda p: {f"{p}.input": 2 * 64 * 64, f"{p}.stats_fp32": 4 * 64, f"{p}.output": 2 * 64 * 64}  # noqa: E731
    assert r.per_layer == {
        **norm("attn_norm"),
        "attn.q_rope": 2 * 64 * 4 * 16, "attn.k_rope": 2 * 64 * 2 * 16, "attn.v": 2 * 64 * 2 * 16,
        "attn.logsumexp_fp32": 4 * 2 * 4 * 32, "attn.core_out(o_proj_input)": 2 * 64 * 4 * 16,
        "attn.q_norm.input": 2 * 64 * 4 * 16, "attn.q_norm.rstd_fp32": 4 * 64 * 4,
        "attn.k_norm.input": 2 * 64 * 2 * 16, "attn.k_norm.rstd_fp32": 4 * 64 * 2,
        **norm("mlp_norm"),
        # SwiGLU, ffn 128: silu's input (the gate output), its output, up's output, the product (down's input)
        "mlp.activation_saved": 2 * 64 * 128, "mlp.act_out": 2 * 64 * 128, "mlp.up_out": 2 * 64 * 128,
        "mlp.product(down_input)": 2 * 64 * 128}
    assert r.embed == {"input_ids(int64)": 8 * 2 * 32}
    assert r.shared == {"rope_cos_sin": 2 * 32 * 16 * 2}  # cos and sin, (1, s, d) each
    # the loss: fp32 log-softmax over b·s·V, the (b, s) int64 shifted labels, one fp32 total weight
    assert r.head == {**norm("final_norm"), "loss.log_softmax_fp32": 4 * 2 * 32 * 256, "loss.labels(int64)": 8 * 2 * 32,
                      "loss.total_weight": 4}
    assert (r.attention_kernel, r.notes, r.layers) == ("flash", (), 2)
    L, E, S, H = (sum(x.values()) for x in (r.per_layer, r.embed, r.shared, r.head))
    assert r.layer_bytes == L and r.total_bytes == 2 * L + E + S + H and r.model == {**r.embed, **r.shared, **r.head}
    assert r.stage_bytes(1, first=True, last=False) == L + E + S
    assert r.stage_bytes(3, first=False, last=True) == 3 * L + S + H


def test_hf_qk_norms_keep_fp32_copies_per_head():
    """HF's Qwen3RMSNorm over each head, in Python: x.float() (fp32 copy), one fp32 rsqrt per head and token, the
    normalized tensor in bf16 (its weight-scaled output goes to RoPE, which saves only cos and sin)."""
    r = activation_bytes(qwen3(), 2, 32)
    assert {k: v for k, v in r.per_layer.items() if k.startswith(("attn.q_norm", "attn.k_norm"))} == {
        "attn.q_norm.input_fp32": 4 * 64 * 4 * 16, "attn.q_norm.rsqrt_fp32": 4 * 64 * 4,
        "attn.q_norm.normalized": 2 * 64 * 4 * 16, "attn.k_norm.input_fp32": 4 * 64 * 2 * 16,
        "attn.k_norm.rsqrt_fp32": 4 * 64 * 2, "attn.k_norm.normalized": 2 * 64 * 2 * 16}


def test_gpt2_on_cuda_with_dropout_term_by_term():
    """hf + cuda, bf16, eager, dropout 0.1 everywhere: 1-byte dropout masks, LayerNorm's fp32 mean and rstd, GPT-2's
    softmax in bf16, its q, kᵀ, v copied for the batched matmuls, gelu_new's four saved ffn tensors (ffn 256)."""
    r = activation_bytes(gpt2(64, 4, drop=0.1), 2, 32, attention="eager", kernels="cuda")
    ln = lambda p: {f"{p}.input": 2 * 64 * 64, f"{p}.mean_rstd": 2 * 4 * 64, f"{p}.output": 2 * 64 * 64}  # noqa: E731
    ss = 2 * 4 * 32 * 32
    assert r.per_layer == {
        **ln("attn_norm"),
        "attn.q_matmul": 2 * 64 * 64, "attn.k_matmul": 2 * 64 * 64, "attn.softmax": 2 * ss,
        "attn.probs_dropped": 2 * ss, "attn.dropout_mask": 1 * ss, "attn.v_matmul": 2 * 64 * 64,
        "attn.core_out(o_proj_input)": 2 * 64 * 64, "attn_resid_dropout.mask": 64 * 64,
        **ln("mlp_norm"),
        "mlp.activation_saved": 4 * 2 * 64 * 256, "mlp.act_out(proj_input)": 2 * 64 * 256, "mlp_dropout.mask": 64 * 64}
    # learned positions: (1, s) int64 position ids, no RoPE tables; the embedding dropout's mask
    assert r.embed == {"input_ids(int64)": 512, "position_ids(int64)": 8 * 32, "embedding_dropout.mask": 64 * 64}
    assert r.shared == {}
    assert r.head == {**ln("final_norm"), "loss.log_softmax_fp32": 4 * 2 * 32 * 256, "loss.labels(int64)": 512,
                      "loss.total_weight": 4}
    # flash on CUDA with dropout: no mask, the kernel's RNG state (flash: (2,) + () uint64 = 24 B)
    fl = activation_bytes(gpt2(64, 4, drop=0.1), 2, 32, kernels="cuda")
    assert fl.per_layer["attn.rng_state"] == 24 and "attn.dropout_mask" not in fl.per_layer
    # the fused profile: vocab-parallel loss over tp 2 (V = 256 splits), HF's loss otherwise
    tp = activation_bytes(gpt2(64, 4), 2, 32, impl="fused", tp=2)
    assert tp.head["loss.log_softmax_fp32"] == 4 * 2 * 32 * 128
    assert activation_bytes(gpt2(64, 4), 2, 32, tp=2).head["loss.log_softmax_fp32"] == 4 * 2 * 32 * 256


def test_selective_recompute_keeps_the_core_inputs_and_output():
    # GPT-2: one c_attn output b·s·(a + 2k)·d (q, k, v are views of it); Llama: q, k after RoPE and v
    g = activation_bytes(gpt2(64, 4), 2, 32, recompute="selective", kernels="cuda")
    assert {k: v for k, v in g.per_layer.items() if k.startswith("attn.")} == {
        "attn.qkv_out(c_attn)": 2 * 64 * 12 * 16, "attn.core_out(o_proj_input)": 2 * 64 * 64}
    ll = activation_bytes(qwen3(), 2, 32, recompute="selective", kernels="cuda", attention="eager")
    assert {k: v for k, v in ll.per_layer.items() if k.startswith("attn.") and "norm" not in k} == {
        "attn.q_rope": 2 * 64 * 64, "attn.k_rope": 2 * 64 * 32, "attn.v": 2 * 64 * 32,
        "attn.core_out(o_proj_input)": 2 * 64 * 64}
    # full: one bf16 b·s·h input per layer, no RoPE tables (the checkpoints recompute them); GPT-2 eager also hands
    # its (b, 1, s, s) mask to each checkpoint
    full = activation_bytes(gpt2(64, 4), 2, 32, recompute="full", attention="eager")
    assert full.per_layer == {"layer_input(checkpoint)": 2 * 64 * 64}
    assert full.shared == {"causal_mask(checkpoint_arg)": 2 * 2 * 32 * 32}
    assert activation_bytes(qwen3(), 2, 32, recompute="full").shared == {}
    assert activation_bytes(gpt2(64, 4), 2, 32, recompute="full").shared == {}  # SDPA: no mask argument


def test_cuda_math_path_and_efficient_kernel():
    """fp32 on CUDA: grouped-query attention takes the math path (fp32 q, k, v repeated to all heads, scores, and with
    dropout a 1-byte mask and the dropped probabilities); MHA the memory-efficient kernel, log-sum-exp rows padded
    to 32 (33 -> 64) and its 16-byte RNG state."""
    m = activation_bytes(qwen3(attn_dropout=0.1), 2, 32, dtype="fp32", kernels="cuda")
    ss = 2 * 4 * 32 * 32
    assert m.attention_kernel == "math" and "math path" in m.notes[0]
    assert {k: v for k, v in m.per_layer.items() if k.startswith("attn.") and "norm" not in k} == {
        "attn.q_scaled_fp32": 4 * 64 * 64, "attn.k_scaled_fp32": 4 * 64 * 64, "attn.softmax_fp32": 4 * ss,
        "attn.dropout_mask": ss, "attn.probs_dropped_fp32": 4 * ss, "attn.v_fp32": 4 * 64 * 64,
        "attn.core_out(o_proj_input)": 4 * 64 * 64}
    e = activation_bytes(family("llama", 64, 4, 4, 128, attn_dropout=0.1), 2, 33, dtype="fp32", kernels="cuda")
    assert e.attention_kernel == "efficient" and e.notes == ()
    assert e.per_layer["attn.logsumexp_fp32"] == 4 * 2 * 4 * 64 and e.per_layer["attn.rng_state"] == 16


@pytest.mark.parametrize("kw,kernel", [
    (dict(impl="fused"), "flash"),
    (dict(attention="eager"), "eager"),
    (dict(kernels="meta"), "math"),
    (dict(kernels="cpu"), "flash"),
    (dict(kernels="cpu", dropout=0.1), "math"),
    (dict(kernels="cpu", dtype="fp32"), "flash"),
    (dict(), "flash"),  # cuda bf16, head_dim 16
    (dict(head_dim=256), "flash"),  # FlashAttention's largest head dimension
    (dict(head_dim=257), "math"),  # beyond it, grouped-query: math
    (dict(head_dim=257, kv_heads=4), "efficient"),  # beyond it, MHA: memory-efficient
    (dict(dtype="fp32"), "math"),  # no flash in fp32; GQA: math
    (dict(dtype="fp32", kv_heads=4), "efficient"),
    (dict(dtype="fp16", kv_heads=4), "flash"),
])
def test_which_attention_kernel_runs(kw, kernel):
    run = {k: v for k, v in kw.items() if k not in ("head_dim", "kv_heads")}  # (the parameters stay as given)
    shape = family("llama", 64, 4, kw.get("kv_heads", 2), 128, d=kw.get("head_dim"))
    assert activation_bytes(shape, 1, 32, **run).attention_kernel == kernel


def test_context_parallel_ring_and_ulysses_terms():
    """cp 2 over s 64: 32 rows per rank, n = 64 tokens, flash, bf16, MHA (4 K/V heads). Ring keeps the flash terms
    of its own rows; Ulysses (heads split over C = 2, all S = 64 rows) keeps q, its output and o_proj's input of
    n·a·d each, K and V of b·S·d·(k/C), log-sum-exp of b·(a/C)·S rows."""
    mha = family("llama", 64, 4, 4, 128)
    ring = activation_bytes(mha, 2, 64, cp=2, kernels="cuda")
    assert {k: v for k, v in ring.per_layer.items() if k.startswith("attn.")} == {
        "attn.q_rope": 2 * 64 * 64, "attn.k_rope": 2 * 64 * 64, "attn.v": 2 * 64 * 64,
        "attn.logsumexp_fp32": 4 * 2 * 4 * 32, "attn.core_out(o_proj_input)": 2 * 64 * 64}
    uly = activation_bytes(mha, 2, 64, cp=2, cp_impl="ulysses", kernels="cuda", dropout=0.1)
    assert {k: v for k, v in uly.per_layer.items() if k.startswith("attn.")} == {
        "attn.q_heads(ulysses)": 2 * 64 * 64, "attn.k_heads(ulysses)": 2 * 2 * 64 * 16 * 2,
        "attn.v_heads(ulysses)": 2 * 2 * 64 * 16 * 2, "attn.logsumexp_fp32": 4 * 2 * 2 * 64,
        "attn.out_heads(ulysses)": 2 * 64 * 64, "attn.core_out(o_proj_input)": 2 * 64 * 64, "attn.rng_state": 24}
    # fp32 MHA: the memory-efficient kernel, S = 66 rows padded to 96, its 16-byte RNG state
    eff = activation_bytes(mha, 2, 66, dtype="fp32", cp=2, cp_impl="ulysses", kernels="cuda", dropout=0.1)
    assert eff.attention_kernel == "efficient"
    assert eff.per_layer["attn.logsumexp_fp32"] == 4 * 2 * 2 * 96 and eff.per_layer["attn.rng_state"] == 16
    # 1 K/V head (< C): replicated on both ranks over all S rows, b·S·d
    rep = activation_bytes(family("llama", 64, 4, 1, 128), 2, 64, cp=2, cp_impl="ulysses", kernels="cuda")
    assert rep.per_layer["attn.k_heads(ulysses)"] == 2 * 2 * 64 * 16 and "attn.rng_state" not in rep.per_layer
    # per-sequence position ids: the cos / sin tables are (b, s/C, d), not (1, s/C, d)
    per = activation_bytes(mha, 2, 64, cp=2, kernels="cuda", position_ids="per-sequence")
    assert per.shared == {"rope_cos_sin": 2 * 2 * 32 * 16 * 2} and ring.shared == {"rope_cos_sin": 2 * 32 * 16 * 2}


def test_tensor_and_sequence_parallel_split_the_right_tensors():
    # tp 2, fused, bf16: 2 heads and 1 K/V head per rank, ffn 64; SP splits the norms' tokens (32 of 64) and, in the
    # fused (Megatron) profile, the column-parallel linears keep the sharded norm output too
    r = activation_bytes(qwen3(), 2, 32, impl="fused", tp=2, sp=True)
    assert r.per_layer["attn_norm.input"] == 2 * 32 * 64 and r.per_layer["attn_norm.output"] == 2 * 32 * 64
    assert r.per_layer["attn.k_rope"] == 2 * 64 * 16 and r.per_layer["mlp.up_out"] == 2 * 64 * 64
    hf = activation_bytes(qwen3(), 2, 32, tp=2, sp=True)  # HF's TP gathers the norm output: all 64 tokens
    assert hf.per_layer["attn_norm.normalized"] == 2 * 32 * 64 and hf.per_layer["attn_norm.output"] == 2 * 64 * 64
    no_sp = activation_bytes(qwen3(), 2, 32, tp=2)
    assert no_sp.per_layer["attn_norm.normalized"] == 2 * 64 * 64
    # tp 4 > 2 K/V heads: each rank keeps one
    assert activation_bytes(qwen3(), 2, 32, impl="fused", tp=4).per_layer["attn.k_rope"] == 2 * 64 * 16
    assert activation_bytes(qwen3(), 2, 32, sp=True).per_layer == activation_bytes(qwen3(), 2, 32).per_layer


def mixtral(**kw):
    return family("mixtral", 64, 4, 2, 128, experts=4, top_k=2, **kw)


def test_moe_terms_grouped_mm_and_dispatch():
    """Mixtral (renormalised top-2 of 4 experts, expert ffn 128, fp32 router weights), bf16, n = 64 tokens:
    S = 128 (token, choice) rows. ep 1: transformers' grouped_mm path; ep 2: coursekit's dispatch with 100 rows
    received by this rank's experts."""
    moe = lambda r: {k: v for k, v in r.per_layer.items() if k.startswith("moe.")}  # noqa: E731
    router = {"moe.router.softmax_fp32": 4 * 64 * 4, "moe.router.topk_ids(int64)": 8 * 128,
              "moe.router.topk_sum_fp32": 4 * 64, "moe.router.topk_weights_fp32": 4 * 128}
    experts = lambda rows: {"moe.experts.gate_up_out": 2 * rows * 256, "moe.experts.act_out": 2 * rows * 128,  # noqa
                            "moe.experts.product(down_input)": 2 * rows * 128}
    assert moe(activation_bytes(mixtral(), 2, 32)) == {
        **router, **experts(128), "moe.sort.perm(int64)": 8 * 128, "moe.sort.token_of_row(int64)": 8 * 128,
        "moe.offsets(int32)": 4 * 4, "moe.experts.rows_in": 2 * 128 * 64, "moe.weights_sorted": 4 * 128,
        "moe.experts.down_out": 2 * 128 * 64, "moe.unsort.inverse(int64)": 8 * 128}
    assert moe(activation_bytes(mixtral(), 2, 32, ep=2, expert_rows=100)) == {
        **router, **experts(100), "moe.dispatch.token_of_row(int64)": 8 * 128, "moe.dispatch.order(int64)": 8 * 128,
        "moe.dispatch.rows_sent": 2 * 128 * 64, "moe.experts.by_expert(int64)": 8 * 100,
        "moe.experts.rows_in": 2 * 100 * 64, "moe.experts.unsort(int64)": 8 * 100,
        "moe.combine.rows_back": 2 * 128 * 64, "moe.weights_sorted": 4 * 128}
    # Qwen3-MoE without norm_topk_prob: no sum / divided weights, the weights cast back to bf16
    q = activation_bytes(family("qwen3_moe", 64, 4, 2, 128, d=16, experts=4, top_k=2), 2, 32)
    assert "moe.router.topk_sum_fp32" not in q.per_layer and q.per_layer["moe.weights_sorted"] == 2 * 128
    # the load-balancing loss: softmax over every layer's (n x E) logits at once, E fp32 token shares
    aux = activation_bytes(mixtral(), 2, 32, aux_loss=True)
    assert aux.head["moe.aux_loss.softmax"] == 2 * 2 * 64 * 4 and aux.head["moe.aux_loss.tokens_per_expert_fp32"] == 16
    assert "moe.aux_loss.softmax" not in activation_bytes(qwen3(), 2, 32, aux_loss=True).head
    # tp 2 splits the block's 64 tokens: 32 per rank, and the router / experts read a copied slice of the norm output
    tp = activation_bytes(mixtral(), 2, 32, tp=2)
    assert tp.per_layer["mlp_norm.output"] == 2 * 32 * 64 and tp.per_layer["moe.router.softmax_fp32"] == 4 * 32 * 4


@pytest.mark.parametrize("shape,kw,needles", [
    (qwen3(), dict(seq=30, cp=4), ["seq (30) must be divisible by cp (4)"]),
    (qwen3(), dict(tp=3), ["tp (3) must divide heads (4) and ffn (128)", "kv_heads (2)"]),
    (family("llama", 64, 4, 2, 130), dict(tp=4), ["tp (4)", "ffn (130)"]),
    (qwen3(), dict(seq=30, tp=4, sp=True), ["seq/cp (30) divisible by tp (4)"]),
    (qwen3(), dict(cp=2, attention="eager"), ["context parallelism needs a flash-style attention kernel"]),
    (qwen3(), dict(cp=2, kernels="cpu", dropout=0.1), ["context parallelism needs"]),
    (family("llama", 96, 6, 6, 128), dict(cp=4, cp_impl="ulysses"), ["cp (4) must divide the query heads", "(6)"]),
    (family("llama", 64, 4, 4, 128), dict(cp=2, cp_impl="ulysses", recompute="selective"), ["ulysses"]),
    (qwen3(activation="mish"), {}, ["unknown activation 'mish'"]),
    (mixtral(), dict(seq=30, tp=4), ["tp (4) splits", "seq/cp (30)"]),
    (qwen3(), dict(impl="fused", attention="eager"), ["impl 'fused' means flash attention"]),
    (qwen3(), dict(dtype="fp8"), ["unknown dtype 'fp8'"]),
    (qwen3(), dict(attention="flash"), ["unknown attention 'flash'"]),
    (qwen3(), dict(impl="megatron"), ["unknown impl 'megatron'"]),
    (qwen3(), dict(kernels="rocm"), ["unknown kernels 'rocm'"]),
    (qwen3(), dict(recompute="some"), ["unknown recompute 'some'"]),
    (qwen3(), dict(cp_impl="striped"), ["unknown cp_impl 'striped'"]),
    (qwen3(), dict(position_ids="absolute"), ["unknown position_ids 'absolute'"]),
])
def test_unmodelled_input_is_refused_naming_the_value(shape, kw, needles):
    from coursekit.memory.errors import ConfigError
    run = {k: v for k, v in kw.items() if k != "seq"}  # (the parameters stay as given)
    with pytest.raises(ConfigError) as e:
        activation_bytes(shape, 2, kw.get("seq", 32), **run)
    for n in needles:
        assert n in str(e.value)


def test_dropout_overrides_and_what_each_architecture_drops():
    # dropout= overrides the shape's rates: GPT-2 (rates 0 here) then keeps its residual and embedding masks
    # (1 byte per element on CUDA); Llama has attention dropout only, whatever the override says
    g = activation_bytes(gpt2(64, 4), 2, 32, dropout=0.1)
    assert g.per_layer["attn_resid_dropout.mask"] == 64 * 64 and g.embed["embedding_dropout.mask"] == 64 * 64
    ll = activation_bytes(qwen3(), 2, 32, dropout=0.1, attention="eager")
    assert "attn_resid_dropout.mask" not in ll.per_layer and "embedding_dropout.mask" not in ll.embed
    assert ll.per_layer["attn.dropout_mask"] == 2 * 4 * 32 * 32


def test_llama_eager_softmax_and_mqa_views_by_name():
    """Llama's eager attention: softmax in fp32, then the bf16 probabilities feed ·V. With one K/V head and one
    sequence, the repeated K and V stay stride-0 views of the single head (what the measured grid shows at 6 heads):
    here 2 query heads, so k and v pin b·s·1·d, not b·s·2·d."""
    r = activation_bytes(family("llama", 32, 2, 1, 64), 1, 32, attention="eager", kernels="cpu")
    ss = 1 * 2 * 32 * 32
    assert r.per_layer["attn.softmax_fp32"] == 4 * ss and r.per_layer["attn.probs"] == 2 * ss
    assert r.per_layer["attn.k_matmul"] == r.per_layer["attn.v_matmul"] == 2 * 32 * 1 * 16
    assert r.per_layer["attn.q_matmul"] == 2 * 32 * 2 * 16


def test_what_is_accepted_where_a_check_could_overreach():
    # sp at tp 1 is no sequence parallelism: accepted for an MoE model, the bytes those of sp off
    assert activation_bytes(mixtral(), 2, 32, sp=True).per_layer == activation_bytes(mixtral(), 2, 32).per_layer
    # cp_impl without cp: nothing to split, selective recompute is modelled
    assert activation_bytes(qwen3(), 2, 32, cp_impl="ulysses", recompute="selective").per_layer == \
        activation_bytes(qwen3(), 2, 32, recompute="selective").per_layer
    # Ulysses over 3 ranks: 6 query heads split; 1 K/V head (< 3) is replicated: accepted
    mqa = family("llama", 96, 6, 1, 128)
    assert activation_bytes(mqa, 1, 96, cp=3, cp_impl="ulysses", kernels="cuda").attention_kernel == "flash"
    # a flash Ulysses log-sum-exp keeps exactly S = 66 rows (only the memory-efficient kernel pads to 32)
    uly = activation_bytes(family("llama", 64, 4, 4, 128), 2, 66, cp=2, cp_impl="ulysses", kernels="cuda")
    assert uly.per_layer["attn.logsumexp_fp32"] == 4 * 2 * 2 * 66


@pytest.mark.parametrize("shape,kw,needles", [
    # 6 query heads over cp 4 do not split, even though the 2 K/V heads divide 4
    (family("llama", 96, 6, 2, 128), dict(seq=32, cp=4, cp_impl="ulysses"),
     ["cp (4) must divide the query heads per TP rank (6)"]),
    # an MoE model with seq 66 over cp 4: refused for seq % cp first (66 // 4 = 16 would split over tp 2)
    (mixtral(), dict(seq=66, cp=4, tp=2), ["seq (66) must be divisible by cp (4)"]),
    (qwen3(activation="mish"), dict(seq=32), ["known: silu, swish, gelu"]),
])
def test_refusals_name_what_is_wrong_and_what_is_allowed(shape, kw, needles):
    from coursekit.memory.errors import ConfigError
    run = {k: v for k, v in kw.items() if k != "seq"}
    with pytest.raises(ConfigError) as e:
        activation_bytes(shape, 2, kw["seq"], kernels="cuda", **run)
    for n in needles:
        assert n in str(e.value)
