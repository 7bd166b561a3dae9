"""Training FLOPs against torch's FlopCounterMode on real HF models (forward + backward), to the FLOP: both count
the same matmuls of known shapes, so there is nothing to round."""
from __future__ import annotations

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
