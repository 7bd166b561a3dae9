"""Training FLOPs of a decoder-only transformer, and model FLOPs utilisation (MFU). Pure Python.

Convention (the one ``torch.utils.flop_counter.FlopCounterMode`` counts for eager attention, and torchtitan's
``6·N + 12·L·h·s`` per token):

- only matrix multiplies count, 2 FLOPs per multiply-add; elementwise ops, norms, softmax, the embedding lookup and
  bias additions are not counted;
- ``N`` = the parameters that take part in a matmul: every layer's q, k, v, o and MLP weight matrices, plus the
  LM head (tied or not: the head is a matmul even when it shares the embedding's storage). Embedding tables (token
  and learned position) are lookups and are excluded. Training = forward (2·N per token) + backward (4·N: gradient
  of the input and of the weight), so 6·N·tokens;
- a mixture of experts: ``N`` counts the router's matrix and, of the experts, the ``top_k / E`` a token runs
  (N_active: 6·N_active per token, the convention of Mixtral's and Qwen3-MoE's "active parameters" and of
  Megatron-Core's MoE MFU); dropped tokens (a capacity factor) are still counted;
- attention: QKᵀ and A·V, 2·2·b·a·s²·d per layer forward, twice that backward, so 12·L·b·a·s²·d per step over the
  full (non-causal) s×s score matrix, which is what the eager path computes. ``causal=True`` halves it (what a causal
  flash kernel actually does).

Like with like: FlopCounterMode registers no formula for CPU's flash SDPA op (it counts 0 attention FLOPs there),
and for the CUDA SDPA ops it counts 5 backward matmuls (flash recomputes QKᵀ); ``sdpa_backward_recompute=True``
adds that recomputation. Activation recomputation (``recompute``) gives hardware FLOPs (HFU) instead of model FLOPs.
"""
from __future__ import annotations

from coursekit.memory.calculator import resolve_model
from coursekit.memory.errors import ConfigError, choice, positive_int
from coursekit.memory.op_recompute import recomputed_params
from coursekit.memory.shapes import ModelShape

_MATMUL_TERMS = ("q_proj", "kv_proj", "o_proj", "mlp_in_proj", "mlp_out_proj")


def matmul_params(model) -> int:
    """Parameters that take part in a matmul per token (see module docstring): layer matrices + LM head."""
    shape = resolve_model(model)
    table = shape.param_table()
    n = sum(table.get(k, 0) for k in _MATMUL_TERMS) + shape.vocab * shape.hidden
    if shape.is_moe:  # the router's matmul, and the top_k of E experts a token runs (the *active* parameters)
        n += table["router"] + (table["experts_in_proj"] + table["experts_out_proj"]) * shape.top_k // shape.experts
    return n


def flops_per_step(model, batch: int, seq: int, *, causal: bool = False, recompute: str = "none",
                   sdpa_backward_recompute: bool = False) -> dict[str, float]:
    """Training FLOPs of one forward + backward over ``batch`` sequences of ``seq`` tokens, as named terms.

    Returns {"dense", "attention", "recompute", "total"}: dense = 6·N·tokens; attention = 12·L·b·a·s²·d
    (halved if causal); recompute = the extra forward that activation checkpointing re-runs (0 for model FLOPs).
    """
    shape: ModelShape = resolve_model(model)
    b, s = positive_int("batch", batch), positive_int("seq", seq)
    choice("recompute", recompute, ("none", "selective", "full", "op"))
    tokens = b * s
    n = matmul_params(shape)
    attn_fwd = 4 * shape.layers * b * shape.heads * s * s * shape.head_dim * (0.5 if causal else 1.0)
    attn_bwd = 2 * attn_fwd + (attn_fwd / 2 if sdpa_backward_recompute else 0)
    extra = 0.0
    if recompute == "full":  # every layer's forward again (not the head)
        extra = 2 * (n - shape.vocab * shape.hidden) * tokens + attn_fwd
    elif recompute == "selective":  # the attention core again
        extra = attn_fwd
    elif recompute == "op":  # torchtitan's per-op policy: the matmuls it does not keep (every second mm; a MoE
        # block's router and experts); the SDPA kernel's output is kept (coursekit.memory.op_recompute)
        extra = 2 * shape.layers * recomputed_params(shape) * tokens
    dense = 6 * n * tokens
    return {"dense": dense, "attention": attn_fwd + attn_bwd, "recompute": extra,
            "total": dense + attn_fwd + attn_bwd + extra}


def flops_per_token(model, seq: int, *, causal: bool = False) -> float:
    """Model FLOPs per trained token at sequence length ``seq``: 6·N + 12·L·a·d·s (non-causal)."""
    return flops_per_step(model, 1, seq, causal=causal)["total"] / seq


def mfu(tokens_per_s: float, model, seq: int, peak_flops: float, *, n_gpus: int = 1, causal: bool = False) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over ``n_gpus`` × ``peak_flops`` (e.g. a GPU's bf16 peak).

    ``tokens_per_s`` is the whole job's throughput.
    """
    if tokens_per_s < 0 or peak_flops <= 0:
        raise ConfigError("tokens_per_s must be >= 0 and peak_flops > 0")
    n_gpus = positive_int("n_gpus", n_gpus)
    return tokens_per_s * flops_per_token(model, seq, causal=causal) / (n_gpus * peak_flops)
