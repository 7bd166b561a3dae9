"""``--recompute op``: torchtitan's per-op selective activation checkpointing (its default "selective" AC).

Read from pytorch/torchtitan ``torchtitan/distributed/activation_checkpoint.py`` (``SelectiveAC``, commit
b5bcd76, Aug 2026). Every decoder block runs under torch's non-reentrant checkpoint with
``context_fn = create_selective_checkpoint_contexts(policy)``; the policy, a fresh one per block call:

- MUST_SAVE the outputs of the save list: the partitioner's compute-intensive ops (``get_default_op_list()``: mm,
  bmm, addmm, convolution, the flash / memory-efficient SDPA kernels, _scaled_mm, ...), the math / cuDNN /
  overrideable SDPA kernels, ``aten.max``, ``aten.linear`` (a leaf on some backends), ``aten.topk`` (keeps a
  router's choices), flex attention, and the collectives ``reduce_scatter_tensor`` and ``all_to_all_single``;
  also a CUDA-to-CPU copy;
- except every second mm / linear: the policy counts them (forward and recompute apart) and recomputes the even
  ones — in a Llama block q, v, gate and down are kept, k, o and up recomputed;
- except (torchtitan's ``force_recompute_mm_shapes_by_fqns``, default ``moe.router.gate``) an mm with the MoE
  router's weight shape: recomputed and not counted (transformers names the router ``...mlp.gate`` /
  ``block_sparse_moe.gate``: we match the modules named ``gate`` inside a sparse block that hold experts);
- one departure: in a mixture of experts transformers renormalises the router's top-k weights in place, which
  SAC refuses for a kept tensor ("cached ... has been mutated"): there ``topk`` is recomputed instead;
- recompute everything else. On CPU, SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``, which is not on
  the list: attention is recomputed here (the calculator's ``hf`` + ``cpu`` profile says so).
"""
from __future__ import annotations

from functools import partial

from coursekit.measure.sac import observed_contexts


def save_ops() -> set:
    import torch
    from torch._functorch.partitioners import get_default_op_list

    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    a = torch.ops.aten
    ops |= {a._scaled_dot_product_cudnn_attention.default, a._scaled_dot_product_attention_math.default,
            a._scaled_dot_product_fused_attention_overrideable.default, a.max.default, a.linear.default,
            a.topk.default, torch._higher_order_ops.flex_attention,
            torch.ops._c10d_functional.reduce_scatter_tensor.default,
            torch.ops._c10d_functional.all_to_all_single.default}
    optional = ((torch._higher_order_ops, "inductor_compiled_code"), (torch.ops, "torch_attn._varlen_attn.default"))
    for root, path in optional:
        try:
            for part in path.split("."):
                root = getattr(root, part)
            ops.add(root)
        except (AttributeError, RuntimeError):
            pass
    return ops


def router_shapes(lm) -> set:
    """(in, out) of the MoE routers' weights: the mms torchtitan force-recomputes."""
    shapes = set()
    for name, mod in lm.named_modules():
        w = getattr(mod, "weight", None)
        if name.rsplit(".", 1)[-1] == "gate" and w is not None and w.dim() == 2 and hasattr(
                _parent(lm, name), "experts"):
            shapes.add((w.shape[1], w.shape[0]))
    return shapes


def _parent(lm, name):
    return lm.get_submodule(name.rsplit(".", 1)[0]) if "." in name else lm


def policy(ops: set, recompute_shapes: set):
    """One block call's policy (torchtitan's ``wrapped_policy``)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    meta = {"forward": 0, "recompute": 0}

    def decide(ctx, func, *args, **kwargs):
        if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device) and "device" in kwargs
                and str(kwargs["device"]) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            w = args[1].shape
            if func == torch.ops.aten.linear.default:
                w = torch.Size((w[1], w[0]))
            if tuple(w) in recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[mode] += 1
        if func in ops:
            if func in mm_ops and meta[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return decide


def context_fn(ops: set, recompute_shapes: set):
    return observed_contexts(policy(ops, recompute_shapes))


def enable_op_recompute(lm) -> None:
    """Checkpoint every decoder block of the causal LM ``lm`` with the op policy (transformers' checkpointing hook
    with torch's non-reentrant checkpoint and our ``context_fn``)."""
    routers = router_shapes(lm)
    ops = save_ops()
    if routers:  # transformers' routers renormalise topk's values in place (``/=``): SAC refuses a kept tensor
        # that is mutated, so topk is recomputed (deterministic for the same input: the same experts are chosen)
        import torch

        ops.discard(torch.ops.aten.topk.default)
    fn = partial(context_fn, ops, routers)
    kw = {"use_reentrant": False, "context_fn": fn}
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers 5's name
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
