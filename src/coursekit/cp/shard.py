"""Cut one sequence into the pieces each context-parallel (CP) rank holds, and glue the pieces back.

Every tensor that runs along the sequence — input ids, labels, position ids, and inside attention q, k, v — must be
cut *the same way*, or a rank's queries meet another rank's positions. Two layouts:

* ``contiguous``: C equal chunks, rank r holds chunk r. What Ulysses needs: its all-to-all gathers the chunks in
  rank order, so the gathered sequence is the original one and a plain causal mask is right.
* ``zigzag`` (head-tail): 2C equal chunks, rank r holds chunks r and 2C-1-r. What causal ring attention needs for
  equal work: with contiguous chunks rank 0 attends only to itself while rank C-1 attends to everything; pairing an
  early chunk with a late one gives every rank the same number of unmasked scores. (Megatron-LM's context
  parallelism, zhuzilin/ring-flash-attention's ``zigzag_ring_flash_attn``, the Llama 3 paper (Dubey et al. 2024),
  torch's ``context_parallel`` head-tail load balancer.)
  For C = 2: chunks [0 1 2 3] -> rank 0 holds [0 3], rank 1 holds [1 2].

Labels: shift for next-token prediction on the *whole* sequence first (``next_token_labels``), then shard. A model
that shifts inside its loss (HF's ``labels=``) would pair the last token of a chunk with the first token of the same
rank's next chunk — a token that is not its successor — so pass pre-shifted labels (HF ``LlamaForCausalLM``: as both
``labels=`` and ``shift_labels=``). The ignored last position lives on one rank only, so average the loss over the
global count of labelled tokens (a sum, then one all-reduce), not rank by rank.

Pure PyTorch indexing (slices and ``cat``): the same on CPU and GPU, and each function is its own inverse's mirror.
"""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")
IMPL_LAYOUT = {"ulysses": "contiguous", "ring": "zigzag"}  # the layout each attention implementation expects


def layout_for(impl: str) -> str:
    """The sharding layout ``impl`` ('ulysses' or 'ring') expects its inputs in."""
    if impl not in IMPL_LAYOUT:
        raise ValueError(f"unknown context-parallel implementation {impl!r}; known: {', '.join(IMPL_LAYOUT)}")
    return IMPL_LAYOUT[impl]


def chunks_of(rank: int, cp: int, layout: str = "zigzag") -> list[int]:
    """Which chunks (of ``cp`` contiguous ones, or ``2·cp`` zig-zag ones) rank ``rank`` holds, in order."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is not in a CP group of {cp}")
    return [rank] if layout == "contiguous" else [rank, 2 * cp - 1 - rank]


def check_seq(seq: int, cp: int, layout: str = "zigzag") -> None:
    """Raise ValueError unless a sequence of ``seq`` tokens cuts into this layout's equal chunks."""
    pieces = cp if layout == "contiguous" else 2 * cp
    if seq % pieces:
        raise ValueError(f"sequence length {seq} must be divisible by {pieces} "
                         f"({'cp' if layout == 'contiguous' else '2·cp for load-balanced ring attention'}, cp={cp})")


def shard(x: torch.Tensor, cp: int, rank: int, *, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s part of the full-sequence tensor ``x`` (sequence along ``dim``): length seq/cp."""
    if cp == 1:
        return x
    check_seq(x.shape[dim], cp, layout)
    n = cp if layout == "contiguous" else 2 * cp
    pieces = x.chunk(n, dim=dim)
    return torch.cat([pieces[c] for c in chunks_of(rank, cp, layout)], dim=dim)


def unshard(parts, *, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's part (``parts[r]`` = rank r's ``shard``), undoing ``shard``."""
    cp = len(parts)
    if cp == 1:
        return parts[0]
    n = cp if layout == "contiguous" else 2 * cp
    full = [None] * n
    for r, part in enumerate(parts):
        for c, piece in zip(chunks_of(r, cp, layout), part.chunk(len(chunks_of(r, cp, layout)), dim=dim)):
            full[c] = piece
    return torch.cat(full, dim=dim)


def gather(x: torch.Tensor, group=None, *, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """All-gather every rank's part over ``group`` and return the full sequence (for evaluation and tests)."""
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return unshard(parts, layout=layout, dim=dim)


def position_ids(seq: int, cp: int, rank: int, *, layout: str = "zigzag", batch: int = 1,
                 device=None) -> torch.Tensor:
    """Global positions of this rank's tokens, shape (batch, seq/cp): RoPE must rotate by the true position."""
    pos = torch.arange(seq, device=device).expand(batch, seq)
    return shard(pos, cp, rank, layout=layout, dim=1)


def next_token_labels(input_ids: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """labels[t] = input_ids[t+1] on the full sequence, the last position ignored: shift *before* sharding."""
    labels = torch.full_like(input_ids, ignore_index)
    labels[..., :-1] = input_ids[..., 1:]
    return labels


def cutter(cp: int, rank: int, layout: str = "zigzag"):
    """``coursekit.data.micro_batches``' ``cut``: rank ``rank``'s part of each [rows, seq] tensor (None for cp 1)."""
    return None if cp == 1 else (lambda x: shard(x, cp, rank, layout=layout))


def shard_batch(input_ids: torch.Tensor, cp: int, rank: int, *, layout: str = "zigzag",
                ignore_index: int = -100) -> dict[str, torch.Tensor]:
    """What one CP rank feeds the model: its input ids, pre-shifted labels and global position ids, all cut alike."""
    b, s = input_ids.shape
    return {"input_ids": shard(input_ids, cp, rank, layout=layout),
            "shift_labels": shard(next_token_labels(input_ids, ignore_index), cp, rank, layout=layout),
            "position_ids": position_ids(s, cp, rank, layout=layout, batch=b, device=input_ids.device)}
