"""Run the trainer's own pipeline for a few steps and report, per pp rank, the last step's chunk timeline and its
peak saved-activation bytes, with the bubble and the calculator's prediction.

    launch("coursekit.pp.probe", ["--model", cfg, "--pp", "2", "--grad-accum", "4", "--pp-schedule", "1f1b"],
           nproc=2)
"""
from __future__ import annotations

import sys


def run(argv) -> dict:
    from coursekit import dist as ckdist
    from coursekit.data import make_dataset, micro_batches
    from coursekit.models import build_model
    from coursekit.options import parse
    from coursekit.parallel import registry
    from coursekit.parallel.api import Context
    from coursekit.parallel.compose import parallelize
    from coursekit.pp import SCHEDULES, PipelineOptions
    from coursekit.pp.bubble import PeakSaved

    opts = parse(["--strategy", "ddp", *argv])
    t = opts.train
    with ckdist.session(seed=t.seed) as info:
        ctx = Context.for_run(info, opts)
        strategy = registry.get("ddp")(ctx)
        strategy.setup(parallelize(build_model(t.model, attention=t.attention, seed=t.seed), strategy, ctx))
        ds = make_dataset(t.data, seq_len=t.seq + 1, num_samples=max(256, 4 * t.global_batch), seed=t.seed)
        params = list(strategy.model.parameters())
        for step in range(t.steps):
            mbs = micro_batches(ds, step, micro_batch=t.micro_batch, grad_accum=t.grad_accum, rank=0, world=1,
                                device=info.device)
            with PeakSaved(params) as peak:
                strategy.train_step(mbs)
        pipe = strategy.pipeline
        kind = opts.of(PipelineOptions).pp_schedule
        out = {"rank": info.rank, "stages": pipe.stage_ids, "timeline": pipe.timeline, "peak_saved": peak.peak,
               "schedule": kind, "v": SCHEDULES[kind][1], "m": t.grad_accum, "pp": ctx.dims.pp}
        strategy.close()
        return out


def main(argv=None) -> int:
    from coursekit.launch import report

    report(run(list(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
