"""ZeRO with DeepSpeed (Lab 2): config builder, what an engine really holds, collectives per step, sweeps.

- ``ds_config``: ``build_config(stage, ...)`` for notebooks; ``finalize`` writes the trainer's batch and dtype in.
- ``held``: per-rank bytes a live engine holds, by category and tier (accelerator / cpu / nvme).
- ``collectives``: the collectives DeepSpeed issues per step, compared with ``coursekit.comm.volume``.
- ``sweep``: bucket / prefetch / overlap sweeps and the benchmark table.

Only ``config`` is pure Python; the others import torch (and DeepSpeed when an engine is passed in).
"""
from dataclasses import dataclass


@dataclass(kw_only=True)
class ZeROOptions:
    ds_config: str | None = None
    """DeepSpeed JSON (default: configs/deepspeed/zero<N>.json); the trainer writes its batch and dtype in."""
