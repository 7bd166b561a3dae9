"""What a real run of the course showed instructors and learners (issue 15), each finding checked on a small lab.

One batch grades an "exp" lab (a plot exercise, and a constant computed from a function, as Lab 1 does) and an
"exp2" copy, under real nbgrader autograde for "exp": alice submits both, right; bob submits "exp" only, with the
plot right, ``plan`` unfinished, a self-check line equal to a hidden-test line, and a cell that prints ``In``.
"""
import csv
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from coursekit.course.authoring import KERNELSPEC, build, drift, language_info, read_lab, write_notebook
from coursekit.course.config import Course
from coursekit.course.feedback import hidden_lines, sanitise
from coursekit.course.grading import grade, submitted_labs
from coursekit.course.report import load, make_figure
from lab_submission import submission

REPO = Path(__file__).resolve().parents[1]

EXP = textwrap.dedent('''\
    # ---
    # jupyter:
    #   coursekit:
    #     call_timeout: 30
    #     autograde_timeout: 120
    #     submission_timeout: 240
    #   kernelspec:
    #     display_name: Python 3 (ipykernel)
    #     language: python
    #     name: python3
    # ---

    # %% [markdown]
    # # Experience lab
    #
    # Call `plan(80, recompute="full")` and keep the answer in PLAN.

    # %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false}
    import matplotlib.pyplot as plt
    from coursekit.course.testing import describe_figure

    # %% nbgrader={"grade": false, "grade_id": "plot", "locked": false, "schema_version": 3, "solution": true}
    def plot_squares(n):
        """A figure of i squared against i."""
        ### BEGIN SOLUTION
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot(list(range(n)), [i * i for i in range(n)], label="squares")
        ax.set_xlabel("i")
        return fig
        ### END SOLUTION

    # %% nbgrader={"grade": false, "grade_id": "show", "locked": true, "schema_version": 3, "solution": false}
    _fig = plot_squares(5)

    # %% nbgrader={"grade": true, "grade_id": "plot_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
    _axes = describe_figure(plot_squares(3))["axes"]
    assert _axes[0]["lines"][0]["y"] == [0, 1, 4]
    print("plot_squares: 3 points, right values")

    # %% nbgrader={"grade": true, "grade_id": "plot_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
    # hidden tests plot more points
    ### BEGIN HIDDEN TESTS
    assert describe_figure(plot_squares(4))["axes"][0]["lines"][0]["y"] == [0, 1, 4, 9], "plot_squares(4)"
    ### END HIDDEN TESTS

    # %% nbgrader={"grade": false, "grade_id": "plan", "locked": false, "schema_version": 3, "solution": true}
    def plan(budget, recompute="none"):
        """The plan for a budget."""
        ### BEGIN SOLUTION
        return {"budget": budget, "recompute": recompute}
        ### END SOLUTION


    PLAN = plan(80, recompute="full")

    # %% nbgrader={"grade": true, "grade_id": "plan_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
    assert PLAN == {"budget": 80, "recompute": "full"}
    print("plan: budget 80 with full recomputation")

    # %% nbgrader={"grade": true, "grade_id": "plan_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
    # hidden tests try other budgets
    ### BEGIN HIDDEN TESTS
    _got = plan(40,
                recompute="full")
    assert _got == {"budget": 40, "recompute": "full"}, "another budget"
    assert plan(12)["recompute"] == "none", "the default"
    ### END HIDDEN TESTS
''')

PLOT = ('def plot_squares(n):\n    fig, ax = plt.subplots(figsize=(3, 2))\n'
        '    ax.plot(list(range(n)), [i * i for i in range(n)])\n    return fig\n')
PLAN_OK = 'def plan(budget, recompute="none"):\n    return {"budget": budget, "recompute": recompute}\n\n\n' \
          'PLAN = plan(80, recompute="full")\n'
SELF_CHECK = 'assert plan(12)["recompute"] == "none", "the default"'  # a hidden-test line, written by bob himself
PLAN_TODO = ('def plan(budget, recompute="none"):\n    raise NotImplementedError()\n\n\n'
             f'PLAN = plan(80, recompute="full")\n# {SELF_CHECK}\n')


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("exp")
    course_dir = root / "course"
    course_dir.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", course_dir)
    for name in ("exp", "exp2"):
        (course_dir / "solutions" / name).mkdir(parents=True)
        (course_dir / "solutions" / name / f"{name}.py").write_text(EXP)
    course = Course(course_dir, overrides={"Execute": {"timeout": 60}})
    build(course)
    subs = root / "submitted"
    for student, lab, cells in (("alice", "exp", dict(plot=PLOT, plan=PLAN_OK)),
                                ("alice", "exp2", dict(plot=PLOT, plan=PLAN_OK)),
                                ("bob", "exp", dict(plot=PLOT, plan=PLAN_TODO))):
        nb = submission(course, lab, **cells)
        if student == "bob":  # a cell of his own at the end: it prints the kernel's input history
            nb.cells.append(nbformat.v4.new_code_cell("print(In)"))
        write_notebook(nb, subs / student / lab / f"{lab}.ipynb")
    rows = grade(course, subs, root / "out", jobs=2, autograde=["exp"])
    return {"course": course, "rows": {(r.student, r.lab): r for r in rows}, "out": root / "out"}


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_a_lab_not_submitted_is_missing_and_no_zero(graded):
    rows, out = graded["rows"], graded["out"]
    assert set(rows) == {("alice", "exp"), ("alice", "exp2"), ("bob", "exp"), ("bob", "exp2")}
    assert rows[("bob", "exp2")].status == "missing" and "no exp2/exp2.ipynb submitted" in rows[("bob", "exp2")].reason
    assert (rows[("alice", "exp")].score, rows[("alice", "exp2")].score) == (4, 4)
    with open(out / "exercises.csv") as f:
        listed = {(r["student"], r["lab"]) for r in csv.DictReader(f)}
    assert listed == {("alice", "exp"), ("alice", "exp2"), ("bob", "exp")}
    data = load(out)
    assert data["exp2"]["plan"] == [(2.0, 2.0)]  # alice's only: bob's missing lab is not a zero
    assert sorted(data["exp"]["plan"]) == [(0.0, 2.0), (2.0, 2.0)]


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_grading_defaults_to_the_labs_that_were_submitted(graded, tmp_path):
    course, subs = graded["course"], graded["out"].parent / "submitted"
    assert submitted_labs(course, subs) == ["exp", "exp2"]
    assert submitted_labs(course, subs / "bob") == ["exp"]  # one student's folder: his labs only
    rows = grade(course, subs / "bob", tmp_path / "out", labs=["exp2"], jobs=1, autograde=False)
    assert [(r.student, r.lab, r.status) for r in rows] == [("bob", "exp2", "missing")]  # named: graded, missing


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_an_unfinished_function_is_reported_as_not_implemented(graded):
    r = graded["rows"][("bob", "exp")]
    assert (r.score, r.exercises["plot"], r.exercises["plan"]) == (2, [2.0, 2.0], [0.0, 2.0])
    assert "plan: not implemented yet: computing PLAN (cell plan, line 5) raised NotImplementedError" in r.reason
    assert "NameError" not in r.reason


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_feedback_keeps_instructions_and_the_students_own_work(graded):
    lab = read_lab(graded["course"], "exp")
    assert SELF_CHECK in hidden_lines(lab)  # bob's line is a hidden-test line: a text filter would remove his cell
    res = json.loads((graded["out"] / "results" / "bob" / "exp.json").read_text())
    executed = nbformat.read(graded["out"] / "results" / "bob" / "exp.ipynb", as_version=4)
    tests = {t["grade_id"]: t for t in res["recheck"]["tests"]}
    fb = sanitise(executed, lab, tests)
    cells = {_gid(c): c for c in fb.cells if _gid(c)}
    assert cells["plan"].source.strip() == PLAN_TODO.strip()  # his answer, as he wrote it
    assert any("keep the answer in PLAN" in c.source and 'recompute="full")' in c.source for c in fb.cells
               if c.cell_type == "markdown")
    assert "hidden test source" not in "".join(c.source for c in fb.cells)
    assert "_got = plan(40," not in cells["plan_hidden"].source  # the lab's test cells show their visible part
    leaked = [o for c in fb.cells for o in c.get("outputs", []) if "_got = plan(40," in json.dumps(o)]
    assert leaked == [] and "[output removed: it contained hidden test source]" in json.dumps(fb.cells[-1].outputs)
    page = (graded["out"] / "feedback" / "bob" / "exp.html").read_text()
    assert "keep the answer in PLAN" in page and "_got = plan(40," not in page


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_executed_notebook_and_feedback_show_the_figure_once(graded):
    executed = nbformat.read(graded["out"] / "results" / "alice" / "exp.ipynb", as_version=4)
    images = {_gid(c): sum("image/png" in o.get("data", {}) for o in c.outputs)
              for c in executed.cells if c.cell_type == "code"}
    assert images["show"] == 1  # the kernel's inline backend drew it (no MPLBACKEND=Agg from the grader)
    assert sum(images.values()) == 1, images  # the test cell drew it again only to check it: not shown
    visible = next(c for c in executed.cells if _gid(c) == "plot_visible")
    assert [(o.output_type, o.text) for o in visible.outputs] == [("stream", "plot_squares: 3 points, right values\n")]
    page = (graded["out"] / "feedback" / "alice" / "exp.html").read_text()
    assert page.count('src="data:image/png;base64') == 1


def test_report_figure_fits_a_screen_with_whole_or_half_point_ticks(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    rows = [("s1", "big", f"ex{i}", 2.0 if i % 2 else 1.5, 2.0) for i in range(9)] + \
           [("s2", "big", f"ex{i}", 0.0, 2.0) for i in range(9)] + \
           [("s1", "small", "a", 3.0, 3.0), ("s2", "small", "a", 1.0, 3.0)]
    with open(out / "exercises.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "lab", "exercise", "points", "max_points"])
        w.writerows(rows)
    fig = make_figure(load(out))
    width, height = fig.get_size_inches()
    assert width <= 13 and height <= 4 * 2.4 + 0.01  # 4 panels a row: big takes 3 rows, small 1
    ticks = {}
    for ax in fig.axes:
        if ax.get_title():
            ticks[ax.get_title().split("\n")[0]] = [float(t) for t in ax.get_xticks()]
            assert all(float(t).is_integer() for t in ax.get_yticks()), "students are whole"
    assert ticks["small: a"] == [0, 1, 2, 3]
    assert ticks["big: ex0"] == [0, 0.5, 1, 1.5, 2]  # someone scored 1.5
    assert ticks["big: ex1"] == [0, 1, 2]


def test_notebooks_carry_what_jupyterlab_writes_and_build_says_unchanged(tmp_path):
    """ipykernel's own kernelspec and language_info (JupyterLab saves exactly these), so saving does not drift."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert KERNELSPEC == {"display_name": spec.display_name, "language": spec.language, "name": "python3"}
    assert language_info() == IPythonKernel.language_info
    for name in Course(REPO).lab_names():
        meta = nbformat.read(REPO / "labs" / name / f"{name}.ipynb", as_version=4).metadata
        assert meta.kernelspec == KERNELSPEC
        assert {k: v for k, v in meta.language_info.items() if k != "version"} == \
            {k: v for k, v in language_info().items() if k != "version"}
    course_dir = tmp_path / "c"
    (course_dir / "solutions" / "exp").mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", course_dir)
    (course_dir / "solutions" / "exp" / "exp.py").write_text(EXP)
    course = Course(course_dir)
    assert build(course) == [(course.labs / "exp", True)]
    released = course.release_path("exp")
    nb = json.loads(released.read_text())
    nb["metadata"]["language_info"]["version"] = "3.99.0"  # built by another Python: not a change
    released.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    assert drift(course) == []
    r = subprocess.run([sys.executable, "-m", "coursekit.course.cli", "--root", str(course_dir), "build"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "unchanged labs/exp", r.stdout + r.stderr
    (course_dir / "solutions" / "exp" / "exp.py").write_text(EXP.replace("# # Experience lab", "# # Lab X"))
    assert build(course) == [(course.labs / "exp", True)] and drift(course) == []


def test_a_failed_job_shows_the_students_frames_first(tmp_path, monkeypatch, no_orphans):
    """A multi-process test cell whose student function raises: the error names the function and the rank, the
    student's own frames come first, the job script's and the library's after."""
    import re

    from coursekit.course.testing import launch_function
    from coursekit.launch import LaunchError

    (tmp_path / "stud_ring.py").write_text("def ring(t):\n    raise NotImplementedError()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import stud_ring

    with pytest.raises(LaunchError) as e:
        launch_function(stud_ring.ring, "coursekit.course.drivers:all_reduce", nproc=2, sizes=[8], timeout=180)
    first, rest = str(e.value).split("\n", 1)
    assert re.fullmatch(r"ring failed on rank [01] of 2: NotImplementedError", first), first
    mine = rest.index("Your code, on rank")
    assert mine < rest.index('stud_ring.py", line 2, in ring') < rest.index("The whole traceback") < \
        rest.index("drivers.py")
    assert e.value.traceback.lstrip().startswith(f'File "{tmp_path / "stud_ring.py"}", line 2, in ring')


def test_a_failed_hidden_test_says_what_failed_without_its_inputs():
    """Lab 1's hidden ring test fails for a wrong ring (as its own message and a failed job's command line would
    put it): the feedback page says which property failed (wrong sums, 3 ranks) but none of the values the hidden
    test chose (tensor sizes 1001 and 3000, shown nowhere else in the lab), in the test cell or in the notes."""
    from coursekit.course.feedback import hidden_literals, render

    repo = Path(__file__).resolve().parents[1]
    course = Course(repo)
    lab = read_lab(course, "lab1_memory")
    values = hidden_literals(lab)
    assert {"1001", "3000"} <= values and "2" not in values  # a short number is no secret: it is everywhere
    assert not any("wrong sum for a tensor of" in v for v in values)  # assertion messages are not values
    failed = {"grade_id": "ring_all_reduce_hidden", "exercise": "ring_all_reduce", "passed": False, "points": 0,
              "max_points": 2, "line": "",
              "message": "AssertionError: 3 ranks: wrong sum for a tensor of 1001 elements\nthe job failed on rank 2: "
                         "python -m coursekit.course.drivers all_reduce '{\"sizes\": [1001, 2, 3000]}'"}
    recheck = {"tests": [failed], "notes": ["ring_all_reduce_hidden: 3000-element case took 2.0 s"]}
    row = {"lab": "lab1_memory", "student": "eve", "score": 0, "max_score": lab.max_points}
    page = render(row, lab, recheck, str(course.release_path("lab1_memory")))
    assert "3 ranks: wrong sum for a tensor of … elements" in page  # the property, without the input
    assert "1001" not in page and "3000" not in page
    assert "failed: 0 / 2 points" in page


def test_feedback_notes_are_listed_once_each():
    """A hang reported by two test cells (or a load error seen twice) is one note, in the order first seen."""
    from coursekit.course.feedback import summary_markdown

    row = {"lab": "exp", "student": "eve", "score": 1, "max_score": 2}
    notes = ["plan: your function did not return within 30 s", "loading: NameError x",
             "plan: your function did not return within 30 s"]
    md = summary_markdown(row, {"tests": [], "notes": notes})
    bullets = [ln for ln in md.splitlines() if ln.startswith("- ")]
    assert bullets == ["- plan: your function did not return within 30 s", "- loading: NameError x"]
