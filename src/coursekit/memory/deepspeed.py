"""Per-rank bytes DeepSpeed 0.19 holds, exactly, from the model's parameter list (pure Python).

The textbook works with Ψ alone (``coursekit.memory.states``). DeepSpeed's real layout adds details, all visible in
``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py``; ``coursekit memory`` uses this layout whenever it
knows the model's tensors (a preset or a config.json, without TP/PP), and tests/test_zero.py checks it against
what live DeepSpeed engines hold on every rank:

1. **Padding.** ZeRO-1/2 flatten all parameters into one buffer padded to a multiple of 2N elements and give each
   rank P = padded/N of it. ZeRO-3 partitions every parameter on its own, ceil(numel/N) elements per rank.
2. **Gradient partition of ZeRO-1/2.** At the end of backward each rank keeps the gradients of every parameter
   that *overlaps* its partition, whole (``grads_in_partition``): a parameter straddling a partition boundary is
   held by both neighbours. So the bytes differ by rank and exceed Ψ/N by up to one parameter per boundary. The
   rank whose partition holds the flat buffer's padding also keeps a zero tensor of that many elements.
3. **fp32 copies even in fp32.** ZeRO 1-3 clone an fp32 master partition from the weights (also when the weights
   are fp32 already) and build an fp32 gradient partition at the step (``flatten(grads).to(fp32)`` — a new tensor).
4. **ZeRO-Offload staging (stages 1-2).** The host keeps a working-precision copy of the partition
   (``param_buffer_of_bit16_for_cpu_offload``) and a largest-parameter gradient buffer; the accelerator keeps one
   largest-parameter gradient buffer too. With several micro-batches per step the gradients of the parameters
   overlapping the partition accumulate on the host, whole (``accumulated_grads_in_cpu``).
5. **ZeRO-3 steps one sub-group at a time.** Each rank's partitions are packed, in parameter order, into sub-groups
   of at least ``sub_group_size`` elements (``_create_fp16_sub_groups``; DeepSpeed's default 1e9: one sub-group for
   any model below 1e9 parameters per rank). ``step`` builds one sub-group's fp32 gradient partition
   (``_prepare_fp32_grad_for_sub_group``), steps it and frees it (``_release_sub_group``) before the next: the step's
   peak holds the largest sub-group's, not the whole partition's. Under CPU offload every sub-group keeps its own
   fp32 gradient buffer on the host all along (``initialize_optimizer_states``): the whole partition.

Assumed, as the course's trainer does: one parameter group in ``model.parameters()`` order, an optimizer whose
state is ``states`` fp32 tensors per element (Adam: 2), and DeepSpeed's defaults for ``round_robin_gradients``,
``parameter_alignment`` and ``data_types.grad_accum_dtype`` (the trainer notes a config that changes them). ZeRO-3:
every parameter partitioned (``stage3_param_persistence_threshold`` 0, as ``configs/deepspeed`` sets it; DeepSpeed's
default 1e5 keeps smaller parameters whole on every rank). Host memory under NVMe offload follows DeepSpeed's source
(pinned parameter buffer, shared gradient buffer) but is not compared byte for byte: measured, it is mixed with the
pinned swap buffers, which are not modelled.
Verified against live engines in fp32 and bf16 (fp16 is taken to match bf16; the trainer refuses fp16).
"""
from __future__ import annotations

from functools import lru_cache

from coursekit.memory.errors import ConfigError

ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}
MAX_IN_CPU = 1_000_000_000  # offload_param.max_in_cpu: parameter elements ZeRO-Infinity keeps in host memory
CATEGORIES = ("params", "grads", "fp32_grads", "master", "optimizer", "buffers")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded(total: int, world: int) -> int:
    """ZeRO-1/2's flat buffer length: a multiple of 2N (nccl_start_alignment_factor 2 x data-parallel size)."""
    return _round_up(total, 2 * world)


def zero3_partitions(numels, world: int) -> list[int]:
    """ZeRO-3's per-rank partition of each parameter: ceil(n/N) elements (each parameter padded to a multiple of N)."""
    return [-(-n // world) for n in numels]


def zero3_sub_groups(parts, sub_group_size: int) -> list[list[int]]:
    """ZeRO-3's sub-groups of one rank's partitions (``stage3._create_fp16_sub_groups``): all in one if they sum to
    at most ``sub_group_size`` elements; else packed in order, a sub-group closed once it reaches ``sub_group_size``
    (so it may exceed it by up to one partition), the last one closed by the last parameter."""
    if isinstance(sub_group_size, bool) or not isinstance(sub_group_size, int) or sub_group_size <= 0:
        raise ValueError(f"sub_group_size must be an integer > 0 (elements), got {sub_group_size!r}")
    parts = list(parts)
    if sub_group_size >= sum(parts):
        return [parts]
    groups, cur, size = [], [], 0
    for p in parts:
        cur.append(p)
        size += p
        if size >= sub_group_size:
            groups.append(cur)
            cur, size = [], 0
    return groups + ([cur] if cur else [])


def partition_params(numels, world: int, rank: int) -> list[int]:
    """Indices of the parameters that overlap ``rank``'s ZeRO-1/2 partition (DeepSpeed's ``get_partition_info``)."""
    size = padded(sum(numels), world) // world
    start, end = size * rank, size * (rank + 1)
    out, cur = [], 0
    for i, n in enumerate(numels):
        if start <= cur < end or cur < start < cur + n:
            out.append(i)
        cur += n
    return out


def overlap_numels(numels, world: int) -> tuple[int, ...]:
    """Per rank: elements of the parameters overlapping its ZeRO-1/2 partition (O(tensors + ranks))."""
    return _overlap_numels(tuple(numels), world)


@lru_cache(maxsize=256)
def _overlap_numels(numels: tuple[int, ...], world: int) -> tuple[int, ...]:
    size = padded(sum(numels), world) // world
    diff = [0] * (world + 1)
    cur = 0
    for n in numels:
        if n:
            first, last = cur // size, min((cur + n - 1) // size, world - 1)
            diff[first] += n
            diff[last + 1] -= n
        cur += n
    out, run = [], 0
    for r in range(world):
        run += diff[r]
        out.append(run)
    return tuple(out)


def tail_padding(total: int, world: int, rank: int) -> int:
    """Elements of ``rank``'s ZeRO-1/2 partition past the last parameter (the flat buffer's alignment padding).
    DeepSpeed's gradient partition appends them as a zero tensor (``get_flat_partition``)."""
    size = padded(total, world) // world
    return max(0, (rank + 1) * size - max(total, rank * size))


def grad_partition_numels(numels, world: int) -> tuple[int, ...]:
    """Per rank: gradient elements ZeRO-1/2 hold at the end of backward (overlapping parameters + tail padding)."""
    numels = tuple(numels)
    total = sum(numels)
    return tuple(n + tail_padding(total, world, r) for r, n in enumerate(overlap_numels(numels, world)))


def fullest_rank(numels, world: int, *, offload: bool = False) -> int:
    """The rank whose ZeRO-1/2 gradients hold the most elements (the first one, if several). Under offload the
    gradients that stay (accumulated on the host) are the overlapping parameters' only, without the padding."""
    per = overlap_numels(numels, world) if offload else grad_partition_numels(numels, world)
    return per.index(max(per))


def deepspeed_bytes(numels, *, stage: int, world: int, rank: int, dtype: str = "fp32",
                    reduce_bucket_size: int = 500_000, offload_optimizer: str = "none",
                    offload_param: str = "none", micro_batches: int = 1, states: int = 2,
                    sub_group_size: int = 1_000_000_000) -> dict:
    """{category: bytes} on ``rank`` for a DeepSpeed engine whose optimizer keeps ``states`` fp32 tensors per
    element, as measured by ``coursekit.zero.strategy`` (params/grads/buffers at the end of backward, the rest
    inside the step), plus ``tiers``: the same bytes split into "accelerator" and "cpu" (what offload moves).

    ``reduce_bucket_size`` defaults to the course configs' 5e5 elements (DeepSpeed's own default is 5e8).
    ``sub_group_size`` (ZeRO-3, DeepSpeed's default 1e9 elements): ``fp32_grads`` is the step's peak, the largest
    sub-group's fp32 gradient partition (``zero3_sub_groups``); under optimizer offload the whole partition.
    ``grads_peak`` is the gradient bytes when the last gradient arrives (stages 0-1; None where it depends on
    bucket timing); ``scalars`` is None under offload (per-parameter norms DeepSpeed keeps as 1-element tensors).
    NVMe offload is not split here: "cpu" then means "off the accelerator" (see ``coursekit.zero.held.nvme_bytes``).
    """
    numels = tuple(numels)
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank!r}")
    b = ELEM[dtype]
    psi = sum(numels)
    K = 4 * states
    out = dict(params=0, grads=0, fp32_grads=0, master=0, optimizer=0, buffers=0, scalars=0, grads_peak=None)
    host_buffers = 0
    if stage == 0:
        out |= dict(params=b * psi, grads=b * psi, optimizer=K * psi, grads_peak=b * psi)
        if dtype == "fp32":
            out["scalars"] = 4 * len(numels)  # one fp32 'step' per parameter tensor
        else:  # FP16_UnfusedOptimizer: fp32 copies of every weight, their grads at the step
            out |= dict(master=4 * psi, fp32_grads=4 * psi, scalars=4 * len(numels))
    elif stage in (1, 2):
        part = padded(psi, world) // world
        mine = overlap_numels(numels, world)[rank]
        out |= dict(params=b * padded(psi, world), grads=b * grad_partition_numels(numels, world)[rank],
                    master=4 * part, optimizer=K * part, fp32_grads=4 * part, scalars=8)  # step + grad norm (fp32)
        out["grads_peak"] = b * psi if stage == 1 else None
        if offload_optimizer != "none":  # gradients stream into the host's fp32 partition during backward
            host_buffers = b * (part + max(numels))
            accumulated = b * mine if micro_batches > 1 else 0
            out |= dict(grads=accumulated, buffers=host_buffers + b * max(numels), scalars=None)
            out["grads_peak"] = b * psi if stage == 1 else accumulated
    elif stage == 3:
        parts = zero3_partitions(numels, world)
        part, groups = sum(parts), zero3_sub_groups(parts, sub_group_size)
        # the step builds and frees one sub-group's fp32 gradients at a time; offload keeps a buffer per sub-group
        fp32_grads = 4 * (part if offload_optimizer != "none" else max(sum(g) for g in groups))
        out |= dict(params=b * part, grads=b * part, master=4 * part, optimizer=K * part, fp32_grads=fp32_grads,
                    buffers=b * reduce_bucket_size,
                    scalars=4 * len(groups) + 9)  # Adam's step per sub-group 4 + grad norm fp64 8 + overflow flag 1
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
    out["tiers"] = {"cpu": {c: out[c] for c in CATEGORIES if c in host and out[c]},
                    "accelerator": {c: out[c] for c in CATEGORIES if c not in host and out[c]}}
    if host_buffers:
        out["tiers"]["cpu"]["buffers"] = host_buffers
        out["tiers"]["accelerator"]["buffers"] = out["buffers"] - host_buffers
    out["tiers"] = {k: v for k, v in out["tiers"].items() if v}
    return out


def state_bytes(numels, *, precision: str, dtype: str, optimizer: str, zero: int, shard: int, rank: int | None,
                offload: str = "none", offload_params: str = "none", micro_batches: int = 1,
                sub_group_size: int = 1_000_000_000):
    """``coursekit.memory.states.StateBytes`` for DeepSpeed's exact layout on data-parallel ``rank`` (None: the rank
    holding the most) and that rank, in the calculator's categories: ``gradients`` is the whole gradient held
    through backward for stages 0-1 (DeepSpeed reduces it at the end) and the rank's partition for stages 2-3;
    ``step_grad_copy`` is ZeRO-3's largest sub-group (``sub_group_size``). ``precision`` is ``16psi`` (working dtype
    ``dtype``) or ``fp32``."""
    return _state_bytes(tuple(numels), precision=precision, dtype=dtype, optimizer=optimizer, zero=zero,
                        shard=shard, rank=rank, offload=offload, offload_params=offload_params,
                        micro_batches=micro_batches, sub_group_size=sub_group_size)


def check_offload(*, zero: int, offload: str, offload_params: str) -> None:
    """DeepSpeed's rules for offload by ZeRO stage (ConfigError otherwise)."""
    if offload_params != "none" and zero != 3:
        raise ConfigError("parameter offload needs ZeRO-3 or FSDP2 (parameters must be sharded)")
    if offload != "none" and zero == 0:
        raise ConfigError("DeepSpeed offloads optimizer state with ZeRO stage 1, 2 or 3, not 0")
    if "nvme" in (offload, offload_params) and zero != 3:
        raise ConfigError("NVMe offload (ZeRO-Infinity) needs ZeRO stage 3")


@lru_cache(maxsize=4096)  # solvers and grids ask the same layout many times
def _state_bytes(numels: tuple[int, ...], *, precision, dtype, optimizer, zero, shard, rank, offload,
                 offload_params, micro_batches, sub_group_size):
    from coursekit.memory.states import OPTIMIZERS, PRECISION_TEXT, StateBytes, check_choices

    check_choices(precision=precision, optimizer=optimizer, zero=zero, offload=offload, offload_params=offload_params)
    check_offload(zero=zero, offload=offload, offload_params=offload_params)
    if rank is None:
        rank = fullest_rank(numels, shard, offload=offload != "none" and micro_batches > 1) if zero in (1, 2) else 0
    dtype = "fp32" if precision == "fp32" else dtype  # the weights' dtype
    d = deepspeed_bytes(numels, stage=zero, world=shard, rank=rank, dtype=dtype,
                        offload_optimizer=offload, offload_param=offload_params, micro_batches=micro_batches,
                        states=OPTIMIZERS[optimizer], sub_group_size=sub_group_size)
    acc, host = d["tiers"].get("accelerator", {}), dict(d["tiers"].get("cpu", {}))
    grads = d["grads_peak"] if zero <= 1 else acc.get("grads", 0)
    nvme = 0
    if "nvme" in (offload, offload_params):  # ZeRO-Infinity: what goes to files, what small tensors stay on the host
        files = nvme_file_bytes(numels, world=shard, dtype=dtype,
                                offload_optimizer=offload, offload_param=offload_params,
                                states=OPTIMIZERS[optimizer], sub_group_size=sub_group_size)
        nvme = files["params"] + files["optimizer"] + files["grads"]
        if offload_params == "nvme":  # partitions stay in a pinned flat host buffer of up to max_in_cpu elements
            host["params"] = ELEM[dtype] * min(sum(zero3_partitions(numels, shard)), MAX_IN_CPU)
        if offload == "nvme":  # swapped sub-groups share one fp32 gradient buffer (initialize_optimizer_states)
            host["master"], host["optimizer"] = files["kept_optimizer"], 0
            host["fp32_grads"] = files["kept_grads"]
    text = (f"{PRECISION_TEXT[precision]}; DeepSpeed's exact layout on data-parallel rank {rank} (padding, "
            f"whole gradients of parameters overlapping the partition, fp32 master and gradient partitions"
            f"{', offload staging buffers' if offload != 'none' and zero in (1, 2) else ''})")
    st = StateBytes(parameters=acc.get("params", 0), gradients=grads, master_weights=acc.get("master", 0),
                    optimizer_states=acc.get("optimizer", 0), grad_copy=0, step_grad_copy=acc.get("fp32_grads", 0),
                    step_temporaries=0, cpu=sum(host.values()), nvme=nvme, convention=text,
                    offload_buffers=acc.get("buffers", 0) if zero in (1, 2) else 0)
    return st, rank


def nvme_file_bytes(numels, *, world: int, dtype: str = "bf16", offload_optimizer: str = "nvme",
                    offload_param: str = "nvme", states: int = 2, sub_group_size: int = 1_000_000_000,
                    aio_block_size: int = 1 << 20, intra_op_parallelism: int = 1) -> dict:
    """Bytes of ZeRO-Infinity's swap files on one rank (ZeRO-3, ``deepspeed/runtime/swap_tensor``), by kind, and
    what stays in host memory instead (``kept_params``, ``kept_optimizer``, and ``kept_grads``: the fp32 gradients of
    sub-groups too small to swap, plus one buffer the size of the largest swapped sub-group that they share). Same on
    every rank.

    A tensor goes to a file only if it is at least ``max(1 MiB, aio block size)``; file lengths are aligned to
    1024·intra_op_parallelism bytes. ``params``: each parameter's partition (ceil(n/N) elements of ``dtype``), its
    file rounded up. ``optimizer``: per sub-group (parameters packed until ``sub_group_size`` partition elements),
    the fp32 master partition and each optimizer state, rounded up. ``grads``: each parameter's fp32 gradient
    partition in a swappable sub-group, rounded *down* (the remainder stays in host memory).
    """
    min_bytes = max(1 << 20, aio_block_size)
    align_bytes = 1024 * intra_op_parallelism
    parts = zero3_partitions(numels, world)
    out = dict(params=0, optimizer=0, grads=0, kept_params=0, kept_optimizer=0, kept_grads=0)
    if offload_param == "nvme":
        b = ELEM[dtype]
        al = align_bytes // b
        for p in parts:
            if p * b >= min_bytes:
                out["params"] += _round_up(p, al) * b
            else:
                out["kept_params"] += p * b
    if offload_optimizer == "nvme":
        al = align_bytes // 4
        largest_swapped = 0
        for g in zero3_sub_groups(parts, sub_group_size):
            n = sum(g)
            if n * 4 < min_bytes:  # too small to swap: states and gradients stay on the host
                out["kept_optimizer"] += (1 + states) * 4 * n
                out["kept_grads"] += 4 * n
                continue
            largest_swapped = max(largest_swapped, n)
            out["optimizer"] += (1 + states) * _round_up(n, al) * 4
            for p in g:  # a fragment is written if it still is >= min_bytes once cut down to the alignment
                q = p // al * al if p * 4 >= min_bytes else 0
                out["grads"] += q * 4 if q * 4 >= min_bytes else 0
        out["kept_grads"] += 4 * largest_swapped
    return out
