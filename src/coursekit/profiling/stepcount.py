"""``--count-step``: what one training step of the trainer moves and keeps — its collectives and its peak of
saved activations — counted on every rank on the run's last step, into the final record.

- ``comm``: per collective, calls and payload bytes (``coursekit.comm.CollectiveCounter``: DDP's reducer, DTensor's
  functional collectives for TP/SP, FSDP2's all-gathers and reduce-scatters, the pipeline's send/recv and the
  context-parallel exchanges all end in dispatcher ops it sees); ``comm_bytes`` their sum. The volume convention
  is ``coursekit.comm.volume``'s (all-gather: gathered output, reduce-scatter: full input, send/recv: the tensor).
- ``peak_saved_bytes``: the largest sum of saved-for-backward storages the autograd graph holds at one time during
  the step (deduplicated by storage, parameters and their unsharded copies excluded, views of them too: a DTensor
  linear saves ``weight.t()``, a view of the gathered weight, not the Parameter): one micro-batch's activations
  under DDP or TP, the in-flight micro-batches of a pipeline stage (``coursekit.measure.peak.SavedPeak``). Unlike
  the PP probe's count (``held_elsewhere``), a tensor stops counting when the graph releases it even if the caller
  still holds it (a micro-batch's labels after its backward; torch's pipeline schedule keeps every micro-batch's
  inputs), so this is the saved activations alone.

Counting routes every tensor op through Python, so it is for one step, not a run (the step it counts is slower;
its step time is still recorded but is not a timing figure).
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def count_step(model, enabled: bool):
    """``with count_step(model, on) as out: strategy.train_step(...)``; then ``out`` holds the counts (empty when
    off)."""
    out: dict = {}
    if not enabled:
        yield out
        return
    from coursekit.comm.counter import CollectiveCounter
    from coursekit.measure.peak import SavedPeak

    with CollectiveCounter() as cc, SavedPeak(model=model) as peak:
        yield out
    summary = cc.summary()  # the counter's one plan of the step, per op
    out["comm"] = {op: {"calls": summary[op]["calls"], "bytes": summary[op]["bytes"]} for op in sorted(summary)}
    out["comm_bytes"] = sum(v["bytes"] for v in out["comm"].values())
    out["peak_saved_bytes"] = peak.peak


def predicted_saved(argv: list, nproc: int) -> list[int]:
    """``coursekit memory``'s saved-activation bytes per pipeline rank for the trainer run ``coursekit train
    ARGV`` on ``nproc`` processes: what ``peak_saved_bytes`` of a rank on that stage is measured against (the
    peak along the run's schedule, ``coursekit.memory.pp_order``; data-parallel flavours do not change
    activations). fp32 only: the trainer's bf16 is autocast, which the calculator does not model."""
    from dataclasses import replace

    from coursekit.memory import estimate
    from coursekit.options import parse
    from coursekit.parallel.validate import validate
    from coursekit.spec.runspec import RunSpec

    opts = parse([str(a) for a in argv])
    dims = validate(opts, nproc)
    t, p = opts.train, opts.parallel
    if t.dtype != "fp32":
        raise ValueError(f"predicted_saved: the calculator models fp32 runs, not the trainer's {t.dtype} autocast")
    if p.strategy not in ("single", "ddp", "fsdp2", "hsdp"):
        raise ValueError(f"predicted_saved: strategy {p.strategy!r} is not modelled here (single, ddp, fsdp2, hsdp)")
    # the run as the trainer describes it; its data-parallel flavour does not change activations, so its
    # data-parallel ranks are priced as DDP replicas
    spec = replace(RunSpec.from_options(opts), strategy="ddp", world=None, dp_shard=None,
                   dp_replicate=dims.size("loss") // dims.cp)
    e = estimate(spec, precision="fp32", kernels="cpu", position_ids="per-sequence")
    if dims.pp == 1:
        return [e.categories["saved_activations"]]
    # what the graph holds: the in-flight micro-batches, and the step's ids / labels that torch's schedule cuts
    # into views of one tensor (their storage stays saved while any micro-batch is in flight), not the stage's
    # receive buffers of the micro-batches it is done with
    from coursekit.memory.calculator import resolve_model
    from coursekit.memory.engines import megatron

    shape = resolve_model(t.model)
    return [megatron.saved_bytes(e.activations, megatron.stage(shape, e.config, i), e.config, shape, graph_only=True)
            for i in range(dims.pp)]
