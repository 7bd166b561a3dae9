"""Collective bus bandwidth on 2 and 4 processes (figures printed, not asserted), plot in bench/results/.

    .venv/bin/python bench/bench_comm.py [--sizes 1K..64M] [--factor 4] [--iters 10] [--nproc 2,4] [--out DIR]

Runs ``coursekit.comm.bench`` through the launcher (nccl-tests definitions: size S per op, algbw = S / time of the
slowest rank, busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather / reduce_scatter / all_to_all, 1 for
broadcast). Our send/recv ``ring_all_reduce`` runs next to the library's all_reduce. On a CPU machine this is gloo
over loopback TCP with every rank sharing the same cores: read the shape of the curves, not the absolute numbers.
"""
import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("COURSEKIT_DEVICE", "cpu")

from coursekit.comm.bench import DEFAULT_OPS, plot_busbw, run_benchmark  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def table(rows, n, ops) -> str:
    """busbw (GB/s) on ``n`` processes: one line per size, one column per op."""
    by = {(r["op"], r["size"]): r["busbw"] for r in rows if r["world_size"] == n}
    lines = [f"n = {n}\n{'size':>6} " + " ".join(f"{op:>15}" for op in ops)]
    for size in sorted({s for _, s in by}):
        cells = [f"{by[(op, size)]:>15.3f}" if (op, size) in by else f"{'-':>15}" for op in ops]
        lines.append(f"{_human(size):>6} " + " ".join(cells))
    return "\n".join(lines)


def _human(b: int) -> str:
    for unit, k in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return str(b)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1K..64M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--nproc", default="2,4")
    p.add_argument("--out", default=str(RESULTS), help="folder for comm_busbw.json and comm_busbw.png")
    a = p.parse_args()
    out = Path(a.out)
    nprocs = [int(n) for n in a.nproc.split(",")]
    ops = [*DEFAULT_OPS, "ring_all_reduce"]
    rows = []
    for n in nprocs:
        rows += run_benchmark(nproc=n, ops=ops, sizes=a.sizes, factor=a.factor, iters=a.iters, warmup=a.warmup,
                              timeout=1200)
    print(f"busbw GB/s ({rows[0]['backend']}, {rows[0]['dtype']}, {os.cpu_count()} CPUs, {a.iters} iters, "
          f"slowest rank's time)\n")
    print("\n\n".join(table(rows, n, ops) for n in nprocs))
    print("\nlatency floor: time per call (us) at the smallest size")
    first = {}
    for r in rows:  # rows come in increasing size per (op, world size)
        first.setdefault((r["op"], r["world_size"]), r)
    for (op, n), r in first.items():
        print(f"  {op:>16} n={n}: {r['time_us']:9.1f} us at {r['size']} B")
    out.mkdir(parents=True, exist_ok=True)
    (out / "comm_busbw.json").write_text(json.dumps(rows, indent=1))
    png = plot_busbw(rows, out / "comm_busbw.png", title=f"busbw, {rows[0]['backend']}, {os.cpu_count()} CPUs")
    print(f"\nrows: {out / 'comm_busbw.json'}\nplot: {png}")


if __name__ == "__main__":
    main()
