"""Deterministic data: every world size sees the same global batch at every step."""
import pytest
import torch

from coursekit.data import CORPUS, Rows, make_dataset, make_rows, micro_batches


@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_same_seed_same_data(kind):
    a, b = make_dataset(kind, seq_len=16, num_samples=32, seed=5), make_dataset(kind, seq_len=16, num_samples=32, seed=5)
    assert torch.equal(a[:]["input_ids"], b[:]["input_ids"])
    assert a[:]["input_ids"].shape == (32, 16)
    c = make_dataset(kind, seq_len=16, num_samples=32, seed=6)
    assert not torch.equal(a[:]["input_ids"], c[:]["input_ids"])


@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_the_trainers_rows_are_the_datasets_micro_batches(kind):
    """The trainer reads ``Rows`` (no ``datasets`` import): the same micro-batches, dtype and all, at every rank."""
    kw = dict(seq_len=9, num_samples=24, seed=3)
    ds, rows = make_dataset(kind, **kw), Rows(make_rows(kind, **kw))
    assert len(rows) == len(ds) == 24
    for step in range(4):  # step 3 wraps around the 24 samples
        for r in range(2):
            a, b = (micro_batches(d, step, micro_batch=2, grad_accum=2, rank=r, world=2) for d in (ds, rows))
            for x, y in zip(a, b, strict=True):
                for u, v in zip(x, y, strict=True):
                    assert u.dtype == v.dtype == torch.int64 and torch.equal(u, v)


def test_text_is_byte_windows_of_the_shipped_corpus():
    raw = CORPUS.read_bytes()
    row = bytes(make_dataset("text", seq_len=24, num_samples=4, seed=0)[0]["input_ids"].tolist())
    assert row in raw + raw[:24]  # a window, possibly wrapping around the end


@pytest.mark.parametrize("world,accum", [(2, 1), (4, 1), (2, 2), (8, 1)])
def test_ranks_partition_the_global_batch(world, accum):
    ds = make_dataset(seq_len=8, num_samples=64, seed=1)
    for step in range(3):
        whole = torch.cat([b.input_ids for b in micro_batches(ds, step, micro_batch=8, grad_accum=1)])
        parts = [b.input_ids for r in range(world) for b in
                 micro_batches(ds, step, micro_batch=8 // (world * accum), grad_accum=accum, rank=r, world=world)]
        assert torch.equal(torch.cat(parts), whole)  # disjoint, complete, same order


def test_labels_are_pre_shifted_and_positions_travel_with_the_tokens():
    ds = make_dataset(seq_len=9, num_samples=8)  # the trainer asks for seq + 1 tokens per row
    (b,) = micro_batches(ds, 0, micro_batch=4, grad_accum=1)
    rows = ds[list(range(4))]["input_ids"]
    assert b.input_ids.shape == (4, 8) and torch.equal(b.input_ids, rows[:, :-1])
    assert torch.equal(b.labels, rows[:, 1:])  # position t is scored against token t+1: no shift in the loss
    assert torch.equal(b.position_ids, torch.arange(8).expand(4, -1))


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_context_parallel_shards_keep_their_labels_and_positions(layout):
    ds = make_dataset(seq_len=17, num_samples=8)
    (full,) = micro_batches(ds, 0, micro_batch=2, grad_accum=1)
    from coursekit.cp.shard import cutter

    shards = [micro_batches(ds, 0, micro_batch=2, grad_accum=1, cut=cutter(2, r, layout))[0] for r in range(2)]
    pos = torch.cat([s.position_ids for s in shards], dim=1)
    assert sorted(pos[0].tolist()) == list(range(16))  # the two ranks hold every position once
    if layout == "zigzag":  # chunks of 4: rank 0 holds 0-3 and 12-15, rank 1 holds 4-11 (equal causal work)
        assert shards[0].position_ids[0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    for s in shards:  # each token keeps its own label and position, wherever it went
        idx = s.position_ids[0]
        assert torch.equal(s.input_ids, full.input_ids[:, idx]) and torch.equal(s.labels, full.labels[:, idx])


def test_bad_input():
    with pytest.raises(ValueError, match="unknown data kind"):
        make_dataset("images")
    with pytest.raises(ValueError, match="seq_len"):
        make_dataset(seq_len=1)
    with pytest.raises(ValueError, match="byte-level"):
        make_dataset("text", vocab_size=100)
    with pytest.raises(ValueError, match="unknown data kind"):
        make_rows("images")
