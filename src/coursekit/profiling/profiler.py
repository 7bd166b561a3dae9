"""Profiling as a context manager (torchtitan's shape): the training loop carries no profiler code.

    with maybe_profile(out_dir, rank, steps=(2, 5)) as prof:   # record steps 2, 3 and 4
        for step in ...:
            ...
            prof.step()

Writes one Chrome/Perfetto trace per rank (``trace-rank<R>.json``) when ``out_dir`` is set; otherwise yields a
no-op with a ``step()`` method. ``steps=(a, b)`` records steps a..b-1 (b excluded, like a slice), counting the
``prof.step()`` calls from 0; in the trace each recorded step is a ``ProfilerStep#N`` span. The step before ``a``
is a warm-up step (recorded, then dropped), as torch.profiler advises. An exception inside the block stops the
profiler and still writes the steps recorded so far (what led up to a crash is often the interesting part).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


class _NoProfiler:
    def step(self):
        pass


def schedule_for(steps: tuple[int, int]) -> dict:
    """torch.profiler.schedule arguments that record steps ``a..b-1``: skip, one warm-up step, record, stop."""
    a, b = (int(x) for x in steps)
    if not 0 <= a < b:
        raise ValueError(f"profile steps a:b need 0 <= a < b, got {a}:{b}")
    return {"skip_first": max(a - 1, 0), "wait": 0, "warmup": min(a, 1), "active": b - a, "repeat": 1}


@contextlib.contextmanager
def maybe_profile(out_dir: str | os.PathLike | None, rank: int = 0, *, steps: tuple[int, int] | None = None,
                  wait: int = 1, warmup: int = 1, active: int = 3, record_shapes: bool = False):
    """Profile steps ``steps`` (a, b), or, without it, ``wait`` + ``warmup`` steps then ``active`` steps."""
    if not out_dir:
        yield _NoProfiler()
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    sched = schedule_for(steps) if steps is not None else {"wait": wait, "warmup": warmup, "active": active,
                                                           "repeat": 1}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    def on_ready(p):
        p.export_chrome_trace(str(out / f"trace-rank{rank}.json"))

    # profile.__exit__ runs on an exception too: it stops the trace and calls on_ready if steps were recorded
    with profile(activities=acts, schedule=schedule(**sched), on_trace_ready=on_ready,
                 record_shapes=record_shapes) as prof:
        yield prof


def top_ops(trace_path: str | os.PathLike, n: int = 10, category: str | None = None) -> list[tuple[str, float]]:
    """The ``n`` op or kernel names with the most total duration (µs) in a Chrome trace (``cat`` filter optional)."""
    import json
    from collections import Counter

    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    tot = Counter()
    for e in events:
        if e.get("ph") == "X" and (category is None or e.get("cat") == category):
            tot[e.get("name", "?")] += float(e.get("dur", 0))
    return tot.most_common(n)
