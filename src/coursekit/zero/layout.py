"""DeepSpeed's exact per-rank layout for a model built by coursekit (the rules: ``coursekit.memory.deepspeed``).

``deepspeed_bytes`` / ``partition_params`` live in the pure-Python calculator so that ``coursekit memory`` and the
tests share one implementation; this module adds ``model_numels``, which reads the sizes from the real model.
"""
from __future__ import annotations

from coursekit.memory.deepspeed import (ELEM, deepspeed_bytes, fullest_rank, grad_partition_numels, overlap_numels,
                                        padded, partition_params, tail_padding)

__all__ = ["ELEM", "deepspeed_bytes", "fullest_rank", "grad_partition_numels", "model_numels", "overlap_numels",
           "padded", "partition_params", "tail_padding"]


def model_numels(model: str) -> list[int]:
    """Parameter sizes of a course model in ``model.parameters()`` order (DeepSpeed's flattening order)."""
    from coursekit.models import build_model

    return [p.numel() for p in build_model(model, device="meta").parameters()]
