"""``coursekit demo``: the main job — a tour of the course where every number is predicted, then measured.

    coursekit demo                         # every module: real runs on 1-4 CPU processes, one row per check
    coursekit demo --quick                 # a subset (about a minute)
    coursekit demo --module 2 --json       # one module, the checks as JSON
    coursekit demo --strategies single,ddp,zero2   # the older view: short trainings and their losses

Exits 1 when any check disagrees, so the demo is also a smoke test on your own cluster (``--nproc``; NCCL on
GPUs). The checks live with their modules (``coursekit.tour``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from coursekit.train.launcher import run_training, summary_table


def strategies_table(a) -> int:
    from coursekit.launch import default_nproc
    from coursekit.spec import registry

    nproc = a.nproc or default_nproc()
    names = [n.strip() for n in a.strategies.split(",") if n.strip()]
    for name in names:  # every name checked before anything runs
        registry.entry(name)
    runs = []
    for name in names:
        n = 1 if registry.entry(name).world == "one" else nproc
        print(f"running {name} on {n} process(es) ...", flush=True)
        runs.append(run_training(["--strategy", name, "--model", a.model, "--steps", str(a.steps), "--seq",
                                  str(a.seq), "--global-batch", str(a.global_batch)], nproc=n, timeout=a.timeout))
    print()
    print(summary_table(runs))
    return 0


def main(argv=None) -> int:
    from coursekit import tour as T

    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit demo", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--module", type=int, default=None, help=f"only this module ({', '.join(map(str, T.TOURS))})")
    p.add_argument("--quick", action="store_true", help="a subset of the checks (about a minute on 2 cores)")
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    p.add_argument("--strategies", default=None, help="instead of the tour: train these strategies, show losses")
    p.add_argument("--nproc", type=int, default=None, help="processes for --strategies runs (default: GPUs, else 2)")
    p.add_argument("--model", default="tiny-llama", help="model of the --strategies runs: a preset or a config.json "
                   "(default tiny-llama)")
    p.add_argument("--steps", type=int, default=5, help="training steps of each --strategies run (default 5)")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence of the --strategies runs (default 64)")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step of the --strategies runs "
                   "(default 8)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one launch may take before every process is "
                   "stopped (default 600)")
    a = p.parse_args(argv)
    if a.strategies:
        return strategies_table(a)
    if a.module is not None and a.module not in T.TOURS:
        raise ValueError(f"--module {a.module}: the tour has modules {', '.join(map(str, T.TOURS))}")
    t0 = time.monotonic()
    tour = T.Tour(quick=a.quick, timeout=a.timeout)
    only = a.module if a.module is not None else None
    if a.quick and only is None:
        checks = [c for m in (1, 2, 4) for c in T.run(tour, m)]
    else:
        checks = T.run(tour, only)
    took = time.monotonic() - t0
    if a.json:
        print(json.dumps({"checks": T.as_json(checks), "agree": all(c.agree for c in checks), "seconds": took}))
    else:
        print()
        print(T.table(checks))
        bad = [c for c in checks if not c.agree]
        print(f"\n{len(checks) - len(bad)}/{len(checks)} checks agree in {took:.0f} s"
              + ("" if not bad else f"; DISAGREE: {', '.join(c.what for c in bad)}"))
        print("next: `coursekit lab` opens the labs in JupyterLab; `coursekit doctor` says what runs on this machine")
    return 0 if all(c.agree for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
