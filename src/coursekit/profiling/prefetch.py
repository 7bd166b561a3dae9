"""How far ahead FSDP2 gathers its units, read from a profiler trace (``coursekit train ... --prefetch N``).

    from coursekit.profiling.prefetch import depth
    depth("runs/prof/trace-rank0.json")   # {step: {"forward": {unit: ahead}, "backward": {unit: ahead}}}

FSDP2 labels what it does on the training thread with ``record_function`` spans named after each unit's fully
qualified name: ``FSDP::all_gather (model.layers.1)`` (the root: plain ``FSDP::all_gather``), ``FSDP::post_forward
(...)`` when a unit's forward is over, ``FSDP::post_backward_* (...)`` when its gradients are. *Ahead* is how many
units beyond those already needed had their all-gather issued when a unit finished computing:

    ahead(k-th unit of the pass) = #units whose all-gather started before that unit's post_forward/post_backward - k

(k counted from 1; the root, which stays gathered from its forward to its backward, is left out). Prefetch N makes
it N (fewer near the end of a pass). Without ``--prefetch`` FSDP2 prefetches nothing in forward (its implicit
forward prefetch is the GPU running behind the CPU, with all-gathers on their own stream) and one unit in backward.

Whether an early all-gather also *overlaps* compute is another matter: ``coursekit.profiling.trace`` measures that.
On CPU there are no streams, and FSDP2's default ``async_op=False`` makes every all-gather block the training thread
while gloo's thread runs it: issued early or late, it would hide behind no compute. So on CPU ``--prefetch`` also
sets ``async_op=True`` for the unshards (``fsdp/strategy.py``): the prefetched unit's all-gather runs on gloo's
thread while the current unit computes, and is waited for when that unit is needed. Measured on 2 CPU ranks
(4 blocks), 2026-12-01: overlap 0 % without prefetch in every run; with ``--prefetch 2`` 35-42 % per step idle,
18-32 % in runs beside other work (Lab 5, bench_profiling).
"""
from __future__ import annotations

import re
from collections import defaultdict

from coursekit.profiling.trace import _STEP, load

_LABEL = re.compile(r"^FSDP::(all_gather|post_forward|post_backward_\w+)(?: \((.*)\))?$")


def events(tr) -> dict[int, list[tuple[float, str, str]]]:
    """{step: [(start µs, kind, unit)]} of one rank's FSDP labels on its training thread, in time order; kind is
    ``all_gather``, ``post_forward`` or ``post_backward``; the root unit is ``""``."""
    main = tr["main"]
    spans = {int(_STEP.match(e["name"]).group(1)): (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
             for e in tr["steps"]}
    out = defaultdict(list)
    for e in tr["events"]:
        m = _LABEL.match(e["name"])
        if not m or (e["pid"], e["tid"]) != main:
            continue
        kind = "post_backward" if m.group(1).startswith("post_backward") else m.group(1)
        ts = float(e["ts"])
        for n, (lo, hi) in spans.items():
            if lo <= ts < hi:
                out[n].append((ts, kind, m.group(2) or ""))
    return {n: sorted(v) for n, v in sorted(out.items())}


def _ahead(evs, done_kind) -> dict[str, int]:
    gathered, order, out = set(), [], {}
    for _, kind, unit in evs:
        if kind == "all_gather" and unit:
            gathered.add(unit)
        elif kind == done_kind and unit and unit not in out:
            order.append(unit)
            out[unit] = len(gathered - set(order))  # gathered, beyond the units the pass has reached
    return out


def depth(path) -> dict[int, dict]:
    """Per recorded step: units gathered ahead when each unit's forward (and backward) ended, and the counts."""
    res = {}
    for n, evs in events(load(path)).items():
        ends = [t for t, kind, _ in evs if kind == "post_forward"]
        cut = max(ends) if ends else float("inf")  # the forward pass ends at its last post_forward
        fwd, bwd = [e for e in evs if e[0] <= cut], [e for e in evs if e[0] > cut]
        res[n] = {"forward": _ahead(fwd, "post_forward"), "backward": _ahead(bwd, "post_backward"),
                  "all_gathers": sum(1 for e in evs if e[1] == "all_gather"),
                  "order": [f"{kind} {unit or 'root'}" for _, kind, unit in evs]}
    return res
