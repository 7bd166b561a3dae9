"""3-D layouts on 8 CPU processes, and the pipeline bubble measured per schedule against theory.

    .venv/bin/python bench/bench_parallel.py            # dp8, dp2 x tp2 x pp2, tp2 x cp2 x dp2; bubbles at m = 1, 2, 4, 8
    .venv/bin/python bench/bench_parallel.py --quick    # bubbles only, 2 stages, m = 1 and 4 (minutes on 2 cores)

Layouts (``coursekit train``, tiny Llama with 4 layers, seq 64, global batch 16, fp32, 4 steps): step time (mean of
steps 2..4, slowest rank) and parameter bytes per rank (``coursekit.measure``, from each rank's final record).
Not yet here: activation and communication bytes per rank for these layouts (issue #13's benchmark list).
Bubbles (``coursekit.pp.probe``): the first stage's idle share of the step, from the timed chunks of every stage,
and (p−1)/(v·m+p−1). On a shared 2-core machine the measured value carries scheduling noise: compare trends.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

LAYOUTS = {"dp8": ["--strategy", "ddp"],
           "dp2 x tp2 x pp2": ["--strategy", "ddp", "--tp", "2", "--pp", "2", "--grad-accum", "2"],
           "tp2 x cp2 x dp2": ["--strategy", "ddp", "--tp", "2", "--cp", "2", "--cp-impl", "ring"]}


def model_file(d: str, layers: int = 4) -> str:
    from coursekit.memory import preset, to_hf_config_dict

    cfg = to_hf_config_dict(preset("tiny-llama")) | {"num_hidden_layers": layers}
    p = Path(d) / f"llama-{layers}.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def layouts(model: str, timeout: float) -> list[dict]:
    from coursekit.launch import launch

    rows = []
    for name, args in LAYOUTS.items():
        res = launch("coursekit.train", [*args, "--model", model, "--steps", "4", "--seq", "64", "--global-batch",
                                         "16", "--quiet"], nproc=8, timeout=timeout, stream=False)
        recs = res.results
        step = max(sum(s["step_time_s"] for s in r["steps"][1:]) / 3 for r in recs)
        rows.append({"layout": name, "step_ms": 1000 * step,
                     "param_bytes_per_rank": sorted({r["final"]["params_bytes"] for r in recs}),
                     "loss": recs[0]["steps"][-1]["loss"]})
    return rows


def bubbles(model: str, schedules, ms, timeout: float) -> list[dict]:
    from coursekit.launch import launch
    from coursekit.pp.bubble import measured, theory

    rows = []
    for kind in schedules:
        for m in ms:
            if kind != "gpipe" and m < 2:  # torch's 1F1B and interleaved schedules need m >= pp (refused)
                continue
            res = launch("coursekit.pp.probe", ["--model", model, "--pp", "2", "--grad-accum", str(m),
                                                "--pp-schedule", kind, "--steps", "3", "--seq", "32",
                                                "--global-batch", str(2 * m)], nproc=2, timeout=timeout, stream=False)
            r = res.results
            rows.append({"schedule": kind, "m": m, "measured": measured([x["timeline"] for x in r])[0],
                         "theory": theory(2, m, r[0]["v"]), "peak_saved_bytes": [x["peak_saved"] for x in r]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        model = model_file(d)
        out = {"layouts": [] if a.quick else layouts(model, a.timeout)}
        scheds = ["gpipe", "1f1b"] if a.quick else ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs"]
        out["bubbles"] = bubbles(model, scheds, [1, 4] if a.quick else [1, 2, 4, 8], a.timeout)
    for r in out["layouts"]:
        print(f"{r['layout']:<16} step {r['step_ms']:8.1f} ms   params/rank {r['param_bytes_per_rank']} B")
    print(f"{'schedule':<18} {'m':>2} {'bubble':>7} {'theory':>7}  peak saved per stage (B)")
    for r in out["bubbles"]:
        print(f"{r['schedule']:<18} {r['m']:>2} {r['measured']:7.3f} {r['theory']:7.3f}  {r['peak_saved_bytes']}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
