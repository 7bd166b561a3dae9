"""The order in which one pipeline rank runs its forwards and backwards, per schedule, and the activations it holds.

    ops = order("interleaved-1f1b", pp=2, rank=0, m=4, v=2)   # [("F", stage, mb), ..., ("B", stage, mb), ...]
    peak_held(ops, saved_of_stage)                             # (peak bytes, chunk micro-batches held then)

Pure Python (no torch): the same orders ``torch.distributed.pipelining`` builds for its schedules (GPipe, 1F1B,
LoopedBFS, Interleaved1F1B; stages are global indices, rank r holds r, r+pp, ... of v·pp), without the idle slots.
A micro-batch's activations on a stage are saved by its forward and freed by its backward, so what a rank holds at
any moment is the sum over the (stage, micro-batch) pairs it has run forward and not yet backward:

- GPipe: all m forwards, then all backwards: m micro-batches at the peak.
- 1F1B: pp - rank forwards of warm-up, then one backward and one forward alternating: min(pp - rank, m).
- LoopedBFS: every micro-batch through the rank's first stage, then through its next, ..., then the backwards in
  reverse: v·m chunk micro-batches at the peak (GPipe per stage).
- Interleaved 1F1B (Narayanan et al. 2021): warm-up (v-1)·(m/rounds) + 2·(pp-1-rank) forwards (at most v·m), then a
  forward and a backward alternating: one more than the warm-up at the peak (the warm-up itself when it already
  covers all v·m), over all v of its stages.

Zero-bubble schedules (interleaved-zb, zbv, dualpipev) split a backward into the input's gradient and the weights'
gradient, freeing a micro-batch's activations in two parts; that split is not modelled here.
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from coursekit.memory.errors import ConfigError


class RoundsError(ConfigError):
    """Interleaved 1F1B with micro-batches torch cannot split into rounds (it refuses the schedule)."""

MODELLED = ("gpipe", "1f1b", "looped-bfs", "interleaved-1f1b")
VIRTUAL = {"gpipe": 1, "1f1b": 1, "looped-bfs": 2, "interleaved-1f1b": 2}  # stages per rank, as coursekit.pp runs


def order(schedule: str, pp: int, rank: int, m: int, v: int | None = None) -> list[tuple[str, int, int]]:
    """The compute actions of pipeline rank ``rank`` for ``m`` micro-batches: ("F" | "B", global stage, mb)."""
    return list(_order(schedule, pp, rank, m, VIRTUAL.get(schedule, 1) if v is None else v))


@lru_cache(maxsize=4096)  # the planner asks for the same few (pp, m, v) over and over
def _order(schedule: str, pp: int, rank: int, m: int, v: int) -> tuple:
    if schedule not in MODELLED:
        raise ConfigError(f"pipeline schedule {schedule!r}: the order is modelled for {', '.join(MODELLED)}")
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ConfigError(f"{schedule} keeps one stage per rank, not {v}")
    if not 0 <= rank < pp or m < 1 or v < 1:
        raise ConfigError(f"need 0 <= rank < pp and m, v >= 1 (rank {rank}, pp {pp}, m {m}, v {v})")
    stages = [rank + i * pp for i in range(v)]
    if schedule == "gpipe":
        return tuple([("F", rank, k) for k in range(m)] + [("B", rank, k) for k in range(m)])
    if schedule == "1f1b":
        warm = min(m, pp - rank)
        ops = [("F", rank, k) for k in range(warm)]
        for k in range(m - warm):
            ops += [("B", rank, k), ("F", rank, warm + k)]
        return tuple(ops + [("B", rank, k) for k in range(m - warm, m)])
    if schedule == "looped-bfs":
        return tuple([("F", s, k) for s in stages for k in range(m)]
                     + [("B", s, k) for s in reversed(stages) for k in reversed(range(m))])
    return tuple(_interleaved(pp, rank, m, v))


def _rounds(pp: int, m: int) -> tuple[int, int]:
    """Interleaved 1F1B's rounds and micro-batches per round (torch's)."""
    rounds = max(1, m // pp)
    if m % rounds:
        raise RoundsError(f"interleaved 1F1B needs micro-batches ({m}) divisible by its rounds ({rounds}): "
                          f"torch refuses it (a multiple of pp always works)")
    return rounds, m // rounds


def warmup(pp: int, rank: int, m: int, v: int) -> int:
    """Forwards interleaved 1F1B runs on ``rank`` before its first backward."""
    per_round = _rounds(pp, m)[1]
    return min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)


def peak(schedule: str, pp: int, rank: int, m: int, v: int | None, saved, kept=None) -> tuple[int, int]:
    """``peak_held`` of the rank's order. Without ``kept`` the interleaved 1F1B phase repeats every round of
    v·(m/rounds) forward-backward pairs (each stage gains and loses m/rounds micro-batches per period), so the peak
    lies within the warm-up and one period: only those are replayed (the planner asks for thousands)."""
    v = VIRTUAL.get(schedule, 1) if v is None else v
    ops = _order(schedule, pp, rank, m, v)
    if kept is None and schedule == "interleaved-1f1b":
        ops = ops[:warmup(pp, rank, m, v) + 2 * (_rounds(pp, m)[1] * v + 1)]
    return peak_held(ops, saved, kept)


def _interleaved(pp: int, rank: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """torch's ScheduleInterleaved1F1B (``_get_1f1b_rank_ops`` without zero bubble)."""
    per_round, warm = _rounds(pp, m)[1], warmup(pp, rank, m, v)
    total = m * v
    fwd_stage = lambda op: ((op // per_round) % v) * pp + rank  # noqa: E731
    bwd_stage = lambda op: (v - 1 - ((op - warm) // per_round) % v) * pp + rank  # noqa: E731
    f_mb, b_mb = defaultdict(int), defaultdict(int)
    ops = []

    def step(kind, stage, count):
        ops.append((kind, stage, count[stage]))
        count[stage] += 1

    for op in range(warm):
        step("F", fwd_stage(op), f_mb)
    for op in range(warm, total):
        step("F", fwd_stage(op), f_mb)
        step("B", bwd_stage(op), b_mb)
    for op in range(total, total + warm):
        step("B", bwd_stage(op), b_mb)
    return ops


def peak_held(ops, saved, kept=None) -> tuple[int, int]:
    """The most bytes of saved activations held at once while running ``ops``, and how many chunk micro-batches
    are in flight then: each forward adds ``saved(stage)``, its backward frees all of it but ``kept(stage)`` (what
    the runtime keeps alive after a micro-batch's backward, e.g. torch's receive buffers; default nothing)."""
    held = n = peak = at_peak = 0
    for kind, stage, _ in ops:
        if kind == "F":
            held, n = held + saved(stage), n + 1
        else:
            held, n = held - saved(stage) + (kept(stage) if kept else 0), n - 1
        if held > peak:
            peak, at_peak = held, n
    return peak, at_peak
