"""Measure this machine for the planner (imports torch): matmul rates, memory bandwidth, per-op overhead, and the
collectives' latency and bus bandwidth through ``coursekit.comm.bench``.

    hw, net = measure_host(nproc=2)           # a Hardware ("cpu-measured") and a Network, ready for predict()
    hw, net = host_hardware([measure_compute(), ...], measure_collectives(2))   # rates around a run, averaged

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
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from coursekit.plan import steptime
from coursekit.spec import registry
from coursekit.plan.hardware import HBM_FRACTION, Hardware, Network, collectives_from_rows


def _sustained(fn, reps: int = 3, window: float = 0.15) -> float:
    """Seconds per call, sustained: each of ``reps`` trials runs ``fn`` for at least ``window`` seconds (about a
    training step), and the median trial counts. On a shared CPU this sees the same contention as a step does; the
    best of short trials would see an idle core."""
    import statistics

    trials = []
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= window:
                break
        trials.append(dt / n)
    return statistics.median(trials)


def matmul_rate(n: int, *, reps: int = 3, dtype=None) -> float:
    """FLOP/s of an n x n x n matmul on this process's threads (sustained, see ``_sustained``)."""
    import torch

    a = torch.randn(n, n, dtype=dtype or torch.float32)
    b = torch.randn(n, n, dtype=dtype or torch.float32)
    return 2 * n ** 3 / _sustained(lambda: a @ b, reps)


def memory_bandwidth(nbytes: int = 64 * 2**20, reps: int = 3) -> float:
    """Bytes/s of an out-of-place add over three ``nbytes`` arrays."""
    import torch

    n = nbytes // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
    return 3 * nbytes / _sustained(lambda: torch.add(a, b, out=c), reps)


def op_overhead(reps: int = 3) -> float:
    """Seconds per aten op of transformers' eager module code: forward + backward of a 2-layer, 16-wide Llama on 8
    tokens (its arithmetic is negligible), divided by the aten ops a TorchDispatchMode counts in it. This dispatch,
    autograd and Python overhead, not the arithmetic, is what a tiny model's step is made of on a CPU; the planner
    charges it per counted op (steptime.OPS_PER_LAYER) as the kernel floor."""
    step, n = _op_overhead_model()
    return _sustained(step, reps) / n


@lru_cache(maxsize=1)
def _op_overhead_model():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from coursekit.models import build_model

    cfg = {"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
           "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 16}
    model = build_model(cfg, seed=0)
    ids = torch.arange(8).unsqueeze(0)

    def step():
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _Count.n += 1
            return func(*args, **(kwargs or {}))

    step()  # first call builds caches
    with _Count():
        step()
    return step, _Count.n


def measure_compute(big: int = 512, small: int = 64) -> dict:
    """Compute figures of this process on the trainer's thread count: matmul rates at ``big`` and ``small``,
    memory bandwidth, per-op overhead (with ``time_s``, when they were taken)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        return {"big": big, "small": small, "r_big": matmul_rate(big), "r_small": matmul_rate(small),
                "mem": memory_bandwidth(), "floor": op_overhead(), "time_s": time.time()}
    finally:
        torch.set_num_threads(threads)


def measure_collectives(nproc: int = 2, *, sizes: str = "16K..4M", iters: int = 5, timeout: float = 300) -> dict:
    """{op: (alpha_s, busbw)} fitted to a coursekit.comm.bench run on ``nproc`` processes."""
    from coursekit.comm.bench import run_benchmark

    rows = run_benchmark(nproc=nproc, ops=("all_reduce", "all_gather", "reduce_scatter", "broadcast"), sizes=sizes,
                         factor=4, iters=iters, warmup=2, timeout=timeout)
    coll = collectives_from_rows(rows)
    coll.setdefault("send", coll.get("broadcast"))  # a 2-rank broadcast is one send
    return coll


def host_hardware(compute: dict | list, coll: dict, nproc: int = 2, *, zero3: dict | None = None,
                  dtensor: dict | None = None) -> tuple[Hardware, Network]:
    """A Hardware and Network from measured figures; a list of ``measure_compute`` results is averaged (e.g. one
    taken before and one after a run, when the machine is shared). ``zero3`` / ``dtensor``: results of
    ``coursekit.plan.calibrate``, whose costs in plain ops are rescaled by this run's per-op overhead (host work
    slows with the load as eager ops do); without them the Hardware defaults stay."""
    import psutil

    cs = compute if isinstance(compute, list) else [compute]
    c = {k: sum(x[k] for x in cs) / len(cs) for k in ("r_big", "r_small", "mem", "floor")}
    big, small = cs[0]["big"], cs[0]["small"]
    # solve (s / (s + h))^3 / (B / (B + h))^3 = r_small / r_big for the half dimension h (bisection)
    ratio, lo, hi = min(c["r_small"] / c["r_big"], 0.999), 0.0, 1e5
    for _ in range(100):
        h = (lo + hi) / 2
        lo, hi = (h, hi) if ((small / (small + h)) / (big / (big + h))) ** 3 > ratio else (lo, h)
    alpha_ar, bw_ar = coll["all_reduce"]
    hw = Hardware(name="cpu-measured", memory_bytes=psutil.virtual_memory().total // nproc,
                  peak_flops={"fp32": c["r_big"] / (big / (big + h)) ** 3},
                  hbm_bw=c["mem"] / HBM_FRACTION, link_bw=bw_ar, link_fraction=1.0, link_latency_s=alpha_ar,
                  hop_latency_s=0.0, gemm_fraction=1.0, gemm_half_dim=max(1, round(h)), attn_fraction=0.5,
                  kernel_floor_s=c["floor"], overlap=0.0, optimizer_ops_per_tensor=steptime.OPT_OPS_PER_TENSOR,
                  loss_sync=True,
                  zero3_hook_s=zero3["per_tensor_ops"] * c["floor"] if zero3 else Hardware.zero3_hook_s,
                  dtensor_op_s=dtensor["per_op_ops"] * c["floor"] if dtensor else Hardware.dtensor_op_s,
                  dtensor_opt_op_s=dtensor["per_opt_op_ops"] * c["floor"] if dtensor else Hardware.dtensor_opt_op_s,
                  collectives=coll,
                  source=f"measured here: matmul {big}^3 {c['r_big'] / 1e9:.1f} GFLOP/s, {small}^3 "
                         f"{c['r_small'] / 1e9:.1f}; add {c['mem'] / 1e9:.1f} GB/s; {c['floor'] * 1e6:.1f} us/op; "
                         f"gloo all_reduce {bw_ar / 1e9:.2f} GB/s")
    net = Network(name="none", bw_per_gpu=bw_ar, fraction=1.0, latency_s=alpha_ar, collectives=coll,
                  source="single host: every group is inside the node")
    return hw, net


def measure_host(nproc: int = 2, **bench) -> tuple[Hardware, Network]:
    """Measure compute here (this process, the trainer's thread count) and gloo collectives on ``nproc``
    processes; ``bench``: sizes, iters, timeout for the collectives benchmark."""
    return host_hardware(measure_compute(), measure_collectives(nproc, **bench), nproc)


# -- the course's own runs as planner layouts ---------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TrainerRun:
    """One ``coursekit train`` run on this machine, and the planner Layout of the same run.

    ``strategy`` is the trainer's (single, ddp, zero1-3, fsdp2, hsdp); tp / pp / cp are its degrees; ``dp_shard``
    (hsdp only) the sharding group, the rest replicas; ``grad_accum`` the micro-batches per step (the pipeline's
    micro-batches under pp); ``sp`` sequence parallelism with tp (the trainer's --sp; off by default, as there)."""
    strategy: str
    nproc: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp_shard: int | None = None
    grad_accum: int = 1
    sp: bool = False
    pp_schedule: str = "1f1b"
    cp_impl: str = "ring"

    @property
    def dp(self) -> int:
        return self.nproc // (self.tp * self.pp * self.cp)

    def degrees(self) -> dict:
        """The parallelisms this run switches on: its fields that are registry entries, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in registry.PARALLELISMS and getattr(self, f.name) > 1}

    @property
    def name(self) -> str:
        extra = "".join(f" {k}{v}" for k, v in self.degrees().items())
        return f"{self.strategy}{extra}{' sp' if self.sp and self.tp > 1 else ''} x{self.nproc}"

    def args(self, *, model: str, seq: int, global_batch: int) -> list[str]:
        """``coursekit train`` arguments of this run: its RunSpec's (``RunSpec.trainer_argv``)."""
        return replace(self.spec(global_batch), model=model, seq=seq).trainer_argv()

    def spec(self, global_batch: int | None = None):
        """This run's description (``coursekit.spec.runspec.RunSpec``)."""
        from coursekit.spec.runspec import RunSpec

        return RunSpec(strategy=self.strategy, world=self.nproc, degrees=self.degrees(), grad_accum=self.grad_accum,
                       dp_shard=self.dp_shard if self.strategy == "hsdp" else None, global_batch=global_batch,
                       sp=self.sp, pp_schedule=self.pp_schedule, cp_impl=self.cp_impl)

    def layout(self, global_batch: int):
        """The planner's Layout of the same run (``Layout.from_spec``)."""
        from coursekit.plan.layout import Layout

        return Layout.from_spec(self.spec(global_batch))


def trainer_layout(strategy: str, nproc: int, micro_batch: int):
    """The planner Layout of a plain data-parallel ``coursekit train --strategy S`` run (see TrainerRun)."""
    return TrainerRun(strategy=strategy, nproc=nproc).layout(micro_batch * nproc)


def run_trainer(run, nproc: int | None = None, *, model: str, seq: int, global_batch: int, steps: int = 6,
                timeout: float = 300, extra=(), on_step=None) -> dict:
    """Run the course trainer (``run``: a TrainerRun, or a strategy name with ``nproc``); returns
    {"step_time_s": median over steps after the first, "steps": [...], "final": rank 0's final record}.
    ``on_step()`` is called when rank 0 reports each step."""
    import statistics

    from coursekit.launch import launch

    if isinstance(run, str):
        run = TrainerRun(strategy=run, nproc=nproc)

    def on_line(line: str) -> bool:  # the per-step progress lines: to on_step, not to the terminal
        if line.startswith("[rank 0] step {"):
            on_step()
            return True
        return False

    res = launch("coursekit.train", [*([] if on_step else ["--quiet"]), *run.args(model=model, seq=seq,
                                     global_batch=global_batch), "--steps", str(steps), *extra],
                 nproc=run.nproc, timeout=timeout, on_line=on_line if on_step else None)
    times = [s["step_time_s"] for s in res.results[0]["steps"]]
    return {"step_time_s": statistics.median(times[1:] or times), "steps": times, "final": res.results[0]["final"]}


def run_measured(run, *, model: str, seq: int, global_batch: int, steps: int = 10, timeout: float = 300,
                 extra=(), cores: int | None = None) -> tuple[dict, list[dict]]:
    """``run_trainer`` and this machine's compute figures (``measure_compute``) as the run saw them.

    With a core to spare (the run's processes fewer than ``cores``, default ``os.cpu_count()``), a thread of this
    process takes the figures over and over from the first step on: those whose interval overlaps the timed steps
    (the nearest one if none does), the machine as the run's processes saw it (on a shared CPU the load moves by the
    minute, and a launch spends most of its time importing before its few seconds of steps). Without one, once just
    before the launch and once just after it: a sampler on the ranks' own cores slowed the run it measured (2 ranks
    on 2 cores: DDP's step 14.8 -> 23.5 ms, CP's 24 -> 59 ms, every collective waiting until both ranks got a core
    back), while the rates it read moved the prediction by a few per cent."""
    import threading

    _op_overhead_model()  # build it now (imports transformers), not in the middle of the steps
    if run.nproc >= (cores or os.cpu_count() or 1):
        before = measure_compute()
        out = run_trainer(run, model=model, seq=seq, global_batch=global_batch, steps=steps, timeout=timeout,
                          extra=extra)
        return out, [before, measure_compute()]
    samples, stop, started = [], threading.Event(), threading.Event()

    def loop():
        started.wait()
        while not stop.is_set():
            t0 = time.time()
            samples.append((t0, measure_compute()))

    th = threading.Thread(target=loop, daemon=True)
    t_launch = time.time()
    th.start()
    try:
        out = run_trainer(run, model=model, seq=seq, global_batch=global_batch, steps=steps, timeout=timeout,
                          extra=extra, on_step=started.set)
    finally:
        stop.set()
        started.set()
        th.join()
    if not samples:  # the steps ended before the thread's first sample began: one now, as close as it gets
        samples.append((time.time(), measure_compute()))
    a = t_launch + out["final"]["first_step_after_s"]
    b = a + sum(out["steps"][1:])
    hits = [c for t0, c in samples if c["time_s"] >= a and t0 <= b]
    return out, hits or [min((c for _, c in samples), key=lambda c: abs(c["time_s"] - (a + b) / 2))]
