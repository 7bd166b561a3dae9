"""``coursekit memory --solve``'s sentences (``coursekit.memory.answers``) word for word: the solver functions are
stubs whose answers are chosen here, so each branch of ``describe`` and ``_fewest`` (which alternative is tried, with
which arguments, and what is said) is checked against its docstring by hand. Where bench/bench_mutation.py found no
test. Pure Python, well under a second."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from coursekit.memory import answers
from coursekit.memory.errors import ConfigError
from coursekit.memory.gpus import GiB


def est(world=8, gpu="H100-80GB", peak=1.25, memory=80, dp=8):
    """A stand-in estimate: its config's world, GPU and dp, its peak and its GPU's memory in GiB."""
    return SimpleNamespace(config=SimpleNamespace(world=world, gpu=gpu, dp=dp), peak_bytes=int(peak * GiB),
                           gpu_memory_bytes=int(memory * GiB))


@pytest.fixture
def solvers(monkeypatch):
    """Stub solvers: each call is recorded as (name, model, kwargs); the answers come from ``table``."""
    calls, table = [], {}

    def make(name):
        def solver(model, **kw):
            calls.append((name, model, kw))
            out = table[name]
            out = out(kw) if callable(out) else out
            if isinstance(out, Exception):
                raise out
            return out
        return solver

    for name in ("max_micro_batch", "max_seq_len", "min_gpus"):
        monkeypatch.setattr(answers, name, make(name))
    return SimpleNamespace(calls=calls, table=table)


def gpus(world, dp):
    return SimpleNamespace(config=SimpleNamespace(world=world, dp=dp))


# --- missing_argument --------------------------------------------------------------------------------------------

def test_missing_argument_names_the_option_and_an_example_where_there_is_one():
    assert answers.missing_argument("seq", None) == "--seq is required (e.g. --seq 4096)"
    assert answers.missing_argument("batch", None) == "--batch is required (e.g. --batch 1)"
    assert answers.missing_argument("seq", "max-batch") == "--solve max-batch needs --seq (e.g. --seq 4096)"
    assert answers.missing_argument("batch", "max-seq") == "--solve max-seq needs --batch (e.g. --batch 1)"
    # a name without an example: the sentence alone
    assert answers.missing_argument("gpu", None) == "--gpu is required"
    assert answers.missing_argument("gpu", "min-gpus") == "--solve min-gpus needs --gpu"
    assert answers.missing_argument("seq", "") == "--seq is required (e.g. --seq 4096)"  # "" is no --solve


# --- max-batch -----------------------------------------------------------------------------------------------------

def test_max_batch_that_fits_gives_the_batch_and_the_peak(solvers):
    # peak 12.75 GiB -> "12.8" (a tenth, half to even: 12.75 is exact in binary), memory 80 GiB -> "80"
    e = est(world=16, gpu="A100-80GB", peak=12.75, memory=80)
    assert answers.describe("max-batch", "m", {"seq": 2048}, {"max_batch": 3}, e) == (
        "solution: up to 3 sequences of 2048 tokens per micro-batch fit on each GPU of 16 × A100-80GB "
        "(peak 12.8 of 80 GiB at micro-batch 3)")
    # one sequence: singular; the GPU memory is rounded to a whole GiB (79.6 -> 80), the peak to a tenth (0.5)
    e = est(world=2, gpu="L4", peak=0.5, memory=79.6)
    assert answers.describe("max-batch", "m", {"seq": 7}, {"max_batch": 1}, e) == (
        "solution: up to 1 sequence of 7 tokens per micro-batch fit on each GPU of 2 × L4 (peak 0.5 of 80 GiB at "
        "micro-batch 1)")
    assert solvers.calls == []  # a batch that fits asks no solver


def test_max_batch_none_fits_but_full_recompute_does(solvers):
    kw = {"seq": 4096, "recompute": "none", "zero": 3}
    solvers.table["max_micro_batch"] = 2
    assert answers.describe("max-batch", "llama", kw, {"max_batch": 0}, est()) == (
        "no micro-batch fits on 8 × H100-80GB at seq 4096; with --recompute full, 2 fit")
    # the solver is asked once, with the same model and every field as given but recompute full
    assert solvers.calls == [("max_micro_batch", "llama", {"seq": 4096, "recompute": "full", "zero": 3})]
    solvers.calls.clear()
    solvers.table["max_micro_batch"] = 1  # one: "fits"
    assert answers.describe("max-batch", "llama", kw, {"max_batch": 0}, est(world=4)) == (
        "no micro-batch fits on 4 × H100-80GB at seq 4096; with --recompute full, 1 fits")
    assert [c[0] for c in solvers.calls] == ["max_micro_batch"]  # recomputing is enough: no GPU count asked


def test_max_batch_without_recompute_given_also_tries_full(solvers):
    solvers.table["max_micro_batch"] = 5
    assert answers.describe("max-batch", "m", {"seq": 64}, {"max_batch": 0}, est()) == (
        "no micro-batch fits on 8 × H100-80GB at seq 64; with --recompute full, 5 fit")
    assert solvers.calls == [("max_micro_batch", "m", {"seq": 64, "recompute": "full"})]


def test_max_batch_not_even_with_full_recompute_asks_for_more_gpus(solvers):
    kw = {"seq": 4096, "recompute": "selective", "batch": 3}
    solvers.table["max_micro_batch"] = 0
    solvers.table["min_gpus"] = gpus(24, 12)
    assert answers.describe("max-batch", "m", kw, {"max_batch": 0}, est()) == (
        "no micro-batch fits on 8 × H100-80GB at seq 4096; not even with --recompute full; or 24 GPUs (--dp 12)")
    # more GPUs at micro-batch 1 (the fewest that fit one sequence), the recomputation as given first
    assert solvers.calls == [("max_micro_batch", "m", {"seq": 4096, "recompute": "full", "batch": 3}),
                             ("min_gpus", "m", {"seq": 4096, "recompute": "selective", "batch": 1})]


def test_max_batch_with_full_recompute_given_goes_straight_to_more_gpus(solvers):
    kw = {"seq": 4096, "recompute": "full"}
    solvers.table["min_gpus"] = gpus(32, 32)
    assert answers.describe("max-batch", "m", kw, {"max_batch": 0}, est()) == (
        "no micro-batch fits on 8 × H100-80GB at seq 4096; or 32 GPUs (--dp 32)")
    assert solvers.calls == [("min_gpus", "m", {"seq": 4096, "recompute": "full", "batch": 1})]


def test_more_gpus_with_full_recompute_when_the_given_recompute_is_not_enough(solvers):
    kw = {"seq": 4096, "recompute": "none"}
    solvers.table["max_micro_batch"] = 0
    solvers.table["min_gpus"] = lambda kw: gpus(64, 16) if kw["recompute"] == "full" else ConfigError("no")
    assert answers.describe("max-batch", "m", kw, {"max_batch": 0}, est()) == (
        "no micro-batch fits on 8 × H100-80GB at seq 4096; not even with --recompute full; or 64 GPUs (--dp 16) "
        "with --recompute full")
    assert solvers.calls[1:] == [("min_gpus", "m", {"seq": 4096, "recompute": "none", "batch": 1}),
                                 ("min_gpus", "m", {"seq": 4096, "recompute": "full", "batch": 1})]


def test_more_gpus_do_not_help(solvers):
    solvers.table["max_micro_batch"] = 0
    solvers.table["min_gpus"] = ConfigError("never fits")
    assert answers.describe("max-batch", "m", {"seq": 8}, {"max_batch": 0}, est()) == (
        "no micro-batch fits on 8 × H100-80GB at seq 8; not even with --recompute full; more GPUs do not help this "
        "configuration")
    assert [c[2].get("recompute") for c in solvers.calls] == ["full", None, "full"]
    # with full recompute given, the second try (the same thing again) is skipped
    solvers.calls.clear()
    assert answers.describe("max-batch", "m", {"seq": 8, "recompute": "full"}, {"max_batch": 0}, est()) == (
        "no micro-batch fits on 8 × H100-80GB at seq 8; more GPUs do not help this configuration")
    assert solvers.calls == [("min_gpus", "m", {"seq": 8, "recompute": "full", "batch": 1})]


# --- max-seq -------------------------------------------------------------------------------------------------------

def test_max_seq_that_fits(solvers):
    e = est(world=4, gpu="H200", peak=100.25, memory=141)
    assert answers.describe("max-seq", "m", {"batch": 2}, {"max_seq": 8192}, e) == (
        "solution: up to 8192 tokens per sequence fit at micro-batch 2 on each GPU of 4 × H200 (peak 100.2 of 141 GiB)")
    assert solvers.calls == []


def test_max_seq_none_fits_but_full_recompute_does(solvers):
    solvers.table["max_seq_len"] = 1024
    kw = {"batch": 2, "recompute": "selective"}
    assert answers.describe("max-seq", "m", kw, {"max_seq": 0}, est()) == (
        "no sequence length fits at micro-batch 2 on 8 × H100-80GB; with --recompute full, 1024 tokens fit")
    assert solvers.calls == [("max_seq_len", "m", {"batch": 2, "recompute": "full"})]


def test_max_seq_not_even_with_full_recompute(solvers):
    solvers.table["max_seq_len"] = 0
    solvers.table["min_gpus"] = gpus(16, 16)
    kw = {"batch": 2, "recompute": "none"}
    assert answers.describe("max-seq", "m", kw, {"max_seq": 0}, est()) == (
        "no sequence length fits at micro-batch 2 on 8 × H100-80GB; not even with --recompute full; or 16 GPUs "
        "(--dp 16)")
    # more GPUs at the micro-batch given (not 1: the sequence is what was solved for)
    assert solvers.calls == [("max_seq_len", "m", {"batch": 2, "recompute": "full"}),
                             ("min_gpus", "m", {"batch": 2, "recompute": "none"})]


def test_max_seq_with_full_recompute_given(solvers):
    solvers.table["min_gpus"] = ConfigError("never")
    kw = {"batch": 4, "recompute": "full"}
    assert answers.describe("max-seq", "m", kw, {"max_seq": 0}, est(world=2, gpu="L4")) == (
        "no sequence length fits at micro-batch 4 on 2 × L4; more GPUs do not help this configuration")
    assert solvers.calls == [("min_gpus", "m", {"batch": 4, "recompute": "full"})]


def test_fewest_takes_micro_batch_1_when_none_is_given(solvers):
    solvers.table["min_gpus"] = gpus(2, 2)
    assert answers._fewest("m", {"batch": None, "seq": 8}) == "; or 2 GPUs (--dp 2)"
    assert answers._fewest("m", {"seq": 8}) == "; or 2 GPUs (--dp 2)"
    assert answers._fewest("m", {"batch": 5, "seq": 8}) == "; or 2 GPUs (--dp 2)"
    assert [c[2]["batch"] for c in solvers.calls] == [1, 1, 5]


# --- min-gpus ------------------------------------------------------------------------------------------------------

def test_min_gpus_sentence(solvers):
    e = est(gpu="H100-80GB", peak=70.5, memory=79.9)
    assert answers.describe("min-gpus", "m", {}, {"min_gpus": 24, "dp": 6}, e) == (
        "solution: 24 GPUs of H100-80GB (--dp 6) are the fewest that fit (peak 70.5 of 80 GiB)")
    assert solvers.calls == []
