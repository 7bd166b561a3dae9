"""Pipeline parallelism (Module 4) with ``torch.distributed.pipelining``: stage split and schedules (``stage.py``).

This file holds only the option group (pure Python, so the CLI parses without importing torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULES = ("gpipe", "1f1b")


@dataclass(kw_only=True)
class PipelineOptions:
    pp_schedule: str = field(default="gpipe", metadata={"choices": SCHEDULES})
    """Pipeline schedule (micro-batches per step: --grad-accum, alias --microbatches)."""
