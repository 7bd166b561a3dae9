"""One candidate layout: the parallel core's degrees plus the knobs that change speed and memory. Pure Python.

Key names are ``coursekit.parallel.ParallelDims``' (dp_replicate, dp_shard, tp, pp, cp, ep) plus micro_batch,
recompute, zero, engine, pp_schedule, microbatches, virtual_stages, cp_impl and sp. ``--layout k=v,...`` parses
into this; ``to_dict`` is what ``--json`` prints.

Data-parallel strategy from (engine, zero, dp_shard, dp_replicate):
    ddp                   engine ddp, dp_shard 1
    zero1 / zero2 / zero3 engine deepspeed, zero 1-3 (ZeRO's group is the replicate axis, as in ParallelDims)
    fsdp2                 engine fsdp2, dp_replicate 1: parameters sharded over all data-parallel ranks
    hsdp                  engine fsdp2, dp_replicate > 1 and dp_shard > 1: sharded within a group, replicated across
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from coursekit.plan import overlap
from coursekit.spec import registry, run
from coursekit.spec.dims import ParallelDims
from coursekit.spec.runspec import RunSpec
from coursekit.spec.schedules import SINGLE_STAGE

ENGINES = tuple(dict.fromkeys(e.engine for e in registry.STRATEGIES.values() if e.engine))  # ddp, deepspeed, fsdp2
RECOMPUTE = run.RECOMPUTE
PP_SCHEDULES = SINGLE_STAGE  # with virtual_stages > 1, 1f1b is interleaved 1F1B
CP_IMPLS = run.CP_IMPLS


@dataclass(frozen=True, kw_only=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    """Expert parallelism (MoE models): experts split over this many of the dp x cp ranks (it borrows them)."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    recompute: str = "none"
    recompute_layers: int | None = None
    """With recompute full: only the first N layers of each pipeline stage (model chunk); None: every layer."""
    zero: int = 0
    engine: str = "ddp"
    pp_schedule: str = "1f1b"
    """1f1b (with virtual_stages > 1: interleaved 1F1B) or gpipe (same bubble, every micro-batch's activations)."""
    microbatches: int | None = None
    """Micro-batches per optimizer step per pipeline (gradient accumulation); None: global batch / (dp x
    micro_batch)."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved schedule)."""
    cp_impl: str = "ring"
    sp: bool = True
    """Sequence parallelism over the TP group (Korthikanti et al. 2022); ignored when tp = 1."""
    sp_style: str = ""
    """With sp: '' (as the attention kernel implies: flash is sized as Megatron's fused kernels, eager as torch's
    plan), torch (the column-parallel linears save the gathered input) or megatron (they save the sequence shard
    and all-gather it again in backward: 2 more all-gathers per layer)."""
    overlap: str = ""
    """Communication overlapped with compute beyond the engine's defaults ('' : its defaults), names joined by '+',
    ``no-NAME`` to switch one off (``coursekit.plan.overlap``: grad_reduce, param_gather, prefetch, tp)."""
    grad_reduce_dtype: str = "fp32"
    """Gradients on the wire: fp32 (DDP / DeepSpeed / FSDP2 defaults) or bf16 (Megatron --grad-reduce-in-bf16)."""

    def __post_init__(self):
        for k in _COUNTS:
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"layout {k} must be a positive integer, got {v!r}")
        for k, allowed in (("recompute", RECOMPUTE), ("engine", ENGINES), ("pp_schedule", PP_SCHEDULES),
                           ("cp_impl", CP_IMPLS)):
            if getattr(self, k) not in allowed:
                raise ValueError(f"layout {k} must be one of {', '.join(allowed)}, got {getattr(self, k)!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"layout zero must be 0-3, got {self.zero!r}")
        if self.engine != "deepspeed" and self.zero:
            raise ValueError(f"zero={self.zero} is a DeepSpeed stage: set engine=deepspeed")
        if self.engine != "fsdp2" and self.dp_shard > 1:
            raise ValueError(f"dp_shard {self.dp_shard} needs engine=fsdp2 (FSDP2 / HSDP); DDP and ZeRO use "
                             "dp_replicate")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"layout ep {self.ep} does not divide the dp x cp = {self.dp * self.cp} ranks it borrows")
        if self.ep > 1 and self.engine == "deepspeed":
            raise ValueError("layout ep > 1 runs with DDP, FSDP2 or HSDP (as the trainer does), not DeepSpeed")
        if self.virtual_stages > 1 and (self.pp == 1 or self.pp_schedule != "1f1b"):
            raise ValueError("virtual_stages > 1 is the interleaved 1F1B schedule: needs pp > 1 and pp_schedule=1f1b")
        if self.recompute_layers is not None and (self.recompute != "full" or isinstance(self.recompute_layers, bool)
                                                  or not isinstance(self.recompute_layers, int)
                                                  or self.recompute_layers < 1):
            raise ValueError(f"layout recompute_layers must be a count >= 1 with recompute=full, got "
                             f"{self.recompute_layers!r} with recompute={self.recompute}")
        if self.sp_style not in ("", *run.SP_STYLES):
            raise ValueError(f"layout sp_style must be torch or megatron (or empty), got {self.sp_style!r}")
        if self.grad_reduce_dtype not in overlap.GRAD_DTYPES:
            raise ValueError(f"layout grad_reduce_dtype must be one of {', '.join(overlap.GRAD_DTYPES)}, got "
                             f"{self.grad_reduce_dtype!r}")
        if self.overlap:
            overlap.resolve(self)  # names what is unknown or cannot act on this layout

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def strategy(self) -> str:
        return registry.strategy_for(self.engine, self.zero, hybrid=self.engine == "fsdp2" and self.dp_replicate > 1
                                     and self.dp_shard > 1)

    @property
    def shards_params(self) -> bool:
        return self.engine == "fsdp2" or (self.engine == "deepspeed" and self.zero == 3)

    @classmethod
    def from_spec(cls, spec: RunSpec) -> "Layout":
        """The planner's layout of a run description: the engine and ZeRO stage its strategy's registry entry names,
        the data-parallel degrees its mesh fills, its micro-batch."""
        e = spec.entry
        if not e.engine:
            raise ValueError(f"no planner layout for strategy {spec.strategy!r}: {e.unmodelled}")
        zero = e.zero if e.zero is not None else spec.zero
        if e.engine == "deepspeed" and zero is None:
            raise ValueError(f"strategy {spec.strategy!r} takes its ZeRO stage from its DeepSpeed config: give zero")
        dims = spec.dims()
        d = dims.degrees
        return cls(dp_replicate=d["dp_replicate"], dp_shard=d["dp_shard"], tp=d["tp"], pp=d["pp"], cp=d["cp"],
                   ep=dims.ep,
                   micro_batch=spec.batch(dims)[0], recompute=spec.recompute, engine=e.engine,
                   zero=zero or 0, sp=spec.sp, cp_impl=spec.cp_impl,
                   pp_schedule=spec.pp_schedule if d["pp"] > 1 else "1f1b")

    def spec(self, **extra) -> RunSpec:
        """The run this layout describes, in the run description's terms (its strategy, degrees, schedule); ``extra``
        adds what a layout does not hold (model, seq, dtype, attention, grad_accum when microbatches is None)."""
        pp = dict(pp_schedule=self.pp_schedule)
        if self.virtual_stages > 1:  # interleaved 1F1B: more chunk micro-batches in flight than 1F1B
            pp = dict(pp_schedule="interleaved-1f1b", pp_virtual=self.virtual_stages)
        if self.microbatches is not None:
            pp["grad_accum"] = self.microbatches
        return RunSpec(strategy=self.strategy, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard,
                       degrees={k: getattr(self, k) for k in DEGREES if getattr(self, k) > 1},
                       micro_batch=self.micro_batch, recompute=self.recompute,
                       recompute_layers=self.recompute_layers, cp_impl=self.cp_impl,
                       sp=self.sp and self.tp > 1, **({"sp_style": self.sp_style} if self.sp_style else {}), **pp,
                       **extra)

    def dims(self) -> ParallelDims:
        return self.spec().dims()

    def to_dict(self) -> dict:
        return asdict(self)

    def short(self) -> str:
        parts = [self.strategy + (f"({self.dp_replicate}x{self.dp_shard})" if self.strategy == "hsdp" else "")
                 + f" dp{self.dp}"]
        parts += [f"{k}{getattr(self, k)}" for k in DEGREES if getattr(self, k) > 1]
        if self.virtual_stages > 1:
            parts.append(f"v{self.virtual_stages}")
        if self.cp > 1:
            parts.append(self.cp_impl)
        parts.append(f"mb{self.micro_batch}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}" + (f"{self.recompute_layers}" if self.recompute_layers else ""))
        if self.tp > 1 and not self.sp:
            parts.append("no-sp")
        if self.overlap:
            parts.append(f"overlap:{self.overlap}")
        if self.grad_reduce_dtype != "fp32":
            parts.append(f"grad-{self.grad_reduce_dtype}")
        return " ".join(parts)


# every whole-number field but the ZeRO stage (0-3) is a count >= 1: degrees, micro-batch size, virtual stages
_COUNTS = tuple(f.name for f in fields(Layout) if f.type == "int" and f.name != "zero")
DEGREES = tuple(n for n in registry.PARALLELISMS if n in {f.name for f in fields(Layout)})  # tp, pp, cp, ep: searched

_INT = {f.name for f in fields(Layout) if f.type.startswith("int")} | {"grad_accum", "pp_virtual"}  # + aliases


def _strategy(out: dict) -> None:
    """``strategy=NAME`` in a --layout: the engine and ZeRO stage its registry entry names (given ones must agree)."""
    name = out.pop("strategy")
    e = registry.STRATEGIES.get(name)
    if e is None:
        raise ValueError(f"--layout strategy {name!r} is unknown; choose one of {', '.join(registry.STRATEGIES)}")
    if not e.engine:
        raise ValueError(f"--layout strategy {name!r} is not modelled: {e.unmodelled}")
    if e.engine == "deepspeed" and e.zero is None and "zero" not in out:
        raise ValueError(f"--layout strategy {name!r} takes its ZeRO stage from its config: give zero=K")
    for k, v in (("engine", e.engine), ("zero", e.zero)):
        if v is not None and k in out and out[k] != v:
            raise ValueError(f"--layout strategy={name} is {k} {v}, not {out[k]}; give one of them")
        if v is not None:
            out[k] = v
    if e.flavour == "hybrid" and not (out.get("dp_replicate", 1) > 1 and out.get("dp_shard", 1) > 1):
        raise ValueError("--layout strategy=hsdp needs dp_replicate > 1 and dp_shard > 1 (replicas of shard groups)")


# the trainer's (and the run description's) names for Layout fields: --layout takes either
TRAINER_NAMES = {"grad_accum": "microbatches", "pp_virtual": "virtual_stages"}


def parse_layout(text: str) -> dict:
    """'dp_shard=8,tp=1,micro_batch=2,recompute=selective' -> a dict of Layout fields (values typed). The trainer's
    names work too: ``strategy=zero3`` (the engine and ZeRO stage of its registry entry), ``grad_accum``,
    ``pp_virtual``."""
    names = {f.name for f in fields(Layout)} | set(TRAINER_NAMES) | {"strategy"}
    out = {}
    for item in (s.strip() for s in text.split(",") if s.strip()):
        if "=" not in item:
            raise ValueError(f"--layout item {item!r} is not key=value")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in names:
            raise ValueError(f"unknown --layout key {k!r}; known: {', '.join(sorted(names))}")
        if k in _INT:
            try:
                out[k] = int(v)
            except ValueError:
                raise ValueError(f"--layout {k} must be an integer, got {v!r}") from None
            if out[k] < (0 if k == "zero" else 1):
                raise ValueError(f"--layout {k} must be >= {0 if k == 'zero' else 1}, got {out[k]}")
        elif k == "sp":
            out[k] = v.lower() in ("1", "true", "yes", "on")
        else:
            out[k] = v
    for new, old in TRAINER_NAMES.items():
        if new in out:
            if old in out and out[old] != out[new]:
                raise ValueError(f"--layout {new}={out[new]} and {old}={out[old]} disagree; give one")
            out[old] = out.pop(new)
    if "strategy" in out:
        _strategy(out)
    if out.get("zero") and "engine" not in out:
        out["engine"] = "deepspeed"
    if out.get("dp_shard", 1) > 1 and "engine" not in out:
        out["engine"] = "fsdp2"
    return out
