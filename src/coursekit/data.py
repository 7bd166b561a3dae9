"""Deterministic training data through ``datasets``: synthetic sequences or a small shipped text corpus, byte tokens.

Every sample is ``seq_len`` tokens; labels are the inputs themselves (Hugging Face causal LMs shift them inside
the loss, so a sample gives ``seq_len - 1`` predictions). Step ``s`` of a run uses
samples ``[s*G, (s+1)*G)`` of the global stream (G = global batch); rank ``r`` of ``W`` takes the contiguous slice
``[r*G/W, (r+1)*G/W)`` and cuts it into micro-batches. So a run on 1, 2 or 4 ranks sees the same global batch at
every step, which is what the distributed-vs-single tests compare, and a resumed run sees what it would have seen.
"""
from __future__ import annotations

from pathlib import Path

import torch

CORPUS = Path(__file__).with_name("data_files") / "corpus.txt"
KINDS = ("synthetic", "text")
VOCAB = 256  # byte-level tokens


def make_dataset(kind: str = "synthetic", *, seq_len: int = 64, num_samples: int = 1024, seed: int = 0,
                 vocab_size: int = VOCAB):
    """A ``datasets.Dataset`` with one column ``input_ids`` of ``seq_len`` ints each.

    synthetic: arithmetic sequences modulo the vocabulary with a random start and stride (learnable, so the loss
    falls); text: byte windows of the shipped corpus at seeded random offsets (wrapping around).
    """
    from datasets import Dataset

    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r}; choose one of {', '.join(KINDS)}")
    if seq_len < 2 or num_samples < 1:
        raise ValueError(f"seq_len and num_samples must be >= 2 and >= 1 (got {seq_len}, {num_samples})")
    g = torch.Generator().manual_seed(seed)
    n = seq_len
    if kind == "synthetic":
        start = torch.randint(0, vocab_size, (num_samples, 1), generator=g)
        stride = torch.randint(1, 8, (num_samples, 1), generator=g)
        ids = (start + stride * torch.arange(n)) % vocab_size
    else:
        if vocab_size < VOCAB:
            raise ValueError(f"text data is byte-level and needs vocab_size >= {VOCAB}, got {vocab_size}")
        data = torch.tensor(list(CORPUS.read_bytes()), dtype=torch.long)
        offsets = torch.randint(0, len(data), (num_samples, 1), generator=g)
        ids = data[(offsets + torch.arange(n)) % len(data)]
    return Dataset.from_dict({"input_ids": ids.tolist()}).with_format("torch")


def rank_slice(global_batch: int, rank: int, world: int) -> slice:
    """Which part of a global batch this data-parallel rank owns."""
    if global_batch % world:
        raise ValueError(f"global batch {global_batch} is not divisible by the data-parallel world size {world}")
    per = global_batch // world
    return slice(rank * per, (rank + 1) * per)


def micro_batches(ds, step: int, *, micro_batch: int, grad_accum: int, rank: int = 0, world: int = 1,
                  device: str | torch.device = "cpu"):
    """The ``grad_accum`` micro-batches (input_ids, labels) this rank trains on at ``step``."""
    global_batch = micro_batch * grad_accum * world
    sl = rank_slice(global_batch, rank, world)
    base = step * global_batch
    idx = [(base + i) % len(ds) for i in range(sl.start, sl.stop)]
    rows = ds[idx]["input_ids"]  # [micro_batch * grad_accum, seq]
    out = []
    for k in range(grad_accum):
        chunk = rows[k * micro_batch:(k + 1) * micro_batch].to(device)
        out.append((chunk, chunk))
    return out
