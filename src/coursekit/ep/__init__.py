"""Expert parallelism (Module 4's fourth dimension): a mixture-of-experts model's experts split over EP ranks.

    coursekit train --model tiny-qwen3-moe --strategy ddp --nproc 4 --ep 2

``dispatch.py`` sends each token to the ranks that hold its experts and brings the results back (two all-to-alls with
uneven splits, written by hand); ``parallel.py`` swaps every MoE layer's experts for this rank's slice of them. This
file holds only the option group (pure Python, so the CLI parses without importing torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class EPOptions:
    ep: int = field(default=1, metadata={"min": 1, "max": 1 << 16})
    """Expert-parallel degree: each MoE layer's experts are split over this many ranks, borrowed from the
    data-parallel (and context-parallel) ranks; it must divide the experts and those ranks. MoE models only."""
    capacity_factor: float | None = field(default=None, metadata={"gt": 0})
    """Expert capacity: an expert takes at most ceil(factor x tokens x top_k / experts) of one rank's token choices
    per layer and the rest are dropped (counted in --json). Default: dropless (every choice is computed)."""
