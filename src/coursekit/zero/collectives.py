"""The collectives DeepSpeed ZeRO issues per optimizer step, against the communication-volume model.

What is counted (``coursekit.comm.counter.CollectiveCounter`` around one whole step — every micro-batch's forward
and backward plus ``engine.step()`` — on each rank): every collective dispatcher op DeepSpeed issues, with its
payload in nccl-tests' convention (all_gather: the gathered output; reduce_scatter: the full input; all_reduce and
reduce: the tensor). Not counted: the trainer's own loss all-reduce after the step.

What DeepSpeed 0.19 issues, per step, with Ψ parameters, b bytes per element (4 fp32, 2 bf16), N ranks, m
micro-batches (DeepSpeed pads the flat buffer to a multiple of 2N elements, ZeRO-3 each parameter to a multiple of
N — ``expected(..., numels=...)`` applies it; the tiny-llama runs need none):

==========  ===============================================================  ========================
stage       collectives (payload totals)                                     paper's volume per rank
==========  ===============================================================  ========================
0           all_reduce Ψb at the last micro-batch (DDP)                      2Ψ
1           reduce Ψb (one ``reduce`` per bucket slice, to the rank owning   2Ψ
            it = a reduce-scatter) at the last micro-batch; all_gather Ψb
2           the same reduce every micro-batch (m·Ψb); all_gather Ψb          2Ψ (m = 1)
3           per micro-batch: all_gather Ψb in forward, again in backward,    3Ψ
            reduce_scatter Ψb
==========  ===============================================================  ========================

plus one scalar all_reduce of the gradient norm (4 bytes fp32 in stages 1-2, 8 bytes fp64 in stage 3), which the
model leaves out. With ``use_multi_rank_bucket_allreduce: true`` (DeepSpeed's default) ZeRO-1/2 *all-reduce* each
bucket instead of reducing it to its owner: DDP's 2Ψ plus the all-gather, 3Ψ. ZeRO-3 with DeepSpeed's prefetch
and persistence defaults gathers a small model once and keeps it (2Ψ). ``configs/deepspeed`` sets both so the
paper's numbers come out; the bucket sweep shows the defaults.

"Paper's volume" counts elements moved per rank the way ZeRO's §7 does (large N): all_reduce 2 × its payload,
reduce_scatter / reduce / all_gather 1 ×, in units of Ψ·b.
"""
from __future__ import annotations

from coursekit.comm import volume
from coursekit.memory.deepspeed import padded, zero3_partitions

PAPER_WEIGHT = {"all_reduce": 2, "reduce_scatter": 1, "reduce": 1, "all_gather": 1, "broadcast": 1}
SCALAR_BYTES = 8  # payloads this small (grad-norm, overflow flags) are bookkeeping, not model traffic


def expected(stage: int, num_params: int, world: int, *, elem_bytes: int = 4, micro_batches: int = 1,
             multi_rank_allreduce: bool = False, numels=None, reused=()) -> dict[str, int]:
    """Payload bytes per op per step that DeepSpeed issues for this ZeRO stage (scalars excluded).

    Built on ``coursekit.comm.volume`` (the textbook model); the only DeepSpeed-specific renaming is that its
    ZeRO-1/2 reduce-scatter is a series of ``reduce`` calls (or ``all_reduce`` with ``multi_rank_allreduce``).
    With the parameter sizes (``numels``) it also applies DeepSpeed's padding: ZeRO-1/2 gather the flat buffer padded
    to a multiple of 2N (they reduce the parameters' gradients only); ZeRO-3 moves every parameter padded to a
    multiple of N, and gathers a parameter once per module that uses it — ``reused``: the sizes of parameters used by
    a second module (a tied embedding is gathered again for the head, in forward and in backward).
    """
    b = elem_bytes
    if numels is not None and stage:
        numels = list(numels)
        if stage in (1, 2):
            out = {"all_gather": b * padded(sum(numels), world)}
            op = "all_reduce" if multi_rank_allreduce else "reduce"
            out[op] = b * sum(numels) * (micro_batches if stage == 2 else 1)
            return out
        moved = b * world * sum(zero3_partitions(numels, world))
        again = b * world * sum(zero3_partitions(reused, world))
        return {"all_gather": micro_batches * 2 * (moved + again), "reduce_scatter": micro_batches * moved}
    if stage == 0:
        plan = volume.ddp(num_params, world, grad_bytes=b)
    else:
        plan = volume.zero(stage, num_params, world, param_bytes=b, grad_bytes=b, micro_batches=micro_batches)
    out: dict[str, int] = {}
    for c in plan:
        op = c.op
        if stage in (1, 2) and op == "reduce_scatter":
            op = "all_reduce" if multi_rank_allreduce else "reduce"
        out[op] = out.get(op, 0) + c.total_bytes
    return out


def measured(collectives: dict) -> dict[str, int]:
    """Payload bytes per op from a strategy's counted step (``final["collectives"]``), scalars excluded."""
    out: dict[str, int] = {}
    for c in collectives["calls"]:
        if c["bytes"] <= SCALAR_BYTES:
            continue
        out[c["op"]] = out.get(c["op"], 0) + c["bytes"] * c["count"]
    return out


def scalar_calls(collectives: dict) -> list[dict]:
    """The bookkeeping collectives left out of the comparison (stated, not hidden)."""
    return [c for c in collectives["calls"] if c["bytes"] <= SCALAR_BYTES]


def paper_volume(per_op: dict[str, int], num_params: int, elem_bytes: int) -> float:
    """Elements each rank moves per step in units of Ψ, counted as the ZeRO paper does (all_reduce = 2 passes)."""
    unknown = set(per_op) - set(PAPER_WEIGHT)
    if unknown:
        raise ValueError(f"no paper weight for {sorted(unknown)}")
    return sum(PAPER_WEIGHT[op] * b for op, b in per_op.items()) / (num_params * elem_bytes)


def wire_bytes(collectives: dict) -> float:
    """Bytes this rank sent under ring algorithms (nccl-tests' bus-bandwidth factors), scalars included."""
    return sum(c["count"] * volume.wire_bytes(c["op"], c["bytes"], c["group_size"]) for c in collectives["calls"])
