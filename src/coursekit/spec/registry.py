"""Every strategy and parallelism of the course, by name: "module:Class", imported only when a run uses it.

A course module adds its pieces here, one line each, plus files in its own folder; the trainer never changes.

- STRATEGIES: the data-parallel flavour, exactly one per run (``--strategy``). ``flavour`` says which mesh axis the
  data-parallel ranks fill (``coursekit.spec.dims``): replicate (DDP, ZeRO), shard (FSDP2), hybrid (HSDP).
- PARALLELISMS: model transforms switched on by their degree (``--tp 2``), each a ``Parallelism`` entry: its mesh
  place, its apply order (compose.py), its option group, the derived groups it joins, what it composes with.
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
    rules: str = "coursekit.parallel.rules:Rules"  # "module:Class", torch-free: its checks before launch (the
    # strategy class inherits them)


STRATEGIES = {
    "single": Entry("coursekit.ddp.strategy:Single", world="one", engine="ddp", amp="fp32"),
    "ddp": Entry("coursekit.ddp.strategy:DDP", engine="ddp", amp="fp32"),
    "zero0": Entry("coursekit.zero.strategy:Zero0", engine="deepspeed", zero=0, rules="coursekit.zero.rules:Zero0"),
    "zero1": Entry("coursekit.zero.strategy:Zero1", engine="deepspeed", zero=1, rules="coursekit.zero.rules:Zero1"),
    "zero2": Entry("coursekit.zero.strategy:Zero2", engine="deepspeed", zero=2, rules="coursekit.zero.rules:Zero2"),
    "zero3": Entry("coursekit.zero.strategy:Zero3", engine="deepspeed", zero=3, rules="coursekit.zero.rules:Zero3"),
    "deepspeed": Entry("coursekit.zero.strategy:ZeRO", engine="deepspeed", rules="coursekit.zero.rules:ZeRO"),
    "fsdp2": Entry("coursekit.fsdp.strategy:FSDP2", flavour="shard", engine="fsdp2",
                   rules="coursekit.fsdp.rules:FSDP2"),
    "hsdp": Entry("coursekit.fsdp.strategy:HSDP", flavour="hybrid", engine="fsdp2", rules="coursekit.fsdp.rules:HSDP"),
    "fsdp1": Entry("coursekit.fsdp.fsdp1:FSDP1", flavour="shard", rules="coursekit.fsdp.rules:FSDP1",
                   unmodelled="FSDP1 flattens each unit's parameters into one padded FlatParameter, a layout the "
                              "calculator does not model; use --strategy fsdp2 (per-parameter sharding)"),
}

@dataclass(frozen=True)
class Parallelism:
    """A parallelism switched on by its degree (``--tp 2``): everything the core derives from it.

    Its mesh axis is named as the entry; ``ParallelDims``, the mesh, the trainer's options, the compatibility checks
    and ``coursekit layout`` read these fields, so adding one is a folder of files and one entry here
    (docs/adding-a-parallelism.md)."""
    target: str
    """"module:Class" with ``check(opts, dims)``, ``__init__(ctx)``, ``apply(model_parts, strategy)`` (optionally
    ``data_cut(opts, dims, rank)`` when it cuts the sequence); imported only when a run uses it."""
    mesh: int
    """Place on the mesh, outermost (smallest) first; the data-parallel axes sit at 10 and 20. Innermost = ranks next
    to each other (one node): tp is 40."""
    order: int
    """Place in the apply order (``coursekit.parallel.compose``), smallest first: the pipeline split is 0."""
    options: str = "coursekit.options:ParallelOptions"
    """The option group holding the degree field (named as the entry) and the parallelism's own flags."""
    groups: tuple[str, ...] = ()
    """Derived groups the axis joins (``coursekit.spec.dims.DERIVED``): batch (its ranks see different data), loss
    (its losses are averaged), fsdp (FSDP shards parameters over it)."""
    strategies: tuple[str, ...] | None = None
    """The strategies it composes with; None: those whose class ``supports`` it."""
    help: str = ""
    borrows: str | None = None
    """A derived group whose ranks it splits instead of adding ranks of its own (expert parallelism borrows the
    ``loss`` ranks, as torchtitan and Megatron-Core do): no mesh axis; its degree divides that group, and
    ``ParallelDims`` answers its groups ``<name>`` (ranks sharing the slices, innermost) and ``<name>_rest`` (ranks
    holding the same slice)."""


# model transforms; `order` is compose.py's (torchtitan's): PP split, TP, CP, then activation checkpointing and
# compile (trainer options), then the strategy's data-parallel wrap
PARALLELISMS = {
    "tp": Parallelism("coursekit.tp.plan:TensorParallel", mesh=40, order=10, help="tensor-parallel"),
    "pp": Parallelism("coursekit.pp.stage:Pipeline", mesh=0, order=0, help="pipeline-parallel (stages)"),
    "cp": Parallelism("coursekit.cp.parallel:ContextParallel", mesh=30, order=20, groups=("loss", "fsdp"),
                      help="context-parallel (the sequence is split over these ranks)"),
    "ep": Parallelism("coursekit.ep.parallel:ExpertParallel", mesh=0, order=25, options="coursekit.ep:EPOptions",
                      borrows="loss", strategies=("ddp", "fsdp2", "hsdp"),
                      help="expert-parallel (a mixture-of-experts model's experts split over data-parallel ranks)"),
}
MESH_PARALLELISMS = tuple(n for n, e in PARALLELISMS.items() if e.borrows is None)  # those with a mesh axis
DATA_AXES = {"dp_replicate": 10, "dp_shard": 20}  # the data-parallel axes (mesh places); a strategy's flavour fills
ORDER = tuple(sorted(PARALLELISMS, key=lambda n: PARALLELISMS[n].order))
CORE_OPTIONS = "coursekit.options:ParallelOptions"

# option group -> the components that own it
OPTIONS = {
    "coursekit.ddp:DDPOptions": ("ddp",),
    "coursekit.zero:ZeROOptions": tuple(n for n, e in STRATEGIES.items() if e.engine == "deepspeed"),
    "coursekit.pp:PipelineOptions": ("pp",),
    "coursekit.tp:TPOptions": ("tp",),
    "coursekit.fsdp:FSDPOptions": ("fsdp2", "hsdp", "fsdp1"),
    "coursekit.cp.options:CPOptions": ("cp",),
}


def zero_stages(engine: str) -> list[int]:
    """The ZeRO stages the registry's strategies of ``engine`` fix (deepspeed: 0-3; others none)."""
    return sorted({e.zero for e in STRATEGIES.values() if e.engine == engine} - {None})


def strategy_for(engine: str, zero: int | None = None, *, hybrid: bool = False) -> str | None:
    """The strategy that runs the calculator's ``engine`` (at ZeRO stage ``zero``; ``hybrid``: HSDP's replicas of
    shard groups) on any number of ranks: the registry read backwards (deepspeed 3 -> zero3, fsdp2 -> fsdp2 or
    hsdp, ddp -> ddp); None if no entry runs it."""
    want = (zero or 0) if zero_stages(engine) else None
    return next((n for n, e in STRATEGIES.items() if e.engine == engine and e.world == "any" and e.zero == want
                 and (e.flavour == "hybrid") == hybrid), None)


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


def rules(name: str):
    """The torch-free class whose ``check(opts, dims)`` refuses what strategy ``name`` cannot run (the strategy class
    inherits it): the CLI checks a run before launching without importing torch."""
    return _load(entry(name).rules)


def parallelism(name: str):
    return _load(PARALLELISMS[name].target)


def _groups() -> dict[str, tuple[str, ...]]:
    """Option group -> owners: OPTIONS, plus each parallelism's own group (declared in its entry)."""
    out = {t: tuple(o) for t, o in OPTIONS.items()}
    for name, e in PARALLELISMS.items():
        if e.options != CORE_OPTIONS and name not in out.get(e.options, ()):
            out[e.options] = (*out.get(e.options, ()), name)
    return out


def option_groups() -> list[tuple[type, str]]:
    """(dataclass, owner label) for every component group."""
    return [(_load(t), ", ".join(owners) if len(owners) < 4 else f"{owners[0]}-{owners[-2]}, {owners[-1]}")
            for t, owners in _groups().items()]


def owners_of(cls) -> tuple[str, ...]:
    for t, owners in _groups().items():
        if _load(t) is cls:
            return owners
    return ()


def degree_fields() -> dict[str, type]:
    """Parallelism name -> the option group whose field of that name is its degree."""
    return {name: _load(e.options) for name, e in PARALLELISMS.items()}


def degree(opts, name: str) -> int:
    """The degree of parallelism ``name`` in ``opts`` (a ``coursekit.options.Options``)."""
    return getattr(opts.of(_load(PARALLELISMS[name].options)), name)


def active_components(opts) -> set[str]:
    """The strategy and every parallelism whose degree is > 1, as option-group owner labels."""
    on = {opts.parallel.strategy} | {name for name in PARALLELISMS if degree(opts, name) > 1}
    return {label for cls, label in option_groups() if on & set(owners_of(cls))}


def describe_run(opts) -> str:
    degrees = " ".join(f"--{k} {degree(opts, k)}" for k in PARALLELISMS if degree(opts, k) > 1)
    return f"--strategy {opts.parallel.strategy}" + (f" {degrees}" if degrees else "")


def composes(strategy_cls, strategy: str, name: str) -> bool:
    """Whether ``strategy`` composes with parallelism ``name``: the entry's list, else the class's ``supports``."""
    allowed = PARALLELISMS[name].strategies
    return strategy in allowed if allowed is not None else bool(getattr(strategy_cls, "supports", {}).get(name))
