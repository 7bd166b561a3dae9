"""What a selective activation checkpoint keeps, made visible to the saved-tensor measurements.

``torch.utils.checkpoint.create_selective_checkpoint_contexts`` keeps the outputs its policy saves in a dict of its
own, not through autograd's ``saved_tensors_hooks``: ``coursekit.measure.activations`` and ``SavedPeak`` would not
see them. ``observed_contexts(policy)`` builds torch's two contexts and swaps their shared storage for one that
tells every active observer (``observing(fn)``) about each tensor it stores; the stored (detached) tensor is what
is handed over, so an observer can watch it until the checkpoint's backward consumes it. Nothing else changes:
without observers the storage behaves as torch's ``defaultdict(dict)``.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict

_OBSERVERS: list = []


@contextlib.contextmanager
def observing(fn):
    """``fn(tensor)`` is called for every tensor a selective checkpoint stores while the block runs."""
    _OBSERVERS.append(fn)
    try:
        yield
    finally:
        _OBSERVERS.remove(fn)


class _Entries(dict):
    def __setitem__(self, idx, value):
        super().__setitem__(idx, value)
        if _OBSERVERS:
            import torch
            from torch.utils._pytree import tree_leaves

            for leaf in tree_leaves(value):
                val = getattr(leaf, "val", None)  # torch's _VersionWrapper; _RECOMPUTE / _CONSUMED markers have none
                if isinstance(val, torch.Tensor):
                    for fn in list(_OBSERVERS):
                        fn(val)


def observed_contexts(policy):
    """``create_selective_checkpoint_contexts(policy)`` whose stored outputs the observers see."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    fw, bw = create_selective_checkpoint_contexts(policy)
    fw.storage = bw.storage = defaultdict(_Entries)
    return fw, bw
