"""The trainer's loop written the Accelerate way, for ``accelerate launch`` (Lab 2, section 6).

    ACCELERATE_USE_CPU=true accelerate launch --config_file configs/accelerate/multi_cpu.yaml \\
        -m coursekit.zero.accel_train --steps 4                                # DDP on 2 CPU processes (gloo)
    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml -m coursekit.zero.accel_train   # GPUs

Same model, seed, data and AdamW as ``coursekit train``, so the losses equal the reference trainer's step by step.
Accelerate picks DDP or DeepSpeed from the launch config; the loop does not change (``accelerator.prepare``,
``accelerator.backward``). Every rank reports its losses and what Accelerate made of the launch (distributed type,
rank, world size) through ``coursekit.launch.report`` when run under the course launcher's results folder.

Why DeepSpeed through Accelerate needs ``--gloo`` on CPU machines: Accelerate 1.x enables DeepSpeed only for
accelerator devices. With ``--cpu`` / ``ACCELERATE_USE_CPU`` its state never selects DeepSpeed; without them, on a
machine with no GPU it finds no backend and tells every process it is rank 0 of 1 (``AcceleratorState``).
``--gloo`` below passes the backend explicitly through Accelerate's public ``InitProcessGroupKwargs``: then its state
counts the ranks right and selects DeepSpeed on CPU too — used only where a test proves it (test_accelerate.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time


def check_config(config) -> None:
    """An Accelerate launch config read by Accelerate's own loader (``load_config_from_file``: its distributed types,
    its key names) plus what that loader lets through (a file that is not a mapping, a non-integer
    ``num_processes``): a ValueError naming the file, before anything launches."""
    from pathlib import Path

    import yaml

    p = Path(config)
    if not p.is_file():
        raise ValueError(f"no such Accelerate config: {config}")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{config}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{config}: an Accelerate config is a mapping of keys, got {type(raw).__name__}")
    n = raw.get("num_processes")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"{config}: num_processes must be a positive integer, got {n!r}")
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        load_config_from_file(str(p))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{config}: {str(e).splitlines()[0]} (Accelerate's config loader)") from None


def accelerate_launch(config: str, args=(), *, nproc: int = 2, cpu: bool = True, timeout: float = 300,
                      env: dict | None = None, cwd: str | None = None) -> list:
    """Run this script under ``accelerate launch --config_file config`` on ``nproc`` processes; per-rank reports.

    ``cpu``: set ``ACCELERATE_USE_CPU=true`` (DDP on CPU). The processes are stamped like ``coursekit.launch``'s and
    stopped (the whole tree) on timeout; a failure raises RuntimeError with the output's tail. ``cwd``: where
    Accelerate runs (default: the repository root), since it resolves a config's ``deepspeed_config_file`` against
    the working directory and ``configs/accelerate`` names its JSON from the root — so a notebook opened in
    ``labs/lab2_zero`` launches the same way.
    """
    import subprocess
    import tempfile
    from pathlib import Path

    from coursekit.dist import free_port
    from coursekit.launch import RESULTS_ENV, STAMP_ENV, kill_tree, launch_stamp, notebook_progress
    from coursekit.zero.ds_config import CONFIG_DIR

    check_config(config)  # refused here, in one line, rather than by every rank after the launch
    config = Path(config).resolve()
    if cwd is None and (CONFIG_DIR.parents[1] / "configs").is_dir():
        cwd = str(CONFIG_DIR.parents[1])

    with tempfile.TemporaryDirectory(prefix="coursekit-accel-") as d:
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", RESULTS_ENV: d,
                    STAMP_ENV: launch_stamp(), **(env or {})}
        if cpu:
            full_env["ACCELERATE_USE_CPU"] = "true"
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes",
               str(nproc), "--main_process_port", str(free_port()), "-m", "coursekit.zero.accel_train",
               *map(str, args)]
        say = notebook_progress(f"accelerate launch {config.name}", [], nproc) or (lambda text: None)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, cwd=cwd)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.communicate()
            say(f"timed out after {timeout:.0f} s")
            raise RuntimeError(f"accelerate launch timed out after {timeout:.0f}s; all processes were stopped")
        say(f"done in {time.monotonic() - t0:.1f} s" if proc.returncode == 0 else
            f"failed after {time.monotonic() - t0:.1f} s")
        if proc.returncode != 0:
            raise RuntimeError(f"accelerate launch failed (exit {proc.returncode}):\n{out[-3000:]}")
        files = sorted(Path(d).glob("rank-*.json"), key=lambda f: int(f.stem.split("-")[1]))
        return [json.loads(f.read_text()) for f in files]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="coursekit.zero.accel_train", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gloo", action="store_true", help="pass backend='gloo' to Accelerate (CPU DeepSpeed, see doc)")
    a = p.parse_args(argv)

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and os.environ.get("COURSEKIT_DEVICE") == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no 60-120 s JIT build of a CPU comm op
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    from coursekit.launch import report

    handlers = [InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(seconds=300))] if a.gloo else []
    acc = Accelerator(kwargs_handlers=handlers)
    rank, world = acc.process_index, acc.num_processes
    if a.global_batch % world:
        print(f"error: --global-batch {a.global_batch} is not divisible by {world} processes", file=sys.stderr)
        return 2
    from coursekit.dist import DistInfo
    from coursekit.options import build
    from coursekit.parallel import ParallelDims
    from coursekit.parallel.api import Context, Strategy
    from coursekit.parallel.run import build_run

    class Accelerated(Strategy):
        """The trainer's step (``train_step``) with Accelerate's two calls: prepare() wraps, backward() reduces."""

        def setup(self, model):
            self.model, self.optimizer = acc.prepare(model, self.make_optimizer(model.parameters()))

        def backward(self, loss, micro, n_micro):
            acc.backward(loss / n_micro)

    opts = build({"strategy": "ddp", "model": a.model, "steps": a.steps, "seq": a.seq, "lr": a.lr, "seed": a.seed,
                  "global_batch": a.global_batch})
    opts.train.micro_batch = micro = a.global_batch // world
    info = DistInfo(rank=rank, world_size=world, local_rank=acc.local_process_index,
                    local_world_size=world, backend=dist.get_backend() if dist.is_initialized() else "none", device=str(acc.device),
                    source="accelerate")
    if acc.distributed_type.value == "DEEPSPEED":
        acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = micro
    set_seed(a.seed)
    # the trainer's set-up (coursekit.parallel.run): same init on every rank, the same data; Accelerate owns the
    # process group, so the Context has no mesh
    run = build_run(info, opts, strategy=Accelerated,
                    ctx=Context(info=info, dims=ParallelDims(world_size=world), mesh=None, opts=opts))
    set_seed(a.seed + rank)
    model = run.strategy.model
    losses = []
    for step in range(a.steps):
        mean = run.strategy.train_step(run.micro_batches(step)).clone()
        if dist.is_initialized():
            dist.all_reduce(mean)
        losses.append(mean.item() / world)
        if acc.is_main_process:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
    stage = model.zero_optimization_stage() if hasattr(model, "zero_optimization_stage") else None
    report({"rank": rank, "world_size": world, "distributed_type": str(acc.distributed_type.value),
            "device": str(acc.device), "losses": losses, "model_class": type(model).__name__, "zero_stage": stage,
            "torch_rank": dist.get_rank() if dist.is_initialized() else None,
            "torch_world": dist.get_world_size() if dist.is_initialized() else None})
    # everyone arrives before the group goes away (coursekit.dist.destroy's rule): a fast rank's teardown under a
    # peer still in gloo aborted that peer once in a tier run ("terminate called without an active exception")
    acc.wait_for_everyone()
    acc.end_training()
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # the trainer's exit: no interpreter teardown of torch's threads once the results are written
