"""``coursekit.plan.calibrate`` without its launches: the timing helper on a fake clock, and what the two
calibrations hand their child process / trainer runs and how they turn the answers into plain-op units, worked by
hand (the real calibrations, a subprocess and two DeepSpeed launches, are tests/test_plan.py's slow tier). One
process, no launch; written against the mutation survivors of bench/bench_mutation.py plan.calibrate."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from coursekit.launch import STAMP_ENV
from coursekit.plan import calibrate, measure
from coursekit.plan.calibrate import CALIBRATION_MODEL, dtensor_op_cost, zero3_hook_cost
from coursekit.plan.measure import TrainerRun


def test_median_time_warms_up_once_then_takes_the_median_of_reps_timed_calls(monkeypatch):
    """Calls of 100 (the warm-up, not timed), 3, 1, 2 s: the median 2; with reps 4 (1, 2, 3, 4 after the warm-up):
    2.5. Catches the warm-up dropped or timed, the reps default, the median."""
    clock = types.SimpleNamespace(t=0.0)
    monkeypatch.setattr(calibrate, "time", types.SimpleNamespace(perf_counter=lambda: clock.t))
    durations = iter([100.0, 3.0, 1.0, 2.0, 100.0, 1.0, 2.0, 3.0, 4.0])
    calls = []

    def fn():
        calls.append(1)
        clock.t += next(durations)

    assert calibrate._median_time(fn) == 2.0 and len(calls) == 4
    assert calibrate._median_time(fn, reps=4) == 2.5 and len(calls) == 9


# -- the DTensor calibration: its child process and the arithmetic on its answer ------------------------------------------
RAW = {"plain": {"ops": 1000, "dtensor_ops": 0, "opt_ops": 500, "opt_dtensor_ops": 0, "t": 0.1, "t_opt": 0.01,
                 "dtensor_params": 0, "params": 75},
       "tp": {"ops": 1100, "dtensor_ops": 800, "opt_ops": 500, "opt_dtensor_ops": 400, "t": 0.5, "t_opt": 0.03,
              "dtensor_params": 50, "params": 75},
       "tp_sp": {"ops": 1200, "dtensor_ops": 1200, "opt_ops": 500, "opt_dtensor_ops": 450, "t": 0.6, "t_opt": 0.04,
                 "dtensor_params": 60, "params": 75}}


def _child(monkeypatch, stdout="", returncode=0, stderr=""):
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw))
        return types.SimpleNamespace(returncode=returncode, stdout=stdout, stderr=stderr)

    monkeypatch.setattr(calibrate, "subprocess", types.SimpleNamespace(run=run))
    return calls


def test_dtensor_op_cost_in_plain_op_units_worked_by_hand(monkeypatch):
    """Plain: 0.1 s / 1000 ops = 100 us per op, 0.01 s / 500 optimizer ops = 20 us. TP: (0.5 - 0.1) s over 800
    DTensor ops = 500 us, 5 plain ops each; the optimizer (0.03 - 0.01) / 400 = 50 us, 2.5 plain optimizer ops;
    800 and 1200 DTensor ops over 8 layers = 100 and 150 per layer; 400 optimizer DTensor ops / 50 DTensor
    parameters = 8. The answer is the child's last stdout line. Catches each quotient's operands and the line read."""
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setenv("CALIBRATE_TEST_MARK", "kept")
    calls = _child(monkeypatch, stdout="a warning\n" + json.dumps(RAW) + "\n")
    got = dtensor_op_cost()
    raw = got.pop("raw")
    assert raw == RAW
    assert got == pytest.approx({"per_op_ops": 5.0, "per_opt_op_ops": 2.5, "tp_layer_ops": 100.0,
                                 "tp_sp_layer_ops": 150.0, "opt_ops_per_dtensor_param": 8.0})
    ((argv, kw),) = calls
    assert argv == [sys.executable, "-m", "coursekit.plan.calibrate", "dtensor"]
    env = kw.pop("env")
    assert kw == {"capture_output": True, "text": True, "timeout": 300}
    assert env["OMP_NUM_THREADS"] == "1" and env["CALIBRATE_TEST_MARK"] == "kept" and STAMP_ENV in env
    _child(monkeypatch, stdout=json.dumps(RAW))
    dtensor_op_cost(timeout=12)


def test_dtensor_op_cost_never_below_zero_and_a_failed_child_is_raised_with_its_stderrs_tail(monkeypatch):
    """TP faster than plain (load noise): 0 extra per op, not negative. A child that fails: RuntimeError with the
    last 3,000 characters of its stderr. Catches max(0, ...) dropped, the return code's test, the tail's length."""
    fast = {**RAW, "tp": {**RAW["tp"], "t": 0.05, "t_opt": 0.005}}
    _child(monkeypatch, stdout=json.dumps(fast))
    got = dtensor_op_cost()
    assert (got["per_op_ops"], got["per_opt_op_ops"]) == (0.0, 0.0)
    calls = _child(monkeypatch, returncode=1, stderr="A" * 10 + "B" * 3000)
    with pytest.raises(RuntimeError) as e:
        dtensor_op_cost(timeout=5)
    assert str(e.value) == "DTensor calibration failed:\n" + "B" * 3000
    assert calls[0][1]["timeout"] == 5


# -- the ZeRO-3 calibration: its two runs and the arithmetic on them ----------------------------------------------------
def _runs(monkeypatch, answers):
    seen = []

    def run_measured(run, **kw):
        seen.append((run, {**kw, "config": json.loads(Path(kw["model"]).read_text())}))
        return answers[run.strategy]

    monkeypatch.setattr(measure, "run_measured", run_measured)
    return seen


def test_zero3_hook_cost_per_parameter_tensor_worked_by_hand(monkeypatch):
    """ZeRO-3's step 0.9 s at a per-op cost of (100 + 300) / 2 = 200 us: 4,500 plain ops; ZeRO-0's 0.3 s at 100 us:
    3,000; the 1,500 more over the calibration model's 75 parameter tensors (8 layers x 9: q, k, v, o, gate, up,
    down and two norms; the embedding, the final norm and the untied head) = 20 plain ops per tensor, at the two
    runs' mean per-op cost 150 us = 3 ms. Both runs are CALIBRATION_MODEL (a config file) on one process, seq 8,
    one sequence. Catches the runs' arguments, the per-op means, the difference's order and the tensor count."""
    seen = _runs(monkeypatch, {"zero3": ({"step_time_s": 0.9}, [{"floor": 1e-4}, {"floor": 3e-4}]),
                               "zero0": ({"step_time_s": 0.3}, [{"floor": 1e-4}])})
    got = zero3_hook_cost()
    assert got["tensors"] == 75
    assert got.pop("op_overhead_s") == pytest.approx((2e-4, 1e-4))
    assert got == pytest.approx({"per_tensor_ops": 20.0, "per_tensor_s": 3e-3, "tensors": 75, "zero3_step_s": 0.9,
                                 "zero0_step_s": 0.3})
    assert [r for r, _ in seen] == [TrainerRun(strategy="zero3", nproc=1), TrainerRun(strategy="zero0", nproc=1)]
    for _, kw in seen:
        assert kw["config"] == CALIBRATION_MODEL and Path(kw["model"]).name == "calibration-llama.json"
        assert not Path(kw["model"]).exists()  # a temporary file, gone after
        assert {k: kw[k] for k in ("seq", "global_batch", "steps", "timeout")} == {"seq": 8, "global_batch": 1,
                                                                                   "steps": 10, "timeout": 300}
    seen.clear()
    zero3_hook_cost(steps=4, timeout=9)
    assert {(kw["steps"], kw["timeout"]) for _, kw in seen} == {(4, 9)}


def test_zero3_hook_cost_is_never_negative(monkeypatch):
    """ZeRO-3 cheaper than ZeRO-0 in per-op units (noise): 0 per tensor."""
    _runs(monkeypatch, {"zero3": ({"step_time_s": 0.2}, [{"floor": 1e-4}]),
                        "zero0": ({"step_time_s": 0.3}, [{"floor": 1e-4}])})
    assert zero3_hook_cost()["per_tensor_ops"] == 0.0


# -- the DTensor calibration itself, in this process --------------------------------------------------------------------
@pytest.mark.slow  # one process, no launch, but three builds of the calibration model and their steps (~3-10 s)
def test_the_dtensor_calibration_counts_the_ops_steptime_states(monkeypatch):
    """The child's work run here (a 1-rank gloo group of its own, destroyed after), its timer replaced by one that
    answers the aten ops of what it was handed (so each "t" must be the step's op count, "t_opt" the optimizer's):
    the plain model has no DTensor op or parameter; TP and TP + SP run the DTensor ops per layer steptime states
    (counted, not fitted: DTENSOR_OPS_TP_LAYER / _SP_LAYER per layer plus DTENSOR_OPS_OUTSIDE_LAYERS for the
    vocab-parallel embedding and head), DTENSOR_OPT_OPS optimizer ops per DTensor parameter, OPT_OPS_PER_TENSOR per
    plain tensor (the trainer's AdamW); every variant holds the model's 75 parameter tensors. Catches a variant's sp
    flag, the counters, the step and the optimizer step swapped, the thread count, the input's shape, the seed,
    a KV cache built, the group left behind."""
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from coursekit.plan import steptime

    class Ops(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.n += 1
            return func(*args, **(kwargs or {}))

    shapes = []

    def ops_of(fn, reps=3):
        free = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        if "ids" in free:  # the forward + backward step: what it feeds the model
            shapes.append(tuple(free["ids"].shape))
        Ops.n = 0
        with Ops():
            fn()
        return float(Ops.n)

    import torch

    import coursekit.models as models

    real_build, seeds, caches = models.build_model, [], []

    def build(cfg, **kw):  # the real model, its seed and each forward's KV cache noted
        seeds.append(kw.get("seed"))
        m = real_build(cfg, **kw)
        m.register_forward_hook(lambda mod, args, out: caches.append(out.past_key_values))
        return m

    monkeypatch.setattr(models, "build_model", build)
    monkeypatch.setattr(calibrate, "_median_time", ops_of)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        raw = calibrate._dtensor_calibration()
        assert torch.get_num_threads() == 1  # one thread, as the trainer's workers run
    finally:
        torch.set_num_threads(before)
    assert not dist.is_initialized()
    assert shapes == [(1, 8)] * 3  # one sequence of 8 tokens, the shape zero3_hook_cost trains (seq 8, batch 1)
    assert seeds == [0, 0, 0]  # the same weights for the three (the trainer's seed), so only the plan differs
    assert caches and all(c is None for c in caches)  # a training step: no KV cache built
    layers = CALIBRATION_MODEL["num_hidden_layers"]
    plain, tp, sp = raw["plain"], raw["tp"], raw["tp_sp"]
    assert set(raw) == {"plain", "tp", "tp_sp"}
    assert (plain["dtensor_ops"], plain["opt_dtensor_ops"], plain["dtensor_params"]) == (0, 0, 0)
    assert tp["dtensor_ops"] == layers * steptime.DTENSOR_OPS_TP_LAYER + steptime.DTENSOR_OPS_OUTSIDE_LAYERS
    assert sp["dtensor_ops"] == layers * steptime.DTENSOR_OPS_SP_LAYER + steptime.DTENSOR_OPS_OUTSIDE_LAYERS
    for r in (tp, sp):
        assert r["opt_dtensor_ops"] == steptime.DTENSOR_OPT_OPS * r["dtensor_params"] > 0
        assert r["ops"] > r["dtensor_ops"] and r["opt_ops"] >= r["opt_dtensor_ops"]
    assert plain["opt_ops"] // plain["params"] == steptime.OPT_OPS_PER_TENSOR
    assert {r["params"] for r in raw.values()} == {75}
    for r in raw.values():  # the timer was handed the step for t, the optimizer step for t_opt
        assert (r["t"], r["t_opt"]) == (r["ops"], r["opt_ops"]) and r["ops"] > r["opt_ops"]
