"""``coursekit course report``: the score distribution of every exercise, as a figure (and a text table).

Reads ``exercises.csv`` of a grading run: one histogram per exercise (how many students got how many points), the
mean and the share of full marks in each title. Only submitted labs count: a lab a student did not submit
(``missing`` in grades.csv) is no zero in the statistics. The figure is sized for a screen (at most four panels
a row, a lab's exercises wrapping onto more rows) and its point ticks are whole points, or half points where an
exercise's points are halves.
"""
from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

COLUMNS = 4  # panels per row of the figure
PANEL_IN = (3.2, 2.4)  # inches per panel (width, height): 4 columns make a 12.8-inch-wide figure


def _missing(d: Path) -> set[tuple[str, str]]:
    path = d / "grades.csv"
    if not path.is_file():
        return set()
    with open(path, newline="") as f:
        return {(r["student"], r["lab"]) for r in csv.DictReader(f) if r.get("status") == "missing"}


def load(*grades_dirs: str | Path) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{lab: {exercise: [(points, max_points) per student]}}`` from one or more grading runs (e.g. one per Slurm
    array task), in file order; a student graded in several runs counts once (the last run wins); labs a student did
    not submit are left out."""
    rows: dict = {}
    for d in grades_dirs:
        path = Path(d) / "exercises.csv"
        if not path.is_file():
            raise FileNotFoundError(f"no {path}: run `coursekit course grade ... --out {d}` first")
        missing = _missing(Path(d))
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if (r["student"], r["lab"]) not in missing:
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


def point_step(scores: list[tuple[float, float]]) -> float:
    """1 where every score and the maximum are whole points, else 0.5 (the course gives half points at most)."""
    values = [v for s in scores for v in s]
    return 1.0 if all(float(v).is_integer() for v in values) else 0.5


def make_figure(data):
    """The matplotlib figure (``figure`` saves it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [(lab, ex, scores) for lab, exercises in data.items() for ex, scores in exercises.items()]
    rows_per_lab = {lab: -(-len(exercises) // COLUMNS) for lab, exercises in data.items()}
    nrows = max(1, sum(rows_per_lab.values()))
    ncols = min(COLUMNS, max((len(e) for e in data.values()), default=1))
    fig, axes = plt.subplots(nrows, ncols, figsize=(PANEL_IN[0] * ncols, PANEL_IN[1] * nrows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    row = 0
    for lab, exercises in data.items():
        for k, (ex, scores) in enumerate(exercises.items()):
            ax = axes[row + k // COLUMNS][k % COLUMNS]
            ax.axis("on")
            mx, step = scores[0][1], point_step(scores)
            points = [p for p, _ in scores]
            ticks = [i * step for i in range(int(round(mx / step)) + 1)]
            ax.hist(points, bins=[t - step / 2 for t in ticks] + [mx + step / 2], color="tab:blue", edgecolor="white")
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            full = sum(1 for p in points if p >= mx) / len(points)
            ax.set_title(f"{lab}: {ex}\nmean {sum(points) / len(points):.2f}/{mx:g}, full {full:.0%}, "
                         f"n={len(points)}", fontsize=9)
            ax.set_xlabel("points", fontsize=8)
            if k % COLUMNS == 0:
                ax.set_ylabel("students", fontsize=8)
            ax.tick_params(labelsize=8)
        row += rows_per_lab[lab]
    fig.suptitle("Score distribution per exercise (independent re-check; submitted labs only)")
    fig.tight_layout()
    return fig


def figure(data, out: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig = make_figure(data)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
