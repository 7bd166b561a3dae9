"""Training FLOPs against torch's FlopCounterMode on real HF models (forward + backward)."""
from __future__ import annotations

import pytest

from coursekit.flops import flops_per_step, flops_per_token, matmul_params, mfu
from coursekit.memory import ModelShape, preset, to_hf_config_dict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


def counted(shape: ModelShape, attention: str, b: int, s: int) -> int:
    d = to_hf_config_dict(shape)
    cls = {"llama": transformers.LlamaConfig, "gpt2": transformers.GPT2Config}[d.pop("model_type")]
    model = transformers.AutoModelForCausalLM.from_config(cls(**d), attn_implementation=attention).train()
    ids = torch.randint(0, shape.vocab, (b, s))
    with FlopCounterMode(display=False) as fc:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("shape,b,s", [
    (preset("tiny-llama"), 3, 40),
    (preset("tiny-gpt2"), 2, 64),
    (ModelShape(arch="llama", layers=3, hidden=96, heads=6, kv_heads=2, ffn=256, vocab=300, tied_embeddings=True),
     2, 33),
], ids=["tiny-llama", "tiny-gpt2", "llama-gqa-tied"])
def test_flops_match_flop_counter(shape, b, s):
    """Eager attention: FlopCounterMode counts every matmul (linears, LM head, QKᵀ and A·V) like our formula."""
    assert flops_per_step(shape, b, s)["total"] == pytest.approx(counted(shape, "eager", b, s), rel=0.01)


def test_cpu_sdpa_attention_is_invisible_to_flop_counter():
    """FlopCounterMode has no formula for CPU's flash SDPA op: with sdpa it counts the dense part only."""
    shape = preset("tiny-llama")
    assert flops_per_step(shape, 2, 32)["dense"] == pytest.approx(counted(shape, "sdpa", 2, 32), rel=0.01)


def test_conventions():
    shape = preset("llama3-8b")
    n = matmul_params(shape)
    assert n == shape.num_params() - shape.vocab * shape.hidden - sum(
        v for k, v in shape.param_table().items() if "norm" in k)  # embedding lookup and norms excluded
    f = flops_per_step(shape, 1, 8192)
    assert f["total"] == 6 * n * 8192 + 12 * 32 * 32 * 128 * 8192 ** 2
    assert flops_per_step(shape, 1, 8192, causal=True)["attention"] == f["attention"] / 2
    # MFU: 8 H100s at 989 TFLOP/s each, 1 token/s -> tiny
    u = mfu(8 * 3000.0, shape, 8192, 989.4e12, n_gpus=8)
    assert u == pytest.approx(3000 * flops_per_token(shape, 8192) / 989.4e12)
    assert flops_per_step(shape, 1, 8192, recompute="full")["recompute"] > 0
