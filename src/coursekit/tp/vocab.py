"""Vocabulary-parallel embedding and LM head (Megatron-LM's VocabParallelEmbedding; torchtitan's plan): each TP rank
holds V/tp rows of each, instead of the whole V x h twice (for Qwen's 151,936-token vocabulary and h 4,096 that is
1.2 B parameters a rank no longer keeps whole).

Embedding, forward: a rank looks up the ids that fall in its rows [offset, offset + rows) — the others are looked up
at row 0 and zeroed — and the partial outputs are all-reduced (every id is some rank's). Backward: the output's
gradient is the same on every rank (no communication); each rank's rows get the gradient of its own ids.

Head: ``ColwiseParallel`` on the output projection: each rank computes its V/tp logits and they are all-gathered for
the loss, so the loss sees every logit as without TP (Megatron's vocab-parallel cross-entropy keeps them split
instead: three all-reduces of one float per token); backward all-reduces the head input's partial gradient.

Saved for backward by the embedding: the rank's local ids (int64, as the whole embedding saves the ids) and the mask
of the ids it does not hold (bool): a fixed b·s bytes. torch's ``RowwiseParallel`` embedding zeroes the masked rows
with an in-place boolean index instead, whose backward keeps the *indices* of the masked rows: bytes that depend on
the batch's ids, which a calculator cannot state.
"""
from __future__ import annotations

import torch
from torch import nn


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of an embedding, as a ``Shard(0)`` DTensor parameter over the TP mesh (FSDP2 and DCP see
    a sharded parameter like any other)."""

    def __init__(self, weight, mesh, padding_idx: int | None = None):
        super().__init__()
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor

        self.mesh, self.padding_idx = mesh, padding_idx
        if not isinstance(weight, DTensor):  # a whole weight: split it (a tied head's weight already is)
            weight = nn.Parameter(distribute_tensor(weight.detach(), mesh, [Shard(0)]))
        self.weight = weight
        V, tp, r = weight.shape[0], mesh.size(), mesh.get_local_rank()
        self.offset = min(V, r * -(-V // tp))  # torch.chunk's split, which Shard(0) uses: ceil(V/tp) rows each

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Partial, Replicate

        w = self.weight.to_local()
        local = ids - self.offset
        outside = (local < 0) | (local >= w.shape[0])
        out = nn.functional.embedding(local.masked_fill(outside, 0), w).masked_fill(outside.unsqueeze(-1), 0.0)
        return DTensor.from_local(out, self.mesh, [Partial()], run_check=False).redistribute(
            placements=[Replicate()]).to_local()

    def extra_repr(self) -> str:
        return f"rows {self.offset}..{self.offset + self.weight.to_local().shape[0] - 1} of {self.weight.shape[0]}"


def vocab_parallel(lm, family, mesh) -> None:
    """Split ``lm``'s embedding and head over the vocabulary; a tied head keeps the one (sharded) weight. A pipeline
    stage without the embedding (a later stage) or the head (an earlier one) skips it."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    body = getattr(lm, family.body)
    embed = getattr(body, family.embed, None)  # None on a later pipeline stage
    head = getattr(lm, family.head)
    head = head if isinstance(head, nn.Linear) else None  # nn.Identity on an earlier stage
    tied = embed is not None and head is not None and head.weight is embed.weight
    if head is not None:
        parallelize_module(head, mesh, ColwiseParallel(output_layouts=Replicate()))
    if embed is not None:
        weight = head.weight if tied else embed.weight  # both shard dim 0 over the same mesh: one parameter
        setattr(body, family.embed, VocabParallelEmbedding(weight, mesh, embed.padding_idx))
