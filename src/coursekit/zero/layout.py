"""Per-rank bytes DeepSpeed 0.19 holds, predicted exactly from the model's parameter list (pure Python).

The textbook (and ``coursekit memory``) works with Ψ alone. DeepSpeed's real layout adds three details, all visible
in ``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py``:

1. **Padding.** ZeRO-1/2 flatten all parameters into one buffer padded to a multiple of 2N elements and give each
   rank P = padded/N of it. ZeRO-3 partitions every parameter on its own, ceil(numel/N) elements per rank.
2. **Gradient partition of ZeRO-1/2.** At the end of backward each rank keeps the gradients of every parameter
   that *overlaps* its partition, whole (``grads_in_partition``): a parameter straddling a partition boundary is
   held by both neighbours. So the bytes differ by rank and exceed Ψ/N by up to one parameter per boundary.
3. **fp32 copies even in fp32.** ZeRO 1-3 clone an fp32 master partition from the weights (also when the weights
   are fp32 already) and build an fp32 gradient partition at the step (``flatten(grads).to(fp32)`` — a new tensor).

Categories and the moments they are read at are ``coursekit.zero.held``'s.
"""
from __future__ import annotations

import math

ELEM = {"fp32": 4, "bf16": 2}


def partition_params(numels: list[int], world: int, rank: int) -> list[int]:
    """Indices of the parameters that overlap ``rank``'s ZeRO-1/2 partition (DeepSpeed's ``get_partition_info``)."""
    padded = _padded(sum(numels), world)
    size = padded // world
    start, end = size * rank, size * (rank + 1)
    out, cur = [], 0
    for i, n in enumerate(numels):
        if start <= cur < end or cur < start < cur + n:
            out.append(i)
        cur += n
    return out


def _padded(total: int, world: int) -> int:
    align = 2 * world  # nccl_start_alignment_factor (2) x data-parallel world size
    return math.ceil(total / align) * align


def deepspeed_bytes(numels: list[int], *, stage: int, world: int, rank: int, dtype: str = "fp32",
                    reduce_bucket_size: int = 500_000, offload_optimizer: str = "none",
                    offload_param: str = "none", micro_batches: int = 1) -> dict:
    """{category: bytes} on ``rank`` for a DeepSpeed engine with an Adam-type optimizer (two fp32 moments), as
    measured by ``coursekit.strategies.zero`` (params/grads/buffers at the end of backward, the rest inside the
    step), plus ``tiers``: the same bytes split into "accelerator" and "cpu" (what offload moves).

    ``grads_peak`` is the gradient bytes when the last gradient arrives (stages 0-1; None where it depends on
    bucket timing); ``scalars`` is None under offload (per-parameter norms DeepSpeed keeps as 1-element tensors).
    CPU offload (stages 1-2) adds staging buffers: a partition-sized working-precision copy on the host and one
    largest-parameter gradient buffer on each side; with several micro-batches the gradients of the parameters
    overlapping the partition accumulate on the host (``accumulated_grads_in_cpu``), whole, between micro-batches.
    NVMe offload is not modelled here (see ``held.nvme_bytes``).
    """
    b = ELEM[dtype]
    psi = sum(numels)
    out = dict(params=0, grads=0, fp32_grads=0, master=0, optimizer=0, buffers=0, scalars=0, grads_peak=None)
    host_buffers = 0
    if stage == 0:
        out |= dict(params=b * psi, grads=b * psi, optimizer=8 * psi, grads_peak=b * psi)
        if dtype == "fp32":
            out["scalars"] = 4 * len(numels)  # one fp32 'step' per parameter tensor
        else:  # FP16_UnfusedOptimizer: fp32 copies of every weight, their grads at the step
            out |= dict(master=4 * psi, fp32_grads=4 * psi, scalars=4 * len(numels))
    elif stage in (1, 2):
        part = _padded(psi, world) // world
        mine = partition_params(numels, world, rank)
        out |= dict(params=b * _padded(psi, world), grads=b * sum(numels[i] for i in mine), master=4 * part,
                    optimizer=8 * part, fp32_grads=4 * part, scalars=8)  # step + grad norm (fp32)
        out["grads_peak"] = b * psi if stage == 1 else None
        if offload_optimizer != "none":  # gradients stream into the host's fp32 partition during backward
            host_buffers = b * (part + max(numels))
            accumulated = b * sum(numels[i] for i in mine) if micro_batches > 1 else 0
            out |= dict(grads=accumulated, buffers=host_buffers + b * max(numels), scalars=None)
            out["grads_peak"] = b * psi if stage == 1 else accumulated
    elif stage == 3:
        part = sum(math.ceil(n / world) for n in numels)
        out |= dict(params=b * part, grads=b * part, master=4 * part, optimizer=8 * part, fp32_grads=4 * part,
                    buffers=b * reduce_bucket_size, scalars=13)  # step 4 + grad norm fp64 8 + overflow flag 1
        out["grads_peak"] = b * part
        if offload_optimizer != "none" or offload_param != "none":
            out["scalars"] = None
    else:
        raise ValueError(f"ZeRO stage must be 0-3, got {stage!r}")
    host = set()
    if offload_optimizer != "none":
        host |= {"master", "optimizer", "fp32_grads"} | ({"grads"} if stage in (1, 2) else set())
    if offload_param != "none":
        host.add("params")
    cats = ("params", "grads", "fp32_grads", "master", "optimizer", "buffers")
    out["tiers"] = {"cpu": {c: out[c] for c in cats if c in host and out[c]},
                    "accelerator": {c: out[c] for c in cats if c not in host and out[c]}}
    if host_buffers:
        out["tiers"]["cpu"]["buffers"] = host_buffers
        out["tiers"]["accelerator"]["buffers"] = out["buffers"] - host_buffers
    out["tiers"] = {k: v for k, v in out["tiers"].items() if v}
    return out


def model_numels(model: str) -> list[int]:
    """Parameter sizes of a course model in ``model.parameters()`` order (DeepSpeed's flattening order)."""
    from coursekit.models import build_model

    return [p.numel() for p in build_model(model, device="meta").parameters()]
