"""The scores of ``coursekit course grade`` in formgrader's gradebook.

formgrader (nbgrader's JupyterLab extension) shows the course's own gradebook (``nbgrader_config.py``:
``course/gradebook.db``) and the notebooks under ``course/autograded/``. ``coursekit course grade`` grades each
submission in a private course folder, so that graders run in parallel, and never writes that gradebook itself;
``publish(course, out...)`` then writes every graded row of its output folders into it, one at a time:

- each lab as an assignment, with the grade, solution and source cells of its instructor notebook (what nbgrader's
  ``generate_assignment`` records; its ``SaveCells`` does it here);
- each student, and a submission per (student, lab) whose grade cells carry the **re-check's** points as their
  autograde score: the final score (nbgrader's in-kernel score, which the student's code controls, is not used);
- the executed notebook as ``course/autograded/<student>/<lab>/<lab>.ipynb`` (the submitted one where nbgrader did not
  run), so formgrader opens it.

Rows that are missing or errors are left out (formgrader would show them as zero); an earlier submission of the same
student and lab is replaced. ``coursekit course gradebook OUT...`` runs it; ``coursekit course grade --gradebook``
runs it after the batch.
"""
from __future__ import annotations

import copy
import json
import shutil
import warnings
from pathlib import Path

from coursekit.course.authoring import read_lab
from coursekit.course.config import Course, ensure_tools_on_path

PUBLISHED = ("graded", "flagged")


def records(*outs) -> list[dict]:
    """Every ``results/<student>/<lab>.json`` of the output folders, later folders overriding earlier ones."""
    found: dict = {}
    for out in map(Path, outs):
        res = out / "results"
        if not res.is_dir():
            raise FileNotFoundError(f"{out} has no results/ folder: not an output folder of coursekit course grade")
        for path in sorted(res.glob("*/*.json")):
            rec = json.loads(path.read_text())
            rec["_folder"] = path.parent
            found[(rec["row"]["student"], rec["row"]["lab"])] = rec
    return list(found.values())


def publish(course: Course, *outs, log=print) -> int:
    """Write the graded rows of ``outs`` into the course's gradebook; returns how many submissions it wrote."""
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.preprocessors import SaveCells

    ensure_tools_on_path()  # nbgrader creates a new gradebook with alembic, from PATH
    cd = course._file_config().CourseDirectory
    db_url, course_id = cd.db_url, cd.course_id
    autograded = course.root / cd.get("autograded_directory", "autograded")
    recs = [r for r in records(*outs) if r["row"]["status"] in PUBLISHED and r.get("recheck")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's deprecation notices from nbgrader's models
        for lab_name in sorted({r["row"]["lab"] for r in recs}):
            lab = read_lab(course, lab_name)
            with Gradebook(db_url, course_id) as gb:
                gb.update_or_create_assignment(lab_name)
            resources = {"nbgrader": {"notebook": lab_name, "assignment": lab_name, "db_url": db_url}}
            SaveCells().preprocess(copy.deepcopy(lab.notebook), resources)
        with Gradebook(db_url, course_id) as gb:
            for rec in recs:
                student, lab_name = rec["row"]["student"], rec["row"]["lab"]
                gb.update_or_create_student(student)
                try:
                    gb.remove_submission(lab_name, student)
                except MissingEntry:
                    pass
                sub = gb.add_submission(lab_name, student)
                points = {t["grade_id"]: float(t["points"]) for t in rec["recheck"]["tests"]}
                for nb in sub.notebooks:
                    for g in nb.grades:
                        g.auto_score = points.get(g.name, 0.0)
                gb.db.commit()
                _copy_notebook(rec, autograded / student / lab_name / f"{lab_name}.ipynb")
                log(f"gradebook: {student}/{lab_name} {sub.score:g}/{sub.max_score:g}")
    return len(recs)


def _copy_notebook(rec: dict, dest: Path) -> None:
    executed = rec["_folder"] / f"{rec['row']['lab']}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if executed.is_file():
        shutil.copy(executed, dest)
