"""Deterministic training data: synthetic sequences or a small shipped text corpus, byte tokens (``make_rows``; as a
``datasets.Dataset``: ``make_dataset``; the trainer reads the rows themselves, ``Rows``).

Every sample is ``seq_len`` tokens; the trainer asks for ``seq + 1`` so that a micro-batch carries ``seq`` inputs and
their ``seq`` pre-shifted next-token labels, plus position ids (``Batch``). Step ``s`` of a run uses
samples ``[s*G, (s+1)*G)`` of the global stream (G = global batch); rank ``r`` of ``W`` takes the contiguous slice
``[r*G/W, (r+1)*G/W)`` and cuts it into micro-batches (r and W: its coordinate in the data-parallel *batch* group,
so tensor- and pipeline-parallel peers see the same rows). So a run on 1, 2 or 4 ranks sees the same global batch at
every step, which is what the distributed-vs-single tests compare, and a resumed run sees what it would have seen.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

CORPUS = Path(__file__).with_name("data_files") / "corpus.txt"
KINDS = ("synthetic", "text")
VOCAB = 256  # byte-level tokens


def make_dataset(kind: str = "synthetic", *, seq_len: int = 64, num_samples: int = 1024, seed: int = 0,
                 vocab_size: int = VOCAB):
    """A ``datasets.Dataset`` with one column ``input_ids`` of ``seq_len`` ints each: ``make_rows``' rows."""
    from datasets import Dataset

    ids = make_rows(kind, seq_len=seq_len, num_samples=num_samples, seed=seed, vocab_size=vocab_size)
    return Dataset.from_dict({"input_ids": ids.tolist()}).with_format("torch")


def make_rows(kind: str = "synthetic", *, seq_len: int = 64, num_samples: int = 1024, seed: int = 0,
              vocab_size: int = VOCAB) -> torch.Tensor:
    """``num_samples`` rows of ``seq_len`` token ids, one int64 tensor.

    synthetic: arithmetic sequences modulo the vocabulary with a random start and stride (learnable, so the loss
    falls); text: byte windows of the shipped corpus at seeded random offsets (wrapping around).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r}; choose one of {', '.join(KINDS)}")
    if seq_len < 2 or num_samples < 1:
        raise ValueError(f"seq_len and num_samples must be >= 2 and >= 1 (got {seq_len}, {num_samples})")
    g = torch.Generator().manual_seed(seed)
    n = seq_len
    if kind == "synthetic":
        start = torch.randint(0, vocab_size, (num_samples, 1), generator=g)
        stride = torch.randint(1, 8, (num_samples, 1), generator=g)
        return (start + stride * torch.arange(n)) % vocab_size
    if vocab_size < VOCAB:
        raise ValueError(f"text data is byte-level and needs vocab_size >= {VOCAB}, got {vocab_size}")
    data = torch.tensor(list(CORPUS.read_bytes()), dtype=torch.long)
    offsets = torch.randint(0, len(data), (num_samples, 1), generator=g)
    return data[(offsets + torch.arange(n)) % len(data)]


class Rows:
    """``make_rows``' rows read as ``micro_batches`` reads a ``make_dataset`` dataset (``ds[idx]["input_ids"]``,
    ``len(ds)``), the same tensors: the trainer's data without importing ``datasets`` (pandas, pyarrow: ~0.8 s of
    every worker's start on 2 CPU cores)."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, idx) -> dict:
        return {"input_ids": self.ids[idx]}


class Batch(NamedTuple):
    """One micro-batch: ``[b, s]`` input ids, the next-token labels of each position (pre-shifted: the loss needs no
    shift, so a context-parallel shard keeps a label for its last token) and the positions (a CP shard starts
    mid-sequence; rotary embeddings need the true positions)."""
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device) for t in self))


def rank_slice(global_batch: int, rank: int, world: int) -> slice:
    """Which part of a global batch this data-parallel rank owns."""
    if global_batch % world:
        raise ValueError(f"global batch {global_batch} is not divisible by the data-parallel world size {world}")
    per = global_batch // world
    return slice(rank * per, (rank + 1) * per)


def micro_batches(ds, step: int, *, micro_batch: int, grad_accum: int, rank: int = 0, world: int = 1,
                  cut=None, device: str | torch.device = "cpu") -> list[Batch]:
    """The ``grad_accum`` micro-batches this rank trains on at ``step``.

    ``rank``/``world`` are the rank's coordinate in the *batch* group (data-parallel ranks), not its global rank:
    tensor- and pipeline-parallel peers take the same rows. Rows have ``seq + 1`` tokens: inputs ``[:-1]``, labels
    ``[1:]``. ``cut`` (a function of one [rows, seq] tensor) keeps this rank's part of every row, applied alike to
    ids, labels and positions: a context-parallel rank's chunks (``coursekit.cp.shard.cutter``: zig-zag for ring
    attention, contiguous for Ulysses). The data layer knows no parallelism; the caller hands it the cut.
    """
    global_batch = micro_batch * grad_accum * world
    sl = rank_slice(global_batch, rank, world)
    base = step * global_batch
    idx = [(base + i) % len(ds) for i in range(sl.start, sl.stop)]
    rows = ds[idx]["input_ids"]  # [micro_batch * grad_accum, seq + 1]
    ids, labels = rows[:, :-1], rows[:, 1:]
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    if cut is not None:
        ids, labels, pos = cut(ids), cut(labels), cut(pos)
    out = []
    for k in range(grad_accum):
        part = slice(k * micro_batch, (k + 1) * micro_batch)
        out.append(Batch(ids[part].contiguous(), labels[part].contiguous(), pos[part].contiguous()).to(device))
    return out
