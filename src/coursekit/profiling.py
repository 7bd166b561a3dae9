"""Profiling as a context manager (torchtitan's shape): the training loop carries no profiler code.

    with maybe_profile(out_dir, rank, active=3) as prof:
        for step in ...:
            ...
            prof.step()

Writes one Chrome/Perfetto trace per rank (``trace-rank<R>.json``) when ``out_dir`` is set; otherwise yields a
no-op with a ``step()`` method.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


class _NoProfiler:
    def step(self):
        pass


@contextlib.contextmanager
def maybe_profile(out_dir: str | os.PathLike | None, rank: int = 0, *, wait: int = 1, warmup: int = 1,
                  active: int = 3, record_shapes: bool = False):
    if not out_dir:
        yield _NoProfiler()
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    def on_ready(p):
        p.export_chrome_trace(str(out / f"trace-rank{rank}.json"))

    with profile(activities=acts, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                 on_trace_ready=on_ready, record_shapes=record_shapes) as prof:
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
