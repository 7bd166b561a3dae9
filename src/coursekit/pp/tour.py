"""Module 4 in ``coursekit demo``: tensor, pipeline and context parallelism on one mesh, each equal to one
process's run step by step."""
from __future__ import annotations

from coursekit.tour import Check

MODULE, TITLE = 4, "Tensor, pipeline and context parallelism"  # found by coursekit.tour.discover()


def checks(tour) -> list[Check]:
    runs = [("DDP x TP=2 on 4 processes = 1 process", ("ddp", 4, "--tp", "2")),
            ("GPipe, 2 stages, 2 micro-batches = 1 process", ("ddp", 2, "--pp", "2", "--grad-accum", "2")),
            ("ring attention, CP=2 = 1 process", ("ddp", 2, "--cp", "2", "--cp-impl", "ring"))]
    if not tour.quick:
        runs.append(("Ulysses, CP=2 = 1 process", ("ddp", 2, "--cp", "2", "--cp-impl", "ulysses")))
    return [tour.equal_losses(4, what, tour.train(*args)) for what, args in runs]
