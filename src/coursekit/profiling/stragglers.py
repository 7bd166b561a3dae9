"""Stragglers: split every rank's step time into compute and waiting for peers, and name the rank they wait for.

    rec = CollectiveRecorder(strategy.model)       # after setup: DDP comm hook + timed torch.distributed calls
    with rec.step(): strategy.train_step(...)      # per step: (issue, done) times of every collective
    report = gather_and_find(records, rank, rec)   # at the end, on every rank: who waits for whom

What is measured. A collective finishes at about the same moment on every rank, so its duration on a rank
(issue -> completion) is the transfer plus the time that rank waited for the last one to arrive. For the k-th
collective of a step, ``wait = its duration on this rank - the shortest duration of it on any rank`` (the same
definition ``coursekit trace`` uses on the profiler's timeline, which cross-checks it). Summed per step:
``wait_ms`` (waiting for peers) and ``compute_ms`` = step time - wait. The straggler is the rank that waits least
while the others wait; its slowdown is the median of the others' wait minus its own.

How the collectives are seen, per strategy. DDP issues its gradient all-reduces from its C++ reducer, which no
Python wrapper sees (its buffer broadcast at each forward, ``dist._broadcast_coalesced``, is called from Python and
wrapped): a DDP comm hook (the default all-reduce, ``allreduce_hook``, plus a completion callback on its
future) times each bucket. FSDP2 (``dist.all_gather_single`` / ``reduce_scatter_single`` / ``all_reduce``), the
course's ZeRO and the trainer call ``torch.distributed`` from Python: those functions are wrapped while a step runs
(outermost call only; async calls are timed to their future's completion). Wall-clock durations, no CPU time:
on a loaded machine (many processes on 2 cores) a rank descheduled by the OS looks slow, and it is.

Rank-0-free and clock-free: only durations on each rank's own clock are compared, never timestamps across hosts.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

METHOD = "per-collective duration minus the fastest rank's (DDP comm hook + timed torch.distributed calls)"
WRAPPED = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
           "reduce_scatter_tensor", "all_gather", "reduce_scatter", "all_to_all_single", "broadcast", "barrier",
           "_broadcast_coalesced")  # the last: DDP's buffer broadcast at the start of every forward (from Python)


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return 0.0 if not n else xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


class CollectiveRecorder:
    """Times every collective a step issues; ``.steps`` holds one list of (issue, done) per recorded step."""

    def __init__(self, model=None):
        self.steps, self.cur, self._tls, self._saved = [], None, threading.local(), {}
        self._lock = threading.Lock()
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def hook(state, bucket):
                entry = self._begin()
                fut = allreduce_hook(state, bucket)  # exactly DDP's default: divide by the group size, all-reduce

                def done(f):
                    self._end(entry)
                    return f.value()
                return fut.then(done)
            model.register_comm_hook(model.process_group, hook)

    def _begin(self):
        entry = [time.perf_counter(), None]
        with self._lock:
            if self.cur is not None:
                self.cur.append(entry)
        return entry

    def _end(self, entry) -> None:
        entry[1] = time.perf_counter()

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            if getattr(self._tls, "depth", 0):  # a collective calling another: count the outer one only
                return fn(*args, **kwargs)
            self._tls.depth = 1
            try:
                entry = self._begin()
                work = fn(*args, **kwargs)
            finally:
                self._tls.depth = 0
            if kwargs.get("async_op") and work is not None:
                try:  # timed to completion; a handle without a future (a coalescing manager) stays unfinished
                    work.get_future().then(lambda f: self._end(entry))
                except (AttributeError, RuntimeError):
                    pass
            else:
                self._end(entry)
            return work
        return timed

    @contextmanager
    def step(self):
        import torch.distributed as dist

        self.cur = []
        for name in (n for n in WRAPPED if hasattr(dist, n)):
            self._saved[name] = getattr(dist, name)
            setattr(dist, name, self._wrap(self._saved[name]))
        try:
            yield
        finally:
            for name, fn in self._saved.items():
                setattr(dist, name, fn)
            with self._lock:
                self.steps.append(self.cur)
                self.cur = None


def durations(rec: CollectiveRecorder) -> list[list[float]]:
    """Per step, the duration (s) of each collective in issue order (unfinished ones left out)."""
    return [[d - i for i, d in sorted(st) if d is not None] for st in rec.steps]


def peer_waits(every: list[list[list[float]]]) -> list[list[float]]:
    """``every[rank][step][k]`` durations -> per rank and step, the summed wait beyond the fastest rank's duration."""
    n_steps = min(len(r) for r in every)
    out = [[0.0] * n_steps for _ in every]
    for s in range(n_steps):
        n = min(len(r[s]) for r in every)
        for k in range(n):
            fastest = min(r[s][k] for r in every)
            for i, r in enumerate(every):
                out[i][s] += r[s][k] - fastest
    return out


def rank_summary(steps: list[dict], waits: list[float]) -> dict:
    """Median step time, wait and compute (ms) of one rank, leaving out the first step (warm-up) when there are
    others."""
    pairs = list(zip([s["step_time_s"] for s in steps], waits))
    pairs = pairs[1:] or pairs
    return {"step_ms": 1000 * _median([t for t, _ in pairs]), "wait_ms": 1000 * _median([w for _, w in pairs]),
            "compute_ms": 1000 * _median([t - w for t, w in pairs]), "steps": len(pairs)}


CONSISTENCY = 2 / 3  # the straggler waits least in at least this share of the steps
NOISE_K = 3.0  # and the others' extra wait for it exceeds NOISE_K x its step-to-step spread (median abs. deviation)


def noise_test(per_step: dict, *, floor_ms: float) -> dict:
    """``per_step[rank]``: that rank's wait (ms) in each step (the same steps on every rank). The candidate is the
    rank with the least median wait; per step, its gap = the others' median wait - its own. It is named only when
    its median gap exceeds ``max(floor_ms, NOISE_K x the gaps' median absolute deviation)`` — the run's own noise,
    measured over its repeated steps — and it is the least-waiting rank in at least ``CONSISTENCY`` of the steps: a
    machine that deschedules a random rank now and then makes a different "straggler" each step."""
    ranks = sorted(per_step)
    n = min(len(per_step[r]) for r in ranks)
    slow = min(ranks, key=lambda r: _median(per_step[r][:n]))
    gaps = [_median([per_step[r][s] for r in ranks if r != slow]) - per_step[slow][s] for s in range(n)]
    gap = _median(gaps)
    noise = NOISE_K * _median([abs(g - gap) for g in gaps])
    least = sum(min(ranks, key=lambda r: per_step[r][s]) == slow for s in range(n)) / n
    threshold = max(floor_ms, noise)
    named = n > 0 and gap > threshold and least >= CONSISTENCY
    why = (f"the others wait {gap:.1f} ms per step for rank {slow} (threshold {threshold:.1f} ms: max({floor_ms:.1f} "
           f"ms, {NOISE_K:g} x the steps' spread); it waits least in {least:.0%} of {n} steps)")
    if not named:
        why = (f"no rank is waited for beyond the run's noise: candidate rank {slow}, {gap:.1f} ms per step against "
               f"a threshold of {threshold:.1f} ms (max({floor_ms:.1f} ms, {NOISE_K:g} x the steps' spread)), least "
               f"waiting in {least:.0%} of {n} steps (needs {CONSISTENCY:.0%})")
    return {"candidate": slow, "gap_ms": gap, "noise_ms": noise, "threshold_ms": threshold, "consistency": least,
            "named": named, "reason": why}


def _gap(per_rank: list[dict], slow: dict) -> tuple[float, float]:
    """(the others' median wait minus ``slow``'s, the others' median step time without waiting), ms per step."""
    others = [r for r in per_rank if r is not slow]
    return (_median([r["wait_ms"] for r in others]) - slow["wait_ms"],
            _median([r["step_ms"] - r["wait_ms"] for r in others]))


def find(per_rank: list[dict], min_ms: float = 2.0, min_frac: float = 0.10, per_step: dict | None = None) -> dict:
    """The straggler among ``per_rank`` ({"rank", "compute_ms", "wait_ms"}), or rank None with the reason.

    Named when the others' median wait exceeds the least-waiting rank's by over ``min_ms`` and ``min_frac`` of
    the others' step time; with ``per_step`` (each rank's wait in each step, ms) also beyond the run's own
    step-to-step noise, consistently (``noise_test``)."""
    out = {"method": METHOD, "per_rank": per_rank, "rank": None, "slowdown_ms": None}
    if len(per_rank) < 2:
        return dict(out, reason="one rank: nobody to wait for")
    slow = min(per_rank, key=lambda r: r["wait_ms"])
    gap, base = _gap(per_rank, slow)
    floor = max(min_ms, min_frac * base)
    out.update(candidate=slow["rank"], gap_ms=gap)
    if per_step is not None:
        t = noise_test(per_step, floor_ms=floor)
        out.update(candidate=t["candidate"], gap_ms=t["gap_ms"], noise_ms=t["noise_ms"], threshold_ms=t["threshold_ms"],
                   consistency=t["consistency"])
        if not t["named"]:
            return dict(out, reason=t["reason"])
        # named by the noise test (gap_ms: its per-step gap); the slowdown reported as Lab 5 defines it, from the
        # whole run's waits: the others' median wait minus the named rank's
        slow = next(r for r in per_rank if r["rank"] == t["candidate"])
        gap, base = _gap(per_rank, slow)
        return dict(out, rank=slow["rank"], slowdown_ms=gap, slowdown_x=(base + gap) / base if base > 0 else None,
                    reason=t["reason"])
    if gap <= floor:
        return dict(out, reason=f"no rank is waited for over max({min_ms} ms, {min_frac:.0%} of compute)")
    return dict(out, rank=slow["rank"], slowdown_ms=gap, slowdown_x=(base + gap) / base if base > 0 else None,
                reason=f"the others wait {gap:.1f} ms per step for rank {slow['rank']}")


def gather_and_find(steps: list[dict], rank: int, rec: CollectiveRecorder) -> dict | None:
    """Every rank's collective durations (one all_gather_object, default group), waits, then ``find``."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1 or not steps:
        return None
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (rank, durations(rec), [s["step_time_s"] for s in steps]))
    waits = peer_waits([d for _, d, _ in every])
    per_rank = [dict(rank=r, **rank_summary([{"step_time_s": t} for t in ts], w))
                for (r, _, ts), w in zip(every, waits)]
    skip = 1 if min(len(w) for w in waits) > 1 else 0  # the first step is warm-up, as in rank_summary
    return find(per_rank, per_step={r: [1000 * x for x in w[skip:]] for (r, _, _), w in zip(every, waits)})


def line(s: dict | None) -> str:
    """One line for ``coursekit train``'s summary."""
    if not s:
        return "straggler: not measured (one process)"
    per = ", ".join(f"r{r['rank']} {r['compute_ms']:.0f}/{r['wait_ms']:.0f}" for r in s["per_rank"])
    head = (f"straggler: rank {s['rank']}, ~{s['slowdown_ms']:.0f} ms per step slower" if s["rank"] is not None
            else "straggler: none")
    return f"{head} (compute/wait ms per step: {per}) - {s['reason']}"
