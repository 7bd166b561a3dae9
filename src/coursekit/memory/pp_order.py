"""The order in which one pipeline rank runs its forwards and backwards, per schedule, and the activations it holds.

    ops = order("interleaved-1f1b", pp=2, rank=0, m=4, v=2)   # [("F", stage, mb), ..., ("B", stage, mb), ...]
    peak_held(ops, saved_of_stage)                             # (peak bytes, chunk micro-batches held then)

Pure Python (no torch): the same orders ``torch.distributed.pipelining`` builds for its schedules (GPipe, 1F1B,
LoopedBFS, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV; stages are global indices, rank r
holds r, r+pp, ... of v·pp, or under the V shape r and 2·pp−1−r), without the idle slots. A micro-batch's
activations on a stage are saved by its forward and freed by its backward, so what a rank holds at any moment is
the sum over the (stage, micro-batch) pairs it has run forward and not yet backward:

- GPipe: all m forwards, then all backwards: m micro-batches at the peak.
- 1F1B: pp - rank forwards of warm-up, then one backward and one forward alternating: min(pp - rank, m).
- LoopedBFS: every micro-batch through the rank's first stage, then through its next, ..., then the backwards in
  reverse: v·m chunk micro-batches at the peak (GPipe per stage).
- Interleaved 1F1B (Narayanan et al. 2021): warm-up (v-1)·(m/rounds) + 2·(pp-1-rank) forwards (at most v·m), then a
  forward and a backward alternating: one more than the warm-up at the peak (the warm-up itself when it already
  covers all v·m), over all v of its stages.

Zero-bubble schedules split a backward into the input's gradient ("I") and the weights' gradient ("W", run later to
fill the bubble). torch's input pass keeps the whole graph (``stage_backward_input``: ``retain_graph=True``; the
first stage runs its whole backward at "W"), so a micro-batch's activations live from its "F" to its "W" (measured:
tests/test_pp.py). Actions: "F" forward, "B" full backward, "I" input gradients (frees nothing), "W" weights
(frees the micro-batch):

- interleaved-zb (ZB1P, Qi et al. 2024): interleaved 1F1B with warm-up (v-1)·(m/rounds) + (pp-1-rank), each "B"
  an "I"; after the rank's first ``rank`` "I"s, each "I" is followed by the oldest pending "W" (the rest at the end).
- zbv: two stages per rank in a V; warm-up of 2·(pp-rank)-1 forwards on the first, then F-I-W on each in turn:
  2·pp half-stage chunks in flight on every rank (1F1B's first-stage peak, on every stage).
- dualpipev (DeepSeek-V3): two stages in a V, forwards of one overlapped with full backwards of the other; the
  last backwards split, their "W"s at the very end: 2·pp + 1 chunks on every rank.
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from coursekit.memory.errors import ConfigError
from coursekit.spec.schedules import SCHEDULES, SINGLE_STAGE, stages_of


class RoundsError(ConfigError):
    """Interleaved 1F1B with micro-batches torch cannot split into rounds (it refuses the schedule)."""

MODELLED = ("gpipe", "1f1b", "looped-bfs", "interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev")
VIRTUAL = {k: v for k, (_, v, _) in SCHEDULES.items()}  # stages per rank, as coursekit.pp runs them
V_SHAPE = tuple(k for k, (_, _, shape) in SCHEDULES.items() if shape == "v")  # exactly two: r and 2·pp−1−r


def order(schedule: str, pp: int, rank: int, m: int, v: int | None = None) -> list[tuple[str, int, int]]:
    """The compute actions of pipeline rank ``rank`` for ``m`` micro-batches: ("F" | "B" | "I" | "W", global
    stage, mb)."""
    return list(_order(schedule, pp, rank, m, VIRTUAL.get(schedule, 1) if v is None else v))


@lru_cache(maxsize=4096)  # the planner asks for the same few (pp, m, v) over and over
def _order(schedule: str, pp: int, rank: int, m: int, v: int) -> tuple:
    if schedule not in MODELLED:
        raise ConfigError(f"pipeline schedule {schedule!r}: the order is modelled for {', '.join(MODELLED)}")
    if schedule in SINGLE_STAGE and v != 1:
        raise ConfigError(f"{schedule} keeps one stage per rank, not {v}")
    if schedule in V_SHAPE and v != 2:
        raise ConfigError(f"{schedule} keeps exactly two stages per rank (a V), not {v}")
    if not 0 <= rank < pp or m < 1 or v < 1:
        raise ConfigError(f"need 0 <= rank < pp and m, v >= 1 (rank {rank}, pp {pp}, m {m}, v {v})")
    if schedule == "dualpipev" and m < 2 * pp:
        raise ConfigError(f"dualpipev needs at least as many micro-batches as stages (2 x pp = {2 * pp}), not {m}")
    stages = stages_of(rank, pp, schedule, v)
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
    if schedule == "zbv":
        return tuple(_zbv(pp, rank, m))
    if schedule == "dualpipev":
        return tuple(_dualpipev(pp, rank, m))
    return tuple(_interleaved(pp, rank, m, v, zero_bubble=schedule == "interleaved-zb"))


def _rounds(pp: int, m: int) -> tuple[int, int]:
    """Interleaved 1F1B's rounds and micro-batches per round (torch's)."""
    rounds = max(1, m // pp)
    if m % rounds:
        raise RoundsError(f"interleaved schedules need micro-batches ({m}) divisible by their rounds ({rounds}): "
                          f"torch refuses it (a multiple of pp always works)")
    return rounds, m // rounds


def warmup(pp: int, rank: int, m: int, v: int, per_hop: int = 2) -> int:
    """Forwards interleaved 1F1B runs on ``rank`` before its first backward (``per_hop`` 1: interleaved-zb)."""
    per_round = _rounds(pp, m)[1]
    return min((v - 1) * per_round + per_hop * (pp - 1 - rank), m * v)


def peak(schedule: str, pp: int, rank: int, m: int, v: int | None, saved, kept=None, loss=None,
         step=None) -> tuple[int, int]:
    """``peak_held`` of the rank's order. Without ``kept`` the interleaved 1F1B phase repeats every round of
    v·(m/rounds) forward-backward pairs (each stage gains and loses m/rounds micro-batches per period), so the peak
    lies within the warm-up and one period: only those are replayed (the planner asks for thousands)."""
    v = VIRTUAL.get(schedule, 1) if v is None else v
    ops = _order(schedule, pp, rank, m, v)
    if kept is None and schedule == "interleaved-1f1b":
        ops = ops[:warmup(pp, rank, m, v) + 2 * (_rounds(pp, m)[1] * v + 1)]
    return peak_held(ops, saved, kept, loss, step)


def _interleaved(pp: int, rank: int, m: int, v: int, zero_bubble: bool = False) -> list[tuple[str, int, int]]:
    """torch's ScheduleInterleaved1F1B, or with ``zero_bubble`` ScheduleInterleavedZeroBubble
    (``_get_1f1b_rank_ops``): each backward an "I", and after the first ``rank`` of them every "I" followed by
    the "W" of the oldest one still pending."""
    per_round, warm = _rounds(pp, m)[1], warmup(pp, rank, m, v, 1 if zero_bubble else 2)
    total = m * v
    fwd_stage = lambda op: ((op // per_round) % v) * pp + rank  # noqa: E731
    bwd_stage = lambda op: (v - 1 - ((op - warm) // per_round) % v) * pp + rank  # noqa: E731
    count = {k: defaultdict(int) for k in "FIBW"}
    ops, backs = [], []  # backs: the op ids whose input pass ran, oldest first (their weight passes follow)

    def step(kind, stage):
        ops.append((kind, stage, count[kind][stage]))
        count[kind][stage] += 1

    for op in range(total + warm):
        if op < total:
            step("F", fwd_stage(op))
        if op < warm:
            continue
        step("I" if zero_bubble else "B", bwd_stage(op))
        backs.append(op)
        if zero_bubble and op - warm >= rank:
            step("W", bwd_stage(backs.pop(0)))
    for op in backs if zero_bubble else ():
        step("W", bwd_stage(op))
    return ops


def _zbv(pp: int, rank: int, m: int) -> list[tuple[str, int, int]]:
    """torch's ScheduleZBVZeroBubble: the order for max(2·pp−1, m) micro-batches, those beyond m left out."""
    n, c0, c1 = max(2 * pp - 1, m), rank, 2 * pp - 1 - rank
    f, b, ops = {c0: 0, c1: 0}, {c0: 0, c1: 0}, []

    def fwd(s):
        ops.append(("F", s, f[s]))
        f[s] += 1

    def fiw(s, weight=True):  # input gradients then (unless deferred) the weights of the same micro-batch
        ops.append(("I", s, b[s]))
        if weight:
            ops.append(("W", s, b[s]))
        b[s] += 1

    for _ in range(2 * (pp - rank) - 1):
        fwd(c0)
    for _ in range(rank):
        fwd(c1)
        fwd(c0)
    for _ in range(pp - rank):
        fwd(c1)
        fiw(c1)
    while f[c1] < f[c0] or f[c0] < n:
        if f[c0] < n:
            fwd(c0)
        fiw(c0)
        fwd(c1)
        fiw(c1)
    w = dict(b)
    for _ in range(rank):
        fiw(c0, weight=False)
        fiw(c1, weight=False)
    for _ in range(pp - rank):
        fiw(c0, weight=False)
        ops.append(("W", c0, w[c0]))
        w[c0] += 1
    ops += [("W", c1, k) for k in range(w[c1], b[c1])] + [("W", c0, k) for k in range(w[c0], b[c0])]
    return [op for op in ops if op[2] < m]


def _dualpipev(pp: int, rank: int, m: int) -> list[tuple[str, int, int]]:
    """torch's ScheduleDualPipeV, each overlapped forward-backward pair as its forward then its full backward."""
    c0, c1 = rank, 2 * pp - 1 - rank
    count, pending, ops = defaultdict(int), [], []  # pending: (stage, mb) whose "W" is still to run

    def act(s, kind):
        key = "I" if kind == "B" else kind
        ops.append((kind, s, count[(s, key)]))
        if kind == "I":
            pending.append((s, count[(s, "I")]))
        count[(s, key)] += 1

    def weight():
        if pending:
            ops.append(("W", *pending.pop(0)))

    for _ in range(2 * (pp - rank - 1)):
        act(c0, "F")
    for _ in range(rank + 1):
        act(c0, "F")
        act(c1, "F")
    for _ in range(pp - rank - 1):
        act(c1, "I")
        weight()
        act(c1, "F")
    for _ in range(m - 2 * pp + rank + 1):
        act(c0, "F")  # overlapped with c1's backward, except the last rank's first (then run apart)
        act(c1, "B")
        act(c1, "F")
        act(c0, "B")
    for _ in range(pp - rank - 1):
        act(c1, "B")
        act(c1, "F")
        act(c0, "B")
    split = False
    for i in range(rank + 1):
        split |= i == (rank + 1) // 2 and rank % 2 == 1
        act(c1, "I" if split else "B")
        split |= i == (rank + 1) // 2 and rank % 2 == 0
        act(c0, "I" if split else "B")
    for _ in range(pp - rank - 1):
        weight()
        act(c0, "I" if split else "B")
    for _ in range(rank + 1):
        weight()
    return ops


def peak_held(ops, saved, kept=None, loss=None, step=None) -> tuple[int, int]:
    """The most bytes of saved activations held at once while running ``ops``, and how many chunk micro-batches
    are in flight then: each forward adds ``saved(stage)``, its backward ("B", or a split backward's "W") frees all
    of it but ``kept(stage)`` (what the runtime keeps alive after a micro-batch's backward, e.g. torch's receive
    buffers; default nothing); an "I" frees only ``loss(stage)`` (the loss's buffers, above the last weight, which
    no weight pass needs). ``step(stage)``: one storage for the whole step (the step's ids or labels, cut into
    micro-batch views), held in full from the stage's first forward. Each callable takes the global stage."""
    held = n = peak = at_peak = 0
    started = set()
    for kind, stage, _ in ops:
        if kind == "F":
            held, n = held + saved(stage), n + 1
            if step and stage not in started:
                started.add(stage)
                held += step(stage)
        elif kind == "I":
            held -= loss(stage) if loss else 0
            continue
        else:  # "B" or "W": freed but for what the runtime keeps (after an "I", its loss buffers are gone)
            freed = saved(stage) - (kept(stage) if kept else 0) - (loss(stage) if loss and kind == "W" else 0)
            held, n = held - freed, n - 1
        if held > peak:
            peak, at_peak = held, n
    return peak, at_peak
