"""PyTorch FSDP2 (Module 3): ``fully_shard`` per block then the root, HSDP, mixed precision, CPU offload.

This file holds only the option group (pure Python, so the CLI parses without importing torch); the strategy is in
``strategy.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

WRAPS = ("block", "pair", "root")


@dataclass(kw_only=True)
class FSDPOptions:
    reshard_after_forward: str = "true"
    """true: free each unit's gathered weights after its forward (FULL_SHARD-like); false: keep them to backward
    (SHARD_GRAD_OP-like); N: keep a copy sharded over N ranks (a smaller all-gather in backward)."""
    wrap: str = field(default="block", metadata={"choices": WRAPS})
    """Units FSDP shards and gathers: every transformer block, every pair of blocks, or the root only."""
    offload: str = field(default="none", metadata={"choices": ("none", "cpu")})
    """cpu: parameters, gradients and optimizer states live on the host (CPUOffloadPolicy); the step runs there."""
    prefetch: int = field(default=0, metadata={"min": 0, "max": 1024})
    """Explicit prefetch: gather the next N units during this one's forward and the previous N in backward (0:
    FSDP2's own, measured from traces on CPU: none in forward, one unit ahead in backward). On CPU the early
    all-gathers are issued asynchronously (gloo's thread), so they overlap compute there too."""
    compile_model: bool = False
    """torch.compile the whole model after fully_shard (one compiled call per step, graph breaks at FSDP2's hooks),
    instead of --compile's per-block compile before it."""
