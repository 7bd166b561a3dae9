"""Data-parallel engines of the calculator, one module each, behind one protocol (``base.Engine``):

- ``ddp``: DistributedDataParallel, everything replicated;
- ``deepspeed``: DeepSpeed ZeRO stages 0-3, offload, DeepSpeed's exact per-rank layout where it is known;
- ``fsdp2``: FSDP2 ``fully_shard`` and HSDP.

``megatron`` is not an engine: it splits the model over TP / SP / PP / CP for every engine alike.
Add an engine: a module with an ``Engine`` subclass and one line in ``REGISTRY``.
"""
from __future__ import annotations

from coursekit.memory.engines.base import Engine
from coursekit.memory.engines.ddp import DDP
from coursekit.memory.engines.deepspeed import DeepSpeed
from coursekit.memory.engines.fsdp2 import FSDP2
from coursekit.memory.errors import choice

REGISTRY: dict[str, Engine] = {e.name: e for e in (DeepSpeed(), FSDP2(), DDP())}  # the first: TrainConfig's default


def get(name: str) -> Engine:
    """The engine called ``name``; a ConfigError listing the names otherwise."""
    return REGISTRY[choice("engine", name, REGISTRY)]


__all__ = ["Engine", "REGISTRY", "get"]
