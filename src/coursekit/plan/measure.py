"""Measure this machine for the planner (imports torch): matmul rates, memory bandwidth, per-op overhead, and the
collectives' latency and bus bandwidth through ``coursekit.comm.bench``.

    hw, net = measure_host(nproc=2)           # a Hardware ("cpu-measured") and a Network, ready for predict()

What each figure is, and why (the planner's fields, coursekit.plan.hardware):
  peak_flops    the fp32 rate of a large square GEMM on one thread (the trainer's workers run OMP_NUM_THREADS=1),
                so gemm_fraction = 1; gemm_half_dim is solved from a second, small GEMM's rate on the same curve.
  hbm_bw        a large out-of-place add (3 arrays' bytes / time), divided by HBM_FRACTION so that memory-bound
                terms reproduce what was measured.
  kernel_floor  one small autograd op, forward + backward, per kernel: on a CPU, eager dispatch dominates a tiny
                model and is paid on every op.
  collectives   per-op (alpha, busbw) fitted to the benchmark's rows (hardware.fit_alpha_beta): gloo here.
  overlap = 0   gloo's communication threads run on the same cores as the compute, so no overlap window is usable.
"""
from __future__ import annotations

import os
import time

from coursekit.plan.hardware import HBM_FRACTION, Hardware, Network, collectives_from_rows


def _best(fn, reps: int, inner: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def matmul_rate(n: int, *, reps: int = 5, dtype=None) -> float:
    """FLOP/s of an n x n x n matmul on this process's threads (best of ``reps``)."""
    import torch

    a = torch.randn(n, n, dtype=dtype or torch.float32)
    b = torch.randn(n, n, dtype=dtype or torch.float32)
    inner = max(1, int(2e8 // (2 * n ** 3)))
    return 2 * n ** 3 / _best(lambda: a @ b, reps, inner)


def memory_bandwidth(nbytes: int = 64 * 2**20, reps: int = 5) -> float:
    """Bytes/s of an out-of-place add over three ``nbytes`` arrays."""
    import torch

    n = nbytes // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
    return 3 * nbytes / _best(lambda: torch.add(a, b, out=c), reps, 3)


def op_overhead(n_ops: int = 200, reps: int = 5) -> float:
    """Seconds per kernel of a chain of tiny autograd ops (forward and backward kernels counted separately)."""
    import torch

    x = torch.ones(16, requires_grad=True)

    def chain():
        y = x
        for _ in range(n_ops):
            y = y * 1.0001
        y.sum().backward()

    return _best(chain, reps, 1) / (2 * n_ops)


def measure_host(nproc: int = 2, *, sizes: str = "16K..4M", iters: int = 5, timeout: float = 300,
                 big: int = 512, small: int = 64) -> tuple[Hardware, Network]:
    """Measure compute here (in this process, one thread) and gloo collectives on ``nproc`` processes."""
    import psutil
    import torch

    from coursekit.comm.bench import run_benchmark

    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        peak, r_small = matmul_rate(big), matmul_rate(small)
        mem = memory_bandwidth()
        floor = op_overhead()
    finally:
        torch.set_num_threads(threads)
    # solve (s / (s + h))^3 / (B / (B + h))^3 = r_small / peak for the half dimension h (bisection)
    ratio, lo, hi = min(r_small / peak, 0.999), 0.0, 1e5
    for _ in range(100):
        h = (lo + hi) / 2
        lo, hi = (h, hi) if ((small / (small + h)) / (big / (big + h))) ** 3 > ratio else (lo, h)
    rows = run_benchmark(nproc=nproc, ops=("all_reduce", "all_gather", "reduce_scatter", "broadcast"), sizes=sizes,
                         factor=4, iters=iters, warmup=2, timeout=timeout)
    coll = collectives_from_rows(rows)
    coll.setdefault("send", coll.get("broadcast"))  # a 2-rank broadcast is one send
    alpha_ar, bw_ar = coll["all_reduce"]
    big_bw = peak / (big / (big + h)) ** 3
    hw = Hardware(name="cpu-measured", memory_bytes=psutil.virtual_memory().total // nproc,
                  peak_flops={"fp32": big_bw},
                  hbm_bw=mem / HBM_FRACTION, link_bw=bw_ar, link_fraction=1.0, link_latency_s=alpha_ar,
                  hop_latency_s=0.0, gemm_fraction=1.0, gemm_half_dim=max(1, round(h)), attn_fraction=0.5,
                  kernel_floor_s=floor, overlap=0.0, optimizer_ops_per_tensor=10, loss_sync=True, collectives=coll,
                  source=f"measured here: matmul {big}^3 {peak / 1e9:.1f} GFLOP/s, {small}^3 {r_small / 1e9:.1f}; "
                         f"add {mem / 1e9:.1f} GB/s; {floor * 1e6:.1f} us/op; gloo all_reduce {bw_ar / 1e9:.2f} GB/s")
    net = Network(name="none", bw_per_gpu=bw_ar, fraction=1.0, latency_s=alpha_ar, collectives=coll,
                  source="single host: every group is inside the node")
    return hw, net


# -- the course's own runs as planner layouts ---------------------------------------------------------------------
def trainer_layout(strategy: str, nproc: int, micro_batch: int):
    """The planner Layout of a ``coursekit train --strategy S`` run on ``nproc`` processes (data parallel only
    today; TP / PP / FSDP2 rows are one more entry each when the trainer runs them on CPU)."""
    from coursekit.plan.layout import Layout

    if strategy == "single":
        if nproc != 1:
            raise ValueError("strategy single runs on one process")
        return Layout(micro_batch=micro_batch)
    if strategy == "ddp":
        return Layout(dp_replicate=nproc, micro_batch=micro_batch)
    if strategy in ("zero1", "zero2", "zero3"):
        return Layout(dp_replicate=nproc, engine="deepspeed", zero=int(strategy[-1]), micro_batch=micro_batch)
    raise ValueError(f"no planner layout for trainer strategy {strategy!r} yet")


def run_trainer(strategy: str, nproc: int, *, model: str, seq: int, global_batch: int, steps: int = 6,
                timeout: float = 300) -> dict:
    """Run the course trainer; returns {"step_time_s": median over steps after the first, "steps": [...]}."""
    import statistics

    from coursekit.launch import launch

    res = launch("coursekit.train", ["--quiet", "--strategy", strategy, "--model", model, "--seq", str(seq),
                                     "--global-batch", str(global_batch), "--steps", str(steps)],
                 nproc=nproc, timeout=timeout)
    times = [s["step_time_s"] for s in res.results[0]["steps"]]
    return {"step_time_s": statistics.median(times[1:] or times), "steps": times, "final": res.results[0]["final"]}
