"""Collective benchmark in the manner of nccl-tests: time, algorithm bandwidth and bus bandwidth per op and size.

    python -m coursekit.comm.bench --ops all_reduce,all_gather --sizes 1K..64M --iters 20     # one rank per process,
                                                                                               # under torchrun
    rows = run_benchmark(nproc=4, ops=["all_reduce"], sizes="1K..16M")                         # from Python
    plot_busbw(rows, "busbw.png")

Definitions (nccl-tests doc/PERFORMANCE.md):
  size S   the full logical buffer, as in nccl-tests: all_reduce / broadcast: the tensor; all_gather: the gathered
           output (each rank contributes S/n); reduce_scatter: the full input (each rank keeps S/n); all_to_all:
           one rank's send buffer (S/n to each peer). Counts are rounded down to a multiple of n where S is split.
  time     per call: ``iters`` calls back to back after ``warmup`` untimed ones and a barrier, then a device sync;
           the slowest rank's time (nccl-tests' ``-a 3``; its default ``-a 1`` averages ranks, also reported).
  algbw    S / time.
  busbw    algbw x factor: all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all (n-1)/n, broadcast 1 —
           per-rank wire bytes / time, comparable with a link's peak independently of n (volume.busbw_factor).
GB/s is 1e9 bytes per second, as in nccl-tests. all_reduce and broadcast run in place, the others out of place.
``ring_all_reduce`` (our send/recv ring, ring.py) can be benchmarked next to the library's all_reduce.
"""
from __future__ import annotations

import argparse
import re
import sys
import time

from coursekit.comm.volume import busbw_factor

# name -> the collective whose size convention and bus-bandwidth factor it follows
OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
       "all_to_all": "all_to_all", "broadcast": "broadcast", "ring_all_reduce": "all_reduce"}
DEFAULT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """'64M' -> 67108864 (binary units, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", str(text).upper())
    if not m:
        raise ValueError(f"bad size {text!r}; use a byte count like 4096, 4K, 64M or 1G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_sizes(spec, factor: int = 2) -> list[int]:
    """'1K..64M' -> 1K, 2K, … 64M (x ``factor`` each step, like nccl-tests -b/-e/-f); '1K,1M' -> those two."""
    if not isinstance(spec, str):
        return [int(s) if not isinstance(s, str) else parse_size(s) for s in spec]
    if ".." in spec:
        lo, hi = (parse_size(s) for s in spec.split(".."))
        if lo < 1 or hi < lo or factor < 2:
            raise ValueError(f"bad size range {spec!r} (need 1 <= lo <= hi) or factor {factor} (need >= 2)")
        out = [lo]
        while out[-1] * factor <= hi:
            out.append(out[-1] * factor)
        return out
    return [parse_size(s) for s in spec.split(",") if s.strip()]


def _make(op: str, size: int, n: int, dtype, device):
    """Buffers for one (op, size) and a zero-argument function that issues the collective once."""
    import torch
    import torch.distributed as dist

    from coursekit.comm.ring import ring_all_reduce

    esize = torch.empty((), dtype=dtype).element_size()
    count = size // esize
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count -= count % n  # S must split into n equal pieces
    if count < n:
        raise ValueError(f"size {size} B is too small for {op} on {n} ranks in {dtype}")
    # zeros: a sum of zeros stays finite however many iterations run; the links move the same bytes either way
    full = torch.zeros(count, dtype=dtype, device=device)
    part = torch.zeros(count // n, dtype=dtype, device=device)
    out = torch.empty_like(full)  # allocated once: the timed loop measures communication only
    calls = {
        "all_reduce": lambda: dist.all_reduce(full),
        "ring_all_reduce": lambda: ring_all_reduce(full),
        "broadcast": lambda: dist.broadcast(full, src=0),
        "all_gather": lambda: dist.all_gather_into_tensor(full, part),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
        "all_to_all": lambda: dist.all_to_all_single(out, full),
    }
    return count, count * esize, calls[op]


def measure(op: str, size: int, *, iters: int, warmup: int, info, dtype) -> dict:
    """One row: time and bandwidths of ``op`` at ``size`` bytes, agreed on by all ranks."""
    import torch
    import torch.distributed as dist

    device = torch.device(info.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    n = info.world_size
    count, nbytes, call = _make(op, size, n, dtype, device)
    for _ in range(warmup):
        call()
    sync(device)
    dist.barrier()  # start the clock together, not while a slow rank is still warming up
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    sync(device)  # NCCL calls only enqueue work on the GPU stream
    dt = (time.perf_counter() - t0) / iters
    t_max = torch.tensor([dt], dtype=torch.float64, device=device)
    t_sum = t_max.clone()
    dist.all_reduce(t_max, op=dist.ReduceOp.MAX)
    dist.all_reduce(t_sum)
    t_max, t_avg = t_max.item(), t_sum.item() / n
    algbw = nbytes / t_max / 1e9
    return {"op": op, "size": nbytes, "count": count, "dtype": str(dtype).removeprefix("torch."), "world_size": n,
            "backend": info.backend, "time_us": t_max * 1e6, "time_us_avg": t_avg * 1e6, "algbw": algbw,
            "busbw": algbw * busbw_factor(OPS[op], n)}


def format_table(rows) -> str:
    head = f"{'op':>16} {'n':>3} {'size (B)':>11} {'count':>10} {'time (us)':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['op']:>16} {r['world_size']:>3} {r['size']:>11} {r['count']:>10} {r['time_us']:>11.1f} "
                     f"{r['algbw']:>11.3f} {r['busbw']:>11.3f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="python -m coursekit.comm.bench", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma list of: {', '.join(OPS)}")
    p.add_argument("--sizes", default="1K..64M", help="'LO..HI' (x --factor each step) or a comma list; K/M/G")
    p.add_argument("--factor", type=int, default=2, help="size multiplier between steps of a LO..HI range")
    p.add_argument("--iters", type=int, default=20, help="timed calls per size (nccl-tests -n)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per size (nccl-tests -w)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "int32"))
    p.add_argument("--quiet", action="store_true", help="no table on rank 0")
    return p


def _validate(ops, iters: int, warmup: int) -> None:
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ValueError(f"unknown ops {bad or ops}; choose from {', '.join(OPS)}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got {iters} and {warmup}")


def main(argv=None) -> int:
    import torch

    from coursekit import dist as ckdist
    from coursekit.launch import report

    args = build_parser().parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    try:
        _validate(ops, args.iters, args.warmup)
        sizes = parse_sizes(args.sizes, args.factor)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    with ckdist.session() as info:
        rows = [measure(op, s, iters=args.iters, warmup=args.warmup, info=info, dtype=dtype)
                for op in ops for s in sizes]
        if info.is_main and not args.quiet:
            print(format_table(rows), flush=True)
        report({"rank": info.rank, "world_size": info.world_size, "device": info.device, "rows": rows})
    return 0


def run_benchmark(nproc: int = 4, ops=DEFAULT_OPS, sizes="1K..64M", *, factor: int = 2, iters: int = 20,
                  warmup: int = 5, dtype: str = "float32", timeout: float | None = 600, stream: bool = False,
                  env: dict | None = None) -> list[dict]:
    """Launch the benchmark on ``nproc`` processes (``coursekit.launch``) and return rank 0's rows.

    Every row: op, size (bytes, nccl-tests convention), count, dtype, world_size, backend, time_us (slowest
    rank), time_us_avg, algbw and busbw (GB/s). The rows are the same on every rank (times are all-reduced).
    """
    from coursekit.launch import launch

    ops = ops.split(",") if isinstance(ops, str) else list(ops)
    _validate(ops, iters, warmup)  # before anything is launched
    sizes = ",".join(str(s) for s in parse_sizes(sizes, factor))
    args = ["--ops", ",".join(ops), "--sizes", sizes, "--iters", iters, "--warmup", warmup, "--dtype", dtype,
            "--quiet"]
    res = launch("coursekit.comm.bench", args, nproc=nproc, timeout=timeout, stream=stream, env=env)
    return res.results[0]["rows"]


def plot_busbw(rows, path, title: str | None = None) -> str:
    """Bus bandwidth against size, one line per (op, world size); saved to ``path`` (PNG/SVG/PDF by suffix)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's chosen backend alone

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    styles = ["-", "--", ":", "-."]
    worlds = sorted({r["world_size"] for r in rows})
    for j, op in enumerate(dict.fromkeys(r["op"] for r in rows)):  # colour = op, line style = world size
        for i, n in enumerate(worlds):
            pts = sorted((r["size"], r["busbw"]) for r in rows if r["op"] == op and r["world_size"] == n)
            if pts:
                ax.plot(*zip(*pts), styles[i % len(styles)], color=f"C{j % 10}", marker="o", ms=3,
                        label=f"{op} (n={n})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size S (bytes, nccl-tests convention)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title or f"busbw per collective ({rows[0]['backend'] if rows else ''})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # results reported: skip the interpreter's slow teardown
