"""Run the trainer's own pipeline for a few steps and report, per pp rank, every step's chunk timeline, its loss and
send/recv waits, and its peak saved-activation bytes.

    launch("coursekit.pp.probe", ["--model", cfg, "--pp", "2", "--grad-accum", "4", "--pp-schedule", "1f1b"],
           nproc=2)
    launch("coursekit.pp.probe", ["--sweep", "gpipe:2,1f1b:4", "--model", cfg, "--pp", "2", "--micro-batch", "2"],
           nproc=2)    # several schedule:micro-batches runs in one launch (one set of imports)

Each rank reports ``{"rank", "runs": [{"schedule", "m", "v", "pp", "stages", "steps": [{"timeline", "events",
"peak_saved"}, ...]}, ...]}`` and, for the last run's last step, the same keys at the top level (``timeline``,
``events``, ``peak_saved``, ``schedule``, ``v``, ``m``, ``pp``, ``stages``).
"""
from __future__ import annotations

import sys


def _one(argv, info) -> dict:
    from coursekit.options import parse
    from coursekit.parallel.run import build_run
    from coursekit.pp import SCHEDULES, PipelineOptions
    from coursekit.measure.peak import SavedPeak

    opts = parse(["--strategy", "ddp", *argv])
    t = opts.train
    run_ = build_run(info, opts)
    ctx, strategy = run_.ctx, run_.strategy
    params = list(strategy.model.parameters())
    steps = []
    for step in range(t.steps):
        mbs = run_.micro_batches(step)
        with SavedPeak(params=params, held_elsewhere=True) as peak:
            strategy.train_step(mbs)
        pipe = strategy.pipeline
        steps.append({"timeline": pipe.timeline, "events": pipe.events, "peak_saved": peak.peak})
    kind = opts.of(PipelineOptions).pp_schedule
    out = {"stages": strategy.pipeline.stage_ids, "schedule": kind, "v": SCHEDULES[kind][1], "m": t.grad_accum,
           "pp": ctx.dims.pp, "micro_batch": t.micro_batch, "steps": steps}
    strategy.close()
    return out


def run(argv) -> dict:
    from coursekit import dist as ckdist
    from coursekit.options import parse

    argv = list(argv)
    sweep = None
    if "--sweep" in argv:
        i = argv.index("--sweep")
        sweep = [x.split(":") for x in argv[i + 1].split(",")]
        del argv[i:i + 2]
    seed = parse(["--strategy", "ddp", *argv]).train.seed
    with ckdist.session(seed=seed) as info:
        if sweep is None:
            runs = [_one(argv, info)]
        else:
            runs = [_one([*argv, "--pp-schedule", kind, "--grad-accum", m], info) for kind, m in sweep]
    last = runs[-1]
    return {"rank": info.rank, "runs": runs, **{k: v for k, v in last.items() if k != "steps"}, **last["steps"][-1]}


def main(argv=None) -> int:
    from coursekit.launch import report

    report(run(list(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # results reported: skip the interpreter's slow teardown
