"""The course's own jobs on a pool's warm ranks, and a training run held across cells.

    from coursekit.pool import Pool, live
    pool = Pool(3)
    records = pool.run(live.train, "--strategy fsdp2 --steps 2")   # every rank's record, as a launch's .results
    pool.run(live.probe, "coursekit.tp.probe", "--tp 2 --seq 32")  # a lab probe's run(argv) on the same ranks
    pool.run("from coursekit.pool import live; job = live.Job('--strategy fsdp2 --global-batch 6')")  # once
    pool.run("print(job.step(), job.held())")                        # each cell: one more step of the same model

Each is what ``coursekit train`` (or ``launch(probe)``) does in a fresh torchrun job, run inside the pool's process
group instead (``coursekit.dist.session`` uses a group that already exists and leaves it standing): the same
options, the same set-up (``coursekit.parallel.run.build_run``), the same seeds, so the same losses step by step.
``Job`` keeps the set-up and steps it one cell at a time with the strategy's own ``train_step``; its record of
each step is the loss over the loss ranks (``coursekit.parallel.loss.global_loss``).
"""
from __future__ import annotations

import importlib
import shlex

from coursekit import dist as ckdist
from coursekit.options import parse
from coursekit.parallel.loss import global_loss
from coursekit.parallel.run import build_run
from coursekit.train.loop import run as train_run


def _argv(args) -> list[str]:
    return shlex.split(args) if isinstance(args, str) else [str(a) for a in args]


def train(args) -> dict:
    """This rank's record of ``coursekit train ARGS`` (``coursekit.train.loop.run``) on the pool's group."""
    return train_run(parse(_argv(args)))


def probe(module: str, args) -> dict:
    """This rank's result of a course probe's ``run(argv)`` (e.g. ``coursekit.tp.probe``) on the pool's group."""
    return importlib.import_module(module).run(_argv(args))


class Job:
    """The trainer's set-up for ``args`` (``coursekit train``'s options), held on this rank and stepped on demand."""

    def __init__(self, args):
        self.opts = parse(_argv(args))
        self.info = ckdist.init()
        ckdist.seed_all(self.opts.train.seed, self.info.rank)  # as the trainer seeds: the same model and data
        self.run = build_run(self.info, self.opts)
        self.losses: list[float] = []

    def step(self) -> float:
        """One more training step (the strategy's ``train_step``, measured); the loss over the loss ranks."""
        local = self.run.strategy.train_step(self.run.micro_batches(len(self.losses)), measure=True)
        self.losses.append(global_loss(local, self.run.ctx))
        return self.losses[-1]

    def held(self) -> dict:
        """What this rank held at the last step, in bytes: {"params", "grads", "optimizer"}."""
        held = self.run.strategy.last_state_bytes or {}
        if not held:
            raise RuntimeError("no step measured yet: call step() first")
        return {k: held[k + "_bytes"] for k in ("params", "grads", "optimizer")}

    def param_sq_sum(self) -> float:
        """Σw² of the whole model (every rank the same): what the trainer's final record reports."""
        return self.run.strategy.param_sq_sum()

    def close(self) -> None:
        """Free the wrapped model while the group stands (a gloo reducer left to the collector can block)."""
        self.run.strategy.close()
        del self.run
