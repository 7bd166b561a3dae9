"""The reference trainer's loop: plain, the same for every strategy and every layout.

    for step in range(start, steps):
        loss = strategy.train_step(micro_batches(step))   # the strategy owns forward/backward/step (and PP)
        record(step, global_loss(loss))                   # mean over the loss group, from the last stage

Around it, each in its own module: the run's set-up (``coursekit.parallel.run.build_run``: the checks, the mesh,
the model and its transforms), checkpoints (``checkpoint``), fault injection (``faults``) and the profiler
(``coursekit.profiling.maybe_profile``, a ``with`` block that closes on errors). Rank 0 prints one ``step {json}``
line per step (``coursekit train`` turns them into a progress bar); every rank returns its record: ``steps``
and ``final`` (what it holds, measured on the last step).
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import json
import multiprocessing
import os
import time

from coursekit.memory.calculator import resolve_model
from coursekit.models import model_class
from coursekit.parallel.compose import model_parts
from coursekit.spec import registry
from coursekit.spec.families import plan_for


# what ``run`` imports inside (torch and the run's set-up: the CLI process imports this file without them)
RUN_MODULES = ("coursekit.dist", "coursekit.parallel.run", "coursekit.parallel.validate", "coursekit.profiling",
               "coursekit.profiling.faults", "coursekit.profiling.stragglers", "coursekit.train.checkpoint")


def prepare(opts) -> None:
    """Import what the run builds from ahead of the run (the model's transformers modules, which transformers loads
    lazily on the first build): ``coursekit.train.main`` imports without the collector, then freezes the imports.
    Bad input is left to the run's own checks (after the process group is up, with their messages)."""
    try:
        model_class(opts.train.model, attention=opts.train.attention)
    except (ValueError, KeyError, OSError):
        pass


def preload_run(opts) -> None:
    """The modules ``run`` and its strategy import, imported ahead of it (``coursekit.train.preload``; no effect but
    the imports). A name the registry does not know is left to the run's own error."""
    for name in RUN_MODULES:
        importlib.import_module(name)
    with contextlib.suppress(ValueError, KeyError, ImportError):
        registry.get(opts.parallel.strategy)


def run(opts) -> dict:
    """Train under an already-launched process group; returns this rank's record."""
    import torch

    from coursekit import dist as ckdist
    from coursekit.parallel.run import build_run
    from coursekit.profiling import maybe_profile
    from coursekit.profiling.faults import kill_in_save, last_step_at
    from coursekit.profiling.stragglers import CollectiveRecorder
    from coursekit.parallel.validate import parse_steps
    from coursekit.train.checkpoint import Checkpointer

    t = opts.train
    with ckdist.session(seed=t.seed) as info:
        run_ = build_run(info, opts)
        strategy = run_.strategy
        ckpt = (Checkpointer(opts.ckpt.ckpt_dir, info, opts.ckpt.save_every, opts.ckpt.async_ckpt, opts.ckpt.keep)
                if opts.ckpt.ckpt_dir else None)
        resumed = ckpt.resume(strategy) if ckpt else None
        loop = _Loop(run_, ckpt, resumed,
                     sync=torch.cuda.synchronize if info.device.startswith("cuda") else (lambda: None),
                     colls=CollectiveRecorder(getattr(strategy, "model", None)),  # who waits for whom
                     in_save=kill_in_save(opts.faults, info.rank, opts.ckpt.ckpt_dir),
                     before=last_step_at(opts.ckpt.ckpt_dir))  # a failed earlier attempt's last step, before ours
        with maybe_profile(opts.profile.profile_dir, info.rank, steps=parse_steps(opts.profile.profile_steps)) as prof:
            for step in range(resumed or 0, t.steps):
                loop.step(step)
                prof.step()
                if ckpt and ckpt.due(step + 1):
                    ckpt.save(strategy, step + 1, before_marker=loop.in_save)
        if ckpt:
            ckpt.finish()  # an async save in flight completes before the final one is considered
        if ckpt and loop.records and ckpt.latest() != t.steps:
            ckpt.save(strategy, t.steps, before_marker=loop.in_save)
        if ckpt:
            ckpt.finish()
        final = loop.final()
        # free the wrapped model (DDP's reducer, DeepSpeed's engine) while the process group still exists: left to
        # the garbage collector after teardown, a gloo reducer's destructor can block forever
        del run_
        strategy.close()
        gc.collect()
        return {"rank": info.rank, "steps": loop.records, "final": final}


class _Loop:
    """One step of the loop (fault injection, the step, its record) and the final record."""

    def __init__(self, run, ckpt, resumed, *, sync, colls, in_save, before):
        self.run, self.ckpt, self.resumed, self.sync, self.colls = run, ckpt, resumed, sync, colls
        self.in_save, self.before = in_save, before
        self.opts, self.info = run.ctx.opts, run.ctx.info
        self.records, self.step_counts, self.startup = [], {}, {}
        self.load = _expert_load(run)  # MoE: tokens per expert per step (None for a dense model)

    def step(self, step: int) -> None:
        from coursekit.parallel.loss import global_loss
        from coursekit.profiling.faults import maybe_crash, maybe_kill, maybe_slow, note_step
        from coursekit.profiling.stepcount import count_step

        opts, info, t, strategy = self.opts, self.info, self.opts.train, self.run.strategy
        maybe_crash(step, opts.faults.crash_at_step, self.resumed is not None)
        maybe_kill(step, opts.faults, info.rank, opts.ckpt.ckpt_dir)
        self.sync()
        t0 = time.perf_counter()
        maybe_slow(opts.faults, info.rank)  # inside the step: a straggler's step is longer
        mbs = self.run.micro_batches(step)
        counting = opts.profile.count_step and step == t.steps - 1
        with self.colls.step(), count_step(strategy.model, counting) as counted:
            local = strategy.train_step(mbs, measure=step == t.steps - 1)
        if counting:
            self.step_counts = counted
        self.sync()
        dt = time.perf_counter() - t0
        rec = {"step": step, "loss": global_loss(local, self.run.ctx),
               "local_loss": None if local is None else local.item(), "step_time_s": dt,
               "tokens_per_s": t.global_batch * t.seq / dt}
        if self.load is not None:
            rec.update(self._experts(strategy))
        if not self.records:
            self.startup = self._startup()
        self.records.append(rec)
        if info.is_main:
            note_step(opts.ckpt.ckpt_dir, step)
        if info.is_main and not opts.output.quiet:
            print("step " + json.dumps(dict(rec, steps=t.steps)), flush=True)

    def _experts(self, strategy) -> dict:
        """This step's expert load: this rank's router counts per layer, their sum over the loss ranks and the TP
        ranks, which split each sparse block's tokens (the whole batch), its imbalance, the choices a capacity
        dropped and the router's auxiliary loss."""
        import torch
        import torch.distributed as dist

        from coursekit.measure.experts import imbalance

        mine = self.load.take()
        total = torch.tensor(mine, dtype=torch.long, device=self.info.device)
        ctx = self.run.ctx
        for group in ("loss", "tp"):  # a sum over loss x tp, one axis group after the other
            if ctx.dims.size(group) > 1:
                dist.all_reduce(total, group=ctx.mesh[group].get_group())
        glob = total.tolist()
        dropped = []
        for m in strategy.model.modules():
            if hasattr(m, "dropped"):  # coursekit.ep.dispatch.ExpertShard: the choices its capacity dropped
                dropped.append(sum(m.dropped))
                m.dropped.clear()
        aux = strategy.aux_losses
        strategy.aux_losses = []
        return {"expert_tokens": mine, "expert_tokens_all_ranks": glob, "expert_imbalance": imbalance(glob),
                "dropped_choices": dropped, "aux_loss": sum(aux) / len(aux) if aux else None}

    def _startup(self) -> dict:
        """Start-up cost: from the launch (or this process's start) to the first step's end; recovery after a
        restart."""
        import psutil

        from coursekit.profiling.faults import recovery

        t_start = float(os.environ.get("COURSEKIT_LAUNCH_T0") or psutil.Process().create_time())
        recovery_s, recovery_from = recovery(self.opts.ckpt.ckpt_dir, self.before)
        return {"recovery_s": recovery_s, "recovery_from": recovery_from, "first_step_after_s": time.time() - t_start}

    def final(self) -> dict:
        from coursekit.profiling.faults import restart_count
        from coursekit.profiling.mfu import device_peak, step_flops, typical_step_time, utilisation
        from coursekit.profiling.stragglers import gather_and_find

        opts, info, t, strategy, dims = self.opts, self.info, self.opts.train, self.run.strategy, self.run.ctx.dims
        records = self.records
        use = (utilisation(step_flops(opts), step_time_s=typical_step_time(records), devices=info.world_size,
                           peak=device_peak(info.device, t.dtype)) if records else {})
        stragglers = gather_and_find(records, info.rank, self.colls)
        started = {k: self.startup.get(k) for k in ("recovery_s", "recovery_from", "first_step_after_s")}
        return {"strategy": opts.parallel.strategy, "model": t.model, "world_size": info.world_size,
                "layout": dims.to_dict(), "coords": dims.coords(info.rank),
                "backend": info.backend, "device": info.device, "micro_batch": t.micro_batch,
                "global_batch": t.global_batch, "grad_accum": t.grad_accum, "seq": t.seq,
                "dtype": t.dtype, "resumed_from_step": self.resumed, "restart_count": restart_count(),
                "worker": "forked" if multiprocessing.parent_process() else "interpreter",  # launch.agent's start
                **started, "num_params": self.run.num_params, "param_sq_sum": strategy.param_sq_sum(),
                **use, "stragglers": stragglers, **(self.ckpt.stats() if self.ckpt else {}), **self.step_counts,
                **(strategy.last_state_bytes or {})}


def _expert_load(run):
    shape = resolve_model(run.ctx.opts.train.model)
    if not shape.is_moe:
        return None
    from coursekit.measure.experts import ExpertLoad  # torch

    plan = plan_for(shape.family, "the expert load", run.ctx.opts.train.model)
    return ExpertLoad(model_parts(run.model), plan, shape.experts)
