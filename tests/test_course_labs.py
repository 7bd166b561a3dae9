"""Every lab present in solutions/: well formed, in sync with labs/, nothing leaked, and graded as it must be.

For each lab, one batch under real nbgrader autograde (private temporary course folders) grades three submissions:
the instructor's solution (100 % of the code points, from nbgrader and from the independent re-check), the released
lab (0) and a partially right one — the released lab with the first exercise solved (strictly between).
A new lab (``solutions/<lab>/<lab>.py``) is covered by adding its file: nothing here names a lab.
"""
from pathlib import Path

import nbformat
import pytest

from coursekit.course.authoring import HIDDEN_BEGIN, HIDDEN_END, SOLUTION_BEGIN, SOLUTION_END, drift, read_lab
from coursekit.course.authoring import write_notebook
from coursekit.course.config import Course
from coursekit.course.feedback import hidden_lines, secret_lines
from coursekit.course.grading import grade

REPO = Path(__file__).resolve().parents[1]
COURSE = Course(REPO)
LABS = COURSE.lab_names()


def test_there_are_labs():
    assert "lab1_memory" in LABS


def test_labs_are_in_sync_with_solutions():
    assert drift(COURSE) == []


@pytest.mark.parametrize("name", LABS)
def test_nothing_from_the_solutions_leaks_into_labs(name):
    lab = read_lab(COURSE, name)
    files = [p for p in (COURSE.labs / name).rglob("*") if p.is_file()]
    released = "\n".join(p.read_text(errors="replace") for p in files)
    lines = set()  # every line a learner can read: cell sources of the notebooks, other files as they are
    for p in files:
        texts = [c.source for c in nbformat.read(p, as_version=4).cells] if p.suffix == ".ipynb" else [p.read_text()]
        lines |= {ln.strip() for t in texts for ln in t.split("\n")}
    assert not list((COURSE.labs / name).rglob("*.py")), "a source file was copied into labs/"
    for marker in (SOLUTION_BEGIN, SOLUTION_END, HIDDEN_BEGIN, HIDDEN_END):
        assert marker not in released
    secret = secret_lines(lab, SOLUTION_BEGIN, SOLUTION_END) | hidden_lines(lab)
    assert len(secret) >= 2 * len(lab.exercises)  # the check has something to look for
    leaked = sorted(secret & lines)
    assert not leaked, f"solution or hidden-test lines in labs/{name}: {leaked[:5]}"


@pytest.mark.parametrize("name", LABS)
def test_every_exercise_has_visible_and_hidden_tests(name):
    lab = read_lab(COURSE, name)
    assert lab.problems == []
    assert len(lab.exercises) >= 2
    for ex in lab.exercises:
        assert ex.points > 0
        assert any(HIDDEN_BEGIN in t.source for t in ex.tests), ex.name
        assert any(t.source.split(HIDDEN_BEGIN)[0].strip("# \n") for t in ex.tests), f"{ex.name}: no visible test"


def _partial(lab) -> nbformat.NotebookNode:
    """The release with the first exercise's solution cells replaced by the instructor's."""
    nb = nbformat.read(COURSE.release_path(lab.name), as_version=4)
    first = set(lab.exercises[0].solution_ids)
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in first:
            cell.source = lab.cell(gid).source
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("labs")
    subs = root / "submitted"
    for name in LABS:
        lab = read_lab(COURSE, name)
        write_notebook(lab.notebook, subs / "solution" / name / f"{name}.ipynb")
        write_notebook(nbformat.read(COURSE.release_path(name), as_version=4), subs / "release" / name / f"{name}.ipynb")
        write_notebook(_partial(lab), subs / "partial" / name / f"{name}.ipynb")
    rows = grade(COURSE, subs, root / "out", labs=LABS, jobs=2)
    return {(r.student, r.lab): r for r in rows}, root / "out"


@pytest.mark.parametrize("name", LABS)
def test_solution_scores_full_marks_under_nbgrader_and_recheck(graded, name):
    rows, _ = graded
    r, lab = rows[("solution", name)], read_lab(COURSE, name)
    assert r.status == "graded", r.reason
    assert r.nbgrader_score == r.score == r.max_score == lab.max_points


@pytest.mark.parametrize("name", LABS)
def test_release_scores_zero_on_every_exercise(graded, name):
    rows, _ = graded
    r = rows[("release", name)]
    assert r.nbgrader_score == 0 and r.score == 0
    assert all(points == 0 for points, _ in r.exercises.values())


@pytest.mark.parametrize("name", LABS)
def test_partial_submission_scores_strictly_between(graded, name):
    rows, _ = graded
    r, lab = rows[("partial", name)], read_lab(COURSE, name)
    assert 0 < r.nbgrader_score < lab.max_points
    assert r.score == r.nbgrader_score  # an honest notebook: both graders agree
    first = lab.exercises[0]
    assert r.exercises[first.name] == [first.points, first.points]


@pytest.mark.parametrize("name", LABS)
def test_feedback_hides_hidden_tests(graded, name):
    _, out = graded
    secret = hidden_lines(read_lab(COURSE, name))
    for student in ("solution", "release", "partial"):
        page = (out / "feedback" / student / f"{name}.html").read_text()
        assert not [s for s in secret if s in page], f"hidden test source in {student}'s feedback"
