"""The independent re-check: the lab's test cells (visible and hidden, from ``solutions/``) run in the grader's
process, against the student's functions running in a separate process (``sandbox``).

This score is final. nbgrader's own autograde runs the same test cells inside the student's kernel, where the
student's code can reach them (an answer whose ``__eq__`` always returns True; an input transformer that empties
every later cell; a patched assert helper). Here none of that can happen:

- the test code comes from the instructor's source, never from the submission (edited or deleted test cells and
  changed points do not matter; points are the source's);
- a student name in a test cell is a ``StudentFunction``: calling it runs the student's function in the student's
  process and returns plain JSON data (``wire``), so every comparison is between built-in values;
- only the *definitions* of the student's cells are loaded (``program``); their top-level statements never run;
- a call that raises, hangs (SIGINT-proof or not) or ends its process fails that test only, with a reason;
- printed text is never read.
"""
from __future__ import annotations

import ast
import contextlib
import io
import time
import traceback
from dataclasses import asdict, dataclass, field

from coursekit.course import wire
from coursekit.course.authoring import HIDDEN_BEGIN, HIDDEN_END, Lab
from coursekit.course.program import interface, lab_prelude, strip_magics, student_program, undefined_because
from coursekit.course.sandbox import StudentError, StudentFunction, StudentProcess

MAX_OUTPUT = 4000


@dataclass
class TestResult:
    grade_id: str
    exercise: str
    max_points: float
    points: float
    passed: bool
    message: str = ""  # why it failed (assertion message or the student's error), never hidden test source
    line: str = ""  # the failing line when it is a visible one
    seconds: float = 0.0


@dataclass
class RecheckResult:
    lab: str
    tests: list[TestResult]
    notes: list[str] = field(default_factory=list)  # load errors, missing cells, hangs and crashes

    @property
    def score(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_points for t in self.tests)

    def by_exercise(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for t in self.tests:
            p, m = out.get(t.exercise, (0.0, 0.0))
            out[t.exercise] = (p + t.points, m + t.max_points)
        return out

    def to_dict(self) -> dict:
        return {"lab": self.lab, "score": self.score, "max_score": self.max_score, "notes": self.notes,
                "tests": [asdict(t) for t in self.tests]}


def _hidden_lines(source: str) -> set[int]:
    hidden, inside = set(), False
    for i, ln in enumerate(source.split("\n"), 1):
        if HIDDEN_BEGIN in ln:
            inside = True
        if inside:
            hidden.add(i)
        if HIDDEN_END in ln:
            inside = False
    return hidden


def _failure(exc: BaseException, label: str, source: str) -> tuple[str, str]:
    """(message, visible failing line) for an exception raised by a test cell."""
    if isinstance(exc, StudentError):
        msg = str(exc)
        if exc.traceback:
            msg += "\n" + exc.traceback.rstrip()
    elif getattr(exc, "traceback", "") and type(exc).__name__ == "LaunchError":  # a job of the student's code
        last = [ln for ln in exc.traceback.strip().splitlines() if ln.strip()][-1:]
        where = f"rank {exc.rank}" if exc.rank is not None else "a rank"
        msg = f"the job failed on {where}: {_strip_rank(last[0]) if last else 'see the log'}\n{exc.traceback}"
    else:
        msg = f"{type(exc).__name__}: {exc}".rstrip(": ")
    lineno = None
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename == label:
            lineno = fs.lineno
    line = ""
    if lineno is not None and lineno not in _hidden_lines(source):
        line = source.split("\n")[lineno - 1].strip()
    elif lineno is not None and not str(exc):
        msg += " (in a hidden test)"
    return msg, line


def _strip_rank(line: str) -> str:
    return line.split("]:", 1)[1].strip() if line.startswith("[rank") and "]:" in line else line.strip()


def _run_statements(source: str, label: str, ns: dict) -> None:
    code = compile(ast.parse(strip_magics(source)), label, "exec")
    exec(code, ns)


def recheck(lab: Lab, submission, *, cwd: str | None = None, env: dict | None = None,
            log_path: str | None = None, call_timeout: float | None = None,
            only: set[str] | None = None, isolation=None) -> RecheckResult:
    """Grade ``submission`` (a notebook node) against every test cell of ``lab`` (or the grade ids in ``only``).

    ``isolation`` (``coursekit.course.isolation.Isolation``): the student's process, and every job a test cell
    launches with the student's code, run in OS sandboxes; the test cells themselves run here."""
    chunks, notes = student_program(lab, submission)
    ns: dict = {"__name__": "__recheck__"}
    for chunk in lab_prelude(lab):  # the instructor's imports, helpers and constants the tests may use
        _run_statements(chunk.source, chunk.label, ns)
    timeout = call_timeout if call_timeout is not None else lab.settings.call_timeout
    results: list[TestResult] = []
    undefined: dict[str, str] = {}  # names whose definition raised while loading: the real reason of a NameError
    with StudentProcess(chunks, interface(lab), call_timeout=timeout, start_timeout=max(120.0, timeout),
                        cwd=cwd, env=env, log_path=log_path, isolation=isolation) as student:
        try:
            ready = student.start()
            notes += [f"error while loading your code: {e}" for e in ready["errors"]]
            undefined = undefined_because(chunks, ready["errors"])
            for name, info in ready["names"].items():
                if info["kind"] == "function":
                    ns[name] = StudentFunction(student, name)
                elif info["kind"] == "value":
                    ns[name] = wire.decode(info["value"])
                elif info["kind"] == "not_plain":
                    notes.append(f"{name}: {info['error']}")
        except StudentError as e:
            notes.append(str(e))
        for ex in lab.exercises:
            for test in ex.tests:
                if only is not None and test.grade_id not in only:
                    continue
                label = f"<test {test.grade_id}>"
                t0 = time.monotonic()
                out = io.StringIO()
                try:
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                        _run_statements(test.source, label, dict(ns))  # a fresh copy: tests cannot leak state
                    res = TestResult(test.grade_id, ex.name, test.points, test.points, True)
                except Exception as e:  # noqa: BLE001 (a failing test, whatever the reason)
                    msg, line = _failure(e, label, test.source)
                    if isinstance(e, NameError) and getattr(e, "name", None) in undefined:
                        msg = undefined[e.name]
                    res = TestResult(test.grade_id, ex.name, test.points, 0.0, False, msg[-MAX_OUTPUT:], line)
                res.seconds = round(time.monotonic() - t0, 3)
                results.append(res)
        notes += [f"{e}" for e in student.events]
    return RecheckResult(lab.name, results, list(dict.fromkeys(notes)))  # each note once, in order
