"""Ulysses vs Ring Attention on the same inputs: forward + backward time and bytes sent per rank, one job.

    launch("coursekit.cp.compare", ["--seqs", "256", "1024", "--heads", "4", "--head-dim", "16"], nproc=2)

Each rank runs one attention core (no projections) on its piece of ``--batch`` sequences of each length, for each
implementation: ``coursekit.cp.ulysses`` (contiguous chunks) and ``coursekit.cp.ring`` (zig-zag chunks), causal.
Every rank reports one row per (seq, impl): ``ms`` (median over ``--iters`` of the slowest rank, after a warm-up),
``sent_bytes`` (what the rank put on the wire per forward + backward, ``CollectiveCounter``) and ``model_bytes``
(the same from ``coursekit.comm.volume``). On a CPU the ring's tiles are plain fp32 matmuls while Ulysses calls
torch's flash SDPA, so times compare these implementations on this machine, not the algorithms at their best
(``bench/bench_cp.py`` adds the projections and saved bytes).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit.cp.compare", description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("--seqs", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None, help="default: = heads")
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--impls", nargs="+", default=["ulysses", "ring"], choices=["ulysses", "ring"])
    return p


def timed_step(step, iters: int, impl: str, *, batch: int, seq: int, heads: int, kv_heads: int, head_dim: int,
               cp: int) -> dict:
    """One CP attention step measured as the course measures it: one warm-up, ``iters`` timed runs (after a barrier,
    the slowest rank's time: a MAX all-reduce), their median in ms; then one step under ``CollectiveCounter``
    against the volume model of ``impl`` (``ms``, ``sent_bytes`` on the wire, ``payload_bytes``, ``model_bytes``)."""
    import torch
    import torch.distributed as dist

    from coursekit.comm import volume
    from coursekit.comm.counter import CollectiveCounter

    step()  # warm-up
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        times.append(t.item())
    with CollectiveCounter() as cc:
        step()
    if impl == "ulysses":
        plan = volume.ulysses_attention(batch, seq, heads, kv_heads, head_dim, cp, act_bytes=4)
    else:
        plan = volume.ring_attention(batch, seq, kv_heads, head_dim, cp, act_bytes=4)
    return {"ms": 1e3 * statistics.median(times), "sent_bytes": cc.wire_bytes(), "payload_bytes": cc.total_bytes(),
            "model_bytes": volume.send_bytes_per_rank(plan)}


def run(argv) -> list[dict]:
    import torch

    from coursekit import dist as ckdist
    from coursekit.cp.ring import ring_attention
    from coursekit.cp.shard import layout_for, shard
    from coursekit.cp.ulysses import ulysses_attention

    a = parser().parse_args(argv)
    kvh = a.kv_heads or a.heads
    fns = {"ulysses": ulysses_attention, "ring": ring_attention}
    rows = []
    with ckdist.session(seed=0) as info:
        cp = info.world_size
        for seq in a.seqs:
            g = torch.Generator().manual_seed(seq)
            full = [torch.randn(a.batch, n, seq, a.head_dim, generator=g) for n in (a.heads, kvh, kvh)]
            for impl in a.impls:
                q, k, v = (shard(t, cp, info.rank, layout=layout_for(impl), dim=2).to(info.device).requires_grad_()
                           for t in full)

                def step(q=q, k=k, v=v, fn=fns[impl]):
                    fn(q, k, v, causal=True).sum().backward()

                m = timed_step(step, a.iters, impl, batch=a.batch, seq=seq, heads=a.heads, kv_heads=kvh,
                               head_dim=a.head_dim, cp=cp)
                rows.append({"cp": cp, "seq": seq, "impl": impl, "ms": m["ms"], "sent_bytes": m["sent_bytes"],
                             "model_bytes": m["model_bytes"]})
    return rows


def main(argv=None) -> int:
    from coursekit.launch import report

    report(run(list(sys.argv[1:] if argv is None else argv)))  # every rank: times are the slowest rank's
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # results reported: skip the interpreter's slow teardown
