"""The pipeline schedules of the course, one table: what ``coursekit.pp`` runs (``pp/stage.py``), what the calculator
models along each schedule's order (``coursekit.memory.pp_order``) and what the planner searches read it.

Pure Python: the calculator imports it without torch.
"""
from __future__ import annotations

# schedule -> (torch class, stages per rank, layout): "loop" = rank r holds stages r, r+pp, ...;
# "v" = rank r holds stages r and 2·pp−1−r (the V shape: the first and the last stage on rank 0)
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
    "looped-bfs": ("ScheduleLoopedBFS", 2, "loop"),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zbv": ("ScheduleZBVZeroBubble", 2, "v"),
    "dualpipev": ("ScheduleDualPipeV", 2, "v"),
}

SINGLE_STAGE = tuple(k for k, (_, v, _) in SCHEDULES.items() if v == 1)
"""Schedules that keep one stage per rank (gpipe, 1f1b); the others keep several (``--pp-virtual``)."""

# zero-bubble schedules: each backward split into an input pass (B) and a weight pass (W) run later
SPLIT_BACKWARD = ("interleaved-zb", "zbv", "dualpipev")


def stages_of(rank: int, pp: int, schedule: str, v: int | None = None) -> list[int]:
    """The global stage indices ``rank`` (its pp coordinate) holds under ``schedule``; ``v``: stages per rank other
    than the trainer's (the calculator's ``--pp-virtual``; a V always has two)."""
    _, default, shape = SCHEDULES[schedule]
    if shape == "v":
        return [rank, 2 * pp - 1 - rank]
    return [rank + i * pp for i in range(default if v is None else v)]
