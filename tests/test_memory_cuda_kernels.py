"""The CUDA attention kernels' saved tensors, pinned by an independent source until a GPU measures them: torch's own
meta registrations (``torch._meta_registrations``: ``meta__scaled_dot_product_flash_attention`` and
``meta__scaled_dot_product_efficient_attention``), which state the shape and dtype of every tensor the CUDA
kernels return, run here on the meta device (no GPU). What the kernels' backward takes (torch's
``tools/autograd/derivatives.yaml``: query, key, value, output, logsumexp, philox seed and offset) is what stays
saved; the calculator's attention terms for ``kernels="cuda"`` must equal those bytes.

Planted bug this catches: the memory-efficient kernel's log-sum-exp padding (rows rounded up to 32) dropped from the
model, which the CPU tests cannot see (CPU SDPA never picks that kernel).
"""
import pytest
import torch

from coursekit.memory import activation_bytes
from coursekit.memory.shapes import ModelShape

# (batch, heads, seq, head_dim): sequences a multiple of 32, one past it, one short of it, shorter than 32
CASES = [(1, 4, 64, 16), (2, 4, 65, 16), (3, 8, 95, 32), (2, 2, 17, 64)]


def _shape(heads: int, head_dim: int) -> ModelShape:
    h = heads * head_dim  # q, k, v heads all alike: fp32 on CUDA picks the memory-efficient kernel, bf16 flash
    return ModelShape(arch="llama", layers=1, hidden=h, heads=heads, kv_heads=heads, ffn=2 * h, vocab=256,
                      max_positions=512)


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _kernel_saved(kernel: str, b: int, a: int, s: int, d: int, dtype, dropout: float) -> dict:
    """Bytes of the log-sum-exp and of the RNG state the kernel returns for its backward (torch's meta functions)."""
    q = torch.empty(b, a, s, d, device="meta", dtype=dtype)
    if kernel == "efficient":  # (output, logsumexp, philox_seed, philox_offset)
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True, dropout,
                                                                                        True)
    else:  # (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug_mask)
        out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, dropout,
                                                                                                    True, False)
    assert out.shape == q.shape and lse.dtype == torch.float32
    return {"lse": _nbytes(lse), "rng": _nbytes(seed) + _nbytes(offset), "lse_rows": lse.shape[-1]}


@pytest.mark.parametrize("b, a, s, d", CASES)
@pytest.mark.parametrize("dtype, kernel", [("fp32", "efficient"), ("bf16", "flash")])
def test_log_sum_exp_rows_are_the_kernels(b, a, s, d, dtype, kernel):
    rep = activation_bytes(_shape(a, d), b, s, dtype=dtype, attention="sdpa", impl="hf", kernels="cuda")
    assert rep.attention_kernel == kernel
    got = _kernel_saved(kernel, b, a, s, d, torch.float32 if dtype == "fp32" else torch.bfloat16, 0.0)
    want_rows = -(-s // 32) * 32 if kernel == "efficient" else s  # by hand: efficient pads to 32, flash does not
    assert got["lse_rows"] == want_rows
    assert rep.per_layer["attn.logsumexp_fp32"] == got["lse"]


@pytest.mark.parametrize("dtype, kernel", [("fp32", "efficient"), ("bf16", "flash")])
def test_dropout_keeps_the_kernels_rng_state(dtype, kernel):
    """With attention dropout the backward regenerates the mask from the philox seed and offset the kernel
    returned: those bytes are saved per layer (and nothing like a mask: the kernels keep no mask)."""
    b, a, s, d = 2, 4, 40, 16
    shape = ModelShape(arch="llama", layers=1, hidden=a * d, heads=a, kv_heads=a, ffn=2 * a * d, vocab=256,
                       max_positions=512, attn_dropout=0.1)
    rep = activation_bytes(shape, b, s, dtype=dtype, attention="sdpa", impl="hf", kernels="cuda")
    got = _kernel_saved(kernel, b, a, s, d, torch.float32 if dtype == "fp32" else torch.bfloat16, 0.1)
    assert rep.per_layer.get("attn.rng_state", 0) == got["rng"]
    assert not any("mask" in k and k.startswith("attn.") for k in rep.per_layer)
