"""One vocabulary with the trainer: ``coursekit train``'s names for the knobs the calculator's TrainConfig names
otherwise. ``estimate``, the solvers and ``coursekit memory`` take either spelling.

    trainer (primary)                       calculator (alias)             TrainConfig field
    --micro-batch B                         --batch B                      batch
    --grad-accum M                          --microbatches M               microbatches
    --strategy single | ddp                 --engine ddp                   engine
    --strategy zero0 .. zero3 | deepspeed   --engine deepspeed --zero K    engine, zero
    --strategy fsdp2 | hsdp                 --engine fsdp2 [--hsdp-shard]  engine, hsdp_shard
    --dp-replicate R --dp-shard S           --dp R·S, --hsdp-shard S       dp, hsdp_shard
    --tp --pp --cp (--world)                the same                       tp, pp, cp, world

A 16-bit ``dtype`` means what it means to the trainer's strategy: autocast with fp32 weights for ``single`` and
``ddp`` (precision ``fp32``), DeepSpeed's bf16 (16Ψ) for ``zero*``, FSDP2's MixedPrecisionPolicy (16Ψ with fp32
sharded master weights) for ``fsdp2`` / ``hsdp``; ``--precision`` overrides it. ``--engine ddp`` keeps 16Ψ.

``--grad-accum`` is the micro-batches of one optimizer step; under pipelining they are the schedule's micro-batches
(1F1B holds ``min(pp - i, M)`` of them on stage ``i``), so the calculator's default is ``pp`` where the trainer's is 1.
The degrees go through ``coursekit.parallel.ParallelDims``, as the trainer's do: the same validation, and the same
fill rule (the data-parallel axis of the strategy — dp_replicate for DDP and ZeRO, dp_shard for FSDP2 — takes the
ranks that ``--world`` leaves after tp · pp · cp).
"""
from __future__ import annotations

from coursekit.memory import engines
from coursekit.memory.errors import ConfigError, choice
from coursekit.spec import registry
from coursekit.spec.dims import LayoutError, ParallelDims

# trainer strategy -> (engine, ZeRO stage or None: as given, data-parallel flavour, 16-bit precision), from the
# registry's entries (coursekit.spec.registry): the strategies the calculator models
STRATEGIES = {name: (e.engine, e.zero, e.flavour, e.amp) for name, e in registry.STRATEGIES.items() if e.engine}
ALIASES = {"micro_batch": "batch", "grad_accum": "microbatches"}  # trainer name -> TrainConfig field


def config_kwargs(kwargs: dict) -> dict:
    """TrainConfig keyword arguments from keyword arguments in either vocabulary (calculator names pass unchanged;
    a trainer name and its alias together are refused)."""
    kw = dict(kwargs)
    for new, old in ALIASES.items():
        if new in kw:
            value = kw.pop(new)
            if kw.get(old) is not None and value is not None and kw[old] != value:
                raise ConfigError(f"{new} ({value}) and its alias {old} ({kw[old]}) disagree; give one")
            if value is not None or old not in kw:
                kw[old] = value
    strategy, rep, shard = kw.pop("strategy", None), kw.pop("dp_replicate", None), kw.pop("dp_shard", None)
    if strategy is None and rep is None and shard is None:
        return kw
    if strategy is not None:
        entry = registry.STRATEGIES.get(strategy)
        if entry is not None and not entry.engine:
            raise ConfigError(f"strategy {strategy!r} is not modelled: {entry.unmodelled}")
        engine, zero, flavour, amp = STRATEGIES[choice("strategy", strategy, STRATEGIES)]
        if kw.get("engine") is not None and kw["engine"] != engine:
            raise ConfigError(f"strategy {strategy!r} runs engine {engine!r}, not {kw['engine']!r}; give one of them")
        if zero is not None and kw.get("zero") is not None and kw["zero"] != zero:
            raise ConfigError(f"strategy {strategy!r} is ZeRO stage {zero}, not {kw['zero']}; give one of them")
        kw["engine"] = engine
        if zero is not None:
            kw["zero"] = zero
        if amp and kw.get("precision") is None and kw.get("dtype", "bf16") != "fp32":
            kw["precision"] = amp  # the trainer's single / ddp run --dtype bf16 as autocast: fp32 weights and states
    else:
        engine = kw.get("engine") or "deepspeed"
        flavour = "shard" if engines.get(engine).hybrid_shard else "replicate"
    hsdp = kw.pop("hsdp_shard", None)
    if hsdp is not None:
        if shard is not None and shard != hsdp:
            raise ConfigError(f"dp_shard ({shard}) and its alias hsdp_shard ({hsdp}) disagree; give one")
        shard = hsdp
    dp = kw.pop("dp", None)
    if dp is not None:  # the calculator's dp: all data-parallel ranks, dp_replicate x dp_shard
        if rep is not None and shard is not None and rep * shard != dp:
            raise ConfigError(f"dp ({dp}) != dp_replicate ({rep}) x dp_shard ({shard})")
        if rep is None and shard is None:
            rep, shard = (dp, 1) if flavour == "replicate" else (1, dp)
        elif rep is None:
            rep = _divide(dp, shard, "dp_shard")
        elif shard is None:
            shard = _divide(dp, rep, "dp_replicate")
    deg = {k: kw.get(k, 1) for k in ("tp", "pp", "cp")}
    world = kw.get("world")
    if world is None:
        world = (rep or 1) * (shard or 1) * deg["tp"] * deg["pp"] * deg["cp"]
    try:
        dims = ParallelDims(world_size=world, dp_replicate=rep, dp_shard=shard, dp_flavour=flavour, **deg)
    except LayoutError as exc:
        raise ConfigError(str(exc)) from exc
    if strategy == "single" and world != 1:
        raise ConfigError(f"strategy 'single' runs on 1 process, but the layout has {world} ranks ({dims}); use "
                          "strategy ddp (or another parallel strategy) for more")
    d = dims.degrees
    kw.update(dp=dims.dp, world=world)
    if flavour == "hybrid" or (flavour == "shard" and d["dp_replicate"] > 1):
        kw["hsdp_shard"] = d["dp_shard"]
    return kw


def layout(c) -> ParallelDims:
    """The ParallelDims of a TrainConfig: the degrees the trainer would build its mesh from."""
    hybrid = engines.get(c.engine).hybrid_shard
    shard = c.hsdp_shard or (c.dp if hybrid else 1)
    return ParallelDims(world_size=c.world, dp_replicate=c.dp // shard, dp_shard=shard, tp=c.tp, pp=c.pp, cp=c.cp,
                        dp_flavour="hybrid" if c.hsdp_shard else "shard" if hybrid else "replicate")


def _divide(dp: int, part: int, name: str) -> int:
    if not isinstance(part, int) or part < 1 or dp % part:
        raise ConfigError(f"{name} ({part}) does not divide dp ({dp})")
    return dp // part
