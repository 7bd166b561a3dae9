"""``coursekit course validate``: every lab is well formed, in sync, solvable and not solved by its release.

For each lab, through the same grading path as real submissions (``grading.grade``):

- authoring rules hold (every code cell carries nbgrader metadata, every exercise has test cells with points and
  hidden tests, ...) and ``labs/`` matches a fresh build of ``solutions/``;
- the instructor's solution passes every test cell, visible and hidden, in the independent re-check, and scores
  full marks under nbgrader's own autograde;
- the released lab fails every exercise: 0 points in each, in the re-check and under nbgrader.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from coursekit.course.authoring import drift, read_lab, write_notebook
from coursekit.course.config import Course


def validate(course: Course, labs: list[str] | None = None, *, nbgrader: bool = True, jobs: int | None = None,
             progress=None) -> list[str]:
    """Problems found (empty: all good)."""
    from coursekit.course.grading import grade

    say = progress or (lambda msg: None)
    problems: list[str] = []
    for name in labs or course.lab_names():
        lab = read_lab(course, name)
        problems += lab.problems
        problems += drift(course, [name])
        release = course.release_path(name)
        if not release.is_file():
            continue  # drift already says so
        with tempfile.TemporaryDirectory(prefix="coursekit-validate-") as tmp:
            subs, out = Path(tmp) / "subs", Path(tmp) / "out"
            write_notebook(lab.notebook, subs / "solution" / name / f"{name}.ipynb")
            write_notebook(read_json_nb(release), subs / "release" / name / f"{name}.ipynb")
            say(f"{name}: grading the solution and the release{' (re-check and nbgrader)' if nbgrader else ''}")
            rows = {r.student: r for r in grade(course, subs, out, labs=[name], jobs=jobs, autograde=nbgrader,
                                                progress=say, isolation="auto")}  # the instructor's own code
            for who in ("solution", "release"):
                if rows[who].status == "error":
                    problems.append(f"{name}: grading the {who} failed: {rows[who].reason[:300]}")
            sol = json.loads((out / "results" / "solution" / f"{name}.json").read_text())
            rel = json.loads((out / "results" / "release" / f"{name}.json").read_text())
            for t in (sol["recheck"] or {}).get("tests", []):
                if not t["passed"]:
                    problems.append(f"{name}: the solution fails test {t['grade_id']}: {t['message'][:300]}")
            if sol["recheck"] is None:
                problems.append(f"{name}: the solution could not be re-checked: {rows['solution'].reason}")
            for ex, (points, _) in rows["release"].exercises.items():
                if points > 0:
                    problems.append(f"{name}: the released lab scores {points:g} on exercise {ex!r} (must be 0)")
            if rel["recheck"] is None:
                problems.append(f"{name}: the release could not be re-checked: {rows['release'].reason}")
            if nbgrader:
                s, r = rows["solution"], rows["release"]
                if s.nbgrader_score is None or abs(s.nbgrader_score - lab.max_points) > 1e-9:
                    problems.append(f"{name}: nbgrader autograde of the solution gives {s.nbgrader_score} of "
                                    f"{lab.max_points:g} ({s.reason[:300]})")
                if r.nbgrader_score is None or r.nbgrader_score != 0:
                    problems.append(f"{name}: nbgrader autograde of the release gives {r.nbgrader_score} (must be 0)")
    return problems


def read_json_nb(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)
