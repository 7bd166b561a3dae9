"""Everything about a run that can be checked without a process group: the CLI runs it before launching, each
worker runs it again on start. Bad input raises ValueError with one clear message (exit code 2 at the CLI)."""
from __future__ import annotations

from coursekit.memory.calculator import resolve_model
from coursekit.parallel import LayoutError, ParallelDims, check_model  # noqa: F401 (ParallelDims: the type)
from coursekit.spec import registry


def dims_for(opts, world_size: int) -> ParallelDims:
    """The mesh of the run ``opts`` describes on ``world_size`` processes (its run description's)."""
    from coursekit.spec.runspec import RunSpec

    return RunSpec.from_options(opts, world_size).dims()


def default_world(opts) -> int | None:
    """The world size the degrees ask for when any is given (dp_* default 1 then), else None. A degree below 1 is
    refused here, naming its flag (before any world size is derived from it)."""
    p = opts.parallel
    for name in ("dp_replicate", "dp_shard", *registry.PARALLELISMS):
        v = getattr(p, name) if name.startswith("dp_") else registry.degree(opts, name)
        if v is not None and (isinstance(v, bool) or v < 1):
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if not {"dp_replicate", "dp_shard", *registry.PARALLELISMS} & set(opts.given):
        return None
    world = (p.dp_replicate or 1) * (p.dp_shard or 1)
    for name in registry.MESH_PARALLELISMS:  # a borrowed degree (ep) splits ranks the others made
        world *= registry.degree(opts, name)
    return world


def check_counts(t) -> None:
    """The counts of TrainingOptions ``t`` are positive (named by their flags)."""
    for k in ("steps", "seq", "grad_accum"):
        if getattr(t, k) < 1:
            raise ValueError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(t, k)}")
    for k in ("micro_batch", "global_batch"):
        if getattr(t, k) is not None and getattr(t, k) < 1:
            raise ValueError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(t, k)}")


def resolve_batch(t, dp_world: int) -> None:
    """Fill ``t.micro_batch`` / ``t.global_batch`` (TrainingOptions) for ``dp_world`` data-parallel ranks."""
    check_counts(t)
    if t.micro_batch is None:
        g = 8 if t.global_batch is None else t.global_batch
        if g < 1 or g % (dp_world * t.grad_accum):
            raise ValueError(f"global batch {g} is not divisible by data-parallel world size {dp_world} x "
                             f"grad-accum {t.grad_accum}; pick a global batch that is a multiple of "
                             f"{dp_world * t.grad_accum}")
        t.micro_batch = g // (dp_world * t.grad_accum)
    elif t.global_batch is not None and t.global_batch != t.micro_batch * t.grad_accum * dp_world:
        raise ValueError(f"--global-batch {t.global_batch} != micro-batch {t.micro_batch} x grad-accum "
                         f"{t.grad_accum} x data-parallel world {dp_world}")
    t.global_batch = t.micro_batch * t.grad_accum * dp_world


def validate(opts, world_size: int) -> ParallelDims:
    """All checks of a run on ``world_size`` processes; returns its layout (and fills the batch sizes)."""
    from coursekit.memory.errors import ConfigError
    from coursekit.memory.presets import PRESETS

    t = opts.train
    if not str(t.model).endswith(".json") and t.model not in PRESETS:
        raise ValueError(f"unknown model {t.model!r}; choose a preset ({', '.join(sorted(PRESETS))}) "
                         "or a path to an HF config.json")
    if opts.ckpt.save_every and not opts.ckpt.ckpt_dir:
        raise ValueError("--save-every needs --ckpt-dir")
    if opts.ckpt.save_every < 0:
        raise ValueError(f"--save-every must be >= 0, got {opts.ckpt.save_every}")
    parse_steps(opts.profile.profile_steps)
    check_counts(t)
    try:
        dims = dims_for(opts, world_size)
        shape = resolve_model(t.model)
        check_model(dims, num_layers=shape.layers, num_heads=shape.heads, num_kv_heads=shape.kv_heads)
    except (LayoutError, ConfigError) as e:
        raise ValueError(str(e)) from None
    resolve_batch(t, dims.size("batch"))
    router_aux_coef(opts)
    registry.rules(opts.parallel.strategy).check(opts, dims)  # torch-free: the CLI checks before launching
    for name in dims.enabled:
        if name in registry.PARALLELISMS:
            registry.parallelism(name).check(opts, dims)
    return dims


def data_cut(opts, dims, rank: int):
    """The cut of every sequence ``rank`` trains on (``coursekit.data.micro_batches``' ``cut``), from the enabled
    parallelisms that declare one (``data_cut``: context parallelism keeps its chunks); None when none does."""
    cuts = [c for name in dims.enabled if name in registry.PARALLELISMS
            for c in [getattr(registry.parallelism(name), "data_cut", lambda *a: None)(opts, dims, rank)] if c]
    if len(cuts) > 1:
        raise ValueError(f"more than one parallelism cuts the sequence: {', '.join(dims.enabled)}")
    return cuts[0] if cuts else None


def parse_steps(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise ValueError(f"--profile-steps takes a:b (first step, step after the last), got {text!r}") from None
    if not 0 <= a < b:
        raise ValueError(f"--profile-steps {text}: need 0 <= a < b")
    return a, b


def router_aux_coef(opts) -> float | None:
    """The weight of a mixture-of-experts model's load-balancing loss in this run (None: a dense model)."""
    shape, given = resolve_model(opts.train.model), opts.train.router_aux_loss_coef
    if not shape.is_moe:
        if given is not None:
            raise ValueError(f"--router-aux-loss-coef applies to mixture-of-experts models; {opts.train.model} is "
                             "dense")
        return None
    return shape.aux_loss_coef if given is None else given
