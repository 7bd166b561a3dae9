"""The pipeline bubble, measured from per-stage timelines and predicted, and saved-activation peaks per stage.

    theory(p=2, m=4)        -> 1/5      GPipe and 1F1B: (p−1)/(m+p−1)
    theory(p=2, m=4, v=2)   -> 1/9      interleaved, v stages per rank: (p−1)/(v·m+p−1)
    measured(timelines)     -> idle share of each rank over the step (Σ busy chunk time / the step's span)

``timelines`` are ``coursekit.pp.stage.Pipeline.timeline`` of every pp rank: ``(stage, kind, micro-batch, start,
end)`` with kind F (forward), B (backward, input grads; or both), W (weight grads, zero-bubble schedules). The span
runs from the first chunk start on any rank to the last chunk end on any rank (one perf_counter clock per machine),
so a rank's bubble is everything it does not spend computing: waiting for a neighbour, and the send/recv itself.

``PeakSaved`` counts the saved-for-backward bytes alive at once during a schedule step (storages deduplicated, as
``coursekit.measure`` does): GPipe holds all m micro-batches at its peak, 1F1B at most p − stage on each stage.
"""
from __future__ import annotations

import weakref


def theory(p: int, m: int, v: int = 1) -> float:
    return (p - 1) / (v * m + p - 1)


def measured(timelines: list[list]) -> list[float]:
    """Bubble share per rank: 1 − busy / span (span over all ranks' chunks)."""
    t0 = min(c[3] for tl in timelines for c in tl)
    t1 = max(c[4] for tl in timelines for c in tl)
    return [1 - sum(c[4] - c[3] for c in tl) / (t1 - t0) for tl in timelines]


class PeakSaved:
    """``with PeakSaved() as p: schedule.step(...)``; then ``p.peak`` (bytes) and ``p.peak_micro`` (micro-batches
    whose tensors were alive at the peak, from the forward chunk each storage was saved in)."""

    def __init__(self, params=()):
        self.live: dict[int, tuple] = {}  # storage key -> (weakref to a tensor, bytes)
        self.excluded = {p.untyped_storage()._cdata for p in params}
        self.peak = 0
        self._hooks = None

    def pack(self, t):
        key = t.untyped_storage()._cdata
        if key not in self.excluded and key not in self.live:
            self.live[key] = (weakref.ref(t), t.untyped_storage().nbytes())
            for k in [k for k, (r, _) in self.live.items() if r() is None]:
                del self.live[k]
            self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return t

    def __enter__(self):
        import torch

        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
