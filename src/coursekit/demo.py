"""``coursekit demo``: the main job. Short real trainings of a tiny transformers model through the launcher.

Default: ``single`` on 1 process, then ``ddp`` on 2 processes (CPU + gloo here, NCCL on GPUs), same global batch,
and a table: strategy, world size, loss per step, tokens/s, time. ``--strategies`` picks others as the course's
later modules add them (e.g. ``--strategies single,ddp,zero2``).
"""
from __future__ import annotations

import argparse
import time

from coursekit.launch import launch


def run_training(train_args: list[str], *, nproc: int, timeout: float = 600, stream: bool = False) -> dict:
    """Launch the reference trainer; returns rank 0's record plus every rank's final record and wall time."""
    t0 = time.monotonic()
    res = launch("coursekit.train", ["--quiet", *train_args], nproc=nproc, timeout=timeout, stream=stream)
    out = dict(res.results[0])
    out["ranks"] = [r["final"] for r in res.results]
    out["wall_s"] = time.monotonic() - t0
    return out


def summary_table(runs: list[dict]) -> str:
    head = f"{'strategy':<10} {'world':>5}  {'loss per step':<44} {'tokens/s':>9} {'step ms':>8} {'wall s':>7}"
    rows = [head, "-" * len(head)]
    for r in runs:
        f, steps = r["final"], r["steps"]
        losses = " ".join(f"{s['loss']:.4f}" for s in steps)
        if len(losses) > 44:
            losses = losses[:41] + "..."
        timed = steps[1:] or steps  # the first step includes warm-up
        tps = sum(s["tokens_per_s"] for s in timed) / len(timed)
        ms = 1000 * sum(s["step_time_s"] for s in timed) / len(timed)
        rows.append(f"{f['strategy']:<10} {f['world_size']:>5}  {losses:<44} {tps:>9.0f} {ms:>8.1f} "
                    f"{r['wall_s']:>7.1f}")
    return "\n".join(rows)


def main(argv=None) -> int:
    from coursekit.launch import default_nproc

    p = argparse.ArgumentParser(prog="coursekit demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--strategies", default="single,ddp")
    p.add_argument("--nproc", type=int, default=None, help="processes for the parallel runs (default: GPUs, else 2)")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args(argv)
    nproc = a.nproc or default_nproc()
    runs = []
    for name in a.strategies.split(","):
        n = 1 if name == "single" else nproc
        print(f"running {name} on {n} process(es) ...", flush=True)
        runs.append(run_training(["--strategy", name, "--model", a.model, "--steps", str(a.steps), "--seq",
                                  str(a.seq), "--global-batch", str(a.global_batch)], nproc=n, timeout=a.timeout))
    print()
    print(summary_table(runs))
    return 0
