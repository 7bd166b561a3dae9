"""Typed options of the reference trainer: keyword-only dataclasses, a docstring per field, the CLI made from them.

    opts = parse(["--strategy", "ddp", "--tp", "2", "--steps", "5"])
    opts.train.steps, opts.parallel.tp, opts.of(DDPOptions).bucket_mb

Each group is owned by a component: the trainer core owns training, parallel, checkpoint, profiling, faults and
output; a strategy or parallelism declares its own group (``options = (DDPOptions,)``) in its registry entry
(``coursekit.spec.registry``). A flag given on the command line whose owner is not part of this run (e.g.
``--bucket-mb`` with ``--strategy zero2``) is refused here, in one place, before anything is launched.
``tests/test_options.py`` freezes the flag list, so that a new flag is a deliberate change.

The field docstrings (the string under each field, as in torchtitan's job config) are the ``--help`` text: they are
read from this file's source once, so docs and help cannot drift apart.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from functools import lru_cache

from coursekit.spec.run import ATTENTION, STRATEGIES, TRAINER_RECOMPUTE

DTYPES = ("fp32", "bf16")


@dataclass(kw_only=True)
class TrainingOptions:
    model: str = "tiny-llama"
    """Preset name (coursekit memory --list) or path to an HF config.json."""
    steps: int = field(default=5, metadata={"min": 1})
    """Optimizer steps to run."""
    seq: int = field(default=64, metadata={"min": 1, "max": 1 << 24})
    """Sequence length in tokens (every sample has seq inputs and seq pre-shifted labels)."""
    micro_batch: int | None = field(default=None, metadata={"min": 1, "max": 1 << 31})
    """Sequences per data-parallel rank per micro-batch (default: from --global-batch)."""
    global_batch: int | None = field(default=None, metadata={"min": 1, "max": 1 << 31})
    """Sequences per optimizer step over all data-parallel ranks (sets --micro-batch); default 8."""
    grad_accum: int = field(default=1, metadata={"aliases": ("--microbatches",), "min": 1, "max": 1 << 20})
    """Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches under --pp)."""
    dtype: str = field(default="fp32", metadata={"choices": DTYPES})
    """fp32, or bf16 (autocast with fp32 master weights; DeepSpeed: its bf16 block)."""
    attention: str = field(default="sdpa", metadata={"choices": ATTENTION})
    """Attention implementation as transformers names it."""
    lr: float = field(default=1e-3, metadata={"min": 0})
    """AdamW learning rate."""
    weight_decay: float = field(default=0.0, metadata={"min": 0})
    """AdamW decoupled weight decay."""
    seed: int = field(default=0, metadata={"min": 0, "max": (1 << 32) - 1})
    """Seed of the model init (same on every rank) and of the data."""
    data: str = field(default="synthetic", metadata={"choices": ("synthetic", "text")})
    """synthetic arithmetic sequences, or byte windows of the shipped text corpus."""
    recompute: str = field(default="none", metadata={"choices": TRAINER_RECOMPUTE})
    """Activation checkpointing of every transformer block: full recomputes it whole, op keeps the outputs of
    torchtitan's per-op save list (every second matmul ...) and recomputes the rest."""
    recompute_layers: int | None = field(default=None, metadata={"min": 1, "max": 1 << 20})
    """With --recompute full: recompute only the first N blocks of each pipeline stage (Megatron's
    --recompute-method block --recompute-num-layers N); default: every block."""
    compile: bool = False
    """torch.compile every transformer block (inductor)."""
    router_aux_loss_coef: float | None = field(default=None, metadata={"min": 0})
    """Mixture-of-experts models: weight of the router's load-balancing loss added to the loss (default: the model
    config's router_aux_loss_coef); 0 trains on the language-model loss alone."""


@dataclass(kw_only=True)
class ParallelOptions:
    strategy: str = field(default="single", metadata={"choices": STRATEGIES})
    """Data-parallel strategy: single, ddp, zero0-3, deepspeed (more as the course's modules add them)."""
    dp_replicate: int | None = field(default=None, metadata={"min": 1})
    """Data-parallel replicas (DDP, ZeRO, HSDP across nodes); default: the ranks left by tp x pp x cp."""
    dp_shard: int | None = field(default=None, metadata={"min": 1})
    """Data-parallel ranks that shard parameters (FSDP2, HSDP within a node)."""
    tp: int = field(default=1, metadata={"min": 1})
    """Tensor-parallel degree."""
    pp: int = field(default=1, metadata={"min": 1})
    """Pipeline-parallel stages."""
    cp: int = field(default=1, metadata={"min": 1})
    """Context-parallel degree (the sequence is split over these ranks)."""


@dataclass(kw_only=True)
class CheckpointOptions:
    ckpt_dir: str | None = None
    """Checkpoint folder (torch.distributed.checkpoint); a run resumes from its latest complete step."""
    save_every: int = field(default=0, metadata={"min": 0})
    """Checkpoint every K steps (and at the end); needs --ckpt-dir."""
    async_ckpt: str = field(default="none", metadata={"choices": ("none", "thread", "process")})
    """dcp.async_save on its own gloo group: thread or process writes in the background while training goes on
    (the loop is blocked only while the state is staged); none: dcp.save."""
    keep: int = field(default=3, metadata={"min": 1})
    """Checkpoints kept in --ckpt-dir (the newest K; older ones are deleted after each save)."""


@dataclass(kw_only=True)
class ProfilingOptions:
    profile_dir: str | None = None
    """Write a torch.profiler Chrome trace per rank (opens in Perfetto) into this folder."""
    profile_steps: str = "2:5"
    """Steps a:b (a included, b excluded) that the profiler records."""
    count_step: bool = False
    """Count the last step's collectives (calls, payload bytes) and peak saved-activation bytes on every rank, into
    the final record (coursekit.profiling.stepcount; that step runs slower)."""


@dataclass(kw_only=True)
class FaultOptions:
    crash_at_step: int | None = field(default=None, metadata={"min": 0})
    """Fault injection: raise at this step unless the run resumed from a checkpoint."""
    kill_at_step: int | None = field(default=None, metadata={"min": 0})
    """Fault injection: SIGKILL one worker (--kill-rank) at this step, in the first attempt only (elastic restarts)."""
    kill_rank: int = field(default=1, metadata={"min": 0})
    """The rank --kill-at-step / --kill-in-save kills."""
    kill_in_save: int | None = field(default=None, metadata={"min": 1})
    """Fault injection: SIGKILL --kill-rank while it writes the checkpoint of this step (before its marker), first
    attempt only; the restart loads the previous complete checkpoint."""
    slow_rank: int | None = field(default=None, metadata={"min": 0})
    """Fault injection: this rank sleeps --slow-ms at the start of every step (a straggler)."""
    slow_ms: float = field(default=0.0, metadata={"min": 0, "max": 3_600_000})
    """Milliseconds the --slow-rank sleeps per step."""


@dataclass(kw_only=True)
class OutputOptions:
    quiet: bool = False
    """No per-step progress."""


@dataclass(kw_only=True)
class LaunchOptions:
    """The launcher's own options (``coursekit train``): not passed to the workers."""
    nproc: int | None = field(default=None, metadata={"min": 1, "max": 1 << 16})
    """Processes (default: the product of the parallel degrees; else GPUs present, else 2; 1 for single)."""
    timeout: float = field(default=600, metadata={"gt": 0})
    """Seconds before the whole job is stopped."""
    json: bool = False
    """Print every rank's records (steps, final) as one JSON object instead of the summary table."""
    max_restarts: int = field(default=0, metadata={"min": 0, "max": 1000})
    """Elastic recovery: torchrun restarts every worker up to this many times when one fails (resume from
    --ckpt-dir)."""


CORE = {"train": TrainingOptions, "parallel": ParallelOptions, "ckpt": CheckpointOptions,
        "profile": ProfilingOptions, "faults": FaultOptions, "output": OutputOptions}


class Options:
    """The parsed run: ``.train``, ``.parallel``, ``.ckpt``, ``.profile``, ``.faults``, ``.output`` and ``of(cls)``
    for a component's own group."""

    def __init__(self, groups: dict, given: set[str] = frozenset()):
        self._groups = groups  # class -> instance
        self.given = set(given)  # flags (dest names) set on the command line
        for attr, cls in CORE.items():
            setattr(self, attr, groups[cls])

    def of(self, cls):
        return self._groups[cls]

    def to_dict(self) -> dict:
        return {cls.__name__: dataclasses.asdict(v) for cls, v in self._groups.items()}


@lru_cache(maxsize=None)
def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source."""
    tree = ast.parse(inspect.getsource(cls))
    body, out = tree.body[0].body, {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            out[a.target.id] = " ".join(str(b.value.value).split())
    return out


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_group(p: argparse.ArgumentParser, cls, title: str | None = None) -> None:
    """One argparse flag per field; defaults are SUPPRESSed so that we know which flags were given."""
    g = p.add_argument_group(title or cls.__name__.replace("Options", "").lower())
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        default = f.default
        doc = docs.get(f.name, "")
        help_ = doc if "default" in doc or kind == "bool" else f"{doc} (default: {default})"
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=help_)
        names = [flag(f.name), *f.metadata.get("aliases", ())]
        if kind == "bool":
            g.add_argument(*names, action="store_true", **kw)
            continue
        conv = float if kind.startswith("float") else int if kind.startswith("int") else str
        choices = f.metadata.get("choices")
        g.add_argument(*names, type=conv, choices=choices,
                       metavar="{" + ",".join(choices) + "}" if choices else f.name.upper(), **kw)


def component_groups() -> list[tuple[type, str]]:
    """Every component option group with the name of its owner, from the registry."""
    from coursekit.spec import registry

    return registry.option_groups()


def build_parser(prog: str = "coursekit train", launcher: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog=prog, description="The reference trainer: one loop, every parallelism of "
                                "the course, on one device mesh.", argument_default=argparse.SUPPRESS)
    if launcher:
        add_group(p, LaunchOptions, "launcher")
    for attr, cls in CORE.items():
        add_group(p, cls, attr)
    for cls, owner in component_groups():
        add_group(p, cls, f"{owner} (only with {owner})")
    return p


def check_ranges(inst) -> None:
    """Every field of an option group against its declaration: a float must be finite; ``min`` / ``max`` bound it
    (inclusive), ``gt`` from below (exclusive). A ValueError names the flag. Every numeric field declares a range
    (``tests/test_options.py`` checks that), so a new option cannot forget it."""
    for f in dataclasses.fields(inst):
        v, m = getattr(inst, f.name), f.metadata
        if v is None or isinstance(v, (bool, str)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{flag(f.name)} must be a finite number, got {v}")
        if "min" in m and v < m["min"]:
            raise ValueError(f"{flag(f.name)} must be >= {m['min']}, got {v}")
        if "gt" in m and v <= m["gt"]:
            raise ValueError(f"{flag(f.name)} must be > {m['gt']}, got {v}")
        if "max" in m and v > m["max"]:
            raise ValueError(f"{flag(f.name)} must be <= {m['max']:,}, got {v}")


def build(values: dict, given: set[str] | None = None) -> Options:
    """Options from a dict of field values (unknown names refused); ``given`` defaults to the dict's keys."""
    given = set(values) if given is None else given
    groups, left = {}, dict(values)
    for cls in [*CORE.values(), *(c for c, _ in component_groups())]:
        names = {f.name for f in dataclasses.fields(cls)}
        groups[cls] = cls(**{k: left.pop(k) for k in list(left) if k in names})
        check_ranges(groups[cls])
    if left:
        raise ValueError(f"unknown option(s): {', '.join(flag(k) for k in sorted(left))}")
    opts = Options(groups, given)
    refuse_unowned(opts)
    return opts


def parse(argv=None) -> Options:
    ns = vars(build_parser().parse_args(argv))
    return build(ns)


def refuse_unowned(opts: Options) -> None:
    """A flag whose owner does not take part in this run is an error (one message naming owner and run)."""
    from coursekit.spec import registry

    active = registry.active_components(opts)
    for cls, owner in component_groups():
        if owner in active:
            continue
        for f in dataclasses.fields(cls):
            if f.name in opts.given and f.name not in registry.PARALLELISMS:  # a degree is the switch itself
                raise ValueError(f"{flag(f.name)} belongs to {owner}, which this run does not use "
                                 f"({registry.describe_run(opts)})")


def to_argv(opts: Options) -> list[str]:
    """The worker command line for ``opts`` (only what was given: defaults stay the workers' own)."""
    out = []
    for cls, inst in opts._groups.items():
        for f in dataclasses.fields(cls):
            if f.name not in opts.given:
                continue
            v = getattr(inst, f.name)
            if isinstance(v, bool):
                out += [flag(f.name)] if v else []
            elif v is not None:
                out += [flag(f.name), str(v)]
    return out
