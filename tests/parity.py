"""The shared baseline of every distributed-vs-single test (CS336's pattern, on every rank).

    base = baseline()                                  # single process, cached once per test session
    res = train("ddp", 4, "--tp", "2")
    assert_equal_to_single(res, base)                  # every rank: losses step by step, Σw² after the run

One set of arguments (COMMON), one tolerance (LOSS_ATOL, PARAM_RTOL) and one cache, so the default tier pays for
the single-process run once however many layouts compare with it.

Adam is blind to a uniformly scaled gradient (a missing 1/ep or a gradient summed over half the ranks still trains
"equal to one process" within LOSS_ATOL), so the gradients themselves too:

    assert_grads_equal_one_process(["--model", "tiny-qwen3"], "ddp", 2, layout=["--tp", "2"])

runs one forward + backward + the strategy's reduction of the trainer's model on every rank (this file is the
worker) and compares every parameter's gradient with the single process's, within GRAD_RTOL; an expert-parallel
rank's expert gradients with its slice of them.
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


# max |a - b| / max |b| per parameter: fp32 reordering only (1.06e-6 seen on an AMD EPYC host: k_norm's gradient,
# dp2 x cp2 ep2); the bugs this catches, a missing 1/ep or an unsummed TP part, are >= 1e-2
GRAD_RTOL = 2e-6
GRAD_COMMON = ["--seq", "32", "--global-batch", "8", "--seed", "3"]


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


def max_rel(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b)) / max(1e-30, max(abs(y) for y in b))


@functools.lru_cache(maxsize=None)
def _one_process_grads(args: tuple) -> dict:
    return launch(__file__, ["grads", *args, "--strategy", "single"], nproc=1, timeout=180, stream=False).results[0][
        "grads"]


def assert_grads_equal_one_process(args, strategy: str, nproc: int, *, layout=()) -> None:
    """Every rank's gradient of every parameter (after the strategy's reduction) equals the one-process gradient
    of the whole batch (``args`` without the ``layout`` flags); with ``--ep`` an expert gradient equals its rank's
    slice (the EP coordinate from the run's own ParallelDims)."""
    from coursekit.options import parse
    from coursekit.parallel.validate import validate

    args, layout = tuple(map(str, args)), [*map(str, layout), "--strategy", strategy]
    one = _one_process_grads(args)
    dims = validate(parse([*GRAD_COMMON, *args, *layout]), nproc)
    res = launch(__file__, ["grads", *args, *layout], nproc=nproc, timeout=180, stream=False).results
    assert len(res) == nproc
    for rec in res:
        if dims.pp == 1:
            assert set(rec["grads"]) == set(one)
        else:  # a pipeline stage holds its layers' parameters; the stages of one pipeline hold all of them
            assert set(rec["grads"]) <= set(one)
            peers = [r for r in res if all(dims.coord(r["rank"], a) == dims.coord(rec["rank"], a)
                                           for a in ("dp_replicate", "dp_shard", "cp", "tp"))]
            assert set().union(*(r["grads"] for r in peers)) == set(one)
        for name, g in rec["grads"].items():
            want = one[name]
            if ".mlp.experts." in name and dims.ep > 1:  # this rank's experts: a contiguous slice of dim 0
                n, slot = len(want) // dims.ep, dims.coord(rec["rank"], "ep")
                want = want[slot * n:(slot + 1) * n]
            assert len(g) == len(want) and max_rel(g, want) <= GRAD_RTOL, (rec["rank"], name, max_rel(g, want))


def _grads_worker(argv) -> None:
    from coursekit import dist as ckdist
    from coursekit.launch import report
    from coursekit.options import parse
    from coursekit.parallel.run import build_run

    opts = parse([*GRAD_COMMON, *argv])
    with ckdist.session(seed=3) as info:
        run = build_run(info, opts)
        st = run.strategy
        if st.pipeline is not None:  # the schedule's forward and backward over the micro-batches (no step)
            st.pipeline.train_step(st, run.micro_batches(0))
        else:
            for i, b in enumerate(run.micro_batches(0)):
                st.backward(st.forward_loss(b), i, 1)
        st.reduce_grads()  # the part of the reduction a step does before the optimizer (TP's partial gradients)
        grads = {}
        for name, p in st.model.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            name = name.replace("module.", "")
            if st.pipeline is not None:  # coursekit.pp.stage.StageModule keeps the model as .lm
                name = name.removeprefix("lm.")
            grads[name] = g.double().flatten().tolist()
        report({"rank": info.rank, "grads": grads})


if __name__ == "__main__":
    import sys

    from coursekit.launch import finish

    if sys.argv[1:2] == ["grads"]:
        _grads_worker(sys.argv[2:])
        finish(0)  # no interpreter teardown of a distributed worker (see coursekit.launch.finish)
