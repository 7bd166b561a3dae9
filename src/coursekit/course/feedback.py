"""The feedback page of one submission: the executed notebook with the re-check's verdict, hidden tests removed.

- the page opens with the final score (the re-check), per exercise, and every note (load errors, hangs, crashes);
- test cells — known by their nbgrader identity (the lab's test grade ids, or a hidden-test region in the cell),
  never by text overlap — show the lab's visible part only, and their output is replaced by the re-check's result
  for that cell (nbgrader's in-kernel output could be forged by the student's code); every other cell (the lab's
  instructions, the student's own answers) is shown as it is;
- an output that reproduces hidden-test source (a student can print ``In`` during autograde) is removed: one that
  contains at least two distinct hidden-test lines (or the only one, for a lab with a one-line secret), so a
  student's output that happens to share one line with a hidden test (``recompute="full")``) stays;
- a failed test's message says which property failed but not with what: every value written in the lab's hidden
  tests that the lab shows nowhere else (their inputs and expected values: numbers of three or more digits, strings
  other than the assertion messages) is replaced by ``…`` there and in the page's notes (a hidden test's message
  ``wrong sum for a tensor of {_size} elements``, or a failed job's command line, would print them).
"""
from __future__ import annotations

import ast
import html
import re
import threading

import nbformat

from coursekit.course.authoring import HIDDEN_BEGIN, HIDDEN_END, Lab

_RENDER_LOCK = threading.Lock()
_MIN_SECRET = 8  # hidden-test lines shorter than this ("else:", ")") are too common to scrub
_LEAK_LINES = 2  # distinct hidden-test lines an output must contain to count as a copy of hidden-test source


def strip_hidden(source: str) -> str:
    out, inside = [], False
    for ln in source.split("\n"):
        if HIDDEN_BEGIN in ln:
            inside = True
        elif HIDDEN_END in ln:
            inside = False
        elif not inside:
            out.append(ln)
    return "\n".join(out).rstrip()


def _region_lines(source: str, begin: str, end: str) -> tuple[list[str], list[str]]:
    """(lines inside begin/end regions, lines outside), as written (indentation kept)."""
    inside_lines, outside_lines, inside = [], [], False
    for ln in source.split("\n"):
        if begin in ln:
            inside = True
        elif end in ln:
            inside = False
        else:
            (inside_lines if inside else outside_lines).append(ln)
    return inside_lines, outside_lines


def secret_lines(lab: Lab, begin: str = HIDDEN_BEGIN, end: str = HIDDEN_END) -> set[str]:
    """Lines of ``begin``/``end`` regions (hidden tests by default) that appear nowhere in the lab's visible text,
    not even inside a longer line, and are long enough to be telling (``for x in y:`` shared with a visible test,
    or ``recompute="full")`` that the instructions show, is no secret)."""
    secret, visible = set(), set()
    for c in lab.cells:
        inside, outside = _region_lines(c.source, begin, end)
        inside, outside = [ln.strip() for ln in inside], [ln.strip() for ln in outside]
        secret |= {ln for ln in inside if len(ln) >= _MIN_SECRET}
        visible |= set(outside)
    if begin != HIDDEN_BEGIN:  # solution regions: hidden-test lines are not visible either
        visible -= secret_lines(lab)
    text = "\n".join(visible)
    return {ln for ln in secret - visible if ln not in text}


def hidden_lines(lab: Lab) -> set[str]:
    """Lines of the lab's hidden tests that a student must never see."""
    return secret_lines(lab)


_NUMBER = re.compile(r"\d[\d_]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _region_literals(code: str) -> set[str]:
    """Numbers (3+ digits) and strings written in ``code``, the strings of assertion messages and raised errors
    excepted (they name the property); a region that does not parse gives its numbers only."""
    nums = {m.group() for m in _NUMBER.finditer(code) if sum(ch.isdigit() for ch in m.group()) >= 3}
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return nums
    messages = {id(n) for node in ast.walk(tree) if isinstance(node, (ast.Assert, ast.Raise))
                for part in (node.msg if isinstance(node, ast.Assert) else node.exc,) if part is not None
                for n in ast.walk(part)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in messages:
            if len(node.value.strip()) >= 4:
                nums.add(node.value)
            nums |= {m.group() for m in _NUMBER.finditer(node.value) if sum(c.isdigit() for c in m.group()) >= 3}
    return nums


def hidden_literals(lab: Lab) -> set[str]:
    """Values written in the lab's hidden tests that appear in no other text of the lab (instructions, visible
    tests, solutions): what a failure message must not show."""
    hidden, visible = [], []
    for c in lab.cells:
        inside, outside = _region_lines(c.source, HIDDEN_BEGIN, HIDDEN_END)
        if inside:
            hidden.append("\n".join(inside))
        visible.append("\n".join(outside))
    text = "\n".join(visible)
    found = set().union(*(_region_literals(h) for h in hidden)) if hidden else set()
    return {v for v in found if not _token(v).search(text)}


def _token(v: str) -> re.Pattern:
    """``v`` as a whole token: not inside a longer name or number."""
    return re.compile(rf"(?<![\w.]){re.escape(v)}(?![\w.])")


def redact(text: str, literals: set[str]) -> str:
    """``text`` with every hidden literal (as a whole token) replaced by an ellipsis."""
    for v in sorted(literals, key=len, reverse=True):
        text = _token(v).sub("…", text)
    return text


def _output_text(out) -> str:
    parts = [out.get("text", ""), out.get("ename", ""), out.get("evalue", ""), *out.get("traceback", [])]
    for v in (out.get("data") or {}).values():
        parts.append(v if isinstance(v, str) else "\n".join(v) if isinstance(v, list) else "")
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def _stream(text: str):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def leaks(text: str, secret: set[str]) -> bool:
    """Whether ``text`` reproduces hidden-test source (see the module docstring)."""
    found = 0
    for s in secret:
        if s in text:
            found += 1
            if found >= min(_LEAK_LINES, len(secret)):
                return True
    return False


def sanitise(nb, lab: Lab, tests: dict[str, dict]) -> nbformat.NotebookNode:
    """Hidden test source out of every cell and output; test cell outputs replaced by the re-check's results."""
    nb = nbformat.from_dict(nb)
    secret, values = hidden_lines(lab), hidden_literals(lab)
    test_cells = {c.grade_id: c for c in lab.cells if c.kind == "test"}
    for cell in nb.cells:
        gid = (cell.get("metadata", {}).get("nbgrader", {}) or {}).get("grade_id")
        if gid in test_cells:  # the lab's own test cell: its visible part, as the lab wrote it
            cell.source = strip_hidden(test_cells[gid].source)
        elif HIDDEN_BEGIN in cell.get("source", ""):  # a test cell whose identity was changed
            cell.source = strip_hidden(cell.source)
        if cell.cell_type != "code":
            continue
        if gid in test_cells:
            t = tests.get(gid)
            if t is None:
                text = "not graded"
            elif t["passed"]:
                text = f"passed: {t['points']:g} / {t['max_points']:g} points (independent re-check)"
            else:
                where = f"\nfailing line: {t['line']}" if t.get("line") else ""
                text = f"failed: 0 / {t['max_points']:g} points (independent re-check)\n{t['message']}{where}"
            cell.outputs = [_stream(redact(text, values) + "\n")]
            continue
        cell.outputs = [o if not leaks(_output_text(o), secret)
                        else _stream("[output removed: it contained hidden test source]\n") for o in cell.outputs]
    return nb


def summary_markdown(row: dict, recheck: dict | None, lab: Lab | None = None) -> str:
    lines = [f"# Feedback: {row['lab']} — {row['student']}", "",
             f"**Score: {row['score']:g} / {row['max_score']:g}** (independent re-check of every test, visible and "
             "hidden, against your functions run in a separate process; this is your grade)."]
    if row.get("nbgrader_score") is not None and abs(row["nbgrader_score"] - row["score"]) > 1e-9:
        lines.append(f"\nnbgrader's in-kernel autograde gave {row['nbgrader_score']:g}; it does not count.")
    if row.get("reason"):
        lines.append(f"\nStatus: {row['status']} — {html.escape(row['reason'])}")
    if recheck:
        per: dict[str, list[float]] = {}
        for t in recheck["tests"]:
            p = per.setdefault(t["exercise"], [0.0, 0.0])
            p[0] += t["points"]
            p[1] += t["max_points"]
        lines += ["", "| exercise | points |", "|---|---|"]
        lines += [f"| {name} | {p:g} / {m:g} |" for name, (p, m) in per.items()]
        if recheck.get("notes"):
            lines += ["", "Notes:"] + [f"- {html.escape(n)}" for n in dict.fromkeys(recheck["notes"])]  # once each
    text = "\n".join(lines)
    return redact(text, hidden_literals(lab)) if lab is not None else text


def render(row: dict, lab: Lab, recheck: dict | None, notebook_path: str | None) -> str:
    """HTML for one submission; ``notebook_path`` is the autograded notebook (or the submitted one, or None)."""
    from nbconvert import HTMLExporter

    tests = {t["grade_id"]: t for t in (recheck or {}).get("tests", [])}
    nb = None
    if notebook_path:
        try:
            nb = sanitise(nbformat.read(notebook_path, as_version=4), lab, tests)
        except Exception:  # noqa: BLE001 (an unreadable notebook still gets its summary page)
            nb = None
    if nb is None:
        nb = nbformat.v4.new_notebook()
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(summary_markdown(row, recheck, lab)))
    with _RENDER_LOCK:
        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return body
