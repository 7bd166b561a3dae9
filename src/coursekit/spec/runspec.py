"""One training run, described once, in the trainer's names: what ``coursekit train`` runs, what the calculator
sizes (``coursekit.memory``) and what the planner prices (``coursekit.plan``). Pure Python, no torch.

    spec = RunSpec(model="llama3-8b", strategy="zero3", dp_replicate=8, micro_batch=1, seq=8192)
    spec.dims()               # ParallelDims: the mesh the trainer would build
    spec.trainer_argv()       # ["--model", "llama3-8b", "--strategy", "zero3", ...]: the same run, for coursekit train
    spec.calculator()         # the calculator's configuration keywords (TrainConfig: engine, zero, dp, hsdp_shard, ...)
    RunSpec.from_options(opts, world)    # from the trainer's parsed options

The strategy's engine, ZeRO stage, data-parallel flavour and 16-bit precision come from its registry entry
(``coursekit.spec.registry``); the choices from ``coursekit.spec.run``. Bad input raises ``ConfigError`` naming the
field. Each tool that needs a run builds one of these and asks it, instead of translating another tool's names.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from math import prod

from coursekit.spec import registry, run
from coursekit.spec.dims import ParallelDims
from coursekit.spec.errors import ConfigError, choice, positive_int

DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    model: str = "tiny-llama"
    """Preset name or path to an HF config.json."""
    strategy: str = "ddp"
    """Data-parallel strategy (the registry's names)."""
    world: int | None = None
    """Total ranks; None: the product of the degrees (data-parallel ones default 1 then)."""
    dp_replicate: int | None = None
    """Data-parallel replicas; None: fill (the strategy's flavour decides which axis fills)."""
    dp_shard: int | None = None
    """Data-parallel ranks that shard parameters (FSDP2, HSDP)."""
    degrees: dict = field(default_factory=dict)
    """Degree of each registered parallelism that is not 1: {"tp": 2, "pp": 2, ...}."""
    seq: int = 64
    """Tokens per sequence."""
    micro_batch: int | None = None
    """Sequences per data-parallel rank per micro-batch; None: from global_batch."""
    global_batch: int | None = None
    """Sequences per optimizer step over all data-parallel ranks."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (under pp: the schedule's)."""
    dtype: str = "fp32"
    """fp32, or a 16-bit compute dtype (what it means for model states: the strategy's ``amp``)."""
    attention: str = "sdpa"
    recompute: str = "none"
    recompute_layers: int | None = None
    """With recompute full: only the first N blocks of each pipeline stage (model chunk) recomputed; None: all."""
    pp_schedule: str = "gpipe"
    pp_virtual: int | None = None
    """Stages per pipeline rank (None: the schedule's own, coursekit.spec.schedules)."""
    cp_impl: str = "ring"
    sp: bool = False
    """Sequence parallelism over the TP group."""
    sp_style: str | None = None
    """With sp: torch (torch's plan, the trainer's default), or megatron (the column-parallel linears save the
    sequence shard); None: unsaid (the calculator follows its kernels: fused is Megatron's)."""
    zero: int | None = None
    """ZeRO stage, for ``strategy deepspeed`` (a zeroK strategy fixes its own)."""

    def __post_init__(self):
        choice("strategy", self.strategy, registry.STRATEGIES)
        choice("dtype", self.dtype, DTYPES)
        choice("attention", self.attention, run.ATTENTION)
        choice("recompute", self.recompute, run.RECOMPUTE)
        choice("pp_schedule", self.pp_schedule, run.PP_SCHEDULES)
        choice("cp_impl", self.cp_impl, run.CP_IMPLS)
        if self.sp_style is not None:
            choice("sp_style", self.sp_style, run.SP_STYLES)
        unknown = sorted(set(self.degrees) - set(registry.PARALLELISMS))
        if unknown:
            raise ConfigError(f"unknown parallel degree(s) {', '.join(unknown)}; known: {', '.join(registry.PARALLELISMS)}")
        for k, v in self.degrees.items():
            positive_int(k, v)
        for k in ("world", "dp_replicate", "dp_shard", "micro_batch", "global_batch", "pp_virtual"):
            if getattr(self, k) is not None:
                positive_int(k, getattr(self, k))
        positive_int("seq", self.seq)
        positive_int("grad_accum", self.grad_accum)
        if self.recompute_layers is not None:
            positive_int("recompute_layers", self.recompute_layers)
            if self.recompute != "full":
                raise ConfigError(f"recompute_layers {self.recompute_layers} needs recompute full (it picks which "
                                  f"blocks full recompute covers), got recompute {self.recompute!r}")
        if self.zero is not None and (self.strategy != "deepspeed" or self.zero not in (0, 1, 2, 3)):
            raise ConfigError(f"zero {self.zero!r}: a ZeRO stage 0-3 is given with strategy deepspeed only "
                              "(zero0-zero3 fix their own)")

    # -- the layout --------------------------------------------------------------------------------------------
    def degree(self, name: str) -> int:
        return self.degrees.get(name, 1)

    @property
    def entry(self) -> registry.Entry:
        return registry.STRATEGIES[self.strategy]

    def dims(self) -> ParallelDims:
        """The trainer's mesh for this run (a LayoutError names what does not divide)."""
        world = self.world
        if world is None:
            world = (self.dp_replicate or 1) * (self.dp_shard or 1) * prod(
                v for k, v in self.degrees.items() if k in registry.MESH_PARALLELISMS)
        if self.entry.world == "one" and world != 1:
            raise ConfigError(f"strategy {self.strategy!r} runs on 1 process, not {world}; use strategy ddp (or "
                              "another parallel strategy) for more")
        return ParallelDims(world_size=world, dp_replicate=self.dp_replicate, dp_shard=self.dp_shard,
                            dp_flavour=self.entry.flavour, **self.degrees)

    def batch(self, dims: ParallelDims | None = None) -> tuple[int, int]:
        """(micro_batch, global_batch) over this run's data-parallel ranks (global batch default 8)."""
        dp = (dims or self.dims()).size("batch")
        if self.micro_batch is not None:
            g = self.micro_batch * self.grad_accum * dp
            if self.global_batch is not None and self.global_batch != g:
                raise ConfigError(f"global_batch {self.global_batch} != micro_batch {self.micro_batch} x grad_accum "
                                  f"{self.grad_accum} x data-parallel ranks {dp}")
            return self.micro_batch, g
        g = 8 if self.global_batch is None else self.global_batch
        if g % (dp * self.grad_accum):
            raise ConfigError(f"global batch {g} is not divisible by data-parallel ranks {dp} x grad_accum "
                              f"{self.grad_accum}")
        return g // (dp * self.grad_accum), g

    # -- the same run for each tool ------------------------------------------------------------------------------
    def trainer_argv(self) -> list[str]:
        """``coursekit train`` arguments for this run (what differs from the trainer's defaults; --nproc aside)."""
        default = {f.name: f.default for f in fields(self) if f.name != "degrees"}
        out = ["--model", self.model, "--strategy", self.strategy]
        for k in ("dp_replicate", "dp_shard"):
            if getattr(self, k) is not None:
                out += [f"--{k.replace('_', '-')}", str(getattr(self, k))]
        for k, v in self.degrees.items():
            out += [f"--{k}", str(v)]
        for k in ("seq", "micro_batch", "global_batch", "grad_accum", "dtype", "attention", "recompute"):
            if getattr(self, k) != default[k] or k == "seq":
                out += [f"--{k.replace('_', '-')}", str(getattr(self, k))]
        if self.recompute_layers is not None:
            out += ["--recompute-layers", str(self.recompute_layers)]
        if self.degree("pp") > 1:
            out += ["--pp-schedule", self.pp_schedule]
        if self.degree("cp") > 1:
            out += ["--cp-impl", self.cp_impl]
        if self.sp and self.degree("tp") > 1:
            out += ["--sp"] + (["--sp-style", self.sp_style] if self.sp_style == "megatron" else [])
        return out

    @classmethod
    def from_options(cls, opts, world: int | None = None) -> "RunSpec":
        """The run the trainer's parsed options (``coursekit.options.Options``) describe."""
        groups = {c.__name__: opts.of(c) for c, _ in registry.option_groups()}

        def opt(group_name, attr, default):
            return getattr(groups[group_name], attr) if group_name in groups else default

        t, p = opts.train, opts.parallel
        degrees = {n: registry.degree(opts, n) for n in registry.PARALLELISMS if registry.degree(opts, n) != 1}
        return cls(model=t.model, strategy=p.strategy, world=world, dp_replicate=p.dp_replicate,
                   dp_shard=p.dp_shard, degrees=degrees, seq=t.seq, micro_batch=t.micro_batch,
                   global_batch=t.global_batch, grad_accum=t.grad_accum, dtype=t.dtype, attention=t.attention,
                   recompute=t.recompute, recompute_layers=t.recompute_layers,
                   pp_schedule=opt("PipelineOptions", "pp_schedule", "gpipe"),
                   cp_impl=opt("CPOptions", "cp_impl", "ring"), sp=bool(opt("TPOptions", "sp", False)),
                   sp_style="megatron" if opt("TPOptions", "sp_style", "torch") == "megatron" else None)

    def calculator(self) -> dict:
        """The calculator's configuration (``coursekit.memory.TrainConfig`` keywords) of this run: the strategy's
        engine, ZeRO stage and precision, every degree, the batch, the schedule."""
        e = self.entry
        if not e.engine:
            raise ConfigError(f"strategy {self.strategy!r} is not modelled: {e.unmodelled}")
        dims = self.dims()
        d = dims.degrees
        micro, _ = self.batch(dims)
        kw = dict(batch=micro, seq=self.seq, dtype=self.dtype, attention=self.attention, recompute=self.recompute,
                  engine=e.engine, dp=dims.dp, world=dims.world_size, tp=d["tp"], pp=d["pp"], cp=d["cp"],
                  ep=dims.ep,
                  sp=self.sp and d["tp"] > 1, cp_impl=self.cp_impl, microbatches=self.grad_accum)
        if self.recompute_layers is not None:
            kw["recompute_layers"] = self.recompute_layers
        if self.sp and d["tp"] > 1 and self.sp_style is not None:
            kw["sp_style"] = self.sp_style
        if d["pp"] > 1:  # without a pipeline the plain loop runs one micro-batch at a time, whatever the schedule
            kw.update(pp_schedule=self.pp_schedule, pp_virtual=self.pp_virtual)
        zero = e.zero if e.zero is not None else self.zero
        if zero is not None:
            kw["zero"] = zero
        if e.amp and self.dtype != "fp32":
            kw["precision"] = e.amp  # e.g. single / ddp run a 16-bit dtype as autocast over fp32 weights
        if e.flavour == "hybrid" or (e.flavour == "shard" and d["dp_replicate"] > 1):
            kw["hsdp_shard"] = d["dp_shard"]
        return kw
