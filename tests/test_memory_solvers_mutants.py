"""The solvers' searches (``coursekit.memory.solvers``) with a stub estimate whose peak is a formula of the
configuration, so every answer and every probe (the doubling bracket, then the bisection the module docstring
states) is worked out here by hand; the GPU named, the kwargs dropped, the refusals word for word. Where
bench/bench_mutation.py found no test. Pure Python, well under a second."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from coursekit.memory import solvers
from coursekit.memory.errors import ConfigError
from coursekit.memory.solvers import _largest, max_micro_batch, max_seq_len, min_gpus

ROPE = SimpleNamespace(positions="rope", max_positions=2048)
LEARNED = SimpleNamespace(positions="learned", max_positions=1000)


@pytest.fixture
def stub(monkeypatch):
    """The model names 'rope' / 'learned' resolve to the shapes above; estimate's peak is ``state.peak(cfg)``; each
    GPU has ``state.cap`` bytes. ``state.calls``: every configuration estimated; ``state.gpus``: every GPU looked
    up."""
    state = SimpleNamespace(peak=lambda c: 0, cap=100, calls=[], gpus=[])
    monkeypatch.setattr(solvers, "resolve_model", {"rope": ROPE, "learned": LEARNED}.__getitem__)

    def estimate(shape, c):
        assert shape in (ROPE, LEARNED)
        state.calls.append(c)
        return SimpleNamespace(peak_bytes=state.peak(c), config=c)

    def gpu(name):
        state.gpus.append(name)
        return SimpleNamespace(memory_bytes=state.cap)

    monkeypatch.setattr(solvers, "estimate", estimate)
    monkeypatch.setattr(solvers, "gpu_lookup", gpu)
    return state


# ---- _largest: the exponential bracket and the bisection ----------------------------------------------------------
def probe(t):
    seen = []

    def ok(n):
        seen.append(n)
        return n <= t
    return ok, seen


def test_largest_doubles_then_bisects():
    # t = 37 in [1, 100]: doubling 1, 2, 4, 8, 16, 32 true, 64 false; bracket (32, 64): mid 48 false, 40 false,
    # 36 true, 38 false, 37 true -> 37 (hi 37, bad 38)
    ok, seen = probe(37)
    assert _largest(ok, 1, 100) == 37
    assert seen == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]


def test_largest_stops_at_the_limit():
    # everything fits: 1 .. 64 then min(128, 100) = 100 true, hi == limit -> 100, no bisection
    ok, seen = probe(10 ** 9)
    assert _largest(ok, 1, 100) == 100
    assert seen == [1, 2, 4, 8, 16, 32, 64, 100]
    # t = 99: 100 false, bracket (64, 100): 82 T, 91 T, 95 T, 97 T, 98 T, 99 T -> 99
    ok, seen = probe(99)
    assert _largest(ok, 1, 100) == 99
    assert seen == [1, 2, 4, 8, 16, 32, 64, 100, 82, 91, 95, 97, 98, 99]


def test_largest_at_a_power_of_two_and_from_another_start():
    ok, seen = probe(64)  # 128 false: bracket (64, 128): 96 F, 80 F, 72 F, 68 F, 66 F, 65 F -> 64
    assert _largest(ok, 1, 1000) == 64
    assert seen == [1, 2, 4, 8, 16, 32, 64, 128, 96, 80, 72, 68, 66, 65]
    ok, seen = probe(7)  # from lo 3: 3 T, 6 T, 12 F; bracket (6, 12): 9 F, 7 T, 8 F -> 7
    assert _largest(ok, 3, 50) == 7
    assert seen == [3, 6, 12, 9, 7, 8]
    ok, seen = probe(1)  # 1 T, 2 F; bracket (1, 2) is already tight
    assert _largest(ok, 1, 50) == 1
    assert seen == [1, 2]
    ok, seen = probe(5)  # lo == limit: one probe, the limit itself
    assert _largest(ok, 5, 5) == 5
    assert seen == [5]


def test_largest_none_fits_is_one_below_the_start():
    assert _largest(lambda n: False, 1, 100) == 0
    assert _largest(lambda n: False, 5, 100) == 4
    ok, seen = probe(4)
    assert _largest(ok, 5, 100) == 4 and seen == [5]


# ---- max_micro_batch ------------------------------------------------------------------------------------------------
def test_max_micro_batch_is_the_largest_batch_at_or_under_the_capacity(stub):
    stub.peak = lambda c: 10 * c.batch + c.seq  # seq 5: 15, 25, ..., 75 <= 75 (peak == capacity fits), 85 not
    stub.cap = 75
    assert max_micro_batch("rope", "H100-80GB", seq=5) == 7
    assert stub.gpus == ["H100-80GB"]
    assert all(c.seq == 5 for c in stub.calls)
    # doubling 1, 2, 4, 8 (8 false); bracket (4, 8): 6 true, 7 true
    assert [c.batch for c in stub.calls] == [1, 2, 4, 8, 6, 7]


def test_max_micro_batch_ignores_batch_and_micro_batch(stub):
    stub.peak = lambda c: c.batch
    stub.cap = 3
    assert max_micro_batch("rope", "L4", seq=8, batch=64, micro_batch=64) == 3
    assert [c.batch for c in stub.calls] == [1, 2, 4, 3]


def test_max_micro_batch_limits(stub):
    stub.cap = 10 ** 30
    stub.peak = lambda c: 0
    assert max_micro_batch("rope", "H100-80GB", seq=8) == 1 << 20  # the default limit, 1048576 sequences
    assert len(stub.calls) == 21  # 1, 2, 4, ..., 2**20: no bisection
    assert max_micro_batch("rope", "H100-80GB", seq=8, limit=5) == 5
    stub.cap = -1  # nothing fits, not even one sequence
    assert max_micro_batch("rope", "H100-80GB", seq=8) == 0


def test_the_gpu_is_the_argument_else_the_configs(stub):
    stub.peak = lambda c: c.batch
    stub.cap = 1
    assert max_micro_batch("rope", seq=8, gpu="A100-40GB") == 1
    assert max_micro_batch("rope", "L4", seq=8) == 1
    assert stub.gpus == ["A100-40GB", "L4"]
    with pytest.raises(ConfigError, match="^give a gpu to solve against$"):
        max_micro_batch("rope", seq=8)
    with pytest.raises(ConfigError, match="^give a gpu to solve against$"):
        max_seq_len("rope", batch=1)
    with pytest.raises(ConfigError, match="^give a gpu to solve against$"):
        min_gpus("rope", batch=1, seq=8)


# ---- max_seq_len -----------------------------------------------------------------------------------------------------
def test_max_seq_len_in_units_of_multiple_of_cp_and_sp_tp(stub):
    # unit = multiple_of 3 · cp 2 · tp 4 (sp) = 24 tokens; peak = seq, capacity 200: 8 units (192) fit, 9 (216) not
    stub.peak = lambda c: c.seq
    stub.cap = 200
    assert max_seq_len("rope", "H100-80GB", batch=1, multiple_of=3, cp=2, tp=4, sp=True, seq=999) == 192
    # units 1, 2, 4, 8, 16 (false); bracket (8, 16): 12 F, 10 F, 9 F -> 8
    assert [c.seq for c in stub.calls] == [24 * m for m in (1, 2, 4, 8, 16, 12, 10, 9)]
    assert stub.gpus == ["H100-80GB"]


def test_max_seq_len_without_sp_tp_does_not_count(stub):
    stub.peak = lambda c: c.seq
    stub.cap = 203
    # unit = cp 2 (multiple_of 1; tp 4 without sp is no factor): 101 units of 2 tokens = 202 <= 203
    assert max_seq_len("rope", "H100-80GB", batch=1, cp=2, tp=4) == 202
    stub.calls.clear()
    assert max_seq_len("rope", "H100-80GB", batch=1, tp=4, sp=True) == 200  # unit tp 4 (cp 1): 50 units
    assert stub.calls[0].seq == 4
    stub.calls.clear()
    assert max_seq_len("rope", "H100-80GB", batch=1, multiple_of=7) == 203  # unit 7: 29 units
    assert stub.calls[0].seq == 7
    assert max_seq_len("rope", "H100-80GB", batch=1, sp=True) == 203  # sp without tp: tp 1, unit 1


def test_max_seq_len_limits(stub):
    stub.peak = lambda c: 0
    stub.cap = 1
    # learned positions: the model's 1000; unit 24 -> 1000 // 24 = 41 units, 984 tokens
    assert max_seq_len("learned", "H100-80GB", batch=1, multiple_of=3, cp=2, tp=4, sp=True) == 984
    assert max_seq_len("learned", "H100-80GB", batch=1) == 1000
    assert max_seq_len("learned", "H100-80GB", batch=1, limit=48, multiple_of=24) == 48  # the given limit
    assert max_seq_len("learned", "H100-80GB", batch=1, limit=24, multiple_of=24) == 24  # one unit
    assert max_seq_len("learned", "H100-80GB", batch=1, limit=10, multiple_of=24) == 24  # at least one unit tried
    stub.calls.clear()
    assert max_seq_len("rope", "H100-80GB", batch=1) == 1 << 24  # RoPE: 2**24 = 16777216 tokens
    assert len(stub.calls) == 25  # 1, 2, ..., 2**24
    assert max_seq_len("rope", "H100-80GB", batch=1, multiple_of=1 << 20) == 1 << 24  # 16 units of 2**20
    stub.cap = -1
    assert max_seq_len("rope", "H100-80GB", batch=1, cp=2) == 0  # not even one unit: 0 units · 2


# ---- min_gpus ------------------------------------------------------------------------------------------------------
def test_min_gpus_brackets_by_doubling_then_bisects(stub):
    # ZeRO-3: peak 10 + 1000 / dp, capacity 60: 1000 / dp <= 50 from dp = 20 on
    stub.peak = lambda c: 10 + 1000 / c.dp
    stub.cap = 60
    e = min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, dp=5, world=5, dp_rank=3)
    assert (e.config.dp, e.config.world, e.config.dp_rank) == (20, 20, None)  # dp, world and dp_rank dropped
    # dp 1 (no), then 2, 4, 8, 16 (no), 32 (yes); bisect (16, 32): 24 y, 20 y, 18 n, 19 n; the answer estimated
    assert [c.dp for c in stub.calls] == [1, 2, 4, 8, 16, 32, 24, 20, 18, 19, 20]
    assert stub.gpus == ["H100-80GB"]
    # dropped before the configuration is built: dp 3 · tp 2 != world 16, world 7 not a multiple of tp 2
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=2, dp=3, world=16).config.dp == 20
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=2, world=7).config.world == 40


def test_min_gpus_one_rank_fits(stub):
    stub.peak = lambda c: 10 + 1000 / c.dp
    stub.cap = 1010  # peak 1010 at dp 1: fits (<=)
    e = min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=2, pp=2)
    assert (e.config.dp, e.config.world) == (1, 4)
    assert len(stub.calls) == 1


def test_min_gpus_from_dp_2(stub):
    stub.peak = lambda c: 10 + 1000 / c.dp
    stub.cap = 510  # dp 2: 510
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=1).config.dp == 2
    assert [c.dp for c in stub.calls] == [1, 2, 2]
    stub.calls.clear()
    stub.cap = 343  # dp 3: 343.3 > 343, dp 4: 260; the bracket (2, 4) bisects at 3
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=1).config.dp == 4
    assert [c.dp for c in stub.calls] == [1, 2, 4, 3, 4]


def test_min_gpus_caps_dp_at_max_gpus_over_a_replica(stub):
    stub.peak = lambda c: 10 + 1000 / c.dp
    stub.cap = 60  # dp >= 20
    # tp 2: 40 GPUs are dp <= 20: 2, 4, 8, 16, then min(32, 20) = 20 (fits); bisect (16, 20): 18 n, 19 n
    e = min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=2, max_gpus=40)
    assert (e.config.dp, e.config.world) == (20, 40)
    assert [c.dp for c in stub.calls] == [1, 2, 4, 8, 16, 20, 18, 19, 20]
    # 42 GPUs: dp <= 21: 2, 4, 8, 16, 21 (fits); bisect (16, 21): 18 n, (18, 21): 19 n, (19, 21): 20 y
    stub.calls.clear()
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=2, max_gpus=42).config.dp == 20
    assert [c.dp for c in stub.calls] == [1, 2, 4, 8, 16, 21, 18, 19, 20, 20]
    # 38 GPUs: dp <= 19 (38 // 2), which does not fit
    stub.calls.clear()
    with pytest.raises(ConfigError, match="^does not fit on 38 GPUs of H100-80GB$"):
        min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=2, max_gpus=38)
    assert [c.dp for c in stub.calls] == [1, 2, 4, 8, 16, 19]
    with pytest.raises(ConfigError, match="^does not fit on 39 GPUs of L4$"):  # the config's GPU in the message
        min_gpus("rope", batch=1, seq=8, zero=3, tp=2, pp=1, cp=1, max_gpus=39, gpu="L4")
    # the default: 65536 GPUs; tp 2 · pp 2 · cp 2 = 8 per replica -> dp <= 8192
    stub.peak = lambda c: 100 if c.dp <= 8192 else 0  # fits only past dp 8192
    with pytest.raises(ConfigError, match="^does not fit on 65536 GPUs of H100-80GB$"):
        min_gpus("rope", "H100-80GB", batch=1, seq=16, zero=3, tp=2, pp=2, cp=2)
    assert max(c.dp for c in stub.calls) == 8192


def test_min_gpus_never_goes_past_max_gpus(stub):
    # a replica of tp 8 on max_gpus 8: dp can only be 1; dp 2 (16 GPUs) would fit but is past the limit
    stub.peak = lambda c: 1000 / c.dp
    stub.cap = 600
    with pytest.raises(ConfigError, match="^does not fit on 8 GPUs of H100-80GB$"):
        min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=8, max_gpus=8)
    assert [c.dp for c in stub.calls] == [1]  # dp 1 only, and once
    with pytest.raises(ConfigError, match="^does not fit on 3 GPUs of H100-80GB$"):  # 3 // 2 -> dp <= 1
        min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=2, max_gpus=3)
    stub.cap = 1000  # dp 1 fits: the 8 GPUs of one replica
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=8, max_gpus=8).config.world == 8
    # one replica past the limit, even where dp 1 fits: refused, not answered with 8 GPUs under a 7-GPU limit
    stub.calls.clear()
    with pytest.raises(ConfigError, match=r"^one replica \(tp 8 x pp 1 x cp 1 = 8 GPUs\) is past max_gpus 7$"):
        min_gpus("rope", "H100-80GB", batch=1, seq=8, zero=3, tp=8, max_gpus=7)
    assert stub.calls == []  # refused before any estimate


def test_min_gpus_refuses_what_dp_does_not_shard(stub):
    stub.peak = lambda c: 1000 / c.dp
    stub.cap = 10
    for kw in (dict(zero=0), dict(engine="ddp")):
        with pytest.raises(ConfigError, match="^does not fit, and more data-parallel ranks do not shard this "
                                              "configuration's state$"):
            min_gpus("rope", "H100-80GB", batch=1, seq=8, **kw)
    assert [c.dp for c in stub.calls] == [1, 1]  # only dp 1 is estimated
    stub.calls.clear()
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, engine="fsdp2").config.dp == 100  # 1000 / 100 <= 10


def test_min_gpus_starts_from_one_rank_whatever_the_run_says(stub):
    # the trainer's vocabulary: fsdp2 over dp_shard 8 is built as dp 8; the search starts from dp 1 again
    stub.peak = lambda c: 1000 / c.dp
    stub.cap = 300  # 1000 / 4 = 250 fits, 1000 / 3 = 333 not
    assert min_gpus("rope", "H100-80GB", micro_batch=1, seq=8, strategy="fsdp2", dp_shard=8).config.dp == 4
    assert [c.dp for c in stub.calls] == [1, 2, 4, 3, 4]
    # a dp beside them is dropped too (kept, dp 3 != dp_shard 8 would be refused), as is a dp of 0
    assert min_gpus("rope", "H100-80GB", micro_batch=1, seq=8, strategy="fsdp2", dp_shard=8, dp=3).config.dp == 4
    assert min_gpus("rope", "H100-80GB", batch=1, seq=8, engine="fsdp2", dp=0).config.dp == 4


def test_min_gpus_hsdp_is_one_shard_group(stub):
    # HSDP: memory depends on the shard group (4 ranks), not on dp: one estimate at dp 4
    stub.peak = lambda c: 1000 / c.hsdp_shard + c.dp
    stub.cap = 254  # 250 + 4
    e = min_gpus("rope", "H100-80GB", batch=1, seq=8, engine="fsdp2", hsdp_shard=4)
    assert (e.config.dp, e.config.hsdp_shard, e.config.world) == (4, 4, 4)
    assert [c.dp for c in stub.calls] == [4]
    stub.cap = 253
    with pytest.raises(ConfigError, match="do not shard"):  # more replicas would not help
        min_gpus("rope", "H100-80GB", batch=1, seq=8, engine="fsdp2", hsdp_shard=4)
    assert [c.dp for c in stub.calls] == [4, 4]
    # with dp_replicate given (the trainer's names), dp is left to the run: replicas x shard group, then one group
    stub.cap = 254
    stub.calls.clear()
    e = min_gpus("rope", "H100-80GB", micro_batch=1, seq=8, strategy="hsdp", dp_replicate=2, hsdp_shard=4)
    assert (e.config.dp, e.config.hsdp_shard) == (4, 4) and [c.dp for c in stub.calls] == [4]
