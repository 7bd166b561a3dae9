"""The course's loss, from logits, and its reduction over the ranks that hold parts of one global batch.

Labels come pre-shifted from ``coursekit.data`` (position t is scored against token t+1), so no shift happens here
and a context-parallel shard keeps every one of its labels. Each rank averages over its own tokens; every rank of
the ``loss`` group (data-parallel × context-parallel) holds the same number of tokens, so the mean of the ranks'
means is the mean over the global batch: the single-process loss.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32; logits ``[b, s, V]``, labels ``[b, s]``."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)


def global_loss(local: torch.Tensor | None, ctx) -> float:
    """The step's loss on every rank: the mean over the ``loss`` group, taken from the last pipeline stage (the
    only stage with a loss) and broadcast along the pipeline."""
    import torch.distributed as dist

    t = torch.zeros((), device=ctx.device) if local is None else local.detach().float().clone()
    if ctx.dims.size("loss") > 1:
        dist.all_reduce(t, group=ctx.mesh["loss"].get_group())
        t /= ctx.dims.size("loss")
    if ctx.dims.pp > 1:
        pp = ctx.mesh["pp"]
        dist.broadcast(t, group_src=ctx.dims.pp - 1, group=pp.get_group())
    return t.item()
