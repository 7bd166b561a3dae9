"""GPU check: the memory calculator against CUDA's allocator, and the reference trainer's MFU, in one run.

    python bench/gpu_check.py --out results/gpu-check           # full run: < 8 minutes on one H100/H200
    python bench/gpu_check.py --out results/gpu-check --quick   # smoke version (~2 minutes)
    python bench/gpu_check.py --out /tmp/gpu-check --cpu        # the reduced CPU version (automatic without CUDA)

Runs from the source tree (puts ``src/`` on ``sys.path`` itself) with only torch and transformers installed: it
imports no coursekit module that needs datasets, psutil or deepspeed (``coursekit.train``, ``coursekit.launch``,
``coursekit.data``). The trainer's step is driven in-process from its own pieces instead: the ``single`` strategy
(autocast bf16 over fp32 weights, fused AdamW on CUDA), ``models.build_model``, synthetic token ids.

Four checks, each written to ``<out>/gpu_check.json``; a short table is printed last (and saved as ``table.txt``):

1. ``matmul``: a large bf16 matmul (8192³ on CUDA), the achievable peak of this card.
2. ``flops``: ``coursekit.flops.flops_per_step`` (6N + attention) against ``FlopCounterMode`` for the MFU step (b=1,
   same model, sequence, autocast and attention kernel), and the eager-attention variant. Goal: within 1 %.
   FlopCounterMode counts the CUDA SDPA ops with 5 backward matmuls (flash recomputes QKᵀ): the formula is taken
   with ``sdpa_backward_recompute=True`` there. It has no formula for CPU's flash SDPA op, so the CPU version counts
   SDPA through the math backend (``sdpa_kernel(SDPBackend.MATH)``), which decomposes into counted matmuls.
3. ``memory``: a grid of single-GPU configurations (GPT-2 124M … 1.5B, Llama 3.2 1B; micro-batch, sequence, eager
   vs SDPA, recompute none/full; bf16), each trained for a steady-state step and probed at the calculator's phases
   (``coursekit.measure.phases``). The precision is the calculator's bf16 model (16Ψ): bf16 weights, activations and
   gradients, fp32 master weights and AdamW states (``MasterAdamW``, fused). Measured: ``torch.cuda.memory_allocated``
   / ``max_memory_allocated`` at each phase; states from the tensors; saved activations from autograd's saved-tensor
   hooks. Predicted: ``estimate(..., kernels="cuda", engine="ddp", dp=1, runtime_bytes=0)`` (the allocator does not
   see the CUDA context). Goals: states exact, saved activations within 1 %, peak within 5 %. One extra row runs the
   trainer's own bf16 (autocast over fp32 weights), which the calculator does not model, to show the difference.
4. ``mfu``: the trainer's step on Llama 3.2 1B at sequence 2048 with SDPA (flash), eager and ``torch.compile``d (each in
   a subprocess, compile time-boxed), at the largest micro-batch that fits (the calculator's ``max_micro_batch`` as
   the start, backing off on out-of-memory): tokens/s, achieved TFLOP/s, MFU against the device table's dense bf16
   peak and against the measured matmul, a profiler trace of a few steps and the top kernels. Goal: MFU ≥ 45 %.

The CPU version runs the same code on tiny models (and a ~9M-parameter Llama) in well under a minute: kernels="cpu"
profile, the probe reads the profiler's memory events, no compile unless ``--compile on``, MFU only against the
measured matmul (the device table has no CPU). Its figures check the machinery, not a GPU.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

import torch  # noqa: E402

from coursekit.flops import flops_per_step, flops_per_token  # noqa: E402
from coursekit.memory import GPUS, ModelShape, estimate, max_micro_batch, resolve_model  # noqa: E402
from coursekit.memory.gpus import GiB  # noqa: E402

GOALS = {"flops_rel": 0.01, "activations_rel": 0.01, "peak_rel": 0.05, "mfu": 0.45}
# ~9M parameters: a Llama small enough to train a step on two CPU cores in about a second
SMALL_LLAMA = ModelShape(arch="llama", name="llama-9m", layers=4, hidden=384, heads=6, kv_heads=2, ffn=1024,
                         vocab=8192, tied_embeddings=True, max_positions=2048)
# (model, micro-batch, seq, attention, recompute)
MEMORY_GRID = {
    "cuda": [("gpt2", 8, 1024, "sdpa", "none"), ("gpt2", 8, 1024, "eager", "none"),
             ("gpt2-medium", 4, 1024, "sdpa", "full"), ("gpt2-medium", 4, 1024, "eager", "full"),
             ("llama3.2-1b", 2, 2048, "sdpa", "none"), ("llama3.2-1b", 2, 2048, "eager", "none"),
             ("llama3.2-1b", 8, 2048, "sdpa", "full"), ("gpt2-xl", 2, 1024, "sdpa", "none"),
             ("gpt2-xl", 4, 1024, "eager", "full")],
    "cuda-quick": [("gpt2", 8, 1024, "sdpa", "none"), ("gpt2-medium", 4, 1024, "eager", "full"),
                   ("llama3.2-1b", 2, 2048, "sdpa", "none")],
    "cpu": [("tiny-llama", 4, 128, "sdpa", "none"), ("tiny-llama", 4, 128, "eager", "full"),
            ("tiny-gpt2", 4, 128, "eager", "none"), ("tiny-gpt2", 4, 128, "sdpa", "full"),
            (SMALL_LLAMA, 2, 128, "sdpa", "none")],
}
AMP_ROW = {"cuda": ("gpt2", 8, 1024, "sdpa", "none"), "cpu": ("tiny-llama", 4, 128, "sdpa", "none")}
MFU = {"cuda": {"model": "llama3.2-1b", "seq": 2048, "warmup": 3, "steps": 8, "quick_steps": 4},
       "cpu": {"model": "tiny-llama", "seq": 64, "micro_batch": 4, "warmup": 1, "steps": 3, "quick_steps": 3}}


# --------------------------------------------------------------------------------------------------- helpers
def _shape(model) -> ModelShape:
    return resolve_model(model)


def _name(model) -> str:
    return _shape(model).name


def _build(model, *, attention: str, dtype, device, recompute: str = "none"):
    from coursekit.memory import to_hf_config_dict
    from coursekit.models import build_model

    spec = model if isinstance(model, str) else to_hf_config_dict(model)
    m = build_model(spec, attention=attention, dtype=dtype, device=device, seed=0).train()
    if recompute == "full":  # as coursekit.train --recompute full does
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _rel(pred, meas):
    return None if not meas else (pred - meas) / meas


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def table_gpu(device_name: str, total_bytes: int | None = None) -> str | None:
    """The coursekit device-table entry for a CUDA device name (None if the table has no such card)."""
    n = device_name.lower()
    if "h200" in n:
        return "H200"
    if "h100" in n:
        return None if "nvl" in n else ("H100-PCIe" if "pcie" in n else "H100-80GB")
    if "a100" in n:
        return "A100-40GB" if total_bytes and total_bytes < 60 * GiB else "A100-80GB"
    if "a10g" in n:
        return "A10G"
    if "a10" in n.replace("a100", ""):
        return "A10"
    if n.endswith(" l4") or n == "l4":
        return "L4"
    if "4090" in n:
        return "RTX-4090"
    if "mi300x" in n:
        return "MI300X"
    return None


# --------------------------------------------------------------------------------------------------- sections
def environment(args, device) -> dict:
    import transformers

    env = {"mode": "cuda" if device.type == "cuda" else "cpu-reduced", "device": str(device),
           "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "coursekit_source": str(SRC), "host": platform.node(),
           "driver": "in-process: coursekit.ddp.strategy.Single (the trainer's train_step), models.build_model, "
                     "memory.estimate, measure.phases, flops, profiling; no coursekit.train / launch / data"}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, device_memory_bytes=props.total_memory,
                   capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
        env["table_gpu"] = args.gpu or table_gpu(props.name, props.total_memory)
        if env["table_gpu"]:
            env["table_bf16_flops"] = GPUS[env["table_gpu"]].bf16_flops
    else:
        env.update(device_name=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
                   table_gpu=None, note="no CUDA device: reduced CPU version; GPU figures still to be taken")
    return env


def check_matmul(device, quick: bool) -> dict:
    """Achieved FLOP/s of a square bf16 matmul: the practical peak MFU can be compared against."""
    n = 8192 if device.type == "cuda" else 512
    iters = (20 if quick else 50) if device.type == "cuda" else 5
    out = {"n": n, "iters": iters}
    for dt in ("bf16",) + (() if device.type == "cuda" else ("fp32",)):
        dtype = torch.bfloat16 if dt == "bf16" else torch.float32
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        _sync(device)
        t = time.perf_counter()
        for _ in range(iters):
            a @ b
        _sync(device)
        dt_s = (time.perf_counter() - t) / iters
        out[f"{dt}_flops"] = 2 * n ** 3 / dt_s
        del a, b
    _free(device)
    return out


class _AttentionOps:
    """A dispatch mode that records which attention kernels run (SDPA's math path shows none: it decomposes)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        names = self.names = set()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                n = func.overloadpacket.__name__
                if "attention" in n:
                    names.add(n)
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


def check_flops(device, mode: str, quick: bool) -> list[dict]:
    """The MFU numerator against FlopCounterMode, for the MFU step (b=1) and an eager-attention variant."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = MFU[mode]
    cases = [(cfg["model"], "sdpa", 1, cfg["seq"]), (cfg["model"], "eager", 1, cfg["seq"])]
    if mode == "cuda" and not quick:
        cases.append(("gpt2", "sdpa", 1, 1024))
    if mode == "cpu":
        cases.append(("tiny-gpt2", "eager", 2, 64))
    out = []
    for model, attention, b, s in cases:
        shape = _shape(model)
        row = {"model": shape.name, "attention": attention, "batch": b, "seq": s}
        try:
            m = _build(model, attention=attention, dtype=torch.float32, device=device)  # the trainer's fp32 weights
            ids = torch.randint(0, shape.vocab, (b, s), device=device)
            backend = "default"
            kernel_ctx = _nullctx()
            if attention == "sdpa" and device.type == "cpu":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                kernel_ctx, backend = sdpa_kernel(SDPBackend.MATH), "math (CPU flash is not counted)"
            rec = _AttentionOps()
            with kernel_ctx, FlopCounterMode(display=False) as fc, rec.mode:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = m(input_ids=ids, labels=ids).loss
                loss.backward()
            counted = fc.get_total_flops()
            fused = any(n.startswith("_scaled_dot_product_") and "math" not in n for n in rec.names)
            f = flops_per_step(shape, b, s, sdpa_backward_recompute=fused)
            row.update(backend=backend, attention_ops=sorted(rec.names), counted=counted, formula=f["total"],
                       formula_terms=f, sdpa_backward_recompute=fused, error=_rel(f["total"], counted))
            row["ok"] = abs(row["error"]) <= GOALS["flops_rel"]
            del m, loss
        except Exception as e:  # noqa: BLE001 - record and go on: one failed case must not lose the run
            row.update(error_text=f"{type(e).__name__}: {e}", ok=False)
        _free(device)
        out.append(row)
    return out


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def memory_case(device, model, b, s, attention, recompute, *, amp: bool = False) -> dict:
    """One configuration: a steady-state step probed at the calculator's phases, against its prediction."""
    from coursekit.measure import tensor_bytes
    from coursekit.measure.activations import saved_activation_bytes
    from coursekit.measure.phases import MasterAdamW, measure_step

    t0 = time.perf_counter()
    shape = _shape(model)
    kernels = "cuda" if device.type == "cuda" else "cpu"
    row = {"model": shape.name, "batch": b, "seq": s, "attention": attention, "recompute": recompute,
           "dtype": "bf16", "modelled": not amp,
           "precision": ("autocast bf16 over fp32 weights + fused AdamW (coursekit.train --dtype bf16; not modelled)"
                         if amp else "bf16 weights/activations/grads + fp32 master + AdamW (calculator 16psi)")}
    e = estimate(shape, batch=b, seq=s, dtype="bf16", attention=attention, recompute=recompute, kernels=kernels,
                 engine="ddp", dp=1, runtime_bytes=0)
    row["num_params"] = e.num_params
    row["attention_kernel_predicted"] = e.activations.attention_kernel
    m = _build(model, attention=attention, dtype=torch.float32 if amp else torch.bfloat16, device=device,
               recompute=recompute)
    params = [p for p in m.parameters() if p.requires_grad]
    if amp:
        strat = _single(str(device), lr=1e-4)
        strat.setup(m)
        opt = strat.optimizer
        autocast = torch.bfloat16
        master_bytes = lambda: 0  # noqa: E731
        opt_bytes = lambda: _optimizer_bytes(opt)  # noqa: E731
    else:
        mopt = MasterAdamW(params)
        opt = mopt
        autocast = None
        master_bytes = lambda: mopt.state_bytes()["master_bytes"]  # noqa: E731
        opt_bytes = lambda: mopt.state_bytes()["optimizer_bytes"]  # noqa: E731
    ids = torch.randint(0, shape.vocab, (b, s), device=device)
    labels = ids.clone()
    ctx = torch.autocast(device.type, dtype=autocast) if autocast else _nullctx()
    for _ in range(2 if device.type == "cuda" else 1):  # the first step creates the optimizer states
        with ctx:
            loss = m(input_ids=ids, labels=labels).loss
        loss.backward()
        del loss
        opt.step()
        for p in params:
            p.grad = None
    _free(device)
    held = {"parameters": tensor_bytes(params), "master_weights": master_bytes(), "optimizer_states": opt_bytes()}
    grads = {}

    def step():
        grads["bytes"] = tensor_bytes([p.grad for p in params])
        opt.step()

    io_bytes = tensor_bytes([ids, labels])
    r = measure_step(m, step, ids, labels, autocast_dtype=autocast,
                     baseline_bytes=sum(held.values()) + io_bytes)
    rec = _AttentionOps()
    with ctx, rec.mode:
        acts = saved_activation_bytes(m, ids, labels=labels)["total_bytes"]
    row["attention_ops"] = sorted(rec.names)  # [] for eager and for SDPA's math path
    held["gradients"] = grads["bytes"]
    held["saved_activations"] = acts
    c = e.categories
    row["terms"] = {k: {"measured": held[k], "predicted": c[k], "error": _rel(c[k], held[k]),
                        "diff_bytes": c[k] - held[k]}
                    for k in ("parameters", "gradients", "master_weights", "optimizer_states", "saved_activations")}
    ph = r["phases"]
    late_peak = ph["end_of_backward"]["peak_bytes"]
    measured = {"start_of_backward": ph["start_of_backward"]["peak_bytes"],  # peak: loss, head, last block
                "end_of_backward": ph["end_of_backward"]["level_bytes"],  # held: states + gradients
                "optimizer_step": ph["optimizer_step"]["peak_bytes"],
                "peak": r["peak_bytes"]}
    predicted = dict(e.phases, peak=e.peak_bytes)
    row["phases"] = {k: {"measured": measured[k], "predicted": predicted[k], "error": _rel(predicted[k], measured[k])}
                     for k in measured}
    row["phases"]["end_of_backward"]["late_backward_peak"] = late_peak
    row["probe"] = {"source": "torch.cuda.memory_allocated / max_memory_allocated" if device.type == "cuda" else
                    "torch.profiler memory events (running sum) + stated baseline",
                    "start_bytes": r["start_bytes"], "inputs_bytes": io_bytes, "raw": ph,
                    "start_minus_states": r["start_bytes"] - (held["parameters"] + held["master_weights"]
                                                              + held["optimizer_states"])}
    row["goals"] = {
        "states_exact": all(row["terms"][k]["diff_bytes"] == 0
                            for k in ("parameters", "gradients", "master_weights", "optimizer_states")),
        "activations_1pct": abs(row["terms"]["saved_activations"]["error"]) <= GOALS["activations_rel"],
        "peak_5pct": abs(row["phases"]["peak"]["error"]) <= GOALS["peak_rel"],
    }
    row["loss"] = r["loss"]
    del m, opt, params, ids, labels
    _free(device)
    row["time_s"] = time.perf_counter() - t0
    return row


def _optimizer_bytes(opt) -> int:
    from coursekit.measure import optimizer_state_bytes

    return optimizer_state_bytes(opt)


def check_memory(device, mode: str, quick: bool, deadline: float) -> list[dict]:
    grid = MEMORY_GRID["cuda-quick" if (mode == "cuda" and quick) else mode]
    rows = []
    for cfg in grid + [("amp",) + AMP_ROW[mode]]:
        amp = cfg[0] == "amp"
        model, b, s, attention, recompute = cfg[1:] if amp else cfg
        label = {"model": _name(model), "batch": b, "seq": s, "attention": attention, "recompute": recompute,
                 "modelled": not amp}
        if time.monotonic() > deadline:
            rows.append({**label, "skipped": "time budget"})
            continue
        try:
            rows.append(memory_case(device, model, b, s, attention, recompute, amp=amp))
        except Exception as e:  # noqa: BLE001 - an OOM or a failure in one configuration must not lose the rest
            rows.append({**label, "error_text": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        _free(device)  # outside the except block, whose traceback holds the failed case's tensors
    return rows


def _single(device: str, *, lr: float, compile: bool = False):
    """The trainer's single-process strategy (bf16 autocast over fp32 weights), in this process."""
    from coursekit.ddp.strategy import Single
    from coursekit.options import build
    from coursekit.parallel.api import Context

    opts = build({"strategy": "single", "dtype": "bf16", "lr": lr, "compile": compile})
    return Single(Context.local(opts, device))


# --------------------------------------------------------------------------------------------------- MFU
def mfu_worker(cfg: dict) -> dict:
    """One MFU variant (run in its own process): the trainer's step, timed, then profiled for a few steps."""
    from types import SimpleNamespace

    from coursekit.models import build_model
    from coursekit.profiling import maybe_profile

    device = torch.device(cfg["device"])
    shape = _shape(cfg["model"])
    b, attempts = cfg["micro_batch"], []
    while b >= 1:
        try:
            t_build = time.perf_counter()
            strat = _single(str(device), lr=1e-4, compile=cfg["compile"])
            from coursekit.parallel.compose import parallelize

            m = build_model(cfg["model"], attention="sdpa", seed=0, device=device)  # fp32, on the device
            strat.setup(parallelize(m, strat, strat.ctx))  # --compile: each block, as the trainer does
            build_s = time.perf_counter() - t_build
            ids = torch.randint(0, shape.vocab, (b, cfg["seq"]), device=device)

            pos = torch.arange(cfg["seq"], device=device).expand(b, -1)
            # a micro-batch as coursekit.data makes it (labels = inputs: a step's FLOPs and bytes do not depend on them)
            batch = SimpleNamespace(input_ids=ids, labels=ids, position_ids=pos)

            def step():
                strat.train_step([batch])  # the trainer's step

            times = []
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for i in range(cfg["warmup"] + cfg["steps"]):
                _sync(device)
                t = time.perf_counter()
                step()
                _sync(device)
                times.append(time.perf_counter() - t)
            peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
            trace_dir = Path(cfg["trace_dir"])
            with maybe_profile(trace_dir, 0, wait=1, warmup=1, active=cfg["profile_steps"]) as prof:
                for _ in range(2 + cfg["profile_steps"]):
                    step()
                    _sync(device)
                    prof.step()
            timed = times[cfg["warmup"]:]
            tokens = b * cfg["seq"]
            return {"micro_batch": b, "seq": cfg["seq"], "compile": cfg["compile"], "attempts": attempts,
                    "build_s": build_s, "first_step_s": times[0], "step_times_s": timed,
                    "tokens_per_s": tokens * len(timed) / sum(timed), "peak_allocated_bytes": peak,
                    "trace": str(trace_dir / "trace-rank0.json")}
        except torch.cuda.OutOfMemoryError:
            attempts.append({"micro_batch": b, "result": "out of memory"})
        # outside the except block: its traceback (and the frames holding the model) is gone now
        strat = ids = step = None  # noqa: F841
        _free(device)
        b = int(b * 0.75) if b > 1 else 0
    raise RuntimeError(f"out of memory even at micro-batch 1 (attempts: {attempts})")


def _run_worker(cfg: dict, timeout: float) -> dict:
    """Run ``mfu_worker`` in a subprocess of its own session; kill that session on timeout (our own PIDs only)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the worker and its compile workers: the group we created
        p.communicate()
        return {"error_text": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    res = next((json.loads(line[7:]) for line in reversed(out.splitlines()) if line.startswith("RESULT ")), None)
    if p.returncode != 0 or res is None:
        return {"error_text": f"worker exit {p.returncode}: {err.strip()[-2000:]}", "wall_s": time.perf_counter() - t0}
    res["wall_s"] = time.perf_counter() - t0
    return res


def analyse_trace(path: str, cuda: bool) -> dict:
    """Top kernels (or CPU ops), time shares by kind and, on CUDA, how busy the GPU was in the profiled steps."""
    from coursekit.profiling import top_ops

    cat = "kernel" if cuda else "cpu_op"
    top = top_ops(path, n=12, category=cat)
    events = [e for e in json.loads(Path(path).read_text()).get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") == cat]
    out = {"category": cat, "top": [{"name": n[:160], "us": us} for n, us in top]}
    if not cuda or not events:
        return out
    shares: dict[str, float] = {}
    for e in events:
        k = _kind(e.get("name", ""))
        shares[k] = shares.get(k, 0.0) + float(e.get("dur", 0))
    total = sum(shares.values())
    out["shares"] = {k: v / total for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events)
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s0, e0 in spans[1:]:
        if s0 > cur_e:
            busy, cur_s, cur_e = busy + cur_e - cur_s, s0, e0
        else:
            cur_e = max(cur_e, e0)
    busy += cur_e - cur_s
    out["gpu_busy_fraction"] = busy / (max(e0 for _, e0 in spans) - spans[0][0])
    return out


def _kind(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n:
        return "attention"
    if "gemm" in n or "nvjet" in n or "xmma" in n or "cutlass" in n or "cublas" in n:
        return "matmul"
    if "adam" in n:
        return "optimizer"
    if "softmax" in n or "nll" in n or "cross_entropy" in n:
        return "loss (log-softmax, nll)"
    if "triton" in n:
        return "fused (triton)"
    if "copy" in n or "cast" in n:
        return "copies and casts"
    if "reduce" in n or "norm" in n:
        return "reductions / norms"
    return "elementwise / other"


def check_mfu(args, device, mode: str, env: dict, matmul: dict, deadline: float) -> dict:
    cfg = MFU[mode]
    shape = _shape(cfg["model"])
    out = {"model": shape.name, "seq": cfg["seq"], "attention": "sdpa",
           "step": "coursekit.ddp.strategy.Single.train_step: autocast bf16, fp32 weights, AdamW fused on CUDA", "variants": []}
    if mode == "cuda":
        gpu = env.get("table_gpu")
        if gpu:
            b0 = max_micro_batch(shape, gpu, seq=cfg["seq"], dtype="bf16", attention="sdpa", kernels="cuda",
                                 engine="ddp", limit=256)
            out["solver"] = {"gpu": gpu, "max_micro_batch": b0,
                             "note": "calculator's bf16 (16psi) model; autocast saves more activations, so the "
                                     "worker backs off by 3/4 on out-of-memory"}
        else:
            b0 = 8
            out["solver"] = {"gpu": None, "max_micro_batch": None, "note": "card not in the device table: start at 8"}
    else:
        b0 = cfg["micro_batch"]
        out["solver"] = {"note": "CPU: fixed micro-batch"}
    compile_on = {"auto": mode == "cuda" and not args.quick, "on": True, "off": False}[args.compile]
    variants = [False] + ([True] if compile_on else [])
    steps = cfg["quick_steps"] if args.quick else cfg["steps"]
    for comp in variants:
        name = "compiled" if comp else "eager"
        left = deadline - time.monotonic()
        if left < (60 if mode == "cuda" else 10):
            out["variants"].append({"variant": name, "skipped": f"time budget ({left:.0f} s left)"})
            continue
        b = out["variants"][0].get("micro_batch", b0) if comp and out["variants"] else b0
        wcfg = {"device": str(device), "model": cfg["model"], "seq": cfg["seq"], "micro_batch": b, "compile": comp,
                "warmup": cfg["warmup"] + (1 if comp else 0), "steps": steps,
                "profile_steps": 2 if (args.quick or mode == "cpu") else 3,
                "trace_dir": str(Path(args.out) / f"trace-{name}")}
        res = _run_worker(wcfg, timeout=min(left, 300 if comp else 180))
        res["variant"] = name
        if "tokens_per_s" in res:
            tps = res["tokens_per_s"]
            res["achieved_flops"] = tps * flops_per_token(shape, cfg["seq"])
            res["achieved_flops_causal"] = tps * flops_per_token(shape, cfg["seq"], causal=True)
            peak = env.get("table_bf16_flops")
            res["mfu_table"] = res["achieved_flops"] / peak if peak else None
            res["mfu_matmul"] = res["achieved_flops"] / matmul["bf16_flops"] if matmul.get("bf16_flops") else None
            res["mfu_table_causal"] = res["achieved_flops_causal"] / peak if peak else None
            if comp:
                res["compile_s"] = res["first_step_s"] - min(res["step_times_s"])
            try:
                res["trace_analysis"] = analyse_trace(res["trace"], device.type == "cuda")
            except Exception as e:  # noqa: BLE001
                res["trace_analysis"] = {"error_text": f"{type(e).__name__}: {e}"}
        out["variants"].append(res)
    best = [v for v in out["variants"] if v.get("mfu_table") is not None]
    out["best_mfu_table"] = max((v["mfu_table"] for v in best), default=None)
    out["limits"] = _limits(out)
    return out


def _limits(out: dict) -> list[str]:
    """What the numbers say limits MFU, in words."""
    notes = []
    for v in out["variants"]:
        ta = v.get("trace_analysis") or {}
        if "gpu_busy_fraction" in ta:
            busy = ta["gpu_busy_fraction"]
            notes.append(f"{v['variant']}: GPU busy {busy:.0%} of the profiled steps"
                         + (" (launch/CPU overhead is visible)" if busy < 0.9 else " (kernel efficiency limits)"))
        if ta.get("shares"):
            notes.append(f"{v['variant']}: GPU time by kind: " + ", ".join(
                f"{k} {s:.0%}" for k, s in list(ta["shares"].items())[:5]))
        if v.get("mfu_table") is not None and v.get("mfu_matmul") is not None:
            notes.append(f"{v['variant']}: {v['mfu_table']:.1%} of the data-sheet peak is {v['mfu_matmul']:.1%} of "
                         "what a large bf16 matmul reaches on this card")
    return notes


# --------------------------------------------------------------------------------------------------- report
def _pct(x) -> str:
    return "   n/a" if x is None else f"{x * 100:+5.1f}%"


def _rows(res: dict, section: str) -> list:
    v = res.get(section)
    return v if isinstance(v, list) else []


def goals(res: dict) -> dict:
    """Each goal: True/False over every case of its section (a case that failed to run counts as missed), a
    "passed/cases" count for the peak, None when the section did not run."""
    fl = _rows(res, "flops")
    mem = [r for r in _rows(res, "memory") if r.get("modelled") and "skipped" not in r]
    ok = lambda r, k: "goals" in r and r["goals"][k]  # noqa: E731
    every = lambda rows, pred: None if not rows else all(pred(r) for r in rows)  # noqa: E731
    count = lambda k: None if not mem else f"{sum(ok(r, k) for r in mem)}/{len(mem)}"  # noqa: E731
    g = {"flops_1pct": every(fl, lambda r: r.get("ok", False)),
         "states_exact": every(mem, lambda r: ok(r, "states_exact")),
         "activations_1pct": every(mem, lambda r: ok(r, "activations_1pct")),
         "peak_5pct": count("peak_5pct")}
    best = (res.get("mfu") or {}).get("best_mfu_table")
    g["mfu_45pct"] = None if best is None else best >= GOALS["mfu"]
    return g


def table(res: dict) -> str:
    env = res["environment"]
    L = []
    head = f"GPU check [{env['mode']}] {env.get('device_name', '')} | torch {env['torch']} | {res['wall_s']:.0f} s"
    if env["mode"] != "cuda":
        head += " | no CUDA: reduced CPU version, GPU figures still to be taken"
    L.append(head)
    for name in ("matmul", "flops", "memory", "mfu"):
        if isinstance(res.get(name), dict) and "error_text" in res[name]:
            L.append(f"{name}: ERROR {res[name]['error_text'][:120]}")
    mm = res.get("matmul") or {}
    if "bf16_flops" in mm:
        peak = env.get("table_bf16_flops")
        L.append(f"matmul {mm['n']}^3 bf16: {_rate(mm['bf16_flops'])}"
                 + (f" ({mm['bf16_flops'] / peak:.0%} of {env['table_gpu']}'s {peak / 1e12:.0f})" if peak else ""))
    L.append("FLOPs: formula vs FlopCounterMode")
    for r in _rows(res, "flops"):
        tag = f"  {r['model']:<12} {r['attention']:<5} b{r['batch']} s{r['seq']:<5}"
        L.append(tag + (f" formula {r['formula']:.4g} counted {r['counted']:.4g} err {_pct(r['error'])}"
                        if "counted" in r else f" ERROR {r.get('error_text', '')[:80]}"))
    L.append("Memory (err = predicted/measured - 1): states | saved acts | start bwd | end bwd | opt step | peak "
             "| measured peak")
    for r in _rows(res, "memory"):
        tag = f"  {r['model']:<12} b{r['batch']:<2} s{r['seq']:<5} {r['attention']:<5} rc={r['recompute']:<4}"
        if "phases" not in r:
            L.append(tag + f" {r.get('skipped') or 'ERROR ' + r.get('error_text', '')[:70]}")
            continue
        st = "exact" if r["goals"]["states_exact"] else "DIFF "
        p = r["phases"]
        L.append(tag + f" {st} {_pct(r['terms']['saved_activations']['error'])} {_pct(p['start_of_backward']['error'])}"
                 f" {_pct(p['end_of_backward']['error'])} {_pct(p['optimizer_step']['error'])}"
                 f" {_pct(p['peak']['error'])}"
                 f" {p['peak']['measured'] / GiB:7.3f} GiB" + ("" if r["modelled"] else "  (autocast: not modelled)"))
    m = res.get("mfu") or {}
    if "variants" in m:
        L.append(f"MFU: {m['model']} seq {m['seq']} ({m['step']})")
        for v in m.get("variants", []):
            tag = f"  {v['variant']:<9}"
            if "tokens_per_s" not in v:
                L.append(tag + f" {v.get('skipped') or 'ERROR ' + v.get('error_text', '')[:90]}")
                continue
            top = ((v.get("trace_analysis") or {}).get("top") or [{"name": "?"}])[0]["name"][:40]
            L.append(tag + f" b{v['micro_batch']:<3} {v['tokens_per_s']:10.0f} tok/s "
                     f"{_rate(v['achieved_flops']):>13}  MFU {_fmt(v['mfu_table'])} (table)"
                     f" {_fmt(v['mfu_matmul'])} (matmul)  top: {top}")
    g = res.get("goals", {})
    L.append("Goals: " + ", ".join(f"{k}={v}" for k, v in g.items()))
    return "\n".join(L)


def _rate(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.2f} GFLOP/s"


def _fmt(x) -> str:
    return "  n/a" if x is None else f"{x:5.1%}"


# --------------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/gpu-check", help="folder for gpu_check.json, table.txt and traces")
    p.add_argument("--quick", action="store_true", help="smoke version: 3 memory configurations, no compile")
    p.add_argument("--cpu", action="store_true", help="run the reduced CPU version even when CUDA is available")
    p.add_argument("--gpu", default=None, choices=sorted(GPUS), help="device-table entry for the peak (default: "
                   "detected from the device name)")
    p.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                   help="MFU with torch.compile too (auto: on CUDA in the full run)")
    p.add_argument("--budget-s", type=float, default=440.0, help="start no new work after this many seconds")
    p.add_argument("--skip", default="", help="comma list of sections to skip: matmul,flops,memory,mfu")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        print("\nRESULT " + json.dumps(mfu_worker(json.loads(args.worker))), flush=True)
        return 0
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    mode = "cuda" if cuda else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    res: dict = {"environment": environment(args, device), "quick": args.quick, "goal_thresholds": GOALS}
    print(f"gpu_check: {res['environment']['mode']} on {res['environment'].get('device_name')}", flush=True)
    failed = False
    sections = [("matmul", lambda: check_matmul(device, args.quick)),
                ("flops", lambda: check_flops(device, mode, args.quick)),
                ("memory", lambda: check_memory(device, mode, args.quick, deadline)),
                ("mfu", lambda: check_mfu(args, device, mode, res["environment"], res.get("matmul") or {},
                                          deadline))]
    for name, fn in sections:
        if name in skip:
            continue
        t = time.monotonic()
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - report, keep the other sections
            res[name] = {"error_text": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            failed = True
        res.setdefault("section_s", {})[name] = time.monotonic() - t
        print(f"gpu_check: {name} done in {res['section_s'][name]:.1f} s", flush=True)
    res["coursekit_modules"] = sorted(m for m in sys.modules if m.startswith("coursekit"))
    res["goals"] = goals(res)
    res["wall_s"] = time.monotonic() - t0
    text = table(res)
    (out / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "table.txt").write_text(text + "\n")
    print(text, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
