"""Tensor parallelism (Module 4) with DTensor ``parallelize_module``: the plan in ``plan.py``.

This file holds only the option group (pure Python, so the CLI parses without importing torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from coursekit.spec.run import SP_STYLES


@dataclass(kw_only=True)
class TPOptions:
    sp: bool = False
    """Sequence parallelism with --tp: norms and the residual stream hold seq/tp tokens per rank (all-gather +
    reduce-scatter replace each all-reduce)."""
    sp_style: str = field(default="torch", metadata={"choices": SP_STYLES})
    """With --sp: torch (torch's plan: the column-parallel linears save the all-gathered input) or megatron
    (Megatron-LM's: they save the rank's sequence shard and all-gather it again in backward)."""
