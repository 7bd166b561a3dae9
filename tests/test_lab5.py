"""Lab 5 (profiling, overlap, MFU, hangs, stragglers, recovery): its syllabus, the lab's plain-data views of traces
and flight-recorder dumps, and hidden tests that catch answers the visible ones miss.

Grading of the whole lab (solution 100 %, release 0, partial in between) is in test_course_labs. Default tier here:
no launch (synthetic traces and dumps; the hidden tests alone). Slow tier: the same wrong answers through the
visible tests too, which run the lab's real jobs (~2 min on 2 idle cores).
"""
import json
import pickle
from pathlib import Path

import pytest

from coursekit.course.authoring import read_lab
from coursekit.course.config import Course
from coursekit.course.program import definitions
from coursekit.course.recheck import recheck
from coursekit.profiling import labruns
from coursekit.profiling import trace as T

from lab_submission import submission

REPO = Path(__file__).resolve().parents[1]
COURSE = Course(REPO)
SYLLABUS = ["overlap_stats", "mfu_gap", "find_culprit", "name_straggler", "resume_check"]


@pytest.fixture(scope="module")
def lab():
    return read_lab(COURSE, "lab5_profiling")


def test_exercises_follow_the_syllabus(lab):
    assert [e.name for e in lab.exercises] == SYLLABUS
    assert lab.max_points == 21
    assert json.loads((COURSE.solutions / "lab5_profiling" / "lab.json").read_text())["module"] == 5


def solution_namespace(lab) -> dict:
    """The lab's setup and the instructor's solutions, as the re-check loads them (definitions only)."""
    ns: dict = {}
    for c in lab.cells:
        if c.kind in ("readonly", "solution"):
            exec(compile(definitions(c.source, c.grade_id).source, c.grade_id, "exec"), ns)
    return ns


def ev(name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid, "cat": "cpu_op"}


def test_trace_intervals_are_the_events_coursekit_trace_measures(lab, tmp_path):
    """Two traced steps of one rank: nested aten ops, gloo collectives on another thread (one across the step
    boundary), and events that count as neither. The intervals the lab hands out, measured by the solution's
    overlap_stats, give coursekit trace's figures."""
    events = [ev("ProfilerStep#1", 0, 1000), ev("ProfilerStep#2", 1000, 1000),
              ev("aten::linear", 100, 300), ev("aten::mm", 150, 200), ev("aten::add_", 1200, 100),
              ev("c10d::allreduce_", 420, 5), ev("FSDP::all_gather", 430, 5), ev("Optimizer.step", 1500, 50),
              ev("gloo:all_reduce", 300, 400, tid=2), ev("gloo:all_reduce", 900, 400, tid=2),
              ev("aten::mul", 50, 10, tid=3)]  # aten on another thread: not the training loop's compute
    (tmp_path / "trace-rank0.json").write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    rows = labruns.trace_intervals(tmp_path)
    assert [(r["rank"], r["step"]) for r in rows] == [(0, 1), (0, 2)]
    assert rows[0]["compute"] == [[100.0, 400.0], [150.0, 350.0]] and rows[0]["window"] == [0.0, 1000.0]
    assert rows[0]["comm"] == [[300.0, 700.0], [900.0, 1300.0]]  # the second crosses into step 2: clip it
    assert rows[1]["comm"] == [[900.0, 1300.0]] and rows[1]["compute"] == [[1200.0, 1300.0]]
    overlap_stats = solution_namespace(lab)["overlap_stats"]
    ref = {s["step"]: s for s in T.analyse(tmp_path)["ranks"][0]["steps"]}
    for r in rows:
        mine = overlap_stats(r["compute"], r["comm"], r["window"])
        assert mine == pytest.approx({k: ref[r["step"]][k] for k in mine})
    assert ref[1]["hidden_ms"] == pytest.approx(0.1) and ref[2]["overlap_pct"] == pytest.approx(100 / 3)


def test_read_dumps_gives_each_ranks_collectives_in_order(tmp_path):
    def entry(rid, seq, op, sizes, p2p=False):
        return {"record_id": rid, "collective_seq_id": seq, "p2p_seq_id": 0, "profiling_name": f"gloo:{op}",
                "input_sizes": sizes, "output_sizes": sizes, "input_dtypes": ["Float"] * len(sizes),
                "process_group": ("0", "default_pg"), "state": "scheduled", "is_p2p": p2p}

    dumps = {0: [entry(1, 2, "all_reduce", [[4]]), entry(0, 1, "all_reduce", [[4]]), entry(2, 0, "send", [[4]], True)],
             1: [entry(0, 1, "all_reduce", [[4]]), entry(1, 2, "all_gather", [[4]])]}
    for rank, entries in dumps.items():
        (tmp_path / f"fr_trace_{rank}.pkl").write_bytes(pickle.dumps({"entries": entries, "pg_config": {}}))
    (tmp_path / "fr_trace_0.json").write_text("{}")  # sidecars are not dumps
    got = labruns.read_dumps(tmp_path)
    assert [d["rank"] for d in got] == [0, 1]
    assert [(e["seq"], e["op"]) for e in got[0]["entries"]] == [(1, "all_reduce"), (2, "all_reduce")]  # no p2p
    assert got[1]["entries"][1] == {"seq": 2, "op": "all_gather", "input_sizes": [[4]], "output_sizes": [[4]],
                                    "dtypes": ["Float"], "pg": "default_pg", "state": "scheduled"}


OVERLAP_ASSUMES_SORTED = '''
def overlap_stats(compute, comm, window):
    lo, hi = window

    def union(iv):  # merges in the order given: right for the lab's sorted events, wrong for any other order
        out = []
        for s, e in ((max(s, lo), min(e, hi)) for s, e in iv if e > lo and s < hi):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out

    C, M = union(compute), union(comm)
    length = lambda iv: sum(e - s for s, e in iv)
    hidden = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for a in C for b in M)
    busy = length(union(sorted(C + M)))
    return {"compute_ms": length(C) / 1e3, "comm_ms": length(M) / 1e3, "hidden_ms": hidden / 1e3,
            "exposed_ms": (length(M) - hidden) / 1e3, "overlap_pct": 100 * hidden / length(M) if M else None,
            "idle_ms": max(hi - lo - busy, 0) / 1e3}
'''
MFU_TWO_DEVICES = '''
def mfu_gap(model, global_batch, seq, steps, devices, peak_flops, trace_row):
    flops = flops_per_step(model, global_batch, seq)["total"]
    step_s = statistics.median(s["step_time_s"] for s in steps[1:])
    ideal_ms = 1e3 * flops / 2 / peak_flops  # this run's two ranks, not the devices asked for
    losses = {"slow_compute": trace_row["compute_ms"] - ideal_ms, "exposed_comm": trace_row["exposed_ms"],
              "idle": trace_row["idle_ms"]}
    return {"mfu": flops / step_s / 2 / peak_flops, "ideal_ms": ideal_ms, "losses": losses,
            "dominant": max(losses, key=losses.get)}
'''
CULPRIT_BY_OP_ONLY = '''
def find_culprit(dumps):
    by_rank = {d["rank"]: {e["seq"]: e["op"] for e in d["entries"]} for d in dumps}  # sizes and dtypes ignored
    for seq in sorted({s for es in by_rank.values() for s in es}):
        have = {r: es[seq] for r, es in by_rank.items() if seq in es}
        missing = sorted(set(by_rank) - set(have))
        if missing:
            return {"kind": "missing", "ranks": missing, "seq": seq, "op": have[min(have)]}
        if len(set(have.values())) > 1:
            odd = sorted(r for r, op in have.items() if op != have[min(have)])
            return {"kind": "mismatch", "ranks": odd, "seq": seq, "op": have[odd[0]]}
    return None
'''
STRAGGLER_BY_MEAN = '''
def name_straggler(per_rank):
    slow = min(per_rank, key=lambda r: r["wait_ms"])
    others = [r for r in per_rank if r is not slow]
    gap = sum(r["wait_ms"] for r in others) / len(others) - slow["wait_ms"]  # the mean: equal to the median of 1
    base = sum(r["step_ms"] - r["wait_ms"] for r in others) / len(others)
    if gap <= max(2.0, 0.10 * base):
        return {"rank": None, "slowdown_ms": None, "slowdown_x": None}
    return {"rank": slow["rank"], "slowdown_ms": gap, "slowdown_x": (base + gap) / base}
'''
RESUME_APPROXIMATELY = '''
def resume_check(whole, resumed, kill_at_step):
    start = resumed[0]["final"]["resumed_from_step"]
    ref = {r["rank"]: {s["step"]: s["loss"] for s in r["steps"]} for r in whole}
    same = len(resumed) == len(whole) and all(
        [s["step"] for s in r["steps"]] == [s for s in sorted(ref[r["rank"]]) if s >= start]
        and all(math.isclose(s["loss"], ref[r["rank"]][s["step"]]) for s in r["steps"]) for r in resumed)
    return {"resumed_from": start, "recomputed": list(range(start, kill_at_step)), "identical": same}
'''
WRONG = {"overlap_stats": OVERLAP_ASSUMES_SORTED, "mfu_gap": MFU_TWO_DEVICES, "find_culprit": CULPRIT_BY_OP_ONLY,
         "name_straggler": STRAGGLER_BY_MEAN, "resume_check": RESUME_APPROXIMATELY}


def regrade(lab, tmp_path, only):
    sub = submission(COURSE, "lab5_profiling", **WRONG)
    res = recheck(lab, sub, log_path=str(tmp_path / "student.log"), only=only)
    return {t.grade_id: t for t in res.tests}


def test_hidden_tests_catch_the_wrong_answers(lab, tmp_path):
    """Each wrong answer fails its hidden test (these cells launch nothing)."""
    res = regrade(lab, tmp_path, {f"{n}_hidden" for n in SYLLABUS})
    assert set(res) == {f"{n}_hidden" for n in SYLLABUS}
    for name in SYLLABUS:
        assert not res[f"{name}_hidden"].passed, name
    assert "shape mismatch" in res["find_culprit_hidden"].message
    assert "one bit off" in res["resume_check_hidden"].message


@pytest.mark.slow  # the visible tests run the lab's jobs: 2 traced DDP runs, a planted hang, a SIGKILL + restart
@pytest.mark.timeout(1200)
def test_the_wrong_answers_pass_the_visible_tests(lab, tmp_path, no_orphans):
    res = regrade(lab, tmp_path, {f"{n}_visible" for n in SYLLABUS})
    for name in SYLLABUS:
        assert res[f"{name}_visible"].passed, (name, res[f"{name}_visible"].message)
