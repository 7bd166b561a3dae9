"""What FSDP2 should hold and send, per rank, from the model's shape alone (pure Python: no torch).

    units = unit_sizes(shape, shard=3)                 # padded elements each all-gather produces, blocks then root
    plan = step_collectives(shape, shard=3, reshard=True)
    assert CollectiveCounter(...).as_plan() == plan    # tests/test_fsdp_memory.py, on a live run

Per micro-batch each block unit all-gathers its parameters before forward and, when it resharded after forward,
again before backward; the root (embeddings, final norm, head) keeps its gathered parameters from forward into
backward (the strategy wraps it with ``reshard_after_forward=False``). Each unit reduce-scatters its gradients once
per optimizer step (accumulation skips the sync until the last micro-batch); HSDP then all-reduces each
reduce-scattered shard across the R replicas. Sizes are FSDP2's padded ones: every parameter's dim 0 is rounded up
to a multiple of the shard degree N (``coursekit.memory.engines.fsdp2``). With ``reshard=K`` (reshard to a smaller
group) a block keeps 1/K of its gathered copy after forward and backward all-gathers the same padded unit over the
K ranks of its post-forward group only (consecutive ranks: within a node), not over all N.
"""
from __future__ import annotations

from coursekit.comm import volume
from coursekit.memory.engines.fsdp2 import unit_sizes


def step_collectives(shape, *, shard: int, replicate: int = 1, wrap: str = "block", reshard: bool | int = True,
                     micro_batches: int = 1, param_bytes: int = 4, grad_bytes: int = 4) -> list[volume.Collective]:
    """Every collective of one optimizer step on one rank (``volume`` plan: compare with a counter's ``as_plan``).
    ``param_bytes`` 2 with bf16 mixed precision (gathers in bf16), ``grad_bytes`` 4 (fp32 reduce); ``reshard``
    True, False or K ranks (as ``--reshard-after-forward``; K = shard is True, K = 1 is False, as torch reads it)."""
    *blocks, root = unit_sizes(shape, shard=shard, wrap=wrap)
    if shard == 1:  # nothing to gather or scatter: each replica's gradients are all-reduced (HSDP's last step)
        return volume.merge(volume.Collective("all_reduce", u * grad_bytes, 1, replicate)
                            for u in [*blocks, root] if replicate > 1)
    kw = dict(param_bytes=param_bytes, grad_bytes=grad_bytes, micro_batches=micro_batches,
              reduce_per_micro_batch=False, replicate=replicate)  # the trainer syncs once per step
    return volume.merge(volume.fsdp(blocks, shard, reshard_after_forward=reshard, **kw)
                        + volume.fsdp(root, shard, reshard_after_forward=False, **kw))
