"""Helpers for a lab's test cells, which run in two places with the same code:

- in the student's kernel (the learner's checks, nbgrader's autograde), where a student name is the real function;
- in the grader's re-check, where it is a ``StudentFunction`` that runs the function in the student's process.

``launch_function`` runs a student function on N processes under torchrun (through ``coursekit.launch``) and
returns what each rank reported, as plain JSON data; ``describe_figure`` turns a matplotlib figure into plain data
(title, axis labels, lines with their x/y values) so a test can assert on a plot, and closes it (a test cell never
shows a figure again).

A failed job raises ``LaunchError`` with the student's frames of the failing rank first (what their code did),
the job's and the library's frames after.
"""
from __future__ import annotations

import inspect
import json
import os
import re

HARNESS = """\
# Written by coursekit.course.testing.launch_function: define the student's code statement by statement (a failing
# definition elsewhere in the notebook must not break this job), then hand the function to the driver.
import ast, json, linecache, sys, importlib

CHUNKS = json.loads({chunks!r})
ns = {{"__name__": "__student__"}}
for label, source in CHUNKS:
    linecache.cache[label] = (len(source), None, source.splitlines(True), label)
    for stmt in ast.parse(source).body:
        try:
            exec(compile(ast.Module([stmt], []), label, "exec"), ns)
        except Exception as e:
            print(f"[coursekit] skipped a failing definition ({{label}}, line {{stmt.lineno}}): "
                  f"{{type(e).__name__}}: {{e}}", file=sys.stderr)
module, _, attr = {driver!r}.partition(":")
getattr(importlib.import_module(module), attr)(ns[{fn!r}], **json.loads({kwargs!r}))
from coursekit.launch import finish
finish(0)  # results reported: no interpreter teardown of a distributed worker (coursekit.launch.finish)
"""


def chunks_of(fn) -> list[tuple[str, str]]:
    """(label, source) pieces that define ``fn`` and what it needs: the student's program in the re-check; in a
    notebook the definitions of every cell run so far; else the source file of ``fn``'s module."""
    from coursekit.course.program import definitions

    if hasattr(fn, "chunks"):  # a StudentFunction
        return list(fn.chunks)
    try:
        ip = get_ipython()  # noqa: F821 (defined in IPython kernels only)
    except NameError:
        ip = None
    if ip is not None and getattr(fn, "__module__", None) == "__main__":
        cells = ip.user_ns.get("In", [])[1:]
        return [(f"<In [{i}]>", definitions(src, f"<In [{i}]>").source) for i, src in enumerate(cells, 1)]
    path = inspect.getsourcefile(fn)
    return [(path, inspect.getsource(inspect.getmodule(fn)))]


def launch_function(fn, driver: str, *, nproc: int = 2, timeout: float = 120, **kwargs) -> list:
    """Run ``driver(fn, **kwargs)`` on every rank of an ``nproc``-process torchrun job; per-rank reports.

    ``driver`` ("package.module:function") is library code: it sets up the process group, calls ``fn`` and
    ``report``s raw results. Judge them in the test cell, never in the job (the student's code runs there).
    A failing or hanging job raises ``LaunchError`` (every process is stopped) naming the rank and its traceback.
    """
    from coursekit.launch import launch_code

    name = getattr(fn, "__name__", None)
    if not name or not name.isidentifier():
        raise TypeError(f"launch_function needs a named function, got {fn!r}")
    script = HARNESS.format(chunks=json.dumps(chunks_of(fn)), driver=driver, fn=name, kwargs=json.dumps(kwargs))
    from coursekit.launch import LaunchError

    # in the re-check the job runs the student's code: in a sandbox of its own when the student's process has one
    sandbox = getattr(getattr(fn, "_process", None), "isolation", None)
    try:
        res = launch_code(script, nproc=nproc, timeout=timeout, stream=False,
                          **({"sandbox": sandbox} if sandbox is not None else {}))
    except LaunchError as e:
        if not e.traceback:
            raise
        message, tb = student_first(e, name, nproc)
        raise LaunchError(message, rank=e.rank, traceback=tb, log=e.log, returncode=e.returncode,
                          timed_out=e.timed_out) from None
    return res.results


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')


def _library_file(path: str) -> bool:
    """Frames of the job script, coursekit, the standard library or installed packages."""
    import sys
    import sysconfig

    import coursekit

    if path.startswith("<"):  # <In [7]>, <cell ring_all_reduce>: the student's cells
        return False
    roots = {os.path.dirname(coursekit.__file__), sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
             sys.prefix, sys.base_prefix}
    return os.path.basename(path) == "job.py" or any(path.startswith(r + os.sep) for r in roots if r)


def student_first(err, fn_name: str, nproc: int) -> tuple[str, str]:
    """(message, traceback) of a failed job, reordered: the student's frames and the error first, then the whole
    traceback of that rank."""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", ln) for ln in err.traceback.rstrip().splitlines()]
    frames, i = [], 0
    while i < len(lines):  # a frame: its "File ..." line and the indented source lines under it
        m = _FRAME.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and lines[j].startswith("    ") and not _FRAME.match(lines[j]):
                j += 1
            frames.append((m.group(1), lines[i:j]))
            i = j
        else:
            i += 1
    tail = [ln for ln in lines if ln.strip() and not ln.startswith(" ") and not ln.startswith("Traceback")]
    error = tail[-1] if tail else "see the log"
    mine = [ln for path, block in frames if not _library_file(path) for ln in block]
    where = f"rank {err.rank}" if err.rank is not None else "a rank"
    head = f"{fn_name} failed on {where} of {nproc}: {error}"
    body = ([f"Your code, on {where}:", *mine, error, ""] if mine else []) + \
        ["The whole traceback of that rank (job script and library frames included):", *lines]
    tb = "\n".join([*mine, error, "", *lines]) if mine else "\n".join(lines)
    return head + "\n" + "\n".join(body), tb


def describe_figure(fig, *, close: bool = True) -> dict:
    """``{"axes": [{"title", "xlabel", "ylabel", "xscale", "yscale", "lines": [{"label", "x", "y"}]}]}``.

    Closes the figure (``close=False`` keeps it open), so a test cell that draws one to check it does not show it
    again in the notebook. Accepts an already-described figure (what a re-check receives) and returns it unchanged."""
    if isinstance(fig, dict) and "axes" in fig:
        return fig
    if not hasattr(fig, "get_axes"):
        raise TypeError(f"expected a matplotlib Figure, got {type(fig).__name__}")
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)
    axes = []
    for ax in fig.get_axes():
        lines = [{"label": str(ln.get_label()), "x": [float(v) for v in ln.get_xdata()],
                  "y": [float(v) for v in ln.get_ydata()]} for ln in ax.get_lines()]
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                     "xscale": ax.get_xscale(), "yscale": ax.get_yscale(), "lines": lines})
    return {"axes": axes}
