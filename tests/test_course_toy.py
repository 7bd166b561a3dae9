"""A two-exercise toy course (no torch in its cells) that the course-system tests grade, plus its authoring tests.

Other test modules import ``make_course`` / ``submission`` from here. The toy lab is a real plug-in lab: a
``solutions/toy/toy.py`` file next to the repository's own ``nbgrader_config.py`` — nothing else is registered.
"""
import shutil
import textwrap
from pathlib import Path

import nbformat
import pytest

from coursekit.course.authoring import build, drift, read_lab
from coursekit.course.config import Course

from lab_submission import submission as lab_submission

REPO = Path(__file__).resolve().parents[1]

TOY = textwrap.dedent('''\
    # ---
    # jupyter:
    #   coursekit:
    #     call_timeout: 6
    #     autograde_timeout: 60
    #     submission_timeout: 120
    #   kernelspec:
    #     display_name: Python 3
    #     language: python
    #     name: python3
    # ---

    # %% [markdown]
    # # Toy lab

    # %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false}
    import math
    from coursekit.course.wire import close
    OFFSET = 0

    # %% nbgrader={"grade": false, "grade_id": "square", "locked": false, "schema_version": 3, "solution": true}
    def square(x):
        """x squared."""
        ### BEGIN SOLUTION
        return x * x + OFFSET
        ### END SOLUTION

    # %% nbgrader={"grade": true, "grade_id": "square_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
    assert square(3) == 9

    # %% nbgrader={"grade": true, "grade_id": "square_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
    # hidden tests run when your notebook is graded
    ### BEGIN HIDDEN TESTS
    assert square(-4) == 16, "square of a negative number"
    assert square(0.5) == 0.25
    ### END HIDDEN TESTS

    # %% nbgrader={"grade": false, "grade_id": "hyp", "locked": false, "schema_version": 3, "solution": true}
    def hypot(a, b):
        """Length of the hypotenuse."""
        ### BEGIN SOLUTION
        return math.sqrt(a * a + b * b)
        ### END SOLUTION

    # %% nbgrader={"grade": true, "grade_id": "hyp_test", "locked": true, "points": 3, "schema_version": 3, "solution": false}
    assert close(hypot(3, 4), 5.0)
    ### BEGIN HIDDEN TESTS
    assert close(hypot(5, 12), 13.0), "a 5-12-13 triangle"
    ### END HIDDEN TESTS
''')

SOLUTIONS = {"square": "def square(x):\n    return x * x\n", "hyp": "def hypot(a, b):\n    return math.hypot(a, b)\n"}
HIDDEN_SOURCE = ("square(-4) == 16", "square(0.5) == 0.25", "hypot(5, 12)")


def make_course(root: Path, labs=("toy",), **execute) -> Course:
    """A course folder with the repository's nbgrader_config.py and the toy lab under each name in ``labs``."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    for name in labs:
        (root / "solutions" / name).mkdir(parents=True, exist_ok=True)
        (root / "solutions" / name / f"{name}.py").write_text(TOY)
    course = Course(root, overrides={"Execute": {"timeout": 4, **execute}})
    build(course)
    return course


def submission(course: Course, lab: str = "toy", **cells) -> nbformat.NotebookNode:
    """The released notebook with the source of the cells named by grade id replaced."""
    return lab_submission(course, lab, **cells)


def write_submission(subs: Path, student: str, nb, lab: str = "toy") -> None:
    path = subs / student / lab / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return make_course(tmp_path_factory.mktemp("toycourse"))


def test_toy_lab_parses_into_exercises(toy):
    lab = read_lab(toy, "toy")
    assert lab.problems == []
    assert [(e.name, [t.grade_id for t in e.tests], e.points) for e in lab.exercises] == [
        ("square", ["square_visible", "square_hidden"], 2.0), ("hyp", ["hyp_test"], 3.0)]
    assert lab.settings.call_timeout == 6


def test_release_strips_solutions_and_hidden_tests(toy):
    text = toy.release_path("toy").read_text()
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    assert "x * x + OFFSET" not in text and "math.sqrt" not in text
    assert not any(s in text for s in HIDDEN_SOURCE)
    assert [p.name for p in (toy.labs / "toy").iterdir()] == ["toy.ipynb"]  # the .py source is never copied


def test_drift_is_detected_and_cleared_by_build(tmp_path):
    course = make_course(tmp_path / "c")
    assert drift(course) == []
    src = course.source_path("toy")
    src.write_text(src.read_text().replace("assert square(3) == 9", "assert square(3) == 9.0"))
    (course.labs / "toy" / "notes.txt").write_text("hand-added")
    (course.labs / "ghost").mkdir()
    problems = drift(course)
    assert any("toy.ipynb differs" in p for p in problems)
    assert any("notes.txt is not generated" in p for p in problems)
    assert any("labs/ghost has no source" in p for p in problems)
    build(course)
    shutil.rmtree(course.labs / "ghost")
    assert drift(course) == []


def test_authoring_mistakes_stop_the_build(tmp_path):
    course = make_course(tmp_path / "c")
    src = course.source_path("toy")
    text = src.read_text()
    text = text.replace('### BEGIN HIDDEN TESTS\nassert close(hypot(5, 12), 13.0), "a 5-12-13 triangle"\n'
                        '### END HIDDEN TESTS\n', "")
    text = text.replace('"points": 1, "schema_version": 3, "solution": false}\nassert square(3)',
                        '"points": 0, "schema_version": 3, "solution": false}\nassert square(3)')
    text += "\n# %%\nprint('a code cell without nbgrader metadata')\n"
    src.write_text(text)
    problems = read_lab(course, "toy").problems
    assert any("exercise 'hyp' has no hidden tests" in p for p in problems)
    assert any("test cell without points" in p for p in problems)
    assert any("no nbgrader grade_id" in p for p in problems)
    with pytest.raises(ValueError, match="authoring problems"):
        build(course)


def test_validate_passes_a_good_lab_and_names_what_is_wrong_with_a_bad_one(tmp_path):
    from coursekit.course.validate import validate

    course = make_course(tmp_path / "c")
    assert validate(course) == []  # with nbgrader's autograde of the solution and of the release
    src = course.source_path("toy")
    src.write_text(src.read_text().replace("return math.sqrt(a * a + b * b)", "return a + b")
                                  .replace("assert square(3) == 9\n", "assert True\n")
                                  .replace('assert square(-4) == 16, "square of a negative number"\n'
                                           'assert square(0.5) == 0.25\n', "assert True\n"))
    build(course)
    problems = validate(course, nbgrader=False)
    assert any("the solution fails test hyp_test" in p for p in problems), problems
    assert any("released lab scores 2 on exercise 'square'" in p for p in problems), problems


def test_cli_grades_one_students_folder(tmp_path, toy, capsys):
    from coursekit.cli import main

    write_submission(tmp_path / "subs", "ada", submission(toy, square=SOLUTIONS["square"]))
    out = tmp_path / "out"
    rc = main(["course", "--root", str(toy.root), "grade", str(tmp_path / "subs" / "ada"), "--out", str(out),
               "--no-nbgrader", "--jobs", "1"])
    assert rc == 0
    lines = (out / "grades.csv").read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("ada,toy,2.0,5.0,40.0,,graded,")
    assert main(["course", "--root", str(toy.root), "report", str(out)]) == 0
    assert (out / "score_distribution.png").is_file()
    assert main(["course", "--root", str(toy.root), "build", "--check"]) == 0
    assert "in sync" in capsys.readouterr().out
