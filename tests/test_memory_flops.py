"""Training FLOPs against torch's FlopCounterMode on real HF models (forward + backward), to the FLOP: both count
the same matmuls of known shapes, so there is nothing to round."""
from __future__ import annotations

import re

import pytest
import torch
import torch.utils.checkpoint
import transformers
from torch.utils.flop_counter import FlopCounterMode

from coursekit.flops import flops_per_step, flops_per_token, matmul_params, mfu
from coursekit.memory import ModelShape, preset, to_hf_config_dict


def counted(shape: ModelShape, attention: str, b: int, s: int, recompute: bool = False) -> int:
    d = to_hf_config_dict(shape)
    cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    # FlopCounterMode has no formula for grouped_mm: count the experts on transformers' per-expert loop ("eager")
    moe = {"experts_implementation": "eager"} if shape.is_moe else {}
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attention, **moe).train()
    if recompute:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, shape.vocab, (b, s))
    with FlopCounterMode(display=False) as fc:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("shape,b,s", [
    (preset("tiny-llama"), 3, 40),
    (preset("tiny-gpt2"), 2, 64),
    (ModelShape(arch="llama", layers=3, hidden=96, heads=6, kv_heads=2, ffn=256, vocab=300, tied_embeddings=True),
     2, 33),
    (preset("tiny-qwen3"), 2, 24),
    (preset("tiny-qwen3-moe"), 2, 24),
    (preset("tiny-mixtral"), 3, 16),
], ids=["tiny-llama", "tiny-gpt2", "llama-gqa-tied", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral"])
def test_flops_match_flop_counter(shape, b, s):
    """Eager attention: FlopCounterMode counts every matmul (linears, LM head, QKᵀ and A·V) like our formula."""
    assert flops_per_step(shape, b, s)["total"] == counted(shape, "eager", b, s)


def test_cpu_sdpa_attention_is_invisible_to_flop_counter():
    """FlopCounterMode has no formula for CPU's flash SDPA op: with sdpa it counts the dense part only."""
    shape = preset("tiny-llama")
    assert flops_per_step(shape, 2, 32)["dense"] == counted(shape, "sdpa", 2, 32)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_full_recompute_is_one_more_forward_of_every_layer(name):
    """``recompute="full"`` (hardware FLOPs): each layer's forward runs again in backward, the LM head does not.
    torch's non-reentrant checkpoint stops recomputing once it has every tensor backward needs, which skips each
    layer's last matmul (its output is not saved); the model counts the whole forward, as Megatron's HFU does, so
    the early stop is switched off to compare like with like."""
    shape, b, s = preset(name), 2, 24
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        extra = counted(shape, "eager", b, s, recompute=True) - counted(shape, "eager", b, s)
    assert flops_per_step(shape, b, s, recompute="full")["recompute"] == extra > 0


def test_conventions():
    """Llama-3 8B by hand: 8,030,261,248 parameters (Meta's model card), less the 128,256 x 4,096 embedding table
    and 65 RMSNorm weight vectors of 4,096 (a lookup and elementwise, no matmul) = 7,504,658,432 matmul parameters
    (= 32 layers x (2·4096² + 2·4096·1024 + 3·4096·14336) + the 128,256 x 4,096 LM head). Training FLOPs of one
    8,192-token sequence by PaLM's per-token 6N + 12·L·H·Q·T (appendix B; L 32, H 32, Q 128, T 8192)."""
    shape = preset("llama3-8b")
    assert shape.num_params() == 8_030_261_248
    n = matmul_params(shape)
    assert n == 7_504_658_432
    f = flops_per_step(shape, 1, 8192)
    assert f["total"] == 474_422_087_516_160  # 6 · 7,504,658,432 · 8192 + 12 · 32 · 32 · 128 · 8192²
    assert flops_per_step(shape, 1, 8192, causal=True)["attention"] == f["attention"] / 2
    # MFU: 8 H100s at 989 TFLOP/s each, 1 token/s -> tiny
    u = mfu(8 * 3000.0, shape, 8192, 989.4e12, n_gpus=8)
    assert u == pytest.approx(3000 * flops_per_token(shape, 8192) / 989.4e12)
    assert flops_per_step(shape, 1, 8192, recompute="full")["recompute"] > 0


def test_the_attention_terms_and_recompute_written_out_by_hand():
    """The terms coursekit.flops names, each written out here from the shape (not from the module): the attention
    core's forward is 2 matmuls of b·a·s²·d multiply-adds per layer (QKᵀ, PV), its backward twice that, and SDPA's
    recomputing backward half a forward more; selective recompute re-runs that core, full recompute every block;
    causal halves the core."""
    shape, b, s = preset("tiny-llama"), 2, 32
    L, a, d, n = shape.layers, shape.heads, shape.head_dim, matmul_params(shape)
    core = 4 * L * b * a * s * s * d  # forward FLOPs of the attention core (2 FLOPs per multiply-add)
    plain = flops_per_step(shape, b, s)
    assert plain["dense"] == 6 * n * b * s and plain["attention"] == 3 * core and plain["recompute"] == 0
    assert plain["total"] == 6 * n * b * s + 3 * core
    assert flops_per_step(shape, b, s, sdpa_backward_recompute=True)["attention"] == 3.5 * core
    sel = flops_per_step(shape, b, s, recompute="selective")
    assert sel["recompute"] == core and sel["total"] == plain["total"] + core
    full = flops_per_step(shape, b, s, recompute="full")
    blocks = 2 * (n - shape.vocab * shape.hidden) * b * s + core  # every block's forward, not the head
    assert full["recompute"] == blocks and full["total"] == plain["total"] + blocks
    assert flops_per_step(shape, b, s, causal=True)["attention"] == 1.5 * core
    assert flops_per_token(shape, s, causal=True) == (6 * n * s + 1.5 * core / b) / s
    assert flops_per_token(shape, s) == 6 * n + 12 * L * a * d * s


def test_a_moe_model_counts_whole_active_parameters():
    """Active matmul parameters of a mixture of experts are a whole number: the router plus top_k of the experts."""
    for name in ("tiny-mixtral", "tiny-qwen3-moe"):
        shape = preset(name)
        assert isinstance(matmul_params(shape), int) and matmul_params(shape) > 0, name


@pytest.mark.parametrize("call,needle", [
    (lambda: flops_per_step("tiny-llama", 0, 8), "batch must be > 0"),
    (lambda: flops_per_step("tiny-llama", 1, 0), "seq must be > 0"),
    (lambda: flops_per_step("tiny-llama", 1, 8, recompute="some"), "unknown recompute 'some'; choose one of: none, "
                                                                   "selective, full"),
    (lambda: mfu(-1, "tiny-llama", 8, 1e12), "tokens_per_s must be >= 0 and peak_flops > 0"),
    (lambda: mfu(10, "tiny-llama", 8, 0), "tokens_per_s must be >= 0 and peak_flops > 0"),
    (lambda: mfu(10, "tiny-llama", 8, 1e12, n_gpus=0), "n_gpus must be > 0"),
])
def test_bad_input_names_the_argument(call, needle):
    from coursekit.memory import ConfigError

    with pytest.raises(ConfigError, match=f"^{re.escape(needle)}"):
        call()


def test_mfu_at_the_edges_of_its_range():
    assert mfu(0, "tiny-llama", 8, 1e12) == 0.0  # an idle job has MFU 0, it is not an error
    per_token = flops_per_token("tiny-llama", 8)
    assert mfu(4, "tiny-llama", 8, 0.5, n_gpus=2) == 4 * per_token / (2 * 0.5)  # any positive peak


def test_op_recompute_re_runs_every_second_matmul_of_each_block():
    """torchtitan's per-op policy (SelectiveAC "op": it saves every second mm of its save list, so of a Llama block's
    seven mms q, k, v, o, gate, up, down it keeps q, v, gate and down) re-runs the forward of the others, k, o and up:
    2 FLOPs per weight element per token. Llama-3 8B by hand (hidden 4,096, 32 heads and 8 KV heads of 128, FFN
    14,336, 32 layers): k 4096 x 1024 + o 4096 x 4096 + up 4096 x 14336 = 79,691,776 per layer; one 8,192-token
    sequence: 2 x 32 x 79,691,776 x 8192 = 41,781,441,855,488 FLOPs more than the model's."""
    shape = preset("llama3-8b")
    plain, op = flops_per_step(shape, 1, 8192), flops_per_step(shape, 1, 8192, recompute="op")
    assert 4096 * 1024 + 4096 * 4096 + 4096 * 14336 == 79_691_776
    assert op["recompute"] == 41_781_441_855_488
    assert op["total"] == plain["total"] + 41_781_441_855_488 and op["dense"] == plain["dense"]


def test_mfu_counts_one_gpu_unless_told():
    """Llama-3 8B, one 8,192-token sequence: 474,422,087,516,160 FLOPs (test_conventions, by hand); 3,000 tokens/s on
    one 989.4 TFLOP/s GPU is 3000 x that / 8192 / 989.4e12 of its peak; on 8 GPUs an eighth of it."""
    one = 3000 * 474_422_087_516_160 / 8192 / 989.4e12
    assert mfu(3000.0, "llama3-8b", 8192, 989.4e12) == pytest.approx(one, rel=1e-12)
    assert mfu(3000.0, "llama3-8b", 8192, 989.4e12, n_gpus=8) == pytest.approx(one / 8, rel=1e-12)
