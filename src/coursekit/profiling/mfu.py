"""MFU and HFU of a training run: model FLOPs per step, achieved FLOP/s, and the device's dense peak.

    fl = step_flops(opts)                                   # coursekit.flops for the run's model, batch, seq
    peak = device_peak("cpu", "fp32")                       # {"flops", "source"}; measured on CPU, cached
    utilisation(fl, step_time_s=0.02, devices=2, peak=peak) # {"mfu", "hfu", "achieved_flops", ...}

- **Model FLOPs** (MFU's numerator) are the FLOPs the model needs, by the course's convention (``coursekit.flops``:
  6·N per token for the matmuls + 12·L·b·a·s²·d for attention, non-causal, as FlopCounterMode counts eager
  attention). **Hardware FLOPs** (HFU) add what the run recomputes: with ``--recompute full`` every block's forward
  runs twice, so HFU > MFU for the same step time.
- **Peak**: on a GPU, the data-sheet *dense* peak for the run's dtype (``coursekit.memory.gpus``; no 2:4-sparsity
  figures). A GPU whose name is not in the table is refused (``peak`` None, the reason in ``source``), never
  guessed. On a CPU there is no data-sheet figure that a PyTorch matmul reaches, so the peak is **measured**: the
  best rate of a 512³ matmul (best of ~1 s of tries: a loaded machine lowers it) in the run's dtype, with the
  threads one rank uses (``coursekit doctor --peak`` measures and caches it; the trainer reads the cache, or
  measures once and caches).

MFU = model FLOPs per step / step time / (devices × peak). The gap to 100 % on CPU: the tiny model's matmuls are
far smaller than the measured one, the step also runs norms, softmax, the optimizer and the loss all-reduce, and
the ranks wait for the gradient all-reduce (see ``coursekit.profiling.stragglers``).
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

# torch.cuda.get_device_name() spellings -> coursekit.memory.gpus names (data-sheet figures with their sources there)
DTYPE_OF = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def step_flops(opts) -> dict:
    """Model and hardware FLOPs of one optimizer step of the run (all ranks together)."""
    from coursekit.flops import flops_per_step

    t = opts.train
    model = flops_per_step(t.model, t.global_batch, t.seq)
    hw = flops_per_step(t.model, t.global_batch, t.seq, recompute=t.recompute)
    return {"model_flops": model["total"], "hw_flops": hw["total"]}


def cache_file() -> Path:
    root = os.environ.get("COURSEKIT_CACHE_DIR") or Path.home() / ".cache" / "coursekit"
    return Path(root) / "peak.json"


def _cpu_key(dtype: str, threads: int) -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}|threads={threads}|{dtype}"


def measure_cpu_peak(dtype: str = "fp32", n: int = 512, seconds: float = 1.0) -> float:
    """Best FLOP/s of an n×n×n matmul in ``dtype`` on this process's threads (2·n³ FLOPs per matmul)."""
    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    a @ b  # warm-up
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def cpu_peak(dtype: str = "fp32", *, refresh: bool = False) -> dict:
    """The measured CPU peak for ``dtype`` with this process's thread count, from the cache or measured now."""
    import torch

    key = _cpu_key(dtype, torch.get_num_threads())
    f = cache_file()
    cache = {}
    if f.exists():
        try:
            cache = json.loads(f.read_text())
        except ValueError:
            cache = {}
    if refresh or key not in cache:
        cache[key] = measure_cpu_peak(dtype)
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, f)
    return {"flops": cache[key], "source": f"measured: best 512^3 {dtype} matmul rate on "
                                            f"{torch.get_num_threads()} thread(s), cached in {f}"}


def gpu_peak(device_name: str, dtype: str) -> dict:
    """The data-sheet dense peak of a named GPU, or ``flops`` None with the reason (unknown devices are refused)."""
    from coursekit.spec.gpus import from_device_name

    g = from_device_name(device_name)
    if g is not None:
        return {"flops": g.peak_flops(dtype), "source": f"{g.name} data sheet, dense {dtype}"}
    return {"flops": None, "source": f"refused: {device_name!r} is not in the peak table (coursekit.spec.gpus); "
                                     "MFU is not guessed"}


def device_peak(device: str, dtype: str = "fp32") -> dict:
    """Dense peak FLOP/s of one device of the run: data sheet on CUDA, measured on CPU."""
    dtype = DTYPE_OF[dtype]
    if device.startswith("cuda"):
        import torch

        return gpu_peak(torch.cuda.get_device_name(torch.device(device)), dtype)
    return cpu_peak(dtype)


def utilisation(fl: dict, *, step_time_s: float, devices: int, peak: dict) -> dict:
    """Achieved FLOP/s per device, MFU and HFU (None when the peak is refused)."""
    achieved = fl["model_flops"] / step_time_s / devices
    p = peak["flops"]
    return {"model_flops_per_step": fl["model_flops"], "hw_flops_per_step": fl["hw_flops"],
            "achieved_flops_per_device": achieved, "peak_flops": p, "peak_source": peak["source"],
            "mfu": achieved / p if p else None,
            "hfu": fl["hw_flops"] / step_time_s / devices / p if p else None}


def typical_step_time(steps: list[dict]) -> float:
    """Median step time, leaving out the first step (warm-up) when there are others."""
    ts = sorted(s["step_time_s"] for s in (steps[1:] or steps))
    return ts[len(ts) // 2]
