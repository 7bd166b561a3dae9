"""The pipeline bubble, measured from per-stage timelines and predicted, and saved-activation peaks per stage.

    theory(p=2, m=4)        -> 1/5      GPipe and 1F1B: (p−1)/(m+p−1)
    theory(p=2, m=4, v=2)   -> 1/9      interleaved, v stages per rank: (p−1)/(v·m+p−1)
    ideal("zbv", p=2, m=4)  -> per rank: the schedule's own order replayed with equal stages (F = I = W = 1, B = 2)
    measured(timelines)     -> idle share of each rank over the step (Σ busy chunk time / the step's span)
    breakdown(timelines, events) -> per rank: compute, send/recv wait, schedule overhead (seconds) and the bubble
    replay(timelines, events, clock="cpu") -> the bubble with the measured chunk costs and free communication

``timelines`` are ``coursekit.pp.stage.Pipeline.timeline`` of every pp rank: ``(stage, kind, micro-batch, start,
end, cpu)`` with kind F (forward), B (backward, input grads; or both), W (weight grads, zero-bubble schedules);
``events`` are ``Pipeline.events``: the last stage's loss (L) and every send/recv wait (P). The span runs from the
first chunk start on any rank to the last chunk end on any rank (one perf_counter clock per machine), so a rank's
bubble is everything it does not spend computing: waiting for a neighbour, the send/recv itself, and the schedule's
Python between chunks. On a machine other jobs share, wall-clock chunks stretch when the core is taken away
(``stretch``); their CPU seconds do not, and ``replay(..., clock="cpu")`` gives the bubble those costs imply.

The PP probe counts the saved-for-backward bytes alive at once during a schedule step with the measurement path's
peak tracker (``coursekit.measure.peak.SavedPeak``, storages once): GPipe holds all m micro-batches at its peak,
1F1B at most p − stage on each stage.
"""
from __future__ import annotations



def theory(p: int, m: int, v: int = 1) -> float:
    return (p - 1) / (v * m + p - 1)


def ideal(schedule: str, p: int, m: int, v: int | None = None, cost: dict | None = None) -> list[float]:
    """Each rank's bubble when every stage costs the same — a forward 1, an input or a weight pass 1, a full backward
    2 — replaying the schedule's own order (``coursekit.memory.pp_order``, torch's). For GPipe, 1F1B and interleaved
    1F1B it is ``theory`` (tests/test_pp.py); for the zero-bubble schedules, which have no closed form here, it is
    what is left once weight passes fill the bubble (ZB-V on 2 ranks, 8 micro-batches: 1 slot of 49).
    ``cost``: {(stage, kind): seconds} instead, kind as in a timeline (F, B — a full backward or an input pass —, W;
    the last stage's loss folded into its F): the same order with each stage's measured work."""
    from coursekit.memory import pp_order

    unit = {"F": 1, "I": 1, "W": 1, "B": 2}
    timelines = []
    for rank in range(p):
        t, tl = 0.0, []
        for kind, stage, mb in pp_order.order(schedule, p, rank, m, v):
            k = "B" if kind == "I" else kind
            d = unit[kind] if cost is None else cost[(stage, k)]
            tl.append((stage, k, mb, t, t + d, d))
            t += d
        timelines.append(tl)
    return replay(timelines)


def _duration(clock: str):
    """A chunk's length: its CPU seconds ("cpu") or start to end ("wall")."""
    return (lambda c: c[5]) if clock == "cpu" else (lambda c: c[4] - c[3])


def theory_uneven(timelines: list[list], events: list[list] | None, m: int, schedule: str = "gpipe",
                  clock: str = "cpu") -> list[float]:
    """The bubble formula with the stages' *measured* work per micro-batch instead of equal stages: stage s's
    forward f_s and backward b_s (+ W, + the loss on the last stage) per micro-batch, from the chunks' ``clock``
    seconds. GPipe: all forwards then all backwards, so span = Σ f + (m−1)·max f + Σ b + (m−1)·max b; 1F1B-style
    schedules: span = Σ (f + b) + (m−1)·max (f + b). Stage s's bubble: 1 − m·(f_s + b_s) / span. With equal stages
    both reduce to (p−1)/(m+p−1)."""
    events = events or [[] for _ in timelines]
    dur = _duration(clock)
    f: dict[int, float] = {}
    b: dict[int, float] = {}
    for tl in timelines:
        for c in tl:
            (f if c[1] == "F" else b)[c[0]] = (f if c[1] == "F" else b).get(c[0], 0.0) + dur(c) / m
    for ev in events:
        for e in ev:
            if e[1] == "L":
                f[e[0]] = f.get(e[0], 0.0) + dur(e) / m
    stages = sorted(set(f) | set(b))
    fs, bs = [f.get(s, 0.0) for s in stages], [b.get(s, 0.0) for s in stages]
    if schedule == "gpipe":
        span = sum(fs) + (m - 1) * max(fs) + sum(bs) + (m - 1) * max(bs)
    else:
        span = sum(fs) + sum(bs) + (m - 1) * max(x + y for x, y in zip(fs, bs))
    work = dict(zip(stages, (x + y for x, y in zip(fs, bs))))
    return [1 - m * sum(work[st] for st in {c[0] for c in tl}) / span for tl in timelines]  # a rank's stages


COMPUTE = ("F", "B", "W", "L")  # chunk kinds that are work; "P" is a send/recv wait


def measured(timelines: list[list], events: list[list] | None = None) -> list[float]:
    """Bubble share per rank: 1 − busy / span (span over all ranks' chunks). With ``events`` (``Pipeline.events``
    of every rank) the last stage's loss counts as busy too."""
    return [b["bubble"] for b in breakdown(timelines, events)]


def breakdown(timelines: list[list], events: list[list] | None = None) -> list[dict]:
    """Per rank, over the step's span: ``compute`` (F, B, W chunks and the loss), ``p2p_wait`` (blocked in a
    send/recv wait: mostly waiting for the neighbour, which is the bubble itself, plus the transfer), ``other``
    (the schedule's Python between chunks) in seconds, and ``bubble`` = 1 − compute / span."""
    events = events or [[] for _ in timelines]
    work = [list(tl) + [e for e in ev if e[1] in COMPUTE] for tl, ev in zip(timelines, events)]
    t0 = min(c[3] for w in work for c in w)
    t1 = max(c[4] for w in work for c in w)
    out = []
    for w, ev in zip(work, events):
        compute = sum(c[4] - c[3] for c in w)
        wait = sum(max(0.0, min(e[4], t1) - max(e[3], t0)) for e in ev if e[1] == "P")
        cpu = sum(c[5] for c in w if len(c) > 5)
        out.append({"span": t1 - t0, "compute": compute, "p2p_wait": wait, "other": t1 - t0 - compute - wait,
                    "bubble": 1 - compute / (t1 - t0),
                    # wall / CPU time of the chunks: 1 on an idle machine; above 1, other jobs took the core
                    "stretch": compute / cpu if cpu else None})
    return out


def replay(timelines: list[list], events: list[list] | None = None, clock: str = "wall") -> list[float]:
    """The bubble each rank would have with the *measured* chunk times (``clock`` "wall": start to end; "cpu": the
    chunk's CPU seconds, which a busy machine does not stretch) and free, instant communication: every
    rank runs its chunks in the order it ran them, each as soon as the rank is free and its inputs exist (F of stage
    s after F of s−1; B of s after B of s+1, or after its own F and loss on the last stage; W after its B). What
    separates ``theory`` from this is uneven chunk times (a heavier last stage, backward ≠ 2 × forward per stage);
    what separates this from ``measured`` is the send/recv and the schedule's overhead."""
    events = events or [[] for _ in timelines]
    dur = _duration(clock)
    loss = {(e[0], e[2]): dur(e) for ev in events for e in ev if e[1] == "L"}
    last = max(c[0] for tl in timelines for c in tl)
    todo = [sorted(tl, key=lambda c: c[3]) for tl in timelines]
    done: dict = {}  # (stage, kind, mb) -> simulated end
    free, busy, pos = [0.0] * len(todo), [0.0] * len(todo), [0] * len(todo)
    while any(p < len(t) for p, t in zip(pos, todo)):
        moved = False
        for r, tl in enumerate(todo):
            while pos[r] < len(tl):
                st, kind, mb = tl[pos[r]][:3]
                dep = {"F": [(st - 1, "F", mb)] if st else [],
                       "B": [(st + 1, "B", mb)] if st < last else [(st, "F", mb)],
                       "W": [(st, "B", mb)]}[kind]
                if any(d not in done for d in dep):
                    break
                d = dur(tl[pos[r]]) + (loss.get((st, mb), 0.0) if kind == "F" else 0.0)
                start = max([free[r]] + [done[x] for x in dep])
                done[(st, kind, mb)] = free[r] = start + d
                busy[r] += d
                pos[r] += 1
                moved = True
        if not moved:
            raise ValueError("the timelines' chunk order is not a schedule (a dependency never ran)")
    span = max(free)
    return [1 - b / span for b in busy]
