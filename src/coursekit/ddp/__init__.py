"""Data parallelism with PyTorch DDP (Module 1): ``single`` and ``ddp`` strategies (``strategy.py``).

This file holds only the option group (pure Python, so the CLI parses without importing torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class DDPOptions:
    bucket_mb: float | None = field(default=None, metadata={"gt": 0})
    """DDP gradient bucket size in MiB (default 25): smaller buckets start their all-reduce earlier in backward."""
