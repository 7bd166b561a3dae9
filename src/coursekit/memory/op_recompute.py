"""``recompute="op"``: what torchtitan's per-op selective checkpoint keeps of one decoder block.

The trainer's ``--recompute op`` (``coursekit.parallel.recompute``, torchtitan's ``SelectiveAC`` policy) wraps each
block in a non-reentrant checkpoint that keeps the block's input and the *outputs* of a save list of ops, and
recomputes everything else in backward. What that keeps, in the order the block runs its matmuls:

- ``layer_input(checkpoint)``: the hidden states the block was called with (the RoPE tables are a keyword
  argument the checkpoint does not save: recomputed with the rest, as under ``full``);
- every second ``mm``: the policy counts the block's ``aten.mm`` calls and keeps the odd ones. A linear without
  bias is an ``mm``: q, k, v, o, then the MLP's gate, up, down (or fc, proj) — a Llama block keeps q, v, gate and
  down, and recomputes k, o and up. A linear with a bias (``qkv_bias``, ``o_bias``, ``mlp_bias``) is an ``addmm``:
  always kept, and not counted. The MoE router's mm is force-recomputed and not counted (torchtitan's
  ``force_recompute_mm_shapes_by_fqns``); the experts' ``_grouped_mm`` is not on the list (recomputed); the
  router's ``topk`` is on torchtitan's list, but transformers renormalises its weights in place, which a kept
  tensor may not be: the trainer recomputes it (``coursekit.parallel.recompute``), so a MoE block keeps no
  router tensor;
- the attention kernel's outputs when the kernel is on the list: CUDA flash (output, fp32 log-sum-exp) and
  memory-efficient (output, padded log-sum-exp), with their RNG state under dropout; eager and the math path run
  ``bmm`` (kept: the score matrix and the probabilities·V product, in the math path's fp32). CPU's flash kernel
  (``_scaled_dot_product_flash_attention_for_cpu``) is not on the list: recomputed.

Under TP (``coursekit.tp.plan``) the mms are the rank's local ones (their widths split by tp) over all n tokens of
the micro-batch, the row-parallel ones (o, down) before their reduction; the block input is the residual stream as
the block gets it (under SP: its sequence shard); under SP the two reduce-scatters of the row-parallel outputs are
on the list (``_c10d_functional.reduce_scatter_tensor``), so their n/tp-token outputs are kept too; without SP the
all-reduce is not: recomputed.

Modelled for the Llama-style blocks (``arch == "llama"``: Llama, Qwen, Mistral, Mixtral ...), dense ones under TP
(with or without SP), without CP or expert parallelism; checked to the byte against the trainer on CPU (``hf`` +
``cpu``, 1 rank and TP 2 with and without SP).
"""
from __future__ import annotations

from coursekit.memory.errors import ConfigError


def check(shape, *, tp: int, cp: int, ep: int) -> None:
    if shape.arch != "llama":
        raise ConfigError(f"recompute 'op' is modelled for Llama-style blocks, not {shape.arch!r} (GPT-2's Conv1D "
                          "runs addmm)")
    if cp > 1 or ep > 1 or (tp > 1 and shape.is_moe):
        raise ConfigError("recompute 'op' is modelled without cp or ep, and under tp for dense blocks only (the "
                          "policy keeps the all-to-alls' outputs there)")


def layer_terms(shape, kernel: str, *, P: int, n: int, a: int, k: int, d: int, h: int, f: int, batch: int, s: int,
                p_attn: float, cuda: bool, rng_state: dict, n_res: int | None = None, sp: bool = False
                ) -> dict[str, int]:
    """Bytes one block keeps under the op policy (name -> bytes); ``n_res``: tokens of the residual stream on this
    rank (n / tp under SP, else n); ``sp``: the row-parallel outputs are reduce-scattered (kept)."""
    n_res = n if n_res is None else n_res
    t = {"layer_input(checkpoint)": P * n_res * h}
    if sp:
        t |= {"o_proj.reduce_scatter_out": P * n_res * h, "mlp.down_proj.reduce_scatter_out": P * n_res * h}
    for name, width, _, biased, kept in _linears(shape, a=a, k=k, d=d, h=h, f=f):
        if kept:
            t[f"{name}.out({'addmm' if biased else 'mm'})"] = P * n * width
    # the attention core sits between v_proj and o_proj; its kernel's outputs, where the kernel is on the list
    if kernel in ("flash", "efficient") and cuda:
        rows = s if kernel == "flash" else -(-s // 32) * 32
        t |= {"attn.sdpa_out": P * n * a * d, "attn.logsumexp_fp32": 4 * batch * a * rows}
        if p_attn > 0:
            t["attn.rng_state"] = rng_state[kernel]
    elif kernel == "eager":  # q·kᵀ and probs·v are bmm (on the list)
        t |= {"attn.scores(bmm)": P * batch * a * s * s, "attn.probs_v(bmm)": P * n * a * d}
    elif kernel == "math":  # the math path's bmm, upcast to fp32
        t |= {"attn.scores_fp32(bmm)": 4 * batch * a * s * s, "attn.probs_v_fp32(bmm)": 4 * n * a * d}
    return t


def _linears(shape, *, a, k, d, h, f):
    """The block's dense linears in the order it runs them: (name, output width, weight elements, biased, kept).
    A biased one is an addmm (kept, not counted); of the mms the 1st, 3rd, ... are kept, every second recomputed.
    A MoE block's router (force-recomputed) and grouped experts are not among them."""
    rows = [("q_proj", a * d, h * a * d, shape.qkv_bias), ("k_proj", k * d, h * k * d, shape.qkv_bias),
            ("v_proj", k * d, h * k * d, shape.qkv_bias), ("o_proj", h, a * d * h, shape.o_bias)]
    if not shape.is_moe and shape.mlp == "swiglu":
        rows += [("mlp.gate_proj", f, h * f, shape.mlp_bias), ("mlp.up_proj", f, h * f, shape.mlp_bias),
                 ("mlp.down_proj", h, f * h, shape.mlp_bias)]
    elif not shape.is_moe:
        rows += [("mlp.fc", f, h * f, shape.mlp_bias), ("mlp.proj", h, f * h, shape.mlp_bias)]
    out, count = [], 0
    for name, width, params, biased in rows:
        count += not biased
        out.append((name, width, params, biased, biased or count % 2 == 1))
    return out


def recomputed_params(shape) -> int:
    """Weight elements per layer of the matmuls the op policy recomputes (2 FLOPs each per token, forward): the
    every-second mms, and a MoE block's router and the top_k experts a token runs. The attention core is kept
    on GPU (flash / memory-efficient SDPA are on the list) and not counted here."""
    d = shape.head_dim
    n = sum(p for _, _, p, _, kept in _linears(shape, a=shape.heads, k=shape.kv_heads, d=d, h=shape.hidden,
                                                f=shape.ffn) if not kept)
    if shape.is_moe:
        n += shape.hidden * shape.experts + shape.top_k * 3 * shape.hidden * shape.moe_ffn
    return n
