"""Inverse questions: the largest micro-batch or sequence that fits a GPU, the fewest GPUs for a model.

Peak memory grows monotonically with batch, with sequence length and (for a fixed layout) falls with the sharding
degree, so each solver is an exponential search for a bracket followed by a bisection: O(log n) estimates.
"""
from __future__ import annotations

from dataclasses import replace

from coursekit.memory import engines, vocab
from coursekit.memory.calculator import Estimate, estimate, resolve_model
from coursekit.memory.train_config import TrainConfig
from coursekit.memory.errors import ConfigError
from coursekit.memory.gpus import gpu as gpu_lookup


def _fits(shape, cfg: TrainConfig, capacity: int) -> Estimate | None:
    e = estimate(shape, cfg)
    return e if e.peak_bytes <= capacity else None


def _largest(ok, lo: int, limit: int) -> int:
    """Largest n in [lo, limit] with ok(n) true, given ok is monotone (true then false); lo - 1 if none."""
    if not ok(lo):
        return lo - 1
    hi = lo
    while hi < limit and ok(min(2 * hi, limit)):
        hi = min(2 * hi, limit)
    if hi == limit:
        return hi
    bad = min(2 * hi, limit)
    while bad - hi > 1:
        mid = (hi + bad) // 2
        hi, bad = (mid, bad) if ok(mid) else (hi, mid)
    return hi


def _capacity(cfg: TrainConfig, gpu) -> int:
    name = gpu or cfg.gpu
    if not name:
        raise ConfigError("give a gpu to solve against")
    return gpu_lookup(name).memory_bytes


def max_micro_batch(model, gpu: str | None = None, *, limit: int = 1 << 20, **kwargs) -> int:
    """Largest micro-batch whose peak fits ``gpu`` (0 if even one sequence does not). ``kwargs``: TrainConfig
    fields or the trainer's names (``seq`` required; ``batch`` is ignored)."""
    shape = resolve_model(model)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("batch", "micro_batch")}
    cfg = vocab.config({**kwargs, "batch": 1})
    cap = _capacity(cfg, gpu)
    return _largest(lambda b: _fits(shape, replace(cfg, batch=b), cap) is not None, 1, limit)


def max_seq_len(model, gpu: str | None = None, *, limit: int | None = None, multiple_of: int = 1, **kwargs) -> int:
    """Largest sequence length (a multiple of ``multiple_of``, of cp and, with sp, of tp) whose peak fits ``gpu``;
    0 if none. ``limit`` defaults to the model's learned positions, or 2**24 tokens for RoPE models."""
    shape = resolve_model(model)
    kwargs = {k: v for k, v in kwargs.items() if k != "seq"}
    cp, tp = kwargs.get("cp", 1), kwargs.get("tp", 1)
    unit = multiple_of * cp * (tp if kwargs.get("sp") else 1)
    cfg = vocab.config({**kwargs, "seq": unit})
    cap = _capacity(cfg, gpu)
    limit = limit or (shape.max_positions if shape.positions == "learned" else 1 << 24)
    k = _largest(lambda m: _fits(shape, replace(cfg, seq=m * unit), cap) is not None, 1, max(1, limit // unit))
    return k * unit


def min_gpus(model, gpu: str | None = None, *, max_gpus: int = 1 << 16, **kwargs) -> Estimate:
    """The fewest GPUs (smallest dp for the given tp, pp, cp) whose per-rank peak fits ``gpu``.

    Returns that estimate (``.config.world`` is the answer); raises ConfigError if even ``max_gpus`` do not fit (e.g.
    without sharding, where more data-parallel ranks never lower per-rank memory).
    """
    shape = resolve_model(model)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("dp", "world", "dp_rank")}  # sized for the fullest rank
    if kwargs.get("hsdp_shard") and kwargs.get("dp_replicate") is None:
        kwargs["dp"] = kwargs["hsdp_shard"]  # one shard group to start from
    base = vocab.config(kwargs)
    # from dp 1; HSDP: from one shard group (dp must be a multiple of it; memory depends on it, not on dp)
    cfg = replace(base, dp=base.hsdp_shard or 1, world=None)
    cap = _capacity(cfg, gpu)
    per_replica = cfg.tp * cfg.pp * cfg.cp
    if per_replica > max_gpus:  # not even one replica: no dp answers (dp 1 fitting would still be past the limit)
        raise ConfigError(f"one replica (tp {cfg.tp} x pp {cfg.pp} x cp {cfg.cp} = {per_replica} GPUs) is past "
                          f"max_gpus {max_gpus}")
    max_dp = max(1, max_gpus // per_replica)
    if (e := _fits(shape, cfg, cap)) is not None:
        return e
    if cfg.hsdp_shard or not engines.get(cfg.engine).shards_over_dp(cfg):
        raise ConfigError("does not fit, and more data-parallel ranks do not shard this configuration's state")
    ok = lambda n: _fits(shape, replace(cfg, dp=n, world=None), cap) is not None  # noqa: E731
    lo, hi = 1, min(2, max_dp)  # dp=1 does not fit; from dp=2 on, per-rank memory only falls as dp grows
    while not (hi > lo and ok(hi)):  # each dp estimated once; none past max_dp (max_dp 1: nothing left to try)
        if hi >= max_dp:
            raise ConfigError(f"does not fit on {max_gpus} GPUs of {gpu or cfg.gpu}")
        lo, hi = hi, min(2 * hi, max_dp)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return estimate(shape, replace(cfg, dp=hi, world=None))
