"""Every strategy and parallelism of the course, by name: "module:Class", imported only when a run uses it.

A course module adds its pieces here, one line each, plus files in its own folder; the trainer never changes.

- STRATEGIES: the data-parallel flavour, exactly one per run (``--strategy``). ``flavour`` says which mesh axis the
  data-parallel ranks fill (``coursekit.spec.dims``): replicate (DDP, ZeRO), shard (FSDP2), hybrid (HSDP).
- PARALLELISMS: model transforms switched on by their degree (``--tp 2``); applied in ``ORDER`` (compose.py).
- OPTIONS: the option group (``coursekit.options`` style dataclass, in a torch-free module) each component owns,
  and the components that own it; a flag of a group none of whose owners runs is refused.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    target: str  # "module:Class"
    flavour: str = "replicate"
    world: str = "any"  # "one": a single process only
    engine: str | None = None  # the calculator's engine (coursekit.memory.engines); None: not modelled
    zero: int | None = None  # the engine's ZeRO stage this strategy fixes (None: as given, default 0)
    amp: str | None = None  # the model-state precision a 16-bit --dtype means ("fp32": torch autocast)
    unmodelled: str = ""  # why the calculator has no engine for it


STRATEGIES = {
    "single": Entry("coursekit.ddp.strategy:Single", world="one", engine="ddp", amp="fp32"),
    "ddp": Entry("coursekit.ddp.strategy:DDP", engine="ddp", amp="fp32"),
    "zero0": Entry("coursekit.zero.strategy:Zero0", engine="deepspeed", zero=0),
    "zero1": Entry("coursekit.zero.strategy:Zero1", engine="deepspeed", zero=1),
    "zero2": Entry("coursekit.zero.strategy:Zero2", engine="deepspeed", zero=2),
    "zero3": Entry("coursekit.zero.strategy:Zero3", engine="deepspeed", zero=3),
    "deepspeed": Entry("coursekit.zero.strategy:ZeRO", engine="deepspeed"),
    "fsdp2": Entry("coursekit.fsdp.strategy:FSDP2", flavour="shard", engine="fsdp2"),
    "hsdp": Entry("coursekit.fsdp.strategy:HSDP", flavour="hybrid", engine="fsdp2"),
    "fsdp1": Entry("coursekit.fsdp.fsdp1:FSDP1", flavour="shard",
                   unmodelled="FSDP1 flattens each unit's parameters into one padded FlatParameter, a layout the "
                              "calculator does not model; use --strategy fsdp2 (per-parameter sharding)"),
}

# model transforms, in the order compose.py applies them (torchtitan's): PP split, TP, CP, then activation
# checkpointing and compile (trainer options), then the strategy's data-parallel wrap
PARALLELISMS = {
    "pp": "coursekit.pp.stage:Pipeline",
    "tp": "coursekit.tp.plan:TensorParallel",
    "cp": "coursekit.cp.parallel:ContextParallel",
}
ORDER = ("pp", "tp", "cp")

# option group -> the components that own it
OPTIONS = {
    "coursekit.ddp:DDPOptions": ("ddp",),
    "coursekit.zero:ZeROOptions": ("zero0", "zero1", "zero2", "zero3", "deepspeed"),
    "coursekit.pp:PipelineOptions": ("pp",),
    "coursekit.tp:TPOptions": ("tp",),
    "coursekit.fsdp:FSDPOptions": ("fsdp2", "hsdp", "fsdp1"),
    "coursekit.cp.options:CPOptions": ("cp",),
}


def names() -> list[str]:
    return list(STRATEGIES)


def entry(name: str) -> Entry:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def _load(target: str):
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def get(name: str):
    """The strategy class for ``name``; a clear error listing the known names otherwise."""
    return _load(entry(name).target)


def parallelism(name: str):
    return _load(PARALLELISMS[name])


def option_groups() -> list[tuple[type, str]]:
    """(dataclass, owner label) for every component group."""
    return [(_load(t), ", ".join(owners) if len(owners) < 4 else f"{owners[0]}-{owners[-2]}, {owners[-1]}")
            for t, owners in OPTIONS.items()]


def owners_of(cls) -> tuple[str, ...]:
    for t, owners in OPTIONS.items():
        if _load(t) is cls:
            return owners
    return ()


def active_components(opts) -> set[str]:
    """The strategy and every parallelism whose degree is > 1, as option-group owner labels."""
    p = opts.parallel
    on = {p.strategy} | {name for name in PARALLELISMS if getattr(p, name, 1) > 1}
    return {label for cls, label in option_groups() if on & set(owners_of(cls))}


def describe_run(opts) -> str:
    p = opts.parallel
    degrees = " ".join(f"--{k} {getattr(p, k)}" for k in ("tp", "pp", "cp") if getattr(p, k) > 1)
    return f"--strategy {p.strategy}" + (f" {degrees}" if degrees else "")
