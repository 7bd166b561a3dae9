"""Strategy registry for the reference trainer: name -> "module:Class", imported only when chosen.

Each later module of the course adds its strategies here (one line each) and a file beside ``ddp.py``; the
trainer never changes.
"""
from __future__ import annotations

import importlib

REGISTRY = {
    "single": "coursekit.strategies.ddp:Single",
    "ddp": "coursekit.strategies.ddp:DDP",
    "zero0": "coursekit.strategies.zero:Zero0",
    "zero1": "coursekit.strategies.zero:Zero1",
    "zero2": "coursekit.strategies.zero:Zero2",
    "zero3": "coursekit.strategies.zero:Zero3",
    "deepspeed": "coursekit.strategies.zero:ZeRO",
}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str):
    """The strategy class for ``name``; a clear error listing the known names otherwise."""
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(REGISTRY)}")
    mod, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(mod), cls)
