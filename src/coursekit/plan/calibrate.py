"""Host-overhead calibrations for the planner (imports torch): what the software stack adds on the host per op or
per module, beyond the eager per-op cost that ``measure.op_overhead`` takes. Each is measured once, on ONE process
(no peer: no communication, which the planner adds from the measured collectives), on CALIBRATION_MODEL, not on the
runs it is then used to predict, and restated in units of the plain per-op cost measured around it, so that a later
run under another load is rescaled by that run's own per-op cost (``measure.host_hardware``).

    dt = dtensor_op_cost()      # DTensor: extra cost of one op on a DTensor, and the ops counted per TP layer
    z3 = zero3_hook_cost()      # DeepSpeed ZeRO-3: fetch/release/partition hooks, per parameter tensor
    hw, net = host_hardware(compute, coll, nproc, zero3=z3, dtensor=dt)

Why they matter here and hardly on a GPU: on a CPU the host *is* the device, so this Python work adds to the step
(overlap 0); on a GPU node the host runs ahead of the kernels and the same work hides behind the device's compute
unless the model is small (``steptime``: exposed only beyond ``overlap`` x compute).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from coursekit.launch import stamped_env
from coursekit.spec.families import LLAMA

# a Llama of many small modules (8 layers of 16 wide, 75 parameter tensors, ~29k parameters; 256 tokens, the
# trainer's synthetic data's vocabulary): its step is almost all per-op and per-module host work, so what a
# strategy adds per op or per module stands out
CALIBRATION_MODEL = {"model_type": "llama", "vocab_size": 256, "hidden_size": 16, "intermediate_size": 32,
                     "num_hidden_layers": 8, "num_attention_heads": 2, "num_key_value_heads": 2,
                     "max_position_embeddings": 16, "tie_word_embeddings": False}


def _median_time(fn, reps: int = 3) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _dtensor_calibration() -> dict:
    """Runs in its own process (a 1-rank gloo group): the calibration model plain and tensor-parallel on a 1-rank
    mesh (the course's TP plan, coursekit.tp.plan), forward + backward and one AdamW step (foreach=False, the
    trainer's); ops counted with a TorchDispatchMode (an op whose arguments include a DTensor is a DTensor op)."""
    import torch
    import torch.distributed as dist
    import torch.utils._pytree as pytree
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    from coursekit.models import build_model
    from coursekit.parallel.api import adamw
    from coursekit.tp.plan import TensorParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        ids = torch.arange(8).unsqueeze(0) % CALIBRATION_MODEL["vocab_size"]

        class Count(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.total = self.dtensor = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.total += 1
                self.dtensor += any(isinstance(a, DTensor) for a in pytree.tree_leaves((args, kwargs)))
                return func(*args, **(kwargs or {}))

        out = {}
        for name, sp in (("plain", None), ("tp", False), ("tp_sp", True)):
            model = build_model(CALIBRATION_MODEL, seed=0)
            if sp is not None:
                tp = TensorParallel.__new__(TensorParallel)  # the plan without a trainer context
                tp.sp, tp.megatron, tp.family = sp, False, LLAMA  # the calibration model is Llama-shaped
                tp.apply_lm(model, mesh, 1, 0)
            opt = adamw(model.parameters(), lr=1e-3)  # the trainer's optimizer (the course's betas, eps, no decay)

            def step():
                model(input_ids=ids, use_cache=False).logits.float().mean().backward()

            def opt_step():
                opt.step()

            step()
            opt_step()
            with Count() as c:
                step()
            with Count() as o:
                opt_step()
            out[name] = {"ops": c.total, "dtensor_ops": c.dtensor, "opt_ops": o.total, "opt_dtensor_ops": o.dtensor,
                         "t": _median_time(step), "t_opt": _median_time(opt_step),
                         "dtensor_params": sum(isinstance(p, DTensor) for p in model.parameters()),
                         "params": len(list(model.parameters()))}
        return out
    finally:
        dist.destroy_process_group()


def dtensor_op_cost(timeout: float = 300) -> dict:
    """The extra host cost of an op on a DTensor (sharding propagation, unwrap / rewrap), in plain-op units:
    (TP model's forward + backward - the plain model's) / its DTensor ops, over the plain model's time per op; and
    the DTensor ops counted per TP layer (forward + backward, with and without sequence parallelism) and per DTensor
    parameter in the optimizer, for the planner's stated counts (steptime.DTENSOR_OPS_*)."""
    r = subprocess.run([sys.executable, "-m", "coursekit.plan.calibrate", "dtensor"], capture_output=True, text=True,
                       timeout=timeout, env=stamped_env(dict(os.environ, OMP_NUM_THREADS="1")))
    if r.returncode:
        raise RuntimeError(f"DTensor calibration failed:\n{r.stderr[-3000:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    plain, tp = d["plain"], d["tp"]
    per_op = plain["t"] / plain["ops"]
    layers = CALIBRATION_MODEL["num_hidden_layers"]
    per_opt_op = plain["t_opt"] / plain["opt_ops"]
    return {"per_op_ops": max(0.0, tp["t"] - plain["t"]) / tp["dtensor_ops"] / per_op,
            "per_opt_op_ops": max(0.0, tp["t_opt"] - plain["t_opt"]) / tp["opt_dtensor_ops"] / per_opt_op,
            "tp_layer_ops": tp["dtensor_ops"] / layers, "tp_sp_layer_ops": d["tp_sp"]["dtensor_ops"] / layers,
            "opt_ops_per_dtensor_param": tp["opt_dtensor_ops"] / tp["dtensor_params"], "raw": d}


def zero3_hook_cost(*, steps: int = 10, timeout: float = 300) -> dict:
    """ZeRO-3's host cost per parameter tensor per micro-batch on this machine (``Hardware.zero3_hook_s``).

    CALIBRATION_MODEL trained by the course trainer on ONE process with ``--strategy zero3`` and with ``--strategy
    zero0`` (the same DeepSpeed engine, nothing partitioned), the per-op cost measured while each runs
    (``measure.run_measured``): the difference of their median steps, each in its own run's per-op units, over
    the model's parameter tensors. What is left without a peer is host work (hooks, fetch/release bookkeeping,
    gradient partitioning), not communication; the planner adds a real group's all-gathers and reduce-scatters
    from the measured collectives."""
    import tempfile
    from pathlib import Path

    from coursekit.memory import resolve_model
    from coursekit.plan.measure import TrainerRun, run_measured

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "calibration-llama.json"
        cfg.write_text(json.dumps(CALIBRATION_MODEL))
        shape = resolve_model(str(cfg))
        per_layer, first, last = shape.local_tensors()
        tensors = shape.layers * per_layer + first + last
        kw = dict(model=str(cfg), seq=8, global_batch=1, steps=steps, timeout=timeout)
        runs = {}
        for stage in ("zero3", "zero0"):
            out, compute = run_measured(TrainerRun(strategy=stage, nproc=1), **kw)
            floor = sum(c["floor"] for c in compute) / len(compute)
            runs[stage] = (out["step_time_s"], floor)
    (t3, f3), (t0, f0) = runs["zero3"], runs["zero0"]
    per_tensor_ops = max(0.0, t3 / f3 - t0 / f0) / tensors
    return {"per_tensor_ops": per_tensor_ops, "per_tensor_s": per_tensor_ops * (f3 + f0) / 2, "tensors": tensors,
            "zero3_step_s": t3, "zero0_step_s": t0, "op_overhead_s": (f3, f0)}


if __name__ == "__main__":
    if sys.argv[1:] == ["dtensor"]:
        print(json.dumps(_dtensor_calibration()))
    else:
        sys.exit("usage: python -m coursekit.plan.calibrate dtensor")
