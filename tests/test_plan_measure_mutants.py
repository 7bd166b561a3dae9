"""``coursekit.plan.measure`` without a launch: the course's runs as trainer arguments and planner layouts
(``TrainerRun``), the Hardware / Network built from measured figures (``host_hardware``, worked by hand), the
timing loop on a fake clock, each rate's arithmetic around a stubbed timer, and how the launching functions
(``measure_collectives``, ``run_trainer``, ``run_measured``) call what they wrap and read its answer (stubbed: the
real launches are tests/test_plan.py's slow tier). One process, no launch; written against the mutation survivors
of bench/bench_mutation.py plan.measure."""
from __future__ import annotations

import statistics
import threading
import types
from dataclasses import replace

import pytest

from coursekit.plan import measure, steptime
from coursekit.plan.hardware import HBM_FRACTION, Hardware, Network
from coursekit.plan.layout import Layout
from coursekit.plan.measure import TrainerRun, host_hardware, trainer_layout
from coursekit.spec.runspec import RunSpec


# -- the course's runs as trainer arguments and planner layouts ------------------------------------------------------
def test_a_trainer_runs_degrees_name_and_data_parallel_degree():
    """degrees: the registry's parallelisms above 1, in field order (tp, pp, cp); the name adds each as
    ``tpN`` and ' sp' only under tp > 1; dp = nproc / (tp x pp x cp), a whole number. Catches > 1 -> >= 1, the
    registry filter inverted, the name's parts, and the degree product's operators."""
    r = TrainerRun(strategy="ddp", nproc=16, tp=2, pp=2, cp=2)
    assert list(r.degrees().items()) == [("tp", 2), ("pp", 2), ("cp", 2)]
    assert r.dp == 2 and type(r.dp) is int  # 16 / (2 x 2 x 2)
    assert TrainerRun(strategy="ddp", nproc=8, pp=4).dp == 2  # 8 / 4: pp counts (not tp / pp)
    assert TrainerRun(strategy="ddp", nproc=2).degrees() == {}
    assert TrainerRun(strategy="ddp", nproc=2).name == "ddp x2"
    assert r.name == "ddp tp2 pp2 cp2 x16"
    assert TrainerRun(strategy="fsdp2", nproc=4, tp=2, sp=True).name == "fsdp2 tp2 sp x4"
    assert TrainerRun(strategy="ddp", nproc=2, sp=True).name == "ddp x2"  # sp without tp: not named


def test_a_trainer_runs_spec_arguments_and_layout():
    """spec(): the RunSpec of the same run (its world, degrees, accumulation, schedule, CP kernel, sp; dp_shard only
    for hsdp); args(): that RunSpec's trainer arguments with the model and sequence (RunSpec.trainer_argv: what
    differs from the trainer's defaults, --seq always); layout(): its planner Layout. Catches a field dropped on the
    way (RunSpec's own defaults differ: pp_schedule gpipe) and the hsdp condition."""
    r = TrainerRun(strategy="hsdp", nproc=4, dp_shard=2, grad_accum=2, cp_impl="ulysses", sp=True,
                   pp_schedule="gpipe")
    assert r.spec(8) == RunSpec(strategy="hsdp", world=4, degrees={}, grad_accum=2, dp_shard=2, global_batch=8,
                                sp=True, pp_schedule="gpipe", cp_impl="ulysses")
    assert TrainerRun(strategy="ddp", nproc=2).spec() == RunSpec(strategy="ddp", world=2, pp_schedule="1f1b")
    assert TrainerRun(strategy="ddp", nproc=2, dp_shard=2).spec().dp_shard is None  # not hsdp: not passed
    assert TrainerRun(strategy="ddp", nproc=4, tp=2, sp=True).args(model="llama3-8b", seq=32, global_batch=8) == [
        "--model", "llama3-8b", "--strategy", "ddp", "--tp", "2", "--seq", "32", "--global-batch", "8", "--sp"]
    assert TrainerRun(strategy="ddp", nproc=2, pp=2, grad_accum=4).args(model="tiny-llama", seq=64,
                                                                         global_batch=8) == [
        "--model", "tiny-llama", "--strategy", "ddp", "--pp", "2", "--seq", "64", "--global-batch", "8",
        "--grad-accum", "4", "--pp-schedule", "1f1b"]
    # 8 sequences over 2 replicas, one micro-batch each step: micro-batch 4; the trainer's sp default (off)
    assert TrainerRun(strategy="ddp", nproc=2).layout(8) == Layout(dp_replicate=2, micro_batch=4, sp=False)
    assert TrainerRun(strategy="ddp", nproc=2, grad_accum=2).layout(8) == Layout(dp_replicate=2, micro_batch=2,
                                                                                 sp=False)
    # trainer_layout: micro_batch x nproc sequences a step, one micro-batch per rank
    assert trainer_layout("zero2", 2, 3) == Layout(dp_replicate=2, micro_batch=3, engine="deepspeed", zero=2,
                                                   sp=False)
    assert trainer_layout("fsdp2", 4, 1) == Layout(dp_shard=4, micro_batch=1, engine="fsdp2", sp=False)


# -- the Hardware and Network of measured figures --------------------------------------------------------------------
def _compute(r_big, r_small, mem, floor, big=512, small=64):
    return {"big": big, "small": small, "r_big": r_big, "r_small": r_small, "mem": mem, "floor": floor, "time_s": 0.0}


@pytest.fixture
def memory(monkeypatch):
    import psutil

    total = 2**31 + 1  # odd: nproc 2 floors it
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=total))
    return total


COLL = {"all_reduce": (50e-6, 2e9), "send": (20e-6, 3e9)}


def test_host_hardware_from_two_samples_worked_by_hand(memory):
    """Two samples averaged: r_big (400, 624) -> 512 GFLOP/s, r_small -> 512 x 729/4096 = 91.125, add 7 GB/s,
    30 us/op. The half dimension h solves ((64 / (64 + h)) / (512 / (512 + h)))^3 = 729/4096: h = 64 (0.5 / (8/9) =
    9/16, cubed); the peak is r_big / (512 / 576)^3 = 512e9 x 729/512 = 729e9 FLOP/s. The rest as the docstring lists:
    gemm_fraction 1, hbm = mem / HBM_FRACTION, the all-reduce's fit as the link, overlap 0, the trainer's loss sync,
    the calibrations' defaults without them; the network the same link, one host. Catches each field's value, the
    averaging, the bisection's direction and bounds, memory // nproc."""
    rs = 512e9 * 729 / 4096
    hw, net = host_hardware([_compute(400e9, rs - 10e9, 6e9, 20e-6), _compute(624e9, rs + 10e9, 8e9, 40e-6)], COLL, 2)
    assert hw.peak_flops["fp32"] == pytest.approx(729e9, rel=1e-9) and list(hw.peak_flops) == ["fp32"]
    assert hw.gemm_half_dim == 64 and type(hw.gemm_half_dim) is int
    assert hw.kernel_floor_s == pytest.approx(30e-6, rel=1e-12)
    assert replace(hw, peak_flops={}, kernel_floor_s=0.0) == Hardware(
        name="cpu-measured", memory_bytes=2**30, peak_flops={}, hbm_bw=7e9 / HBM_FRACTION, link_bw=2e9,
        link_fraction=1.0, link_latency_s=50e-6, hop_latency_s=0.0, gemm_fraction=1.0, gemm_half_dim=64,
        attn_fraction=0.5, kernel_floor_s=0.0, overlap=0.0, optimizer_ops_per_tensor=steptime.OPT_OPS_PER_TENSOR,
        loss_sync=True, zero3_hook_s=Hardware.zero3_hook_s, dtensor_op_s=Hardware.dtensor_op_s,
        dtensor_opt_op_s=Hardware.dtensor_opt_op_s, collectives=COLL,
        source="measured here: matmul 512^3 512.0 GFLOP/s, 64^3 91.1; add 7.0 GB/s; 30.0 us/op; gloo all_reduce "
               "2.00 GB/s")
    assert net == Network(name="none", bw_per_gpu=2e9, fraction=1.0, latency_s=50e-6, collectives=COLL,
                          source="single host: every group is inside the node")


def test_host_hardware_one_sample_the_calibrations_and_a_flat_gemm_curve(memory):
    """One sample (not a list); nproc 3 shares the memory three ways; the calibrations' costs in plain ops times this
    run's per-op cost (170 x 30 us = 5.1 ms per tensor, 10 and 4 x 30 us per DTensor op). A small GEMM as fast as
    the big one (ratio >= 1) is read as 0.999: then (512 + h) / (8 (64 + h)) = c = 0.999^(1/3), h = 512 (1 - c) /
    (8c - 1) ~ 0.024, so the curve's half dimension rounds to 0 and is held at 1, and the peak is r_big x
    ((512 + h) / 512)^3. Catches the 0.999 cap and the at-least-1 floor, the calibrations' products and defaults."""
    one = _compute(512e9, 512e9, 7e9, 30e-6)
    hw, _ = host_hardware(one, COLL, 3, zero3={"per_tensor_ops": 170.0},
                          dtensor={"per_op_ops": 10.0, "per_opt_op_ops": 4.0})
    assert hw.memory_bytes == (2**31 + 1) // 3
    assert (hw.zero3_hook_s, hw.dtensor_op_s, hw.dtensor_opt_op_s) == pytest.approx((5.1e-3, 300e-6, 120e-6))
    c = 0.999 ** (1 / 3)
    h = 512 * (1 - c) / (8 * c - 1)
    assert 0.02 < h < 0.03 and hw.gemm_half_dim == 1
    assert hw.peak_flops["fp32"] == pytest.approx(512e9 * ((512 + h) / 512) ** 3, rel=1e-9)
    faster, _ = host_hardware(_compute(512e9, 768e9, 7e9, 30e-6), COLL, 3)  # above 1: the same cap
    assert faster.peak_flops["fp32"] == pytest.approx(512e9 * ((512 + h) / 512) ** 3, rel=1e-9)


def test_host_hardwares_defaults_and_its_sources_figures_rounded(memory):
    """Two processes by default (the memory halved); the source's figures in GFLOP/s, GB/s and us, one decimal (two
    for the link): 2.75 -> 2.8, 0.75 -> 0.8, 2.7499999 -> 2.7, 2.375 -> 2.38 (exact halves round to even). Catches
    the nproc default and each unit's scale (a scale off by one part in 10^9 moves these across a rounding edge)."""
    hw, _ = host_hardware(_compute(2.75e9, 0.75e9, 2.75e9, 2.7499999e-6), {"all_reduce": (1e-5, 2.375e9)})
    assert hw.memory_bytes == 2**30
    assert hw.source == ("measured here: matmul 512^3 2.8 GFLOP/s, 64^3 0.8; add 2.8 GB/s; 2.7 us/op; gloo all_reduce "
                         "2.38 GB/s")


def test_measure_host_measures_here_and_on_nproc_processes(memory, monkeypatch):
    """measure_host: this process's figures, the collectives on ``nproc`` processes with the benchmark's options,
    the memory shared by nproc. Catches an argument dropped or nproc's default."""
    asked = []
    monkeypatch.setattr(measure, "measure_compute", lambda: _compute(512e9, 512e9 * 729 / 4096, 7e9, 30e-6))
    monkeypatch.setattr(measure, "measure_collectives", lambda nproc, **kw: asked.append((nproc, kw)) or COLL)
    hw, net = measure.measure_host()
    assert asked == [(2, {})] and hw.memory_bytes == 2**30 and hw.gemm_half_dim == 64 and net.collectives == COLL
    hw, _ = measure.measure_host(4, sizes="1K..2K", iters=2)
    assert asked[1] == (4, {"sizes": "1K..2K", "iters": 2}) and hw.memory_bytes == (2**31 + 1) // 4


def test_the_half_dimension_solves_the_ratio_of_other_sizes(memory):
    """big 1024, small 128, h = 128: (0.5 / (1024 / 1152))^3 = (9/16)^3 again; the peak r_big x (9/8)^3. Catches
    big and small not read from the sample."""
    hw, _ = host_hardware(_compute(512e9, 512e9 * 729 / 4096, 7e9, 30e-6, big=1024, small=128), COLL, 2)
    assert hw.gemm_half_dim == 128 and hw.peak_flops["fp32"] == pytest.approx(729e9, rel=1e-9)
    assert hw.source.startswith("measured here: matmul 1024^3 512.0 GFLOP/s, 128^3 91.1;")


# -- the timing loop and the rates ------------------------------------------------------------------------------------
class _Clock:
    """time.perf_counter / time.time that move only when told."""

    def __init__(self, t=0.0):
        self.t = t

    def now(self):
        return self.t


def test_sustained_runs_each_trial_for_the_window_and_takes_the_median(monkeypatch):
    """Each trial calls fn until at least ``window`` seconds passed (at exactly the window: stop), then counts
    elapsed / calls; the median trial is the answer. With a 1/8 s window the trials below take 2 calls of 1/16 s
    (exactly the window: stop), 1 of 1/2 and 4 of 1/32: 1/16, 1/2 and 1/32 per call, median 1/16. Catches >= -> >,
    the count, the median, reps and the window's default."""
    clock = _Clock()
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=clock.now))
    steps = iter([1 / 16, 1 / 16,  # trial 1: 2 calls reach 1/8 exactly -> 1/16 per call
                  1 / 2,  # trial 2: one call past the window -> 1/2
                  1 / 32, 1 / 32, 1 / 32, 1 / 32,  # trial 3: 4 calls -> 1/32
                  1 / 4])  # the next call's one trial: 1 call -> 1/4

    def fn():
        clock.t += next(steps)

    assert measure._sustained(fn, reps=3, window=1 / 8) == 1 / 16  # median of 1/16, 1/2, 1/32
    assert measure._sustained(fn, reps=1, window=1 / 8) == 1 / 4  # the fourth trial's one call
    clock2 = _Clock()
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=clock2.now))
    calls = []

    def tick():
        calls.append(1)
        clock2.t += 1 / 16

    assert measure._sustained(tick) == 1 / 16  # defaults: 3 trials of >= 0.15 s: 3 calls each (2/16 < 0.15 <= 3/16)
    assert len(calls) == 9


def timer_of(seen, seconds=0.5):
    def timer(fn, reps=3):
        seen["reps"], seen["result"] = reps, fn()
        return seconds

    return timer


def _stub_timer(monkeypatch, seconds=0.5):
    seen = {}
    monkeypatch.setattr(measure, "_sustained", timer_of(seen, seconds))
    return seen


def test_each_rate_is_its_work_over_the_sustained_time(monkeypatch):
    """matmul: 2 n^3 FLOPs of an n x n product (fp32 unless told); the add: 3 arrays of nbytes (nbytes / 4 floats,
    a + b = 2); the per-op cost: the step's time over its counted ops. Catches each formula and each default."""
    import torch

    seen = _stub_timer(monkeypatch)
    assert measure.matmul_rate(4) == 2 * 4**3 / 0.5
    assert seen["reps"] == 3 and seen["result"].shape == (4, 4) and seen["result"].dtype == torch.float32
    assert measure.matmul_rate(3, reps=5, dtype=torch.float64) == 2 * 27 / 0.5
    assert seen["reps"] == 5 and seen["result"].dtype == torch.float64
    assert measure.memory_bandwidth(64, reps=2) == 3 * 64 / 0.5
    assert seen["reps"] == 2 and seen["result"].tolist() == [2.0] * 16
    # out of place into the third array, allocated once: every call writes the same storage (no allocation timed)
    monkeypatch.setattr(measure, "_sustained", lambda fn, reps=3: seen.update(ptrs={fn().data_ptr() for _ in "ab"}) or 1)
    measure.memory_bandwidth(64)
    assert len(seen["ptrs"]) == 1
    monkeypatch.setattr(measure, "_sustained", timer_of(seen))
    assert measure.memory_bandwidth() == 3 * 64 * 2**20 / 0.5  # 64 MiB by default
    assert seen["reps"] == 3 and seen["result"].numel() == 16 * 2**20 and bool((seen["result"] == 2).all())
    monkeypatch.setattr(measure, "_op_overhead_model", lambda: ("step", 200))

    def timer(fn, reps=3):
        seen["fn"], seen["reps"] = fn, reps
        return 0.5

    monkeypatch.setattr(measure, "_sustained", timer)
    assert measure.op_overhead() == 0.5 / 200 and (seen["fn"], seen["reps"]) == ("step", 3)
    assert measure.op_overhead(reps=7) == 0.5 / 200 and seen["reps"] == 7


def test_measure_compute_takes_every_figure_on_the_trainers_thread_count(monkeypatch):
    """The rates at big and small, the add, the per-op cost and when they were taken, all on OMP_NUM_THREADS threads
    (default 1), the process's own count restored after. Catches the figures' keys, the thread count, the restore."""
    import torch

    threads = []
    monkeypatch.setattr(measure, "matmul_rate", lambda n: (threads.append(torch.get_num_threads()), n * 1e9)[1])
    monkeypatch.setattr(measure, "memory_bandwidth", lambda: 7e9)
    monkeypatch.setattr(measure, "op_overhead", lambda: 3e-5)
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(time=lambda: 123.0))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert measure.measure_compute() == {"big": 512, "small": 64, "r_big": 512e9, "r_small": 64e9, "mem": 7e9,
                                             "floor": 3e-5, "time_s": 123.0}
        assert threads == [1, 1] and torch.get_num_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert measure.measure_compute(big=256, small=32)["r_small"] == 32e9
        assert threads[2:] == [1, 1] and torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(1)
        measure.measure_compute()
        assert threads[4:] == [2, 2] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# -- what the launching functions hand on and read back -----------------------------------------------------------------
def _rows(op, alpha_us, bw, world=2):
    """Two rows of ``op`` on ``world`` ranks, time = alpha + size / bw (all_reduce and broadcast at 2 ranks: busbw
    factor 1, so the wire bytes are the size)."""
    return [{"op": op, "size": s, "world_size": world, "time_us": alpha_us + s / bw * 1e6} for s in (1e6, 3e6)]


def test_measure_collectives_fits_the_benchmarks_rows_and_a_send_is_a_broadcast(monkeypatch):
    import coursekit.comm.bench as bench

    asked = {}

    def run_benchmark(**kw):
        asked.update(kw)
        return _rows("all_reduce", 10, 1e9) + _rows("broadcast", 20, 2e9)

    monkeypatch.setattr(bench, "run_benchmark", run_benchmark)
    coll = measure.measure_collectives(3)
    assert asked == {"nproc": 3, "ops": ("all_reduce", "all_gather", "reduce_scatter", "broadcast"),
                     "sizes": "16K..4M", "factor": 4, "iters": 5, "warmup": 2, "timeout": 300}
    assert set(coll) == {"all_reduce", "broadcast", "send"}
    assert coll["all_reduce"] == pytest.approx((10e-6, 1e9)) and coll["broadcast"] == pytest.approx((20e-6, 2e9))
    assert coll["send"] == coll["broadcast"]
    measure.measure_collectives(sizes="1K..2K", iters=2, timeout=9)
    assert (asked["nproc"], asked["sizes"], asked["iters"], asked["timeout"]) == (2, "1K..2K", 2, 9)
    monkeypatch.setattr(bench, "run_benchmark", lambda **kw: _rows("all_reduce", 10, 1e9))
    assert measure.measure_collectives()["send"] is None  # no broadcast measured: no send either


def _fake_launch(monkeypatch, steps, final=None):
    import coursekit.launch

    calls = []

    def launch(module, argv, *, nproc, timeout, on_line):
        calls.append(dict(module=module, argv=argv, nproc=nproc, timeout=timeout, on_line=on_line))
        return types.SimpleNamespace(results=[{"steps": [{"step_time_s": t} for t in steps],
                                               "final": final or {"loss": 1.0}}, {"steps": [], "final": None}])

    monkeypatch.setattr(coursekit.launch, "launch", launch)
    return calls


def test_run_trainer_launches_the_runs_arguments_and_takes_the_median_after_the_first_step(monkeypatch):
    """The trainer (coursekit.train) on the run's processes with its arguments, --steps, the extra ones; quiet
    unless steps are reported, then rank 0's step lines go to on_step and no further; the median step after the
    first (the only one when there is one). Catches each argument, the filter's prefix, the median's slice."""
    calls = _fake_launch(monkeypatch, [9.0, 1.0, 3.0, 2.0], final={"loss": 2.5})
    run = TrainerRun(strategy="zero1", nproc=2)
    out = measure.run_trainer(run, model="tiny-llama", seq=32, global_batch=4)
    assert out == {"step_time_s": 2.0, "steps": [9.0, 1.0, 3.0, 2.0], "final": {"loss": 2.5}}
    (c,) = calls
    assert c["module"] == "coursekit.train" and c["nproc"] == 2 and c["timeout"] == 300 and c["on_line"] is None
    assert c["argv"] == ["--quiet", *run.args(model="tiny-llama", seq=32, global_batch=4), "--steps", "6"]
    assert c["argv"][1:5] == ["--model", "tiny-llama", "--strategy", "zero1"]
    seen = []
    measure.run_trainer("ddp", 4, model="m", seq=8, global_batch=4, steps=3, timeout=7, extra=("--x", "1"),
                        on_step=lambda: seen.append(1))
    c = calls[1]
    assert c["nproc"] == 4 and c["timeout"] == 7
    assert c["argv"] == [*TrainerRun(strategy="ddp", nproc=4).args(model="m", seq=8, global_batch=4), "--steps", "3",
                         "--x", "1"]
    assert c["on_line"]("[rank 0] step {'step': 1}") is True and seen == [1]
    assert c["on_line"]("[rank 1] step {'step': 1}") is False and c["on_line"]("loss 2.0") is False and seen == [1]
    calls = _fake_launch(monkeypatch, [5.0])
    assert measure.run_trainer(run, model="m", seq=8, global_batch=4)["step_time_s"] == 5.0


class _Samples:
    """measure_compute's stand-in: hands out the given samples in order, then (the steps are over) waits to be let go
    and hands out far-away ones until the loop stops."""

    def __init__(self, times):
        self.todo = [{"time_s": t, "name": i} for i, t in enumerate(times)]
        self.drained, self.release = threading.Event(), threading.Event()
        self.threads = set()

    def __call__(self):
        self.threads.add(threading.current_thread())
        if self.todo:
            return self.todo.pop(0)
        self.drained.set()
        self.release.wait(5)
        return {"time_s": -1e9, "name": "late"}


def _measured(monkeypatch, launch_at, t0s, times, steps, first_after, *, step_reported=True):
    built = []
    monkeypatch.setattr(measure, "_op_overhead_model", lambda: built.append(1))
    clock = iter([launch_at, *t0s])
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(time=lambda: next(clock, 5e8)))
    samples = _Samples(times)
    monkeypatch.setattr(measure, "measure_compute", samples)
    asked = {}

    def run_trainer(run, *, on_step, **kw):
        asked.update(kw, run=run)
        if step_reported:
            on_step()
            assert samples.drained.wait(5)
        samples.release.set()
        return {"step_time_s": statistics.median(steps[1:]), "steps": steps,
                "final": {"first_step_after_s": first_after}}

    monkeypatch.setattr(measure, "run_trainer", run_trainer)
    out, hits = measure.run_measured(TrainerRun(strategy="ddp", nproc=2), model="tiny-llama", seq=64,
                                     global_batch=8, cores=3)  # a core to spare: the sampling thread
    assert built == [1] and out["steps"] == steps
    sampler = samples.threads - {threading.main_thread()}
    assert len(sampler) == step_reported and all(t.daemon for t in sampler)  # it must not keep the process alive
    return asked, [h["name"] for h in hits]


def test_run_measured_keeps_the_samples_whose_interval_overlaps_the_timed_steps(monkeypatch):
    """Launched at 100 s, first step after 10 s: the timed steps (after the first) run from 110 to 110 + 1 + 1 + 1 =
    113 s. A sample [t0, time_s] counts when it ends at or after 110 and starts at or before 113: (105, 106) no,
    (109, 110) yes (ends at 110), (113, 113.5) yes (starts at 113), (113.25, 114) no (would with the first step's
    0.5 s). Catches >= -> >, <= -> <, the slice of steps, a + b, the arguments handed on."""
    asked, hits = _measured(monkeypatch, 100.0, [105.0, 109.0, 113.0, 113.25], [106.0, 110.0, 113.5, 114.0],
                            [0.5, 1.0, 1.0, 1.0], 10.0)
    assert hits == [1, 2]
    assert asked == {"model": "tiny-llama", "seq": 64, "global_batch": 8, "steps": 10, "timeout": 300, "extra": (),
                     "run": TrainerRun(strategy="ddp", nproc=2)}


def test_run_measured_samples_before_and_after_when_the_ranks_take_every_core(monkeypatch):
    """2 ranks on 2 cores (and 2 on 1): no sampling thread beside them; the figures are taken once before the launch
    and once after it, in that order, and the run is handed on as asked (no on_step: nothing to wake); with a core
    to spare the thread samples (the tests above). Catches >= -> >, the default core count, the samples' order and
    the arguments."""
    events = []
    monkeypatch.setattr(measure, "_op_overhead_model", lambda: events.append("model"))
    monkeypatch.setattr(measure, "measure_compute", lambda: events.append("sample") or {"n": events.count("sample")})

    def run_trainer(run, **kw):
        events.append(("run", run.nproc, kw))
        assert threading.active_count() == before_threads  # no sampler running beside the ranks
        return {"step_time_s": 0.01, "steps": [0.02, 0.01], "final": {"first_step_after_s": 1.0}}

    monkeypatch.setattr(measure, "run_trainer", run_trainer)
    before_threads = threading.active_count()
    kw = dict(model="tiny-llama", seq=64, global_batch=8)
    for nproc, cores in ((2, 2), (2, 1)):
        events.clear()
        out, hits = measure.run_measured(TrainerRun(strategy="ddp", nproc=nproc), cores=cores, **kw)
        assert hits == [{"n": 1}, {"n": 2}] and out["step_time_s"] == 0.01
        assert events == ["model", "sample", ("run", 2, {**kw, "steps": 10, "timeout": 300, "extra": ()}), "sample"]
    monkeypatch.setattr(measure.os, "cpu_count", lambda: 2)  # the default: this machine's cores
    events.clear()
    measure.run_measured(TrainerRun(strategy="ddp", nproc=2), **kw)
    assert events[1] == "sample" and events[2][0] == "run"
    monkeypatch.setattr(measure.os, "cpu_count", lambda: None)  # unknown: one core assumed, so 1 rank takes it
    events.clear()
    measure.run_measured(TrainerRun(strategy="single", nproc=1), steps=3, timeout=7, extra=("--x",), **kw)
    assert events == ["model", "sample", ("run", 1, {**kw, "steps": 3, "timeout": 7, "extra": ("--x",)}), "sample"]


def test_run_measured_takes_the_nearest_sample_when_none_overlaps(monkeypatch):
    """Steps from 110 to 112 (midpoint 111); samples ending at 104 and 109.5 and starting after 112: the one
    ending nearest 111 (109.5, 1.5 s off; 115 is 4 s off). And when the steps ended before the sampling began
    (no step reported), one sample is taken then."""
    _, hits = _measured(monkeypatch, 100.0, [103.0, 108.0, 112.5], [104.0, 109.5, 115.0], [3.0, 1.0, 1.0], 10.0)
    assert hits == [1]
    _, hits = _measured(monkeypatch, 100.0, [101.0], [101.5], [3.0, 1.0], 10.0, step_reported=False)
    assert hits == [0]
