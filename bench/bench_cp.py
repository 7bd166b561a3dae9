"""Ulysses vs Ring Attention on 2 and 4 processes for growing sequence lengths: time, bytes moved, bytes saved.

    .venv/bin/python bench/bench_cp.py                    # seq 512 .. 4096, 8 heads of 64, 2 and 4 processes
    .venv/bin/python bench/bench_cp.py --kv-heads 2       # GQA: Ulysses replicates K/V heads below the CP degree
    .venv/bin/python bench/bench_cp.py --quick --nproc 2  # tiny settings, seconds (the smoke test runs this)

One row per (processes, sequence, implementation), for one attention block (q/k/v projections, CP attention, o_proj;
``coursekit.cp.probe.AttentionBlock``) on one sequence of ``seq`` tokens split over the processes:
  fwd+bwd ms   median over ``--iters`` timed iterations of the slowest rank (after one warm-up)
  sent MB      bytes this rank puts on the wire per forward+backward under ring algorithms (``CollectiveCounter``
               wire bytes: all-to-all (C-1)/C of its payload, a send its message), and ``(model)`` the same from
               ``coursekit.comm.volume``
  saved MB     saved-for-backward bytes of the attention (core + o_proj input) per rank, ``coursekit.measure``,
               and ``(model)`` from ``coursekit.cp.probe.modelled_bytes`` (the calculator's ``--cp`` terms + what it
               leaves out for Ulysses)
Ring tiles here are plain fp32 matmuls (no flash kernel on CPU) while Ulysses calls torch's CPU flash SDPA, so the
time column compares implementations on this machine, not the algorithms at their best.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _worker(a) -> None:
    import torch

    from coursekit import dist as ckdist
    from coursekit.cp.compare import timed_step
    from coursekit.cp.probe import AttentionBlock, measured_bytes, modelled_bytes
    from coursekit.cp.ring import ring_attention
    from coursekit.cp.shard import layout_for, shard
    from coursekit.cp.ulysses import ulysses_attention
    from coursekit.launch import report

    fns = {"ulysses": ulysses_attention, "ring": ring_attention}
    rows = []
    with ckdist.session(seed=0) as info:
        cp, rank = info.world_size, info.rank
        hidden = a.heads * a.head_dim
        for seq in a.seqs:
            x_full = torch.randn(1, seq, hidden, generator=torch.Generator().manual_seed(seq))
            for impl in a.impls:
                torch.manual_seed(0)
                block = AttentionBlock(hidden, a.heads, a.kv_heads, fns[impl]).to(info.device)
                x = shard(x_full, cp, rank, layout=layout_for(impl), dim=1).to(info.device)
                step = lambda block=block, x=x: block(x).sum().backward()  # noqa: E731
                m = timed_step(step, a.iters, impl, batch=1, seq=seq, heads=a.heads, kv_heads=a.kv_heads,
                               head_dim=a.head_dim, cp=cp)
                saved = measured_bytes(block, x)["attention"]
                model = modelled_bytes(impl, batch=1, seq=seq, hidden=hidden, heads=a.heads, kv_heads=a.kv_heads,
                                       cp=cp)["attention"]
                rows.append({"nproc": cp, "seq": seq, "impl": impl, "ms": m["ms"], "sent_bytes": m["sent_bytes"],
                             "sent_model": m["model_bytes"], "payload_bytes": m["payload_bytes"],
                             "saved_bytes": saved, "saved_model": model})
        if rank == 0:
            report(rows)


def table(rows: list[dict]) -> str:
    head = (f"{'N':>2} {'seq':>6} {'impl':<8} {'fwd+bwd ms':>11} {'sent MB':>9} {'(model)':>9} "
            f"{'saved MB':>9} {'(model)':>9}")
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['nproc']:>2} {r['seq']:>6} {r['impl']:<8} {r['ms']:>11.1f} {r['sent_bytes'] / 1e6:>9.3f} "
                   f"{r['sent_model'] / 1e6:>9.3f} {r['saved_bytes'] / 1e6:>9.3f} {r['saved_model'] / 1e6:>9.3f}")
    return "\n".join(out)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="default: = heads (multi-head attention)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--impls", nargs="+", default=["ulysses", "ring"], choices=["ulysses", "ring"])
    p.add_argument("--quick", action="store_true", help="tiny settings: seq 32 and 64, 4 heads of 8, 1 iteration")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.seqs, a.heads, a.head_dim, a.iters = [32, 64], 4, 8, 1
    a.kv_heads = a.kv_heads or a.heads
    if a.worker:
        return _worker(a)
    from coursekit.launch import launch

    args = ["--worker", "--seqs", *a.seqs, "--heads", a.heads, "--kv-heads", a.kv_heads, "--head-dim", a.head_dim,
            "--iters", a.iters, "--impls", *a.impls]
    rows = []
    for n in a.nproc:
        rows += launch(str(Path(__file__).resolve()), args, nproc=n, timeout=1800, stream=False).results[0]
    print(f"one attention block, 1 sequence, {a.heads} heads ({a.kv_heads} K/V) of {a.head_dim}, fp32, gloo")
    print(table(rows))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
