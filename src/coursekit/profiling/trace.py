"""How much communication hides behind compute: the course's overlap computation, from profiler traces.

    coursekit trace runs/prof              # a table per rank and step
    coursekit trace runs/prof --json       # the same as one JSON object
    coursekit trace runs/prof --plot t.png # a timeline per rank: compute vs communication

Input: a folder with one Chrome trace per rank (``maybe_profile`` writes ``trace-rank<R>.json``). Each recorded
step is a ``ProfilerStep#N`` span on the thread that runs the training loop (the *main thread*).

What counts as what
  * communication, CPU/gloo traces: every ``gloo:*`` event (``gloo:all_reduce``, ``gloo:all_gather``, ...). gloo
    runs each collective on one of its own ``pt_gloo_runloop`` threads, so the event spans the transfer, waiting
    for the peers included. The ``c10d::allreduce_`` & co. on the main thread are only the launch (microseconds,
    or the wait of a blocking call); they are not counted. ``FSDP::*`` spans are labels around launch and copies,
    not counted either (FSDP2's reduce-scatter shows up as ``gloo:all_reduce``).
  * communication, GPU traces: kernels named ``nccl*Kernel*`` (the rule HTA uses).
  * compute, CPU traces: ``aten::*`` ops on the main thread. They nest (``aten::linear`` holds ``aten::mm``), so
    intervals are merged (a union) before they are measured; nothing is counted twice.
  * compute, GPU traces: every other kernel (memcpy/memset excluded); a kernel belongs to the step that launched
    it (``correlation`` links it to its launch on the CPU), as kernels run after their launch.
Per step, with C = union of compute, M = union of communication, W = the step's time window:
    hidden = |M ∩ C|,  exposed = |M| - hidden,  overlap % = 100 * hidden / |M|,  idle = |W| - |M ∪ C|
Idle on CPU is the main thread doing neither: Python glue, the optimizer's loop overhead, waiting in a blocking
collective already counted as communication on gloo's thread is *not* idle.

Waiting for peers (stragglers): a collective ends at about the same moment on every rank, so the rank that arrives
last spends the least time in it. For the k-th collective of a step, its wait on this rank is its time there minus
the shortest time on any rank, taken as the collective's first part (the rank is in, its peers are not yet); a
step's ``wait`` is the union of those parts, so collectives that overlap (FSDP2's prefetched gathers) are not
counted twice and wait <= comm <= time: the part of the step's communication spent waiting for slower ranks. The rank that waits
least while the others wait a lot is the straggler; the others' wait is its estimated slowdown. No clock is
compared across ranks, so this holds across hosts too.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from coursekit.profiling.stragglers import noise_test

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NCCL = re.compile(r"^nccl.*Kernel")  # HTA's communication-kernel rule


# ---------------------------------------------------------------- intervals: the whole arithmetic of overlap
def union(iv):
    """Merge (start, end) intervals into disjoint sorted ones."""
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]


def length(iv) -> float:
    return sum(e - s for s, e in iv)


def intersect(a, b):
    """Intersection of two disjoint sorted interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(iv, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in iv if e > lo and s < hi]


# ---------------------------------------------------------------- classifying one rank's events
def load(path) -> dict:
    """One rank's trace: rank, complete events, the main thread, and whether it holds GPU kernels."""
    raw = json.loads(Path(path).read_text())
    ev = [e for e in raw.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    rank = (raw.get("distributedInfo") or {}).get("rank")
    if rank is None:
        m = re.search(r"(\d+)\D*$", Path(path).name)
        rank = int(m.group(1)) if m else 0
    steps = [e for e in ev if _STEP.match(e["name"])]
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep#N spans (was the profiler stepped with prof.step()?)")
    main = (steps[0]["pid"], steps[0]["tid"])
    return {"rank": int(rank), "path": str(path), "events": ev, "steps": steps, "main": main,
            "gpu": any(e.get("cat") == "kernel" for e in ev)}


def is_comm(e, gpu: bool) -> bool:
    return bool(_NCCL.match(e["name"])) if gpu else e["name"].startswith("gloo:")


def is_compute(e, gpu: bool, main) -> bool:
    if gpu:
        return e.get("cat") == "kernel" and not _NCCL.match(e["name"])
    return (e["pid"], e["tid"]) == main and e["name"].startswith("aten::")


def _span(e):
    return (float(e["ts"]), float(e["ts"]) + float(e["dur"]))


def _by_step(tr):
    """{step N: (window, [compute events], [comm events])}; GPU kernels go to the step that launched them."""
    gpu, main = tr["gpu"], tr["main"]
    spans = {int(_STEP.match(e["name"]).group(1)): _span(e) for e in tr["steps"]}
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in tr["events"]
              if gpu and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    out = {}
    for n, (lo, hi) in sorted(spans.items()):
        comp, comm = [], []
        for e in tr["events"]:
            c, m = is_compute(e, gpu, main), is_comm(e, gpu)
            if not (c or m):
                continue
            t = launch.get(e.get("args", {}).get("correlation")) if gpu else None
            s, f = _span(e)
            if (lo <= t < hi) if t is not None else (f > lo and s < hi):
                (comp if c else comm).append(e)
        if gpu and launch and (comp or comm):  # kernels run later than the step that launched them
            win = (min(_span(e)[0] for e in comp + comm), max(_span(e)[1] for e in comp + comm))
        else:
            win = (lo, hi)
        out[n] = (win, comp, comm)
    return out


def self_times(events) -> dict:
    """Exclusive time per op name on one thread: an op's duration minus that of the ops nested directly in it."""
    tot, stack = defaultdict(float), []
    for e in sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        s, f = _span(e)
        while stack and stack[-1][1] <= s:
            stack.pop()
        tot[e["name"]] += f - s
        if stack:
            tot[stack[-1][2]] -= min(f, stack[-1][1]) - s
        stack.append((s, f, e["name"]))
    return tot


def overlap(compute, comm, window) -> dict:
    """The numbers of one step from its compute and comm intervals (µs in, ms out)."""
    C, M = union(clip(compute, *window)), union(clip(comm, *window))
    hidden = length(intersect(C, M))
    busy = length(union(C + M))
    ms = 1e-3
    return {"time_ms": (window[1] - window[0]) * ms, "compute_ms": length(C) * ms, "comm_ms": length(M) * ms,
            "hidden_ms": hidden * ms, "exposed_ms": (length(M) - hidden) * ms,
            "overlap_pct": 100 * hidden / length(M) if M else None,
            "idle_ms": max(window[1] - window[0] - busy, 0) * ms}


def analyse_rank(tr, top: int = 5) -> dict:
    steps = []
    for n, (win, comp, comm) in _by_step(tr).items():
        row = {"step": n, **overlap([_span(e) for e in comp], [_span(e) for e in comm], win)}
        threads = defaultdict(list)
        for e in comp + comm:
            threads[(e["pid"], e["tid"])].append(e)
        st = defaultdict(float)
        for evs in threads.values():
            for k, v in self_times(evs).items():
                st[k] += v
        row["top_ops"] = [[k, round(v * 1e-3, 3)] for k, v in sorted(st.items(), key=lambda kv: -kv[1])[:top]]
        row["_comm"] = [(e["name"], float(e["dur"]), float(e["ts"])) for e in sorted(comm, key=lambda e: float(e["ts"]))
                        if float(e["ts"]) >= win[0]]  # for waits: the collectives that started in this step
        row["_window"] = win
        steps.append(row)
    return {"rank": tr["rank"], "file": tr["path"], "device": "gpu" if tr["gpu"] else "cpu", "steps": steps}


def _total(steps) -> dict:
    keys = ("time_ms", "compute_ms", "comm_ms", "hidden_ms", "exposed_ms", "idle_ms", "wait_ms")
    t = {k: sum(s.get(k) or 0.0 for s in steps) for k in keys}
    t["overlap_pct"] = 100 * t["hidden_ms"] / t["comm_ms"] if t["comm_ms"] else None
    return t


def waits(ranks) -> None:
    """Fill ``wait_ms`` per rank and step: time in each collective beyond the fastest rank's time in it."""
    by_step = defaultdict(dict)
    for r in ranks:
        for s in r["steps"]:
            by_step[s["step"]][r["rank"]] = s
    for rows in by_step.values():
        for s in rows.values():
            s["wait_ms"] = 0.0
        lists = [s["_comm"] for s in rows.values()]
        if len(rows) < 2 or len({len(c) for c in lists}) != 1:  # not the same collectives everywhere: no match
            continue
        parts = {id(s): [] for s in rows.values()}
        for k in range(len(lists[0])):
            if len({c[k][0] for c in lists}) != 1:
                continue
            fastest = min(c[k][1] for c in lists)
            for s in rows.values():
                _, dur, start = s["_comm"][k]
                parts[id(s)].append((start, start + dur - fastest))
        for s in rows.values():  # the waiting parts of overlapping collectives once, inside the step's window
            s["wait_ms"] = length(union(clip(parts[id(s)], *s["_window"]))) * 1e-3


def straggler_test(ranks, min_ms: float = 1.0) -> dict | None:
    """``coursekit.profiling.stragglers.noise_test`` on the traced steps: the candidate, its gap, the threshold
    (``min_ms`` or the run's own step-to-step noise) and whether it is named; None with fewer than 2 ranks."""
    if len(ranks) < 2:
        return None
    common = sorted(set.intersection(*({s["step"] for s in r["steps"]} for r in ranks)))
    per_step = {r["rank"]: [next(s["wait_ms"] for s in r["steps"] if s["step"] == n) for n in common] for r in ranks}
    return noise_test(per_step, floor_ms=min_ms) if common else None


def straggler(ranks, min_ms: float = 1.0) -> dict | None:
    """The rank the others wait for: beyond ``min_ms`` per step and beyond the run's own noise over its steps, in
    most steps (``straggler_test``); None when no rank is."""
    t = straggler_test(ranks, min_ms)
    if not t or not t["named"]:
        return None
    per = {r["rank"]: r["total"]["wait_ms"] / max(len(r["steps"]), 1) for r in ranks}
    return {"rank": t["candidate"], "slowdown_ms_per_step": t["gap_ms"], "wait_ms_per_step": per,
            "threshold_ms": t["threshold_ms"]}


def analyse(folder, top: int = 5) -> dict:
    """Every rank's trace in ``folder``: per-step rows, totals, waits and the straggler."""
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no trace JSON files in {folder}")
    ranks = sorted((analyse_rank(load(f), top) for f in files), key=lambda r: r["rank"])
    waits(ranks)
    for r in ranks:
        for s in r["steps"]:
            s.pop("_comm")
            s.pop("_window")
        r["total"] = _total(r["steps"])
    test = straggler_test(ranks)
    return {"folder": str(folder), "ranks": ranks, "straggler": straggler(ranks),
            "straggler_reason": test["reason"] if test else "one rank: nobody to wait for"}


LEGEND = ("time: the step's span on the training thread; compute, comm: the union of its compute and communication "
          "intervals; hidden: comm under compute; exposed = comm - hidden; overlap % = hidden / comm; idle: neither; "
          "wait: the part of comm spent waiting for slower ranks (<= comm). All in ms.")


def table(res, width: int = 96) -> str:
    """The per-rank, per-step table, ``width`` characters at most a line: the numbers on one line, the step's top
    ops under it (wrapped between ops, never inside a name), a legend of the columns at the end."""
    import textwrap

    cols = ("time_ms", "compute_ms", "comm_ms", "hidden_ms", "exposed_ms", "overlap_pct", "idle_ms", "wait_ms")
    head = f"{'rank':>4} {'step':>5} " + " ".join(f"{c.replace('_pct', ' %').replace('_ms', ''):>9}" for c in cols)
    lines = [head]

    def fmt(v):
        return f"{'-':>9}" if v is None else f"{v:9.2f}"

    for r in res["ranks"]:
        for s in r["steps"] + [dict(r["total"], step="all", top_ops=[])]:
            lines.append(f"{r['rank']:>4} {s['step']:>5} " + " ".join(fmt(s.get(c)) for c in cols))
            if s["top_ops"]:
                ops = "top ops (self ms): " + "  ".join(f"{k}\u00a0{v:.2f}" for k, v in s["top_ops"][:3])
                lines += [ln.replace("\u00a0", " ") for ln in textwrap.wrap(
                    ops, width, initial_indent=" " * 11, subsequent_indent=" " * 13, break_long_words=False,
                    break_on_hyphens=False)]
    g = res["straggler"]
    verdict = (f"straggler: rank {g['rank']} (the others wait {g['slowdown_ms_per_step']:.1f} ms per step for it, "
               f"over the {g['threshold_ms']:.1f} ms threshold)" if g else
               f"straggler: none ({res.get('straggler_reason', 'no rank waits more than the threshold')})")
    lines += textwrap.wrap(verdict, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    lines += textwrap.wrap(LEGEND, width, break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)
