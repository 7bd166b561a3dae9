"""The shared baseline of every distributed-vs-single test (CS336's pattern, on every rank).

    base = baseline()                                  # single process, cached once per test session
    res = train("ddp", 4, "--tp", "2")
    assert_equal_to_single(res, base)                  # every rank: losses step by step, Σw² after the run

One set of arguments (COMMON), one tolerance (LOSS_ATOL, PARAM_RTOL) and one cache, so the default tier pays for
the single-process run once however many layouts compare with it.
"""
from __future__ import annotations

import functools

import pytest

from coursekit.launch import launch

STEPS = 4
COMMON = ["--model", "tiny-llama", "--steps", str(STEPS), "--seq", "32", "--global-batch", "8", "--dtype", "fp32",
          "--quiet", "--seed", "3"]

# fp32 tolerance: a distributed run sums gradient shards (and TP partial sums) in another order than one process
# sums the whole batch, so results differ by float rounding only (~1e-7 relative per step, compounding through
# Adam); 1e-5 absolute on a loss of ~5 and 1e-6 relative on Σw² catch any real error (a wrong averaging factor,
# data slice, gradient scale or missing all-reduce moves them by >1e-3).
LOSS_ATOL = 1e-5
PARAM_RTOL = 1e-6


def train(strategy: str, nproc: int, *extra, timeout: float = 300):
    return launch("coursekit.train", ["--strategy", strategy, *COMMON, *map(str, extra)], nproc=nproc,
                  timeout=timeout, stream=False)


@functools.lru_cache(maxsize=None)
def baseline(*extra) -> dict:
    """Rank 0's record of the single-process run with COMMON (+ extra), computed once per session."""
    return train("single", 1, *extra).results[0]


def losses(rec) -> list[float]:
    return [s["loss"] for s in rec["steps"]]


def assert_equal_to_single(res, base: dict, nproc: int | None = None) -> None:
    """Every rank's step losses and final Σw² equal the single-process run's (and the run really trains)."""
    nproc = nproc or len(res.results)
    assert len(res.results) == nproc
    for rank, rec in enumerate(res.results):
        assert rec["rank"] == rank and rec["final"]["world_size"] == nproc
        assert losses(rec) == pytest.approx(losses(base), abs=LOSS_ATOL), f"rank {rank}"
        assert rec["final"]["param_sq_sum"] == pytest.approx(base["final"]["param_sq_sum"], rel=PARAM_RTOL), rank
    assert losses(base)[-1] < losses(base)[0]


def llama_file(folder, **overrides) -> str:
    """A config.json of the tiny Llama with ``overrides`` (e.g. num_hidden_layers=3), written in ``folder``."""
    import json
    from pathlib import Path

    from coursekit.memory import preset, to_hf_config_dict

    d = to_hf_config_dict(preset("tiny-llama")) | overrides
    path = Path(folder) / ("llama-" + "-".join(f"{k}{v}" for k, v in sorted(overrides.items())) + ".json")
    path.write_text(json.dumps(d))
    return str(path)


def cli_ranks(*args, timeout: float = 400) -> list[dict]:
    """Every rank's record of ``coursekit ARGS --json`` run as a user runs it (the CLI in a subprocess)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "coursekit.cli", *map(str, args)], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout[out.stdout.index("{"):])["ranks"]
