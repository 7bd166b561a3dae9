"""Every lab present in solutions/: well formed, in sync with labs/, nothing leaked, and graded as it must be.

Three submissions per lab go through ``coursekit course grade``: the instructor's solution (100 % of the code
points), the released lab (0 on every exercise) and a partially right one — the release with the first exercise
solved (strictly between). Under real nbgrader autograde (private temporary course folders) both nbgrader's score
and the independent re-check must say so.

Tiers: a lab whose header sets ``ci_autograde: true`` is graded with nbgrader in the default tier; any other lab
(its notebook takes minutes) is re-checked without nbgrader in the default tier — unless its header sets
``ci_recheck: false`` (its live runs take minutes even then) — and graded with nbgrader in the slow tier
(``scripts/test.sh --slow``). A new lab (``solutions/<lab>/<lab>.py``) is covered by adding its file:
nothing here names a lab.
"""
import html
from pathlib import Path

import nbformat
import pytest

from coursekit.course.authoring import HIDDEN_BEGIN, HIDDEN_END, SOLUTION_BEGIN, SOLUTION_END, drift, read_lab
from coursekit.course.authoring import write_notebook
from coursekit.course.config import Course
from coursekit.course.feedback import hidden_lines, hidden_literals, secret_lines
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


@pytest.mark.parametrize("name", LABS)
def test_every_visible_test_prints_one_line_named_by_its_exercise(name):
    """The source side of test_executed_solution_reads_well (slow tier: the executed lines): a visible test cell ends
    in one print whose text starts with its exercise's name (grade id ``moe_a2a_visible`` -> "moe..."), so a passing
    test reads as one recognisable line in the feedback."""
    import re

    from coursekit.course.feedback import strip_hidden

    for cell in read_lab(COURSE, name).cells:
        code = strip_hidden(cell.source) if cell.kind == "test" else ""
        if not [ln for ln in code.split("\n") if ln.strip() and not ln.startswith("#")]:
            continue
        prints = re.findall(r'^print\(f?["\'](.*)', code, re.M)
        prefix = cell.grade_id.rsplit("_visible", 1)[0].split("_")[0]
        assert len(prints) == 1 and prints[0].startswith(prefix), (cell.grade_id, prints)


def _partial(lab) -> nbformat.NotebookNode:
    """The release with the first exercise's solution cells replaced by the instructor's."""
    nb = nbformat.read(COURSE.release_path(lab.name), as_version=4)
    first = set(lab.exercises[0].solution_ids)
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in first:
            cell.source = lab.cell(gid).source
    return nb


FAST = [n for n in LABS if read_lab(COURSE, n).settings.ci_autograde]
DEFAULT = [n for n in LABS if n in FAST or read_lab(COURSE, n).settings.ci_recheck]  # graded in the default tier
SLOW = [n for n in LABS if n not in FAST]
CASES = [pytest.param(n, "default", id=f"{n}-{'nbgrader' if n in FAST else 'recheck'}") for n in DEFAULT]
CASES += [pytest.param(n, "slow", marks=pytest.mark.slow, id=f"{n}-nbgrader") for n in SLOW]


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """One grading batch per tier, run on first use: default (every lab; nbgrader for FAST), slow (SLOW, nbgrader)."""
    done = {}

    def get(tier):
        if tier not in done:
            labs, nbgrader = (DEFAULT, FAST) if tier == "default" else (SLOW, SLOW)
            root = tmp_path_factory.mktemp(f"labs-{tier}")
            subs = root / "submitted"
            for name in labs:
                lab = read_lab(COURSE, name)
                release = nbformat.read(COURSE.release_path(name), as_version=4)
                for student, nb in (("solution", lab.notebook), ("release", release), ("partial", _partial(lab))):
                    write_notebook(nb, subs / student / name / f"{name}.ipynb")
            rows = grade(COURSE, subs, root / "out", labs=labs, jobs=2, autograde=nbgrader)
            done[tier] = ({(r.student, r.lab): r for r in rows}, root / "out", set(nbgrader))
        return done[tier]

    return get


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name,tier", CASES)
def test_solution_scores_full_marks(batches, name, tier):
    rows, _, nbgrader = batches(tier)
    r, lab = rows[("solution", name)], read_lab(COURSE, name)
    assert r.status == "graded", r.reason
    assert r.score == r.max_score == lab.max_points
    if name in nbgrader:
        assert r.nbgrader_score == lab.max_points, r.reason


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name,tier", CASES)
def test_release_scores_zero_on_every_exercise(batches, name, tier):
    rows, _, nbgrader = batches(tier)
    r = rows[("release", name)]
    assert r.status == "graded", r.reason  # a zero earned by unanswered exercises, not a grader crash
    assert r.score == 0 and all(points == 0 for points, _ in r.exercises.values())
    if name in nbgrader:
        assert r.nbgrader_score == 0


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name,tier", CASES)
def test_partial_submission_scores_strictly_between(batches, name, tier):
    rows, _, nbgrader = batches(tier)
    r, lab = rows[("partial", name)], read_lab(COURSE, name)
    assert r.status == "graded", r.reason
    assert 0 < r.score < lab.max_points
    first = lab.exercises[0]
    assert r.exercises[first.name] == [first.points, first.points]
    if name in nbgrader:
        assert r.nbgrader_score == r.score  # an honest notebook: both graders agree


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name,tier", CASES)
def test_feedback_hides_hidden_tests(batches, name, tier):
    """No hidden-test source line and no value written in a hidden test (its inputs, its expected values: numbers
    of 3+ digits and strings that are not assertion messages, shown nowhere else in the lab) on any feedback page,
    in the page's text (its style sheets and scripts aside), while every failed test still says it failed."""
    import re

    _, out, _ = batches(tier)
    lab = read_lab(COURSE, name)
    secret, values = hidden_lines(lab), hidden_literals(lab)
    assert values, "every lab's hidden tests use values of their own"
    tests = {c.grade_id for c in lab.cells if c.kind == "test"}

    def token(v):
        return rf"(?<![\w.]){re.escape(v)}(?![\w.])"

    for student in ("solution", "release", "partial"):
        page = (out / "feedback" / student / f"{name}.html").read_text()
        assert not [s for s in secret if s in page], f"hidden test source in {student}'s feedback"
        # what the student's own run of the lab printed (cells other than tests) is theirs to see anyway
        executed = nbformat.read(out / "results" / student / f"{name}.ipynb", as_version=4)
        own = "\n".join(json_text(o) for c in executed.cells
                        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") not in tests
                        for o in c.get("outputs", []))
        text = html.unescape(re.sub(r"<(style|script)\b.*?</\1>|<[^>]+>", " ", page, flags=re.S))
        shown = [v for v in values if re.search(token(v), text) and not re.search(token(v), own)]
        assert not shown, f"values of hidden tests in {student}'s feedback: {shown}"
        if student == "release":
            assert "failed: 0 /" in text


def json_text(output) -> str:
    """An output's text as the page shows it: streams, plain/HTML data, an error's name, value and traceback."""
    import json

    return json.dumps(output, ensure_ascii=False).encode().decode("unicode_escape", errors="ignore")


EXECUTED = [pytest.param(n, "default", id=f"{n}-nbgrader") for n in FAST]
EXECUTED += [pytest.param(n, "slow", marks=pytest.mark.slow, id=f"{n}-nbgrader") for n in SLOW]


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name,tier", EXECUTED)
def test_executed_solution_reads_well(batches, name, tier):
    """As nbgrader's kernel ran the solution: each passing visible test prints one short line and shows no figure,
    every figure appears once (none from test cells), and the feedback keeps the lab's instructions and figures."""
    from coursekit.course.feedback import strip_hidden

    _, out, _ = batches(tier)
    lab = read_lab(COURSE, name)
    executed = nbformat.read(out / "results" / "solution" / f"{name}.ipynb", as_version=4)
    tests = {c.grade_id: c for c in lab.cells if c.kind == "test"}
    images = 0
    for cell in executed.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        shown = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        images += len(shown)
        if gid not in tests:
            continue
        assert not shown, f"{gid}: a test cell shows a figure"
        code = [ln for ln in strip_hidden(tests[gid].source).split("\n") if ln.strip() and not ln.startswith("#")]
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        if code:  # a visible test: one short line
            # one short line on stdout; the kernel may deliver one print as two stream messages under load, and
            # Jupyter shows consecutive stream outputs as one block, so they are read together
            shown_out = [o for o in cell.outputs if o.output_type != "stream" or o.get("text", "").strip()]
            assert {(o.output_type, o.get("name")) for o in shown_out} == {("stream", "stdout")}, (gid, cell.outputs)
            assert text.count("\n") == 1, (gid, text)
            assert len(text) <= 160 and text.startswith(gid.rsplit("_visible", 1)[0].split("_")[0]), (gid, text)
        else:  # hidden tests only: silent
            assert cell.outputs == [], gid
    page = (out / "feedback" / "solution" / f"{name}.html").read_text()
    assert page.count('src="data:image/png;base64') == images
    for c in lab.cells:
        if c.kind == "markdown":
            for heading in (ln.lstrip("# ").strip() for ln in c.source.split("\n") if ln.startswith("#")):
                assert html.escape(heading, quote=False) in page, f"feedback lost the instructions {heading!r}"
