"""Cross-check ``coursekit.profiling.trace`` against Holistic Trace Analysis (HTA, ``holistictraceanalysis``).

HTA measures overlap on GPU streams only: on a raw CPU trace its overlap is NaN. ``to_gpu_layout`` rewrites a
CPU/gloo trace so that HTA sees the same events our rule classifies (field notes, Module 5):
  * every compute event (``aten::*`` on the main thread) is copied as a kernel on a fake GPU stream 7;
  * every communication event (``gloo:*``) is copied as ``ncclDevKernel_<op>`` on stream 20 (HTA's rule for
    communication kernels is ``^nccl.*Kernel``);
  * each copy and its CPU original share a ``correlation`` id, since HTA keeps only kernels launched by a CPU
    op inside the traced steps.
HTA then computes overlap its own way (pandas, cumulative status over merged kernel intervals, whole trace per
rank) and ``ours`` computes it ours (``trace.union``/``intersect``) over the same events: the two agree only if
the interval arithmetic does. HTA rounds times to whole µs unless ``HTA_DISABLE_NS_ROUNDING=1``; we set it, so
what remains is float rounding. On native GPU traces no rewrite is needed (``hta_overlap`` on the folder).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from coursekit.profiling import trace as T

COMPUTE_STREAM, COMM_STREAM = 7, 20


def to_gpu_layout(src, dst) -> Path:
    """Write a copy of every trace in ``src`` into ``dst`` with the fake GPU streams described above."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(src).glob("*.json")):
        raw = json.loads(f.read_text())
        tr = T.load(f)
        extra, corr = [], 10**9
        for e in tr["events"]:
            if T.is_compute(e, False, tr["main"]):
                name, stream = e["name"], COMPUTE_STREAM
            elif T.is_comm(e, False):
                name, stream = "ncclDevKernel_" + e["name"].split(":", 1)[1], COMM_STREAM
            else:
                continue
            corr += 1
            e.setdefault("args", {})["correlation"] = corr  # the CPU original "launches" its copy
            extra.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": e["ts"],
                          "dur": e["dur"], "args": {"device": 0, "stream": stream, "correlation": corr}})
        raw["traceEvents"] = [e for e in raw["traceEvents"] if e.get("ph") != "X"] + tr["events"] + extra
        (dst / f.name).write_text(json.dumps(raw))
    return dst


def hta_overlap(folder) -> dict[int, float]:
    """HTA's communication/computation overlap % per rank (all traced steps included)."""
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis

    for name in ("hta", "Flight Recorder"):
        logging.getLogger(name).setLevel(logging.ERROR)
    df = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True).get_comm_comp_overlap(
        visualize=False)
    return {int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"])}


def ours(folder) -> dict[int, float]:
    """Our overlap % per rank over the events HTA keeps: all classified events up to the last step's end."""
    out = {}
    for f in sorted(Path(folder).glob("*.json")):
        tr = T.load(f)
        end = max(T._span(e)[1] for e in tr["steps"])
        comp = [T._span(e) for e in tr["events"] if T.is_compute(e, tr["gpu"], tr["main"]) and e["ts"] <= end]
        comm = [T._span(e) for e in tr["events"] if T.is_comm(e, tr["gpu"]) and e["ts"] <= end]
        M = T.union(comm)
        out[tr["rank"]] = 100 * T.length(T.intersect(T.union(comp), M)) / T.length(M) if M else float("nan")
    return out
