"""Planted collective bugs, for the hang-diagnosis tests, the benchmark and Lab 5 (2+ ranks).

    coursekit launch --nproc 2 --diagnose -m coursekit.profiling.planted --case op

Every rank runs ``--n`` all-reduces of a 4-element tensor; at collective number ``--at`` rank ``--rank`` goes wrong:
  op     it calls all_gather instead of all_reduce        (both ranks wait on different collectives)
  shape  it all-reduces 2 elements instead of 4           (same op, different sizes)
  skip   it leaves the loop before that collective        (the others wait for a rank that never comes)
  sleep  it sleeps ``--sleep-s`` seconds before it        (it is alive but late: the others time out)
  none   nothing goes wrong (the control case)
Backend and device come from the environment (``coursekit.dist``).
"""
from __future__ import annotations

import argparse
import sys
import time

CASES = ("op", "shape", "skip", "sleep", "none")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="planted", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--case", choices=CASES, required=True)
    p.add_argument("--rank", type=int, default=1, help="the rank that goes wrong")
    p.add_argument("--at", type=int, default=3, help="the collective (1, 2, ...) where it goes wrong")
    p.add_argument("--n", type=int, default=4, help="all-reduces per rank")
    p.add_argument("--sleep-s", type=float, default=600.0, help="how long the late rank sleeps (case sleep)")
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    from coursekit import dist as ckdist

    info = ckdist.init()
    bad = info.rank == a.rank
    x = torch.ones(4, device=info.device)
    for i in range(1, a.n + 1):
        if bad and i == a.at:
            if a.case == "op":
                dist.all_gather([torch.empty_like(x) for _ in range(info.world_size)], x)
                continue
            if a.case == "shape":
                dist.all_reduce(torch.ones(2, device=info.device))
                continue
            if a.case == "skip":
                break
            if a.case == "sleep":
                time.sleep(a.sleep_s)
        dist.all_reduce(x)
    print(f"rank {info.rank}: done, x[0] = {x[0].item()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
