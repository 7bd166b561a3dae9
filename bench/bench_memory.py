"""Speed of the memory calculator: one estimate, a 10,000-configuration grid, and the solvers.

    python bench/bench_memory.py            # prints the figures
    python bench/bench_memory.py --json     # one JSON object

The calculator is pure Python; the target is the whole grid in well under a second.
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import time

from coursekit.memory import PRESETS, TrainConfig, activation_bytes, estimate, max_micro_batch, min_gpus

MODELS = ("tiny-llama", "gpt2", "llama3-8b", "llama3-70b", "llama3-405b")


def grid(n: int = 10_000) -> list[tuple[str, TrainConfig]]:
    """``n`` distinct, valid configurations over models, shapes, dtypes, recompute and parallel layouts."""
    axes = itertools.product(
        MODELS, (1, 2, 4, 8), (512, 1024, 4096, 8192), ("bf16", "fp32"), ("sdpa", "eager"),
        ("none", "selective", "full"), (0, 1, 2, 3), ((8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 8, 1)))
    out = []
    for model, b, s, dtype, attn, rc, zero, (dp, tp, pp) in axes:
        shape = PRESETS[model]
        if (shape.positions == "learned" and s > shape.max_positions) or shape.heads % tp or shape.layers < pp:
            continue
        out.append((model, TrainConfig(batch=b, seq=s, dtype=dtype, attention=attn, recompute=rc, zero=zero,
                                       dp=dp, tp=tp, pp=pp, gpu="H100-80GB")))
        if len(out) == n:
            return out
    raise RuntimeError(f"grid too small: {len(out)} < {n}")


def timed(fn, repeat: int = 3) -> float:
    """Best wall time of ``repeat`` runs, each from a cold activation cache (no run profits from an earlier one)."""
    best = float("inf")
    for _ in range(repeat):
        activation_bytes.cache_clear()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--n", type=int, default=10_000)
    ns = p.parse_args(argv)
    single_kw = dict(batch=1, seq=8192, dp=8, zero=3, gpu="H100-80GB")
    n_single = 2000
    t_warm = timed(lambda: [estimate("llama3-8b", **single_kw) for _ in range(n_single)]) / n_single

    def cold():
        for _ in range(n_single):
            activation_bytes.cache_clear()
            estimate("llama3-8b", **single_kw)
    t_single = timed(cold) / n_single
    configs = grid(ns.n)
    t_grid = timed(lambda: [estimate(m, c) for m, c in configs])
    t_build = timed(lambda: grid(ns.n))
    t_batch = timed(lambda: max_micro_batch("llama3-8b", "H100-80GB", seq=4096, dp=8, zero=3), repeat=5)
    t_gpus = timed(lambda: min_gpus("llama3-405b", "H100-80GB", batch=1, seq=8192, zero=3, tp=8,
                                    recompute="full"), repeat=5)
    res = {"python": platform.python_version(), "machine": platform.machine(),
           "estimate_us": t_single * 1e6, "estimate_cached_us": t_warm * 1e6, "grid_configs": len(configs), "grid_s": t_grid,
           "grid_build_s": t_build, "max_micro_batch_ms": t_batch * 1e3, "min_gpus_ms": t_gpus * 1e3}
    if ns.json:
        print(json.dumps(res))
    else:
        print(f"one estimate (llama3-8b, ZeRO-3, dp 8):  {res['estimate_us']:8.1f} µs  "
              f"({res['estimate_cached_us']:.1f} µs with its activation terms cached)")
        print(f"grid of {len(configs)} configurations (cold):  {t_grid:8.3f} s  "
              f"({t_grid / len(configs) * 1e6:.1f} µs each; building the configs: {t_build:.3f} s)")
        print(f"max_micro_batch (llama3-8b, H100):      {res['max_micro_batch_ms']:8.2f} ms")
        print(f"min_gpus (llama3-405b, tp 8, H100):     {res['min_gpus_ms']:8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
