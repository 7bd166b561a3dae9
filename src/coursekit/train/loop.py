"""The reference trainer's loop: plain, the same for every strategy and every layout.

    for step in range(start, steps):
        loss = strategy.train_step(micro_batches(step))   # the strategy owns forward/backward/step (and PP)
        record(step, global_loss(loss))                   # mean over the loss group, from the last stage

Around it, each in its own module: the layout and its checks (``layout``), the model transforms
(``coursekit.parallel.compose``), checkpoints (``checkpoint``), fault injection (``faults``) and the profiler
(``coursekit.profiling.maybe_profile``, a ``with`` block that closes on errors). Rank 0 prints one ``step {json}``
line per step (``coursekit train`` turns them into a progress bar); every rank returns its record: ``steps``
and ``final`` (what it holds, measured on the last step).
"""
from __future__ import annotations

import gc
import json
import os
import time


def run(opts) -> dict:
    """Train under an already-launched process group; returns this rank's record."""
    import psutil
    import torch

    from coursekit import dist as ckdist
    from coursekit.data import make_dataset, micro_batches
    from coursekit.models import build_model
    from coursekit.spec import registry
    from coursekit.parallel.api import Context
    from coursekit.parallel.compose import parallelize
    from coursekit.profiling import maybe_profile
    from coursekit.profiling.mfu import device_peak, step_flops, typical_step_time, utilisation
    from coursekit.profiling.stepcount import count_step
    from coursekit.profiling.stragglers import CollectiveRecorder, gather_and_find
    from coursekit.train.checkpoint import Checkpointer
    from coursekit.profiling.faults import (kill_in_save, last_step_at, maybe_crash, maybe_kill, maybe_slow, note_step,
                                        recovery, restart_count)
    from coursekit.parallel.validate import data_cut, parse_steps
    from coursekit.parallel.loss import global_loss

    t = opts.train
    with ckdist.session(seed=t.seed) as info:
        ctx = Context.for_run(info, opts)
        dims = ctx.dims
        strategy = registry.get(opts.parallel.strategy)(ctx)
        model = build_model(t.model, attention=t.attention, seed=t.seed)  # same init on every rank
        num_params = sum(p.numel() for p in model.parameters())  # before a pipeline split keeps only a stage
        strategy.setup(parallelize(model, strategy, ctx))
        ds = make_dataset(t.data, seq_len=t.seq + 1, num_samples=max(256, 4 * t.global_batch), seed=t.seed)
        batch_rank, cut = dims.coord(info.rank, "batch"), data_cut(opts, dims, info.rank)
        ckpt = (Checkpointer(opts.ckpt.ckpt_dir, info, opts.ckpt.save_every, opts.ckpt.async_ckpt)
                if opts.ckpt.ckpt_dir else None)
        resumed = ckpt.resume(strategy) if ckpt else None
        start = resumed or 0
        records, tokens_per_step, step_counts = [], t.global_batch * t.seq, {}
        a, b = parse_steps(opts.profile.profile_steps)
        sync = torch.cuda.synchronize if info.device.startswith("cuda") else (lambda: None)
        colls = CollectiveRecorder(getattr(strategy, "model", None))  # who waits for whom (profiling.stragglers)
        in_save = kill_in_save(opts.faults, info.rank, opts.ckpt.ckpt_dir)
        before = last_step_at(opts.ckpt.ckpt_dir)  # a failed earlier attempt's last step, before we write ours
        with maybe_profile(opts.profile.profile_dir, info.rank, steps=(a, b)) as prof:
            for step in range(start, t.steps):
                maybe_crash(step, opts.faults.crash_at_step, resumed is not None)
                maybe_kill(step, opts.faults, info.rank, opts.ckpt.ckpt_dir)
                sync()
                t0 = time.perf_counter()
                maybe_slow(opts.faults, info.rank)  # inside the step: a straggler's step is longer
                mbs = micro_batches(ds, step, micro_batch=t.micro_batch, grad_accum=t.grad_accum, rank=batch_rank,
                                    world=dims.size("batch"), cut=cut, device=info.device)
                counting = opts.profile.count_step and step == t.steps - 1
                with colls.step(), count_step(strategy.model, counting) as counted:
                    local = strategy.train_step(mbs, measure=step == t.steps - 1)
                if counting:
                    step_counts = counted
                sync()
                dt = time.perf_counter() - t0
                rec = {"step": step, "loss": global_loss(local, ctx),
                       "local_loss": None if local is None else local.item(), "step_time_s": dt,
                       "tokens_per_s": tokens_per_step / dt}
                if not records:  # start-up cost: from the launch (or this process's start) to the first step's end
                    t_start = float(os.environ.get("COURSEKIT_LAUNCH_T0") or psutil.Process().create_time())
                    first_step_after_s = time.time() - t_start
                    recovery_s, recovery_from = recovery(opts.ckpt.ckpt_dir, before)
                records.append(rec)
                if info.is_main:
                    note_step(opts.ckpt.ckpt_dir, step)
                if info.is_main and not opts.output.quiet:
                    print("step " + json.dumps(dict(rec, steps=t.steps)), flush=True)
                prof.step()
                if ckpt and ckpt.due(step + 1):
                    ckpt.save(strategy, step + 1, before_marker=in_save)
        if ckpt:
            ckpt.finish()  # an async save in flight completes before the final one is considered
        if ckpt and records and ckpt.latest() != t.steps:
            ckpt.save(strategy, t.steps, before_marker=in_save)
        if ckpt:
            ckpt.finish()
        use = (utilisation(step_flops(opts), step_time_s=typical_step_time(records), devices=info.world_size,
                           peak=device_peak(info.device, t.dtype)) if records else {})
        stragglers = gather_and_find(records, info.rank, colls)
        final = {"strategy": opts.parallel.strategy, "model": t.model, "world_size": info.world_size,
                 "layout": dims.to_dict(), "coords": dims.coords(info.rank),
                 "backend": info.backend, "device": info.device, "micro_batch": t.micro_batch,
                 "global_batch": t.global_batch, "grad_accum": t.grad_accum, "seq": t.seq,
                 "dtype": t.dtype, "resumed_from_step": resumed, "restart_count": restart_count(),
                 "recovery_s": recovery_s if records else None,
                 "recovery_from": recovery_from if records else None,
                 "first_step_after_s": first_step_after_s if records else None,
                 "num_params": num_params,
                 "param_sq_sum": strategy.param_sq_sum(),
                 **use, "stragglers": stragglers,
                 **(ckpt.stats() if ckpt else {}), **step_counts,
                 **(strategy.last_state_bytes or {})}
        # free the wrapped model (DDP's reducer, DeepSpeed's engine) while the process group still exists: left to
        # the garbage collector after teardown, a gloo reducer's destructor can block forever
        del model
        strategy.close()
        gc.collect()
        return {"rank": info.rank, "steps": records, "final": final}
