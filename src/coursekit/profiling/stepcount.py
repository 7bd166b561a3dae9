"""``--count-step``: what one training step of the trainer moves and keeps — its collectives and its peak of
saved activations — counted on every rank on the run's last step, into the final record.

- ``comm``: per collective, calls and payload bytes (``coursekit.comm.CollectiveCounter``: DDP's reducer, DTensor's
  functional collectives for TP/SP, FSDP2's all-gathers and reduce-scatters, the pipeline's send/recv and the
  context-parallel exchanges all end in dispatcher ops it sees); ``comm_bytes`` their sum. The volume convention
  is ``coursekit.comm.volume``'s (all-gather: gathered output, reduce-scatter: full input, send/recv: the tensor).
- ``peak_saved_bytes``: the largest sum of saved-for-backward storages the autograd graph holds at one time during
  the step (deduplicated by storage, parameters and their unsharded copies excluded): one micro-batch's activations
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
    caller still holds elsewhere, e.g. a micro-batch's labels after its backward, is no longer counted)."""
    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class _Peak:
    """Peak bytes of saved-for-backward storages held by the autograd graph at one time during the step."""

    def __init__(self, model):
        import torch

        from coursekit.measure.activations import _held, _storage_key  # the measurement path's own keys

        self._param, self._held = torch.nn.Parameter, _held
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
