"""One vocabulary with the trainer: the calculator reads a run in ``coursekit train``'s names into the run description
(``coursekit.spec.runspec.RunSpec``) and sizes *that*; ``RunSpec.calculator()`` is the one place a strategy becomes
the calculator's engine, ZeRO stage, precision and HSDP shard group. The calculator's older names, which the course's
Module 1 teaches, say the same things and still work:

    trainer (the run description)           calculator (older alias)       TrainConfig field
    --micro-batch B                         --batch B                      batch
    --grad-accum M                          --microbatches M               microbatches
    --strategy single | ddp                 --engine ddp                   engine
    --strategy zero0 .. zero3 | deepspeed   --engine deepspeed --zero K    engine, zero
    --strategy fsdp2 | hsdp                 --engine fsdp2 [--hsdp-shard]  engine, hsdp_shard
    --dp-replicate R --dp-shard S           --dp R·S, --hsdp-shard S       dp, hsdp_shard
    --tp --pp --cp --ep (--world)           the same                       tp, pp, cp, ep, world

A 16-bit ``dtype`` means what it means to the trainer's strategy: autocast with fp32 weights for ``single`` and
``ddp`` (precision ``fp32``), DeepSpeed's bf16 (16Ψ) for ``zero*``, FSDP2's MixedPrecisionPolicy (16Ψ with fp32
sharded master weights) for ``fsdp2`` / ``hsdp``; ``--precision`` overrides it. ``--engine ddp`` keeps 16Ψ.

``--grad-accum`` is the micro-batches of one optimizer step; under pipelining they are the schedule's micro-batches
(1F1B holds ``min(pp - i, M)`` of them on stage ``i``), so the calculator's default is ``pp`` where the trainer's is 1.
The degrees go through ``ParallelDims`` as the trainer's do: the same validation and the same fill rule (the
data-parallel axis of the strategy — dp_replicate for DDP and ZeRO, dp_shard for FSDP2 — takes the ranks that
``--world`` leaves after tp · pp · cp).
"""
from __future__ import annotations

from coursekit.memory import engines
from coursekit.memory.errors import ConfigError, choice, positive_int
from coursekit.memory.train_config import TrainConfig
from coursekit.spec import registry
from coursekit.spec.dims import LayoutError, ParallelDims
from coursekit.spec.runspec import RunSpec

ALIASES = {"micro_batch": "batch", "grad_accum": "microbatches"}  # the run description's name -> TrainConfig's
TRAINER_NAMES = ("strategy", "dp_replicate", "dp_shard", "micro_batch", "grad_accum")  # names only the trainer has
RUN_FIELDS = ("seq", "attention", "recompute", "recompute_layers", "pp_schedule", "pp_virtual", "cp_impl", "sp", "sp_style", "world")
OVERRIDES = ("precision",)  # calculator knobs that may override what the run's strategy implies


def config(kwargs: dict, model: str = "tiny-llama") -> TrainConfig:
    """The calculator's configuration from keyword arguments in either vocabulary: with any of the trainer's names
    (``strategy``, ``dp_replicate``, ``dp_shard``, ``micro_batch``, ``grad_accum``) through the run description they
    name; otherwise TrainConfig's own fields as given."""
    spec, knobs = spec_of(kwargs, model=model)
    return TrainConfig(**knobs) if spec is None else config_of(spec, knobs)


def config_of(spec: RunSpec, knobs: dict | None = None) -> TrainConfig:
    """The calculator's configuration of a run: ``spec.calculator()`` plus the calculator's own knobs (optimizer,
    kernels, offload, ...), which must not restate what the run says (``precision`` may override its strategy's)."""
    knobs = {k: v for k, v in (knobs or {}).items() if v is not None}
    try:
        run = spec.calculator()
    except LayoutError as exc:
        raise ConfigError(str(exc)) from exc
    both = sorted(set(run) & set(knobs) - set(OVERRIDES))
    if both:
        raise ConfigError(f"the run description already sets {', '.join(both)}; give them in the RunSpec")
    return TrainConfig(**{**run, **knobs})


def spec_of(kwargs: dict, *, model: str = "tiny-llama", always: bool = False) -> tuple[RunSpec | None, dict]:
    """(the run, the calculator's other knobs) that keyword arguments in either vocabulary describe. Without any of
    the trainer's names (and ``always`` false) the run is None and the arguments come back as they are: TrainConfig's
    own fields. An older name beside its new one must agree with it."""
    if not always and all(kwargs.get(k) is None for k in TRAINER_NAMES):
        return None, dict(kwargs)
    kw = {k: v for k, v in kwargs.items() if v is not None}
    for new, old in ALIASES.items():
        if new in kw and old in kw and kw[new] != kw[old]:
            raise ConfigError(f"{new} ({kw[new]}) and its alias {old} ({kw[old]}) disagree; give one")
        if old in kw:
            kw[new] = kw.pop(old)
    knobs = {}
    strategy, zero = _strategy(kw, knobs)
    rep, shard = _data_parallel(kw, registry.STRATEGIES[strategy].flavour)
    degrees = {n: positive_int(n, kw.pop(n)) for n in registry.PARALLELISMS if n in kw}
    run = {k: kw.pop(k) for k in RUN_FIELDS if k in kw}
    micro = positive_int("batch", kw.pop("micro_batch", None))  # the calculator sizes one given micro-batch
    positive_int("seq", run.get("seq"))
    spec = RunSpec(model=model, strategy=strategy, dp_replicate=rep, dp_shard=shard,
                   degrees={n: v for n, v in degrees.items() if v != 1}, micro_batch=micro,
                   grad_accum=kw.pop("grad_accum", degrees.get("pp", 1)), dtype=kw.pop("dtype", "bf16"),
                   zero=zero, **run)
    return spec, {**kw, **knobs}


def _strategy(kw: dict, knobs: dict) -> tuple[str, int | None]:
    """The run's strategy, from ``strategy`` or the older ``engine`` / ``zero``; and the ZeRO stage the run carries
    (only strategy deepspeed takes one)."""
    strategy, engine, zero = kw.pop("strategy", None), kw.pop("engine", None), kw.pop("zero", None)
    if strategy is None:
        engine = choice("engine", engine or "deepspeed", engines.REGISTRY)
        stages = registry.zero_stages(engine)
        if not stages and zero not in (None, 0):
            raise ConfigError(f"zero stages are DeepSpeed's; engine {engine!r} needs zero 0")
        if stages and (zero or 0) not in stages:
            raise ConfigError(f"zero stage must be {', '.join(map(str, stages))}, got {zero!r}")
        strategy = registry.strategy_for(engine, zero)
        if registry.STRATEGIES[strategy].amp and kw.get("dtype", "bf16") != "fp32" and "precision" not in kw:
            knobs["precision"] = "16psi"  # --engine ddp keeps 16Ψ; the trainer's ddp (autocast) is --strategy ddp
        return strategy, None
    e = registry.STRATEGIES.get(strategy)
    if e is not None and not e.engine:
        raise ConfigError(f"strategy {strategy!r} is not modelled: {e.unmodelled}")
    choice("strategy", strategy, [n for n, x in registry.STRATEGIES.items() if x.engine])
    if engine is not None and engine != e.engine:
        raise ConfigError(f"strategy {strategy!r} runs engine {e.engine!r}, not {engine!r}; give one of them")
    if e.engine != "deepspeed" and zero not in (None, 0):
        raise ConfigError(f"zero stages are DeepSpeed's; engine {e.engine!r} (strategy {strategy!r}) needs zero 0")
    if e.zero is not None and zero is not None and zero != e.zero:
        raise ConfigError(f"strategy {strategy!r} is ZeRO stage {e.zero}, not {zero}; give one of them")
    return strategy, zero if e.zero is None and e.engine == "deepspeed" else None


def _data_parallel(kw: dict, flavour: str) -> tuple[int | None, int | None]:
    """(dp_replicate, dp_shard) from the trainer's names or the older ``dp`` (all data-parallel ranks, split as the
    strategy's flavour fills) and ``hsdp_shard`` (= dp_shard); None: the mesh fills it."""
    rep, shard, hsdp = kw.pop("dp_replicate", None), kw.pop("dp_shard", None), kw.pop("hsdp_shard", None)
    if hsdp is not None:
        if flavour == "replicate":
            raise ConfigError(f"hsdp_shard {hsdp} is the shard group of HSDP: give strategy hsdp or fsdp2 (engine "
                              "fsdp2); this one replicates (use dp_replicate)")
        if shard is not None and shard != hsdp:
            raise ConfigError(f"dp_shard ({shard}) and its alias hsdp_shard ({hsdp}) disagree; give one")
        shard = hsdp
    dp = kw.pop("dp", None)
    if dp is None:
        return rep, shard
    positive_int("dp", dp)
    if rep is not None and shard is not None and rep * shard != dp:
        raise ConfigError(f"dp ({dp}) != dp_replicate ({rep}) x dp_shard ({shard})")
    if rep is None and shard is None:
        return (dp, 1) if flavour == "replicate" else (1, dp)
    if rep is None:
        if hsdp is not None and (not isinstance(shard, int) or dp % shard):
            raise ConfigError(f"dp ({dp}) is not divisible by the HSDP shard group ({shard})")
        return _divide(dp, shard, "dp_shard"), shard
    return rep, _divide(dp, rep, "dp_replicate")


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
