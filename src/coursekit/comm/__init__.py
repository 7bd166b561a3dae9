"""Collectives (Module 1): measure them, model their volume, count them in a live job, build one from send/recv.

- ``volume``  (pure Python): bytes per collective and per strategy step; nccl-tests' payload and bus-bandwidth
  conventions, used by everything below.
- ``counter``: ``CollectiveCounter`` records every collective a job issues (DDP's reducer, DeepSpeed, DTensor too).
- ``bench``:   ``run_benchmark`` / ``python -m coursekit.comm.bench``: time, algbw, busbw per op and size;
  ``plot_busbw``.
- ``ring``:    ``ring_all_reduce`` / ``ring_reduce_scatter`` / ``ring_all_gather`` from point-to-point messages.

Names are imported lazily, so ``import coursekit.comm`` (and ``coursekit.comm.volume``) needs no torch.
"""
_LAZY = {
    "CollectiveCounter": "coursekit.comm.counter",
    "run_benchmark": "coursekit.comm.bench", "plot_busbw": "coursekit.comm.bench",
    "ring_all_reduce": "coursekit.comm.ring", "ring_reduce_scatter": "coursekit.comm.ring",
    "ring_all_gather": "coursekit.comm.ring",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'coursekit.comm' has no attribute {name!r}")
