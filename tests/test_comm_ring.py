"""The teaching ring collectives equal torch's on 2, 3 and 4 processes, for any numel and in sub-groups.

Tolerance for floats, and why: every output element is a sum of n addends, one per rank, which both the ring and
the library compute with n-1 float32 additions in some order. Each addition rounds by at most u = eps/2 relative,
so (recursive summation) |computed - exact| <= (n-1)·u·Σ|x_i|. Orders differ, so the two results may differ from
each other by up to twice that; both are checked against the exact sum (float64 of the float32 inputs, which every
rank can regenerate from the seeds). Integers are exact. All ranks must hold bit-identical ring results: after the
reduce-scatter each chunk is summed on one rank and only copied afterwards.

This file is also the worker (run under torchrun by the tests).
"""
import hashlib
from pathlib import Path

import pytest

SHAPES = [(0,), (1,), (3,), (5,), (7,), (1001,), (4096,), (7, 5)]  # empty, < n, not divisible by n, 2-D
DTYPES = ("float32", "int64")


def _input(shape, dtype, rank):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + sum(shape) + len(dtype))
    if dtype == "int64":
        return torch.randint(-10**6, 10**6, shape, generator=g, dtype=torch.int64)
    return torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[-1] if shape[-1] else 1)  # mixed scales


def _compare(result, reference, exact, abs_sum, n, dtype) -> dict:
    """Error of ``result`` and ``reference`` against ``exact``, as a fraction of the rounding bound (ints: exact)."""
    import torch

    if dtype == "int64":
        return {"ring_exact": torch.equal(result, exact.long()), "lib_exact": torch.equal(reference, exact.long())}
    u = torch.finfo(torch.float32).eps / 2
    bound = (n - 1) * u * abs_sum + 1e-30  # recursive summation bound (the 1e-30 keeps 0/0 away)
    ratio = lambda t: float(((t.double() - exact).abs() / bound).max()) if t.numel() else 0.0  # noqa: E731
    return {"ring": ratio(result), "lib": ratio(reference),
            "ring_vs_lib": float(((result.double() - reference.double()).abs() / (2 * bound)).max())
            if result.numel() else 0.0}


def _cases(dev, group=None, members=None):
    import torch
    import torch.distributed as dist

    from coursekit.comm.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter

    members = members or list(range(dist.get_world_size()))
    n, me = len(members), dist.get_rank()
    out = []
    for dtype in DTYPES:
        for shape in SHAPES:
            x = _input(shape, dtype, me).to(dev)
            alls = [_input(shape, dtype, r).double() for r in members]
            exact, abs_sum = sum(alls), sum(a.abs() for a in alls)
            ring = x.clone()
            ring_all_reduce(ring.t() if ring.dim() == 2 else ring, group)  # 2-D: through a non-contiguous view
            lib = x.clone()
            dist.all_reduce(lib, group=group)
            rec = {"op": "all_reduce", "shape": shape, "dtype": dtype,
                   "digest": hashlib.sha1(ring.cpu().numpy().tobytes()).hexdigest()}
            out.append(rec | _compare(ring.cpu(), lib.cpu(), exact, abs_sum, n, dtype))
        # reduce-scatter / all-gather: the tensor API (numel divisible by n)
        k = 6
        x = _input((n * k,), dtype, me).to(dev)
        before = x.clone()
        rs, lib = torch.empty(k, dtype=x.dtype, device=dev), torch.empty(k, dtype=x.dtype, device=dev)
        ring_reduce_scatter(rs, x, group)
        dist.reduce_scatter_tensor(lib, x, group=group)
        alls = [_input((n * k,), dtype, r).double() for r in members]
        mine = slice(members.index(me) * k, (members.index(me) + 1) * k)
        exact, abs_sum = sum(alls)[mine], sum(a.abs() for a in alls)[mine]
        out.append({"op": "reduce_scatter", "dtype": dtype, "input_unchanged": torch.equal(x, before)}
                   | _compare(rs.cpu(), lib.cpu(), exact, abs_sum, n, dtype))
        ag, lib = torch.empty(n * k, dtype=x.dtype, device=dev), torch.empty(n * k, dtype=x.dtype, device=dev)
        ring_all_gather(ag, x[:k], group)
        dist.all_gather_into_tensor(lib, x[:k], group=group)
        out.append({"op": "all_gather", "dtype": dtype, "equal": torch.equal(ag, lib)})  # copies only: bit-exact
    return out


def _error_paths(dev) -> dict:
    """Wrong sizes and layouts are refused before anything is sent (no peer is left waiting); a one-rank group
    returns at once. Each check runs on every rank, so no rank blocks in a collective its peers skipped."""
    import torch
    import torch.distributed as dist

    from coursekit.comm.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter

    n = dist.get_world_size()
    out = {}
    for name, call in {
        "reduce_scatter_size": lambda: ring_reduce_scatter(torch.empty(3, device=dev), torch.ones(3 * n + 1,
                                                                                                  device=dev)),
        "all_gather_size": lambda: ring_all_gather(torch.empty(3 * n - 1, device=dev), torch.ones(3, device=dev)),
        "all_gather_layout": lambda: ring_all_gather(torch.empty(3, 2 * n, device=dev).t(),
                                                     torch.ones(6, device=dev)),
    }.items():
        try:
            call()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    solo = [dist.new_group([r]) for r in range(n)][dist.get_rank()]  # every rank takes part in each new_group
    t = torch.arange(5.0, device=dev)
    out["solo_unchanged"] = ring_all_reduce(t, solo) is t and t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    dist.barrier()  # the ranks are still in step: no refused call left a send or receive behind
    return out


def _worker() -> None:
    import torch.distributed as dist

    from coursekit import dist as ckdist
    from coursekit.launch import report

    with ckdist.session(seed=0) as info:
        rec = {"rank": info.rank, "world": info.world_size, "world_cases": _cases(info.device),
               "errors": _error_paths(info.device)}
        if info.world_size >= 3:  # a sub-group without rank 0: group ranks differ from global ranks
            members = list(range(1, info.world_size))
            sub = dist.new_group(members)
            if info.rank in members:
                rec["sub_cases"] = _cases(info.device, sub, members)
        report(rec)


@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.slow), 4])  # 3: the default tier's budget
def test_ring_collectives_equal_torch(nproc, no_orphans):
    from coursekit.launch import launch

    res = launch(str(Path(__file__).resolve()), nproc=nproc, timeout=180, stream=False).results
    for key in ("world_cases", "sub_cases"):
        ranks = [r for r in res if key in r]
        assert len(ranks) == (nproc if key == "world_cases" else (nproc - 1 if nproc >= 3 else 0))
        for r in ranks:
            for c in r[key]:
                if "ring_exact" in c:
                    assert c["ring_exact"] and c["lib_exact"], c
                elif "ring" in c:
                    assert c["ring"] <= 1 and c["lib"] <= 1 and c["ring_vs_lib"] <= 1, c
                if c["op"] == "reduce_scatter":
                    assert c["input_unchanged"], c
                if c["op"] == "all_gather":
                    assert c["equal"], c
        # the same bits on every rank (per case), not merely close
        if ranks:
            digests = [[c.get("digest") for c in r[key]] for r in ranks]
            assert all(d == digests[0] for d in digests), key
    for r in res:
        e = r["errors"]
        assert e["reduce_scatter_size"] == f"input has {3 * nproc + 1} elements, expected group size {nproc} x output 3"
        assert e["all_gather_size"] == f"output has {3 * nproc - 1} elements, expected group size {nproc} x input 3"
        assert e["all_gather_layout"] == "output must be contiguous (its chunks are received in place)"
        assert e["solo_unchanged"] is True


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(_worker())  # no interpreter teardown of a distributed worker (see coursekit.launch.finish)
