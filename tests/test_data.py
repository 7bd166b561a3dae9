"""Deterministic data: every world size sees the same global batch at every step."""
import pytest
import torch

from coursekit.data import CORPUS, make_dataset, micro_batches


@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_same_seed_same_data(kind):
    a, b = make_dataset(kind, seq_len=16, num_samples=32, seed=5), make_dataset(kind, seq_len=16, num_samples=32, seed=5)
    assert torch.equal(a[:]["input_ids"], b[:]["input_ids"])
    assert a[:]["input_ids"].shape == (32, 16)
    c = make_dataset(kind, seq_len=16, num_samples=32, seed=6)
    assert not torch.equal(a[:]["input_ids"], c[:]["input_ids"])


def test_text_is_byte_windows_of_the_shipped_corpus():
    raw = CORPUS.read_bytes()
    row = bytes(make_dataset("text", seq_len=24, num_samples=4, seed=0)[0]["input_ids"].tolist())
    assert row in raw + raw[:24]  # a window, possibly wrapping around the end


@pytest.mark.parametrize("world,accum", [(2, 1), (4, 1), (2, 2), (8, 1)])
def test_ranks_partition_the_global_batch(world, accum):
    ds = make_dataset(seq_len=8, num_samples=64, seed=1)
    for step in range(3):
        whole = torch.cat([ids for ids, _ in micro_batches(ds, step, micro_batch=8, grad_accum=1)])
        parts = [ids for r in range(world) for ids, _ in
                 micro_batches(ds, step, micro_batch=8 // (world * accum), grad_accum=accum, rank=r, world=world)]
        assert torch.equal(torch.cat(parts), whole)  # disjoint, complete, same order


def test_labels_are_the_inputs_for_hf_shifting():
    ds = make_dataset(seq_len=8, num_samples=8)
    ((ids, labels),) = micro_batches(ds, 0, micro_batch=4, grad_accum=1)
    assert torch.equal(ids, labels)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown data kind"):
        make_dataset("images")
    with pytest.raises(ValueError, match="seq_len"):
        make_dataset(seq_len=1)
    with pytest.raises(ValueError, match="byte-level"):
        make_dataset("text", vocab_size=100)
