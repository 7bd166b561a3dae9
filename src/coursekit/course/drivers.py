"""Drivers: library code that runs a student's function on every rank of a torchrun job and reports raw results.

A test cell starts one with ``launch_function(student_fn, "coursekit.course.drivers:all_reduce", nproc=3, ...)``.
The student's code runs in the job's processes, so a driver never judges: it reports what happened (outputs,
collectives issued) and the test cell compares that with what it computes itself (``expected_sum``).
"""
from __future__ import annotations


def rank_input(size: int, rank: int, case: int, seed: int = 0):
    """The tensor rank ``rank`` starts case ``case`` with (reproducible anywhere, so a checker can sum them)."""
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + case * 1009 + rank)
    return torch.randn(size, generator=g, dtype=torch.float32)


def expected_sum(size: int, world: int, case: int, seed: int = 0) -> list[float]:
    """What an all-reduce (SUM) of case ``case`` must leave on every rank."""
    total = rank_input(size, 0, case, seed).double()
    for r in range(1, world):
        total += rank_input(size, r, case, seed).double()
    return total.float().tolist()


def all_reduce(fn, sizes, seed: int = 0) -> None:
    """Each rank calls ``fn(tensor)`` on its ``rank_input`` for every size (``fn`` works in place) and reports
    ``{"rank", "world", "outputs": [list per case], "collectives": [CollectiveCounter summary per case]}``."""
    from coursekit import dist as ckdist
    from coursekit.comm.counter import CollectiveCounter
    from coursekit.launch import report

    with ckdist.session() as info:
        outputs, collectives = [], []
        for case, size in enumerate(sizes):
            t = rank_input(size, info.rank, case, seed)
            with CollectiveCounter() as cc:
                fn(t)
            outputs.append(t.tolist())
            collectives.append(cc.summary())
        report({"rank": info.rank, "world": info.world_size, "outputs": outputs, "collectives": collectives})
