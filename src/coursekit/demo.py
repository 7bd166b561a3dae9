"""``coursekit demo``: the main job. Short real trainings of a tiny transformers model through the launcher.

Default: ``single`` on 1 process, then ``ddp`` on 2 processes (CPU + gloo here, NCCL on GPUs), same global batch,
and a table: strategy, world size, loss per step, tokens/s, time. ``--strategies`` picks others as the course's
later modules add them (e.g. ``--strategies single,ddp,zero2``).
"""
from __future__ import annotations

import argparse
from coursekit.train.launcher import run_training, summary_table


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
    from coursekit.parallel import registry

    names = [n.strip() for n in a.strategies.split(",") if n.strip()]
    for name in names:  # every name checked before anything runs
        registry.entry(name)
    runs = []
    for name in names:
        n = 1 if name == "single" else nproc
        print(f"running {name} on {n} process(es) ...", flush=True)
        runs.append(run_training(["--strategy", name, "--model", a.model, "--steps", str(a.steps), "--seq",
                                  str(a.seq), "--global-batch", str(a.global_batch)], nproc=n, timeout=a.timeout))
    print()
    print(summary_table(runs))
    return 0
