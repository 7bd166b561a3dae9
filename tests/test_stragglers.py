"""Stragglers (coursekit.profiling.stragglers): per-collective waits across ranks, the straggler named with its
slowdown, in the trainer's final record and summary, cross-checked with the trace analysis."""
import json
import os
import subprocess
import sys

import pytest

from coursekit.profiling.stragglers import find, peer_waits

SLOW_MS = 200


def test_peer_waits_and_find_on_known_durations():
    # two steps, two collectives; rank 1 arrives 0.2 s late at the first collective of each step
    every = [[[0.25, 0.01], [0.21, 0.02]], [[0.05, 0.01], [0.01, 0.02]]]
    w = peer_waits(every)
    assert w[0] == pytest.approx([0.2, 0.2]) and w[1] == pytest.approx([0.0, 0.0])
    per = [{"rank": 0, "step_ms": 300, "wait_ms": 200}, {"rank": 1, "step_ms": 300, "wait_ms": 0}]
    s = find(per)
    assert s["rank"] == 1 and s["slowdown_ms"] == 200
    even = find([{"rank": 0, "step_ms": 100, "wait_ms": 1}, {"rank": 1, "step_ms": 100, "wait_ms": 0.5}])
    assert even["rank"] is None and even["slowdown_ms"] is None


def test_noise_is_not_a_straggler_and_a_steady_one_is():
    """On per-step waits (ms): a machine that deschedules a random rank now and then (big, but a different rank each
    time) names nobody; a rank 40 ms late in every step, with that same noise on top, is named; so is a steady
    5 ms one on a quiet run; and the same 5 ms within +-20 ms of step-to-step noise is not."""
    import random

    from coursekit.profiling.stragglers import noise_test

    rng = random.Random(0)
    steps = 9

    def noisy():
        return [rng.choice([0.0, 0.0, 0.0, rng.uniform(20, 200)]) for _ in range(steps)]

    busy = {0: noisy(), 1: noisy(), 2: noisy(), 3: noisy()}
    t = noise_test(busy, floor_ms=2.0)
    assert not t["named"] and "beyond the run's noise" in t["reason"], t
    late = {r: [w + (0 if r == 2 else 40) for w in noisy()] for r in range(4)}  # the others wait 40 ms for rank 2
    t = noise_test(late, floor_ms=2.0)
    assert t["named"] and t["candidate"] == 2 and 30 < t["gap_ms"] < 60, t
    quiet = {0: [5.0 + 0.1 * (s % 3) for s in range(steps)], 1: [0.1 * (s % 2) for s in range(steps)]}
    assert noise_test(quiet, floor_ms=2.0)["named"]
    shaky = {0: [5.0 + rng.uniform(-20, 20) for _ in range(steps)], 1: [rng.uniform(0, 20) for _ in range(steps)]}
    assert not noise_test(shaky, floor_ms=2.0)["named"]


BURSTS = """
import random, time
while True:
    end = time.perf_counter() + random.uniform(0.001, 0.010)
    while time.perf_counter() < end:
        pass
    time.sleep(random.uniform(0, 0.010))
"""


def test_a_loaded_machine_without_a_planted_straggler_names_none(no_orphans):
    """The trainer's finding under load made here — four processes on the same cores as its two ranks, each in
    random bursts of work and sleep, so now one rank and now the other is descheduled — names no straggler. (A busy
    loop pinned beside one rank for the whole run would make that rank really slower, and naming it is right.)"""
    burn = [subprocess.Popen([sys.executable, "-c", BURSTS]) for _ in range(4)]
    try:
        out = train("--strategy", "ddp", "--steps", "10", "--json")
    finally:
        for p in burn:
            p.kill()
            p.wait()
    ranks = json.loads(out[out.index("{"):])["ranks"]
    s = ranks[0]["final"]["stragglers"]
    assert s["rank"] is None, s
    assert "threshold" in s["reason"] and s["threshold_ms"] >= 2.0


def train(*args, timeout=500):
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--nproc", "2", "--steps", "6",
                          "--seq", "16", *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def check(final, strategy):
    s = final["stragglers"]
    assert s["rank"] == 1, s
    # the estimate is the others' extra wait per step: the injected sleep plus the difference in the two ranks'
    # compute before their first shared collective, so it lies within a factor 2 of the sleep
    assert SLOW_MS / 2 <= s["slowdown_ms"] <= 2 * SLOW_MS, (strategy, s)
    r0, r1 = sorted(s["per_rank"], key=lambda r: r["rank"])
    assert r0["wait_ms"] > r1["wait_ms"] + SLOW_MS / 2 and r1["compute_ms"] > r0["compute_ms"]


def test_ddp_slow_rank_is_named_in_record_summary_and_trace(tmp_path, no_orphans):
    from coursekit.profiling.trace import analyse

    args = ["--strategy", "ddp", "--slow-rank", 1, "--slow-ms", SLOW_MS, "--profile-dir", tmp_path,
            "--profile-steps", "2:5"]
    out = train(*args, "--json")
    ranks = json.loads(out[out.index("{"):])["ranks"]
    for rec in ranks:  # every rank reports the same finding
        check(rec["final"], "ddp")
    est = ranks[0]["final"]["stragglers"]["slowdown_ms"]
    tr = analyse(tmp_path)["straggler"]  # the profiler's timeline, analysed independently
    assert tr and tr["rank"] == 1 and tr["slowdown_ms_per_step"] == pytest.approx(est, rel=0.5)


@pytest.mark.slow  # ~1 launch of fsdp2 plus the summary text (~30 s idle, minutes on a loaded machine)
def test_fsdp2_slow_rank_is_named_in_the_summary(no_orphans):
    out = train("--strategy", "fsdp2", "--slow-rank", 1, "--slow-ms", SLOW_MS)
    line = next(ln for ln in out.splitlines() if "straggler:" in ln)
    assert "straggler: rank 1" in line, out
    assert "~" in line and "ms per step slower" in line and "r0 " in line and "r1 " in line
