"""Sweeps of DeepSpeed settings in one launch: how bucket sizes, prefetch and overlap change the collectives and the
step time (Lab 2, section 4), and the stage x offload benchmark table (bench/bench_zero.py).

    rows = run_sweep([{"name": "rb=20k", "stage": 2, "reduce_bucket_size": 20_000}, ...], nproc=2)

Each point builds a fresh model and DeepSpeed engine inside the same process group (the imports, 5-8 s per launch,
are paid once), trains ``steps`` steps with the reference trainer's pieces (``coursekit.zero.strategy``, the same
data and AdamW), times steps 1..steps-2 and counts the collectives of the last step (the counter slows that step,
so it is never timed). A point is ``build_config`` keywords plus ``name``, ``stage``, ``dtype``, ``model``, and
optionally ``config`` (a whole DeepSpeed dict, then the keywords are ignored).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

POINT_KEYS = ("name", "stage", "dtype", "model", "config")


def sweep_points(stage: int, **grid) -> list[dict]:
    """One point per value of one varied setting, e.g. ``sweep_points(2, reduce_bucket_size=[1e4, 1e5, 1e6])``."""
    points = []
    for key, values in grid.items():
        for v in values:
            points.append({"name": f"{key}={v}", "stage": stage, key: v})
    return points


def run_sweep(points: list[dict], *, nproc: int = 2, steps: int = 5, seq: int = 64, global_batch: int = 8,
              model: str = "tiny-llama", timeout: float = 600, stream: bool = False,
              per_rank: bool = False, pool=None) -> list:
    """Run every point on ``nproc`` ranks in one launch (or on a notebook's ``pool`` of live ranks,
    ``coursekit.pool.Pool``: its size, no launch); returns rank 0's row per point (see ``_row``), or with
    ``per_rank`` one such list per rank (ZeRO-1/2 ranks hold different gradient bytes)."""
    from coursekit.launch import launch

    if steps < 3:
        raise ValueError("steps must be >= 3 (a warm-up step, timed steps, a counted step)")
    with tempfile.TemporaryDirectory(prefix="coursekit-sweep-") as d:
        spec = Path(d) / "points.json"
        spec.write_text(json.dumps(points))
        args = ["--points", spec, "--steps", steps, "--seq", seq, "--global-batch", global_batch, "--model", model]
        if pool is not None:
            results = pool.probe("coursekit.zero.sweep", *args, timeout=timeout)
        else:
            results = launch("coursekit.zero.sweep", args, nproc=nproc, timeout=timeout, stream=stream).results
    return [r["rows"] for r in results] if per_rank else results[0]["rows"]


def _one(point: dict, a, info) -> dict:
    import torch.distributed as dist

    from coursekit.options import build
    from coursekit.parallel.run import build_run
    from coursekit.zero.ds_config import build_config, stage_of
    from coursekit.zero.strategy import ZeRO

    cfg = point.get("config") or build_config(point["stage"], dtype=point.get("dtype", "fp32"),
                                              **{k: v for k, v in point.items() if k not in POINT_KEYS})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    opts = build({"strategy": "deepspeed", "ds_config": f.name, "steps": a.steps, "seq": a.seq,
                  "global_batch": a.global_batch, "model": point.get("model", a.model),
                  "dtype": "bf16" if cfg.get("bf16", {}).get("enabled") else "fp32"})
    run_ = build_run(info, opts, strategy=ZeRO)  # the trainer's set-up: seed 0, synthetic data, same rows
    strat = run_.strategy
    times, losses = [], []
    for step in range(a.steps):  # the trainer's step (train_step); the last one is measured and counted
        dist.barrier()
        t0 = time.perf_counter()
        mbs = run_.micro_batches(step)
        loss = strat.train_step(mbs, measure=step == a.steps - 1)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    held = strat.last_state_bytes
    strat.engine.destroy()
    Path(f.name).unlink(missing_ok=True)
    timed = times[1:-1]
    return _row(point, stage_of(cfg), held, statistics.median(timed), losses)


def _row(point, stage, held, step_s, losses) -> dict:
    """One table row: the point, its step time, per-op call counts and payload sizes, and the held bytes."""
    coll = held["collectives"]["calls"]
    ops = {}
    for c in coll:
        if c["bytes"] <= 8:  # grad-norm / overflow scalars
            continue
        o = ops.setdefault(c["op"], {"calls": 0, "bytes": 0, "max_bytes": 0})
        o["calls"] += c["count"]
        o["bytes"] += c["count"] * c["bytes"]
        o["max_bytes"] = max(o["max_bytes"], c["bytes"])
    keep = ("params_bytes", "grads_bytes", "grads_peak_bytes", "master_bytes", "optimizer_bytes", "fp32_grads_bytes", "buffers_bytes",
            "accelerator_bytes", "cpu_bytes", "nvme_bytes", "tiers")
    return {"name": point.get("name", f"zero{stage}"), "stage": stage, "step_ms": 1000 * step_s, "ops": ops,
            "calls": sum(o["calls"] for o in ops.values()), "losses": losses, **{k: held[k] for k in keep}}


def run(argv) -> dict:
    """Worker: run the points in ``--points`` under an existing launch (or a pool's group); this rank's rows."""
    from coursekit import dist as ckdist

    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--points", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--model", default="tiny-llama")
    a = p.parse_args(argv)
    points = json.loads(Path(a.points).read_text())
    with ckdist.session(seed=0) as info:
        return {"rows": [_one(pt, a, info) for pt in points]}


def main(argv=None) -> int:
    from coursekit.launch import report

    report(run(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # results reported: skip the interpreter's slow teardown
