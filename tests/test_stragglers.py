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
