"""Pipeline parallelism (Module 4) with ``torch.distributed.pipelining``: stage split and schedules (``stage.py``).

This file holds only the option group (pure Python, so the CLI parses without importing torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from coursekit.spec.schedules import SCHEDULES, SPLIT_BACKWARD, stages_of  # noqa: F401 (the table: spec/)


@dataclass(kw_only=True)
class PipelineOptions:
    pp_schedule: str = field(default="gpipe", metadata={"choices": tuple(SCHEDULES)})
    """Pipeline schedule (micro-batches per step: --grad-accum, alias --microbatches); interleaved-1f1b,
    looped-bfs, interleaved-zb, zbv and dualpipev keep 2 stages per rank."""
