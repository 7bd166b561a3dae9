"""``coursekit course report``: the score distribution of every exercise, as a figure (and a text table).

Reads ``exercises.csv`` of a grading run: one histogram per exercise (how many students got how many points),
one row of panels per lab, the mean and the share of full marks in each title.
"""
from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path


def load(*grades_dirs: str | Path) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{lab: {exercise: [(points, max_points) per student]}}`` from one or more grading runs (e.g. one per Slurm
    array task), in file order; a student graded in several runs counts once (the last run wins)."""
    rows: dict = {}
    for d in grades_dirs:
        path = Path(d) / "exercises.csv"
        if not path.is_file():
            raise FileNotFoundError(f"no {path}: run `coursekit course grade ... --out {d}` first")
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                rows[(r["student"], r["lab"], r["exercise"])] = (float(r["points"]), float(r["max_points"]))
    data: dict = defaultdict(lambda: defaultdict(list))
    for (_, lab, ex), score in rows.items():
        data[lab][ex].append(score)
    return data


def table(data) -> str:
    lines = [f"{'lab':<16} {'exercise':<28} {'n':>4} {'mean':>7} {'max':>5} {'full':>6} {'zero':>6}"]
    for lab, exercises in data.items():
        for ex, scores in exercises.items():
            n, mx = len(scores), scores[0][1]
            mean = sum(p for p, _ in scores) / n
            full = sum(1 for p, m in scores if p >= m) / n
            zero = sum(1 for p, _ in scores if p == 0) / n
            lines.append(f"{lab:<16} {ex:<28} {n:>4} {mean:>7.2f} {mx:>5g} {full:>6.0%} {zero:>6.0%}")
    return "\n".join(lines)


def figure(data, out: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labs = list(data)
    ncols = max(len(ex) for ex in data.values())
    fig, axes = plt.subplots(len(labs), ncols, figsize=(2.6 * ncols, 2.4 * len(labs)), squeeze=False)
    for i, lab in enumerate(labs):
        for j in range(ncols):
            ax = axes[i][j]
            items = list(data[lab].items())
            if j >= len(items):
                ax.axis("off")
                continue
            ex, scores = items[j]
            mx = scores[0][1]
            points = [p for p, _ in scores]
            edges = [b - 0.5 for b in range(int(mx) + 2)] if float(mx).is_integer() else 10
            ax.hist(points, bins=edges, color="tab:blue", edgecolor="white")
            full = sum(1 for p in points if p >= mx) / len(points)
            ax.set_title(f"{ex}\nmean {sum(points) / len(points):.2f}/{mx:g}, full {full:.0%}", fontsize=8)
            ax.set_xlabel("points", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{lab}\nstudents", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle("Score distribution per exercise (independent re-check)")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
