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
from coursekit.memory.states import StateBytes

REGISTRY: dict[str, Engine] = {e.name: e for e in (DeepSpeed(), FSDP2(), DDP())}  # the first: TrainConfig's default


def get(name: str) -> Engine:
    """The engine called ``name``; a ConfigError listing the names otherwise."""
    return REGISTRY[choice("engine", name, REGISTRY)]


def model_state_bytes(params: float, *, precision: str = "16psi", optimizer: str = "adamw", engine: str = "deepspeed",
                      zero: int = 0, shard: int = 1, offload: str = "none",
                      offload_params: str = "none", param_tensors: int = 0) -> StateBytes:
    """Model-state bytes on one rank holding ``params`` parameters (after TP/PP split), sharded over ``shard`` ranks.

    ``zero`` is DeepSpeed's stage (engine ``deepspeed``); ``fsdp2`` shards everything, ``ddp`` nothing.
    ``param_tensors``: parameter tensors on this rank. torch's Adam/AdamW keep a 4-byte fp32 ``step`` counter per
    tensor (engines ``ddp`` and ``fsdp2``, whose optimizers see every tensor; DeepSpeed steps flat partitions).
    """
    return get(engine).state_bytes(params, precision=precision, optimizer=optimizer, zero=zero, shard=shard,
                                   offload=offload, offload_params=offload_params, param_tensors=param_tensors)


def check_options(*, precision: str, optimizer: str, engine: str, zero: int, offload: str,
                  offload_params: str) -> None:
    """Raise ConfigError for a combination the engine does not support: the shared choices, then the engine's own."""
    get(engine).check_options(precision=precision, optimizer=optimizer, zero=zero, offload=offload,
                              offload_params=offload_params)


__all__ = ["Engine", "REGISTRY", "check_options", "get", "model_state_bytes"]
