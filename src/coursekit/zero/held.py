"""What a DeepSpeed engine really holds on this rank, read from its own tensors.

One walk over the places DeepSpeed keeps tensors — every attribute of the ZeRO optimizer wrapper (lists, dicts and
small helper objects included), the model's parameters (and ZeRO-3's ``ds_tensor`` partitions) and the inner
optimizer's state — finds each distinct storage once (a view is charged its whole storage) and files it under the
*first* rule its walk path matches (a ``.grad`` of a master partition is ``fp32_grads``, any other ``.grad`` is
``grads``):

=============  ============================================================================================
category       what (attribute paths of DeepSpeed 0.19)
=============  ============================================================================================
params         the working (bf16 or fp32) weights: ``param.data`` (stage 0-2: views of ``bit16_groups_flat``),
               ZeRO-3's partition ``param.ds_tensor`` (views of ``fp16_partitioned_groups_flat``)
grads          working-precision gradients: ``param.grad``, ZeRO-1/2 ``grads_in_partition`` /
               ``averaged_gradients``, ZeRO-3 ``grad_partitions_flat_buffer``
fp32_grads     the fp32 gradient partition the optimizer reads at the step: ``<master>.grad``
master         fp32 master partition: ``single_partition_of_fp32_groups`` (1/2), ``fp32_partitioned_groups_flat``
               (3), ``fp32_groups`` (stage 0 with bf16)
optimizer      the inner optimizer's per-element state (Adam's ``exp_avg``, ``exp_avg_sq``)
buffers        communication / offload staging buffers (``ipg_buckets``, ``temp_grad_buffer_*``, ...)
scalars        one-element bookkeeping tensors (Adam's ``step``, the global grad norm, overflow flags)
other          anything not matched: listed by path, so nothing DeepSpeed holds goes unseen
=============  ============================================================================================

Where each lives: on a GPU the tensor's device says it. On a CPU-only machine DeepSpeed's "accelerator" *is* the
CPU, so the split follows DeepSpeed's own offload decision for the structure (``cpu_offload`` for ZeRO-1/2,
``offload_optimizer`` / ``offload_param`` for ZeRO-3): ``tier`` is "accelerator" or "cpu". NVMe bytes are the
sizes of the swap files under the configured folder (``nvme_bytes``).
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import torch

from coursekit.measure.states import distinct_storages

CATEGORIES = ("params", "grads", "fp32_grads", "master", "optimizer", "buffers", "scalars", "other")

# (regex on the walk path, category). First match wins; one-element tensors are always 'scalars'.
_MASTER = r"(single_partition_of_fp32_groups|fp32_partitioned_groups_flat|fp32_groups_flat_partition|fp32_groups)"
_RULES = [
    (_MASTER + r"(\[\d+\])*\.grad$", "fp32_grads"),
    (r"\.grad$", "grads"),
    (_MASTER, "master"),
    (r"^param(\.ds_tensor)?$", "params"),
    (r"(bit16_groups_flat|fp16_partitioned_groups|fp16_groups|bit16_groups|params_in_partition|param_dict)",
     "params"),
    (r"(grads_in_partition|averaged_gradients|grad_partitions_flat_buffer|all_grad_tensors|accumulated_grads_in_cpu"
     r"|non_expert_gradients|fp32_groups_gradient)", "grads"),
    (r"^state\..*\['(exp_avg|exp_avg_sq|momentum_buffer|max_exp_avg_sq)'\]$", "optimizer"),
    (r"(ipg_buckets|temp_grad_buffer|param_buffer_of_bit16|pin_buffer|_muon_allgather_buffers|swap_buffer"
     r"|param_swapper|optimizer_swapper)", "buffers"),
]
# owners walked before the rest, so a gradient that is a view into a bucket is charged to the bucket
_FIRST = ("ipg_buckets", "bit16_groups_flat", "fp16_partitioned_groups_flat", "single_partition_of_fp32_groups",
          "fp32_partitioned_groups_flat", "grads_in_partition", "grad_partitions_flat_buffer")
# structures DeepSpeed keeps on the host when it offloads the optimizer: the partitioned optimizer categories; and
# host-only structures: ZeRO-1/2 offload's staging buffers (a copy of the partition, a one-parameter gradient buffer,
# accumulated gradients) and NVMe offload's swap buffers (pinned host memory the async I/O reads into and writes from)
_OFFLOAD_OPT = {"master", "optimizer", "fp32_grads"}
_HOST_BUFFERS = (r"(param_buffer_of_bit16_for_cpu_offload|temp_grad_buffer_for_cpu_offload|accumulated_grads_in_cpu"
                 r"|param_swapper|optimizer_swapper)")


def _classify(path: str, t: torch.Tensor) -> str:
    if t.numel() <= 1:
        return "scalars"
    for pattern, cat in _RULES:
        if re.search(pattern, path):
            return cat
    return "other"


def _walk(obj, path: str, out: list, depth: int = 0, seen_objs: set | None = None):
    """Yield (path, tensor) for every tensor reachable through lists, dicts and DeepSpeed helper objects."""
    seen_objs = set() if seen_objs is None else seen_objs
    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        if obj.grad is not None:
            out.append((path + ".grad", obj.grad))
        return
    if id(obj) in seen_objs:
        return
    if isinstance(obj, dict):
        seen_objs.add(id(obj))
        for k, v in obj.items():
            _walk(v, f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}[{type(k).__name__}]", out,
                  depth + 1, seen_objs)
    elif isinstance(obj, (list, tuple)):
        seen_objs.add(id(obj))
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", out, depth + 1, seen_objs)
    elif (type(obj).__module__.startswith("deepspeed") and not isinstance(obj, torch.nn.Module)
          and not isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "__dict__")):
        seen_objs.add(id(obj))
        for k, v in vars(obj).items():
            _walk(v, f"{path}.{k}", out, depth + 1, seen_objs)


def _inner_optimizer(engine):
    opt = engine.optimizer
    return getattr(opt, "optimizer", opt)


def _on_host(engine, cat: str, path: str) -> bool:
    """On a CPU-only machine every tensor's device is the CPU, so "host" vs "accelerator" cannot be observed there:
    this reads DeepSpeed's own offload decision (its flags and the names of its host buffers). On GPUs ``held_bytes``
    uses the tensor's device instead."""
    opt = engine.optimizer
    if re.search(_HOST_BUFFERS, path):
        return True
    if cat in _OFFLOAD_OPT and (getattr(opt, "cpu_offload", False) or getattr(opt, "offload_optimizer", False)):
        return True
    return cat == "params" and bool(getattr(opt, "offload_param", False))


def held_tensors(engine) -> list[tuple[str, str, torch.Tensor, int]]:
    """Every distinct storage the engine holds now: (category, path, tensor, bytes), in walk order."""
    found: list = []
    opt, inner = engine.optimizer, _inner_optimizer(engine)
    if opt is not None and opt is not inner:  # the ZeRO wrapper first: its names say what a storage is for
        attrs = vars(opt)
        for k in [k for k in _FIRST if k in attrs] + [k for k in attrs if k not in _FIRST]:
            if k not in ("optimizer", "module", "param_names"):
                _walk(attrs[k], f"opt.{k}", found)
    swappers = {}
    for p in engine.module.parameters():
        _walk(p, "param", found)
        if hasattr(p, "ds_tensor"):
            _walk(p.ds_tensor, "param.ds_tensor", found)
        if getattr(p, "nvme_swapper", None) is not None:  # ZeRO-Infinity's parameter swapper (one per engine)
            swappers[id(p.nvme_swapper)] = p.nvme_swapper
    for sw in swappers.values():
        _walk(sw, "param_swapper", found)
    if inner is not None:
        for i, st in enumerate(inner.state.values()):
            _walk(st, f"state.{i}", found)
        for g in inner.param_groups:
            _walk(g["params"], "opt.fp32_groups", found)  # stage 0 fp32: these are the model's own params (seen)
    return [(_classify(path, t), path, t, n) for path, t, n in distinct_storages(found, meta=False)]


def held_bytes(engine, *, nvme_dir: str | None = None, rank: int | None = None) -> dict:
    """Bytes by category, by tier (accelerator / cpu) and on NVMe, with the paths of anything unclassified."""
    cpu_accel = _accelerator_is_cpu()
    by_cat: dict = defaultdict(int)
    by_tier: dict = defaultdict(lambda: defaultdict(int))
    other = []
    for cat, path, t, n in held_tensors(engine):
        by_cat[cat] += n
        on_host = _on_host(engine, cat, path) if cpu_accel else t.device.type == "cpu"
        by_tier["cpu" if on_host else "accelerator"][cat] += n
        if cat == "other":
            other.append(f"{path} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
    out = {c: by_cat.get(c, 0) for c in CATEGORIES}
    out["tiers"] = {tier: dict(v) for tier, v in by_tier.items()}
    out["nvme"] = nvme_bytes(nvme_dir, rank) if nvme_dir else 0
    out["other_paths"] = other
    return out


def nvme_bytes(folder: str, rank: int | None = None) -> int:
    """Bytes of DeepSpeed swap files under ``folder`` for ``rank`` (its files sit under a ``rank<N>`` folder)."""
    total = 0
    root = Path(folder)
    if not root.exists():
        return 0
    for f in root.rglob("*"):
        if f.is_file() and (rank is None or f"rank{rank}" in f.parts or f"rank{rank}" in f.name):
            total += f.stat().st_size
    return total


def _accelerator_is_cpu() -> bool:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cpu"


def num_params(engine) -> int:
    """Ψ of the model, also under ZeRO-3 (whose partitioned parameters report numel() 0)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())


def describe(engine) -> list[str]:
    """One line per held storage (category, bytes, dtype, shape, path): for a learner's 'where did it go?'."""
    rows = []
    for cat, path, t, n in held_tensors(engine):
        rows.append(f"{cat:<11} {n:>12,} {str(t.dtype).removeprefix('torch.'):<9} "
                    f"{str(tuple(t.shape)):<16} {path}")
    return rows
