"""``coursekit trace DIR --plot FILE.png``: one row pair per rank (compute, communication) over the traced steps.

Uses the classification of ``coursekit.profiling.trace`` (the same events, merged the same way), matplotlib's
Agg backend (no display needed). Time is relative to the earliest recorded step of any rank: ranks on one host
share a clock; across hosts the rows can be shifted by the hosts' clock offset.
"""
from __future__ import annotations

from pathlib import Path

from coursekit.profiling import trace as T


def plot(folder, out, max_ranks: int = 16) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted((T.load(f) for f in sorted(Path(folder).glob("*.json"))), key=lambda t: t["rank"])[:max_ranks]
    fig, ax = plt.subplots(figsize=(12, 0.9 * len(traces) + 1.2))
    yt, yl = [], []
    by_step = [T._by_step(tr) for tr in traces]
    t0 = min(w[0] for steps in by_step for w, _, _ in steps.values())
    for i, (tr, steps) in enumerate(zip(traces, by_step)):
        comp, comm = [], []
        for w, c, m in steps.values():
            comp += T.clip([T._span(e) for e in c], *w)
            comm += T.clip([T._span(e) for e in m], *w)
            ax.axvline((w[0] - t0) / 1e3, color="0.8", lw=0.8, zorder=0)
        y = 2 * (len(traces) - 1 - i)
        for row, iv, color in ((y + 1, comp, "tab:blue"), (y, comm, "tab:orange")):
            ax.broken_barh([((s - t0) / 1e3, (e - s) / 1e3) for s, e in T.union(iv)], (row + 0.1, 0.8),
                           color=color, lw=0)
        yt += [y + 0.5, y + 1.5]
        yl += [f"rank {tr['rank']} comm", f"rank {tr['rank']} compute"]
    ax.set_yticks(yt, yl)
    ax.set_xlabel("ms since the first recorded step (grey lines: each rank's step starts)")
    ax.set_title(f"compute vs communication: {folder}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return str(out)
