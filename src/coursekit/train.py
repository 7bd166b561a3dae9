"""The reference trainer: one loop, every strategy of the course.

    python -m coursekit.train --strategy single --steps 5                      # one process
    torchrun --nproc-per-node 2 -m coursekit.train --strategy ddp --steps 5  # or: coursekit train --nproc 2 ...

The loop is plain (forward/backward per micro-batch, step); what differs between DDP, ZeRO, FSDP2, TP … lives in a
strategy (``coursekit/strategies``). Rank 0 prints one JSON line per step (prefix ``step``); every rank reports a
final record with the bytes it actually holds for parameters, gradients and optimizer state (``coursekit.launch``
gathers them). Global batch = micro-batch × grad-accum × data-parallel ranks, the same at every world size, so
runs at different world sizes see identical data and can be compared step by step.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

DTYPES = ("fp32", "bf16")


def build_parser() -> argparse.ArgumentParser:
    from coursekit import strategies
    from coursekit.data import KINDS

    p = argparse.ArgumentParser(prog="coursekit train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--strategy", default="single", help=f"one of: {', '.join(strategies.names())}")
    p.add_argument("--model", default="tiny-llama", help="preset name or path to an HF config.json")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per rank per micro-batch")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per optimizer step over all ranks (sets --micro-batch); default 8")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--seq", type=int, default=64, help="sequence length in tokens")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dtype", default="fp32", choices=DTYPES, help="bf16 = autocast with fp32 master weights")
    p.add_argument("--attention", default="sdpa", choices=("sdpa", "eager"))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="synthetic", choices=KINDS)
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP bucket size in MiB")
    p.add_argument("--ds-config", default=None, help="DeepSpeed JSON for the zero* strategies")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint folder (DCP); resumes from its latest step")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every K steps (and at the end)")
    p.add_argument("--crash-at-step", type=int, default=None,
                   help="fault injection: raise at this step unless the run resumed from a checkpoint")
    p.add_argument("--recompute", default="none", choices=("none", "full"),
                   help="activation checkpointing of every transformer block")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    p.add_argument("--profile-dir", default=None, help="write a torch.profiler trace per rank (steps 2-4)")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    return p


def resolve_batch(args, dp_world: int) -> None:
    """Fill ``args.micro_batch`` from the global batch; clear errors for sizes that do not divide."""
    for k in ("steps", "seq", "grad_accum"):
        if getattr(args, k) < 1:
            raise ValueError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    if args.micro_batch is not None and args.micro_batch < 1:
        raise ValueError(f"--micro-batch must be >= 1, got {args.micro_batch}")
    if args.micro_batch is None:
        g = 8 if args.global_batch is None else args.global_batch
        if g < 1 or g % (dp_world * args.grad_accum):
            raise ValueError(f"global batch {g} is not divisible by data-parallel world size {dp_world} x "
                             f"grad-accum {args.grad_accum}; pick a global batch that is a multiple of "
                             f"{dp_world * args.grad_accum}")
        args.micro_batch = g // (dp_world * args.grad_accum)
    elif args.global_batch is not None and args.global_batch != args.micro_batch * args.grad_accum * dp_world:
        raise ValueError(f"--global-batch {args.global_batch} != micro-batch {args.micro_batch} x grad-accum "
                         f"{args.grad_accum} x world {dp_world}")
    args.global_batch = args.micro_batch * args.grad_accum * dp_world


def validate(args) -> None:
    """Checks that need no process group (the CLI runs them before launching anything)."""
    from coursekit import strategies
    from coursekit.memory.presets import PRESETS

    strategies.get(args.strategy)
    if not str(args.model).endswith(".json") and args.model not in PRESETS:
        raise ValueError(f"unknown model {args.model!r}; choose a preset ({', '.join(sorted(PRESETS))}) "
                         "or a path to an HF config.json")
    if args.save_every and not args.ckpt_dir:
        raise ValueError("--save-every needs --ckpt-dir")


def _latest(ckpt_dir: Path) -> int | None:
    f = ckpt_dir / "latest"
    return int(f.read_text()) if f.exists() else None


def _save(strategy, ckpt_dir: Path, step: int, info) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dcp.save(strategy.state_dict(), checkpoint_id=str(ckpt_dir / f"step-{step}"))
    dist.barrier()
    if info.is_main:  # the marker is written last, so a crash mid-save never points at half a checkpoint
        tmp = ckpt_dir / "latest.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, ckpt_dir / "latest")
    dist.barrier()


def run(args) -> dict:
    """Train under an already-launched process group layout; returns this rank's record."""
    import psutil
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from coursekit import dist as ckdist
    from coursekit import strategies
    from coursekit.data import make_dataset, micro_batches
    from coursekit.models import build_model
    from coursekit.profiling import maybe_profile

    validate(args)
    with ckdist.session(seed=args.seed) as info:
        strategy = strategies.get(args.strategy)(args, info)
        dp_world = getattr(strategy, "dp_world", info.world_size)
        dp_rank = getattr(strategy, "dp_rank", info.rank)
        resolve_batch(args, dp_world)
        model = build_model(args.model, attention=args.attention, seed=args.seed)  # same init on every rank
        if args.recompute == "full":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        strategy.setup(model)
        ds = make_dataset(args.data, seq_len=args.seq, num_samples=max(256, 4 * args.global_batch), seed=args.seed)
        start, resumed = 0, None
        ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else None
        if ckpt_dir:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            last = _latest(ckpt_dir)
            if last is not None:
                sd = strategy.state_dict()
                dcp.load(sd, checkpoint_id=str(ckpt_dir / f"step-{last}"))
                strategy.load_state_dict(sd)
                start = resumed = last
        records = []
        tokens_per_step = args.global_batch * args.seq
        prof_ctx = maybe_profile(args.profile_dir, info.rank)
        prof = prof_ctx.__enter__()
        for step in range(start, args.steps):
            if args.crash_at_step is not None and step == args.crash_at_step and resumed is None:
                raise RuntimeError(f"injected failure at step {step} (--crash-at-step)")
            if info.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            mbs = micro_batches(ds, step, micro_batch=args.micro_batch, grad_accum=args.grad_accum,
                                rank=dp_rank, world=dp_world, device=info.device)
            loss = torch.zeros((), device=info.device)
            for i, (ids, labels) in enumerate(mbs):
                loss += strategy.forward_backward(ids, labels, i, len(mbs)).float() / len(mbs)
            strategy.step(measure=step == args.steps - 1)
            if info.device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            dist.all_reduce(loss)  # mean over data-parallel ranks (and replicas that hold the same loss)
            rec = {"step": step, "loss": loss.item() / info.world_size, "step_time_s": dt,
                   "tokens_per_s": tokens_per_step / dt}
            if not records:  # start-up cost: from the launch (or this process's start) to the first step's end
                t_start = float(os.environ.get("COURSEKIT_LAUNCH_T0") or psutil.Process().create_time())
                first_step_after_s = time.time() - t_start
            records.append(rec)
            if info.is_main and not args.quiet:
                print("step " + json.dumps(rec), flush=True)
            prof.step()
            if ckpt_dir and args.save_every and (step + 1) % args.save_every == 0:
                _save(strategy, ckpt_dir, step + 1, info)
        prof_ctx.__exit__(None, None, None)
        if ckpt_dir and records and _latest(ckpt_dir) != args.steps:
            _save(strategy, ckpt_dir, args.steps, info)
        final = {"strategy": args.strategy, "model": args.model, "world_size": info.world_size,
                 "backend": info.backend, "device": info.device, "micro_batch": args.micro_batch,
                 "global_batch": args.global_batch, "grad_accum": args.grad_accum, "seq": args.seq,
                 "dtype": args.dtype, "resumed_from_step": resumed,
                 "first_step_after_s": first_step_after_s if records else None,
                 "num_params": sum(p.numel() for p in model.parameters()),
                 "param_sq_sum": strategy.param_sq_sum(),
                 **(strategy.last_state_bytes or {})}
        # free the wrapped model (DDP's reducer, DeepSpeed's engine) while the process group still exists: left to
        # the garbage collector after teardown, a gloo reducer's destructor can block forever
        del model
        strategy.close()
        gc.collect()
        return {"rank": info.rank, "steps": records, "final": final}


def main(argv=None) -> int:
    from coursekit.launch import report

    args = build_parser().parse_args(argv)
    try:
        out = run(args)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
