"""How live a notebook session is: persistent ranks (``coursekit.pool``) against a launch per cell.

    .venv/bin/python bench/bench_pool.py            # 2 and 4 ranks
    .venv/bin/python bench/bench_pool.py --nproc 2 --reps 3

Prints, side by side in one run (issue 30's goals in brackets; figures, not a test):
- the floor: a bare ``torchrun`` of N processes that import torch, join a gloo group and pass a barrier (wall s);
- the pool's start (N engines, their process group) [<= 1.3 x the floor];
- a small collective cell on N warm ranks (an all-reduce of 4 floats, its output back) [<= 0.5 s];
- ``coursekit train --nproc N --steps 1`` (tiny-llama) [<= 1.5 x the floor].
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = """import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def _wall(cmd: list[str], timeout: float = 300) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, timeout=timeout,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "COURSEKIT_DEVICE": "cpu"})
    return time.perf_counter() - t0


def floor_s(nproc: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "floor.py"
        script.write_text(FLOOR)
        return _wall([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                      str(script)])


def train_s(nproc: int) -> float:
    return _wall([sys.executable, "-m", "coursekit.cli", "train", "--strategy", "ddp" if nproc > 1 else "single",
                  "--nproc", str(nproc), "--steps", "1", "--quiet"])


def pool_s(nproc: int, cells: int = 5) -> tuple[float, float]:
    from coursekit.pool import Pool

    t0 = time.perf_counter()
    pool = Pool(nproc)
    start = time.perf_counter() - t0
    try:
        times = []
        for _ in range(cells):
            t0 = time.perf_counter()
            pool.run("x = torch.ones(4); dist.all_reduce(x); print(x.tolist())", quiet=True)
            times.append(time.perf_counter() - t0)
    finally:
        pool.close()
    return start, statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=1, help="repeat each launch, keep the median")
    a = p.parse_args(argv)
    print(f"{'ranks':>5} {'floor s':>8} {'pool start s':>13} {'x floor':>8} {'cell s':>7} {'train 1 step s':>15} "
          f"{'x floor':>8}")
    for n in a.nproc:
        fl = statistics.median(floor_s(n) for _ in range(a.reps))
        runs = [pool_s(n) for _ in range(a.reps)]
        start, cell = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        tr = statistics.median(train_s(n) for _ in range(a.reps))
        print(f"{n:>5} {fl:8.2f} {start:13.2f} {start / fl:8.2f} {cell:7.3f} {tr:15.2f} {tr / fl:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
