"""Batch grading of the toy course: every integrity attack graded correctly, every student × lab recorded.

One batch (real nbgrader autograde in private course folders + the independent re-check, 2 graders at once) grades
a submission per attack vector; each test below checks one row. Expected scores follow from the toy lab:
``square`` is worth 2 points (1 visible + 1 hidden), ``hyp`` 3 (one test cell with visible and hidden parts).
"""
import csv
import json
import os
import re
import textwrap
import threading

import psutil
import pytest

from coursekit.course.grading import grade
from coursekit.course.report import figure, load, table
from test_course_toy import HIDDEN_SOURCE, SOLUTIONS, make_course, submission, write_submission

RIGHT_SQUARE, RIGHT_HYP = SOLUTIONS["square"], SOLUTIONS["hyp"]
WRONG_SQUARE, WRONG_HYP = "def square(x):\n    return 0\n", "def hypot(a, b):\n    return 0.0\n"


def hanging_job(tag: str, ignore_sigint: bool) -> str:
    """A cell that starts a 2-process torchrun job that never ends; ``tag`` on its command line finds its processes
    (from outside the grading sandbox too, where pids and files of the job are the sandbox's own)."""
    guard = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" if ignore_sigint else ""
    launch = f"from coursekit.launch import launch_code\nlaunch_code('import time; time.sleep(600)', [{tag!r}], " \
             f"nproc=2, timeout=600)\n"
    return guard + launch + RIGHT_SQUARE


def watch_processes(tags: dict, seen: dict, stop: threading.Event) -> None:
    """Record in ``seen[key]`` the pid of every process whose command line carries ``tags[key]``, until ``stop``."""
    while not stop.is_set():
        for p in psutil.process_iter(["cmdline"]):
            for key, tag in tags.items():
                if tag in (p.info["cmdline"] or []):
                    seen[key].add(p.pid)
        stop.wait(0.2)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    course = make_course(root / "course", labs=("toy", "toy2"), timeout=12)
    subs = root / "submitted"
    tags = {k: f"coursekit-test-{k}-{os.getpid()}" for k in ("job", "job_sigint")}
    seen = {k: set() for k in tags}
    S = dict  # cells of a submission, by grade id
    cases = {
        "solution": S(square=RIGHT_SQUARE, hyp=RIGHT_HYP),
        "release": S(),
        "partial": S(square=RIGHT_SQUARE),
        "raises": S(square=RIGHT_SQUARE, hyp="def hypot(a, b):\n    return 1 / 0\n"),
        "hang": S(square=RIGHT_SQUARE, hyp="import time\ndef hypot(a, b):\n    while True:\n        time.sleep(0.1)\n"),
        "hang_sigint": S(square=RIGHT_SQUARE, hyp=textwrap.dedent("""\
            import signal, time
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            def hypot(a, b):
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                while True:
                    pass
            while True:
                pass
            """)),
        "os_exit": S(square=RIGHT_SQUARE, hyp="import os\ndef hypot(a, b):\n    os._exit(3)\n"),
        "always_equal": S(square="class Answer(int):\n    def __eq__(self, other):\n        return True\n"
                                 "def square(x):\n    return Answer(1)\n", hyp=RIGHT_HYP),
        "transformer": S(square="get_ipython().input_transformers_cleanup.append(lambda lines: [])\n" + WRONG_SQUARE,
                         hyp=WRONG_HYP),
        "fake_print": S(square=WRONG_SQUARE + "print('square_visible: All tests passed!')\n",
                        hyp=WRONG_HYP + "print('hyp_test: passed (3/3 points)')\n"),
        "patch": S(square="import coursekit.course.wire, coursekit.course.recheck\n"
                          "coursekit.course.wire.close = lambda *a, **k: True\n"
                          "coursekit.course.recheck.recheck = lambda *a, **k: None\n"
                          "close = lambda *a, **k: True\n" + WRONG_SQUARE,
                   hyp="def hypot(a, b):\n    import coursekit.course.wire as w\n"
                       "    w.close = lambda *a, **k: True\n    return -1.0\n"),
        "job_timeout": S(square=hanging_job(tags["job"], False)),
        "job_timeout_sigint": S(square=hanging_job(tags["job_sigint"], True)),
    }
    for student, cells in cases.items():
        write_submission(subs, student, submission(course, **cells))
    # edited and deleted test cells, changed points, on top of a right `square` and a stub `hypot`
    nb = submission(course, square=RIGHT_SQUARE)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") == "hyp_test":
            cell.source, meta["points"] = "pass", 100
    nb.cells = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") != "square_hidden"]
    write_submission(subs, "edited_tests", nb)
    (subs / "not_a_notebook" / "toy").mkdir(parents=True)
    (subs / "not_a_notebook" / "toy" / "toy.ipynb").write_text("{ this is not json")
    (subs / "absent").mkdir()
    write_submission(subs, "solution", submission(course, "toy2", square=RIGHT_SQUARE, hyp=RIGHT_HYP), lab="toy2")
    out = root / "out"
    stop = threading.Event()
    watcher = threading.Thread(target=watch_processes, args=(tags, seen, stop), daemon=True)
    watcher.start()
    try:
        rows = grade(course, subs, out, jobs=2)
    finally:
        stop.set()
        watcher.join()
    return {"rows": {(r.student, r.lab): r for r in rows}, "out": out, "pids": seen, "cases": cases, "course": course}


def row(graded, student, lab="toy"):
    return graded["rows"][(student, lab)]


def test_every_student_and_lab_has_a_row(graded):
    students = set(graded["cases"]) | {"edited_tests", "not_a_notebook", "absent"}
    assert set(graded["rows"]) == {(s, lab) for s in students for lab in ("toy", "toy2")}
    with open(graded["out"] / "grades.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == 2 * len(students)
    assert {r["status"] for r in csv_rows if r["lab"] == "toy2" and r["student"] != "solution"} == {"missing"}
    assert row(graded, "absent").status == "missing" and row(graded, "absent").score == 0


def test_solution_release_and_partial(graded):
    sol, rel, part = row(graded, "solution"), row(graded, "release"), row(graded, "partial")
    assert (sol.score, sol.max_score, sol.nbgrader_score, sol.status) == (5, 5, 5, "graded")
    assert row(graded, "solution", "toy2").score == 5
    assert (rel.score, rel.nbgrader_score) == (0, 0) and "NotImplementedError" in rel.reason
    assert part.score == 2 and part.exercises == {"square": [2.0, 2.0], "hyp": [0.0, 3.0]}


def test_edited_or_deleted_test_cells_and_changed_points_change_nothing(graded):
    r = row(graded, "edited_tests")
    assert (r.score, r.max_score) == (2, 5)
    assert r.nbgrader_score == 2  # nbgrader restores its test cells too; points come from the source


def test_code_that_raises(graded):
    r = row(graded, "raises")
    assert r.score == 2 and "ZeroDivisionError" in r.reason


def test_a_hang_and_a_sigint_proof_hang(graded):
    assert row(graded, "hang").score == 2 and "no answer within 6 s" in row(graded, "hang").reason
    r = row(graded, "hang_sigint")
    assert r.score == 2 and "no answer within" in r.reason
    assert r.nbgrader_score is None and "nbgrader" in r.reason  # its kernel could not be interrupted


def test_os_exit(graded):
    r = row(graded, "os_exit")
    assert r.score == 2 and "ended (exit code 3)" in r.reason


def test_eq_always_true_is_flagged_and_scored_on_the_truth(graded):
    r = row(graded, "always_equal")
    assert r.score == 3 and r.exercises["square"] == [0.0, 2.0]
    assert r.nbgrader_score == 5 and r.status == "flagged"  # nbgrader alone gives it full marks


def test_input_transformer_trick(graded):
    r = row(graded, "transformer")
    assert r.score == 0 and r.nbgrader_score == 5 and r.status == "flagged"


def test_printing_passed_is_not_passing(graded):
    r = row(graded, "fake_print")
    assert r.score == 0 and r.nbgrader_score == 0


def test_monkeypatching_helpers_and_the_checker(graded):
    r = row(graded, "patch")
    assert r.score == 0 and r.nbgrader_score == 3 and r.status == "flagged"  # in-kernel `close` was patched


def test_unreadable_notebook_gets_a_row_with_a_reason(graded):
    r = row(graded, "not_a_notebook")
    # graded (a zero the student earned, every test failed for a stated reason), not an error of the grader
    assert r.score == 0 and r.status == "graded", (r.status, r.reason)
    assert "notebook not readable" in r.reason


@pytest.mark.parametrize("student", ["job_timeout", "job_timeout_sigint"])
def test_a_cell_that_times_out_leaves_no_orphan_process(graded, student):
    pids = graded["pids"][{"job_timeout": "job", "job_timeout_sigint": "job_sigint"}[student]]
    # the torchrun agent at least (its workers too, unless a loaded machine starts them after the cell's timeout)
    assert pids, "the job never started: raise the toy course's cell timeout"
    for pid in pids:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"{student}: process {pid} outlived its grader"
    assert row(graded, student).score == 2  # its functions are graded on their merit


def test_feedback_has_scores_and_no_hidden_test_source(graded):
    fb = graded["out"] / "feedback"
    pages = list(fb.rglob("*.html"))
    assert len(pages) == len([r for r in graded["rows"].values() if r.status != "missing"])
    for page in pages:
        text = page.read_text()
        assert not any(s in text for s in HIDDEN_SOURCE), page
        assert "HIDDEN TESTS" not in text
    eq = (fb / "always_equal" / "toy.html").read_text()
    assert "Score: 3 / 5" in eq and "it does not count" in eq
    res = json.loads((graded["out"] / "results" / "hang" / "toy.json").read_text())
    assert res["row"]["score"] == 2 and any(t["grade_id"] == "hyp_test" and not t["passed"]
                                            for t in res["recheck"]["tests"])


def test_report_figure_and_table(graded, tmp_path):
    data = load(graded["out"])
    # every toy submission but "absent"'s (missing: not a zero); toy2: only "solution" submitted it
    assert set(data) == {"toy", "toy2"} and len(data["toy"]["square"]) == len(graded["cases"]) + 2
    assert len(data["toy2"]["square"]) == 1
    text = table(data)
    assert re.search(r"toy\s+square", text) and re.search(r"toy\s+hyp", text)
    png = figure(data, tmp_path / "dist.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_graded_rows_reach_formgraders_gradebook(graded):
    """``coursekit course gradebook OUT`` (``publish``): every graded or flagged row becomes a submission in the
    course's own gradebook (formgrader's) with the re-check's score per test cell, missing and error rows none; a
    student's flagged row keeps the re-check's score, not nbgrader's in-kernel one; the executed notebook is where
    formgrader opens it; publishing twice replaces, it does not duplicate."""
    from nbgrader.api import Gradebook, MissingEntry

    from coursekit.course.cli import main as course_cli

    course, out = graded["course"], graded["out"]
    assert course_cli(["--root", str(course.root), "gradebook", str(out)]) == 0
    assert course_cli(["--root", str(course.root), "gradebook", str(out)]) == 0  # again: replaced, not added
    db = "sqlite:///" + str(course.root / "course" / "gradebook.db")  # nbgrader_config.py's, under the course root
    with Gradebook(db, "coursekit") as gb:
        for (student, lab), r in graded["rows"].items():
            if r.status in ("graded", "flagged"):
                sub = gb.find_submission(lab, student)
                assert (sub.score, sub.max_score) == (r.score, r.max_score), (student, lab)
            else:
                with pytest.raises(MissingEntry):
                    gb.find_submission(lab, student)
        assert len(gb.find_assignment("toy").submissions) == sum(
            r.status in ("graded", "flagged") and lab == "toy" for (_, lab), r in graded["rows"].items())
        part = {g.name: g.auto_score for nb in gb.find_submission("toy", "partial").notebooks for g in nb.grades}
        assert sum(v for k, v in part.items() if k.startswith("square")) == 2
        assert sum(v for k, v in part.items() if k.startswith("hyp")) == 0
    assert (course.root / "course" / "autograded" / "solution" / "toy" / "toy.ipynb").is_file()
