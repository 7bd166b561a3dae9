"""The one saved-tensor peak tracker: the most bytes of saved-for-backward storages alive at once during a block of
autograd work (a training step, a pipeline schedule's step), each storage counted once.

    with SavedPeak(model=model) as p: strategy.train_step(mbs)    # what the graph holds (--count-step)
    with SavedPeak(params=params, held_elsewhere=True) as p: ...   # the graph or anyone else (the PP probe)
    p.peak                                                         # bytes

Every tensor autograd saves passes through ``saved_tensors_hooks``' pack hook; the graph is handed a detached alias
(as autograd itself keeps a node's own output without its ``grad_fn``: handing it the tensor itself would tie a node
to its output in a cycle that outlives the backward wherever the node is not run — a zero-bubble schedule's weight
pass runs only part of the graph — and would count memory a real run frees). A storage counts from its first save
until the last watched tensor on it is collected (a weakref callback each, not a scan of every storage per save:
the tracker's own cost stays out of the chunks a probe times):

- the graph's aliases always; with ``held_elsewhere`` also the saved tensor itself, so a tensor the caller still
  holds keeps counting after the graph let it go (torch's pipeline runtime keeps every micro-batch's receive buffer).
- Not counted: the ``params`` given; with ``model``, its parameters and buffers, any ``nn.Parameter`` (FSDP2's
  unsharded parameters are Parameters too: model state), and a view of a parameter registered on the model at the
  time of saving (the ``weight.t()`` a DTensor linear saves of a weight FSDP2 or replicate gathered for this forward).
A DTensor counts its local shard (``coursekit.measure.activations``' keys, the measurement path's own).
"""
from __future__ import annotations

import weakref

from coursekit.measure.activations import _held, _storage_key
from coursekit.measure.sac import observing


class SavedPeak:
    def __init__(self, *, model=None, params=(), held_elsewhere: bool = False):
        self.model, self.held_elsewhere = model, held_elsewhere
        state = [*model.parameters(), *model.buffers()] if model is not None else []
        self.excluded = {_storage_key(t) for t in [*params, *state]}
        self.live: dict[int, list] = {}  # storage key -> [watched tensors alive, bytes]
        self.peak = self.total = 0
        self._refs: set = set()  # the weak references themselves (a collected one never calls back)
        self._hooks = None

    def _model_state(self, t, key) -> bool:
        import torch

        if isinstance(t, torch.nn.Parameter):
            return True
        # looked up for every new storage: the local tensor of a DTensor's view is not itself a view
        return key not in self.live and key in {_storage_key(p) for p in self.model.parameters()}

    def pack(self, t, kept: bool = False):
        held = _held(t)  # a DTensor saves its local shard
        key = held.untyped_storage()._cdata
        if key in self.excluded or (self.model is not None and self._model_state(t, key)):
            return t
        alias = t if kept else t.detach()  # kept: a selective checkpoint's own stored tensor, watched itself
        entry = self.live.get(key)
        if entry is None:  # a new storage: counted until the last tensor watched on it is gone
            entry = self.live[key] = [0, held.untyped_storage().nbytes()]
            self.total += entry[1]
            self.peak = max(self.peak, self.total)
            if self.held_elsewhere:
                self._watch(key, entry, t)
        self._watch(key, entry, alias)
        return alias

    def _watch(self, key, entry, obj) -> None:
        def gone(ref):
            self._refs.discard(ref)
            entry[0] -= 1
            if not entry[0] and self.live.get(key) is entry:  # an address can be reused by a later storage
                del self.live[key]
                self.total -= entry[1]

        entry[0] += 1
        self._refs.add(weakref.ref(obj, gone))

    def __enter__(self):
        import torch

        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._hooks.__enter__()
        self._kept = observing(lambda t: self.pack(t, kept=True))  # what a selective checkpoint stores itself
        self._kept.__enter__()
        return self

    def __exit__(self, *exc):
        self._kept.__exit__(*exc)
        self._hooks.__exit__(*exc)
