"""Tensor parallelism (Module 4) with DTensor ``parallelize_module``: the plan in ``plan.py``.

This file holds only the option group (pure Python, so the CLI parses without importing torch).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class TPOptions:
    sp: bool = False
    """Sequence parallelism with --tp: norms and the residual stream hold seq/tp tokens per rank (all-gather +
    reduce-scatter replace each all-reduce)."""
