"""``--count-step``: what one training step of the trainer moves and keeps — its collectives and its peak of
saved activations — counted on every rank on the run's last step, into the final record.

- ``comm``: per collective, calls and payload bytes (``coursekit.comm.CollectiveCounter``: DDP's reducer, DTensor's
  functional collectives for TP/SP, FSDP2's all-gathers and reduce-scatters, the pipeline's send/recv and the
  context-parallel exchanges all end in dispatcher ops it sees); ``comm_bytes`` their sum. The volume convention
  is ``coursekit.comm.volume``'s (all-gather: gathered output, reduce-scatter: full input, send/recv: the tensor).
- ``peak_saved_bytes``: the largest sum of saved-for-backward storages the autograd graph holds at one time during
  the step (deduplicated by storage, parameters and their unsharded copies excluded, views of them too: a DTensor
  linear saves ``weight.t()``, a view of the gathered weight, not the Parameter): one micro-batch's activations
  under DDP or TP, the in-flight micro-batches of a pipeline stage. Unlike ``coursekit.pp.bubble.PeakSaved``, a
  tensor stops counting when the graph releases it even if the caller still holds it (a micro-batch's labels after
  its backward; torch's pipeline schedule keeps every micro-batch's inputs), so this is the saved activations
  alone.

Counting routes every tensor op through Python, so it is for one step, not a run (the step it counts is slower;
its step time is still recorded but is not a timing figure).
"""
from __future__ import annotations

import contextlib
import weakref


class _Saved:
    """What autograd keeps for one saved slot: alive exactly as long as the graph holds that slot (a tensor the
    caller still holds elsewhere, e.g. a micro-batch's labels after its backward, is no longer counted). It holds a
    detached alias, as autograd keeps a node's own output: the tensor itself would tie the node to its output in a
    cycle that outlives the backward where the node is not run (a zero-bubble schedule's weight pass)."""
    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t.detach()


class _Peak:
    """Peak bytes of saved-for-backward storages held by the autograd graph at one time during the step."""

    def __init__(self, model):
        import torch

        from coursekit.measure.activations import _held, _storage_key  # the measurement path's own keys

        self._param, self._held, self._key, self._model = torch.nn.Parameter, _held, _storage_key, model
        self.excluded = {_storage_key(t) for t in [*model.parameters(), *model.buffers()]}
        self.live: dict[int, tuple[int, weakref.WeakSet]] = {}  # storage -> (bytes, the slots that save it)
        self.peak = 0

    def pack(self, t):
        if isinstance(t, self._param):  # FSDP2's unsharded parameters are Parameters too: model state
            return t
        held = self._held(t)  # a DTensor saves its local shard
        key = held.untyped_storage()._cdata
        if key in self.excluded:
            return t
        if key not in self.live and key in {self._key(p) for p in self._model.parameters()}:
            # a view of a parameter FSDP2 (or replicate) gathered for this forward, e.g. the ``weight.t()`` a
            # DTensor linear saves: model state on its own storage, registered on its module only while in use
            # (looked up for every new storage: the local tensor of a DTensor's view is not itself a view)
            return t
        for k in [k for k, (_, slots) in self.live.items() if not slots]:  # released by the graph
            del self.live[k]
        slot = _Saved(t)
        self.live.setdefault(key, (held.untyped_storage().nbytes(), weakref.WeakSet()))[1].add(slot)
        self.peak = max(self.peak, sum(n for n, _ in self.live.values()))
        return slot

    @staticmethod
    def unpack(x):
        return x.t if isinstance(x, _Saved) else x


@contextlib.contextmanager
def count_step(model, enabled: bool):
    """``with count_step(model, on) as out: strategy.train_step(...)``; then ``out`` holds the counts (empty when
    off)."""
    out: dict = {}
    if not enabled:
        yield out
        return
    import torch

    from coursekit.comm.counter import CollectiveCounter

    peak = _Peak(model)
    with CollectiveCounter() as cc, torch.autograd.graph.saved_tensors_hooks(peak.pack, peak.unpack):
        yield out
    ops = sorted({r.op for r in cc.records})
    out["comm"] = {op: {"calls": cc.calls(op), "bytes": cc.total_bytes(op)} for op in ops}
    out["comm_bytes"] = sum(v["bytes"] for v in out["comm"].values())
    out["peak_saved_bytes"] = peak.peak


def predicted_saved(argv: list, nproc: int) -> list[int]:
    """``coursekit memory``'s saved-activation bytes per pipeline rank for the trainer run ``coursekit train
    ARGV`` on ``nproc`` processes: what ``peak_saved_bytes`` of a rank on that stage is measured against (the
    peak along the run's schedule, ``coursekit.memory.pp_order``; data-parallel flavours do not change
    activations). fp32 only: the trainer's bf16 is autocast, which the calculator does not model."""
    from coursekit.memory import estimate
    from coursekit.options import parse
    from coursekit.pp import PipelineOptions
    from coursekit.parallel.validate import validate

    opts = parse([str(a) for a in argv])
    dims = validate(opts, nproc)
    t, p = opts.train, opts.parallel
    if t.dtype != "fp32":
        raise ValueError(f"predicted_saved: the calculator models fp32 runs, not the trainer's {t.dtype} autocast")
    if p.strategy not in ("single", "ddp", "fsdp2", "hsdp"):
        raise ValueError(f"predicted_saved: strategy {p.strategy!r} is not modelled here (single, ddp, fsdp2, hsdp)")
    kw = {}
    if dims.cp > 1:
        from coursekit.cp.options import CPOptions

        kw["cp_impl"] = opts.of(CPOptions).cp_impl
    if dims.tp > 1:
        from coursekit.tp import TPOptions

        kw["sp"] = opts.of(TPOptions).sp
    if dims.pp > 1:
        kw["pp_schedule"] = opts.of(PipelineOptions).pp_schedule
    e = estimate(t.model, micro_batch=t.micro_batch, seq=t.seq, dtype="fp32", precision="fp32", strategy="ddp",
                 dp_replicate=dims.size("loss") // dims.cp, tp=dims.tp, pp=dims.pp, cp=dims.cp,
                 grad_accum=t.grad_accum, attention=t.attention, kernels="cpu", recompute=t.recompute,
                 position_ids="per-sequence", **kw)
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
