"""nbgrader's own autograde of one submission, in a private course folder.

Each submission gets a copy of a *template* course folder (``prepare_template``: the lab's instructor notebook,
its release and a gradebook, made once per batch), so parallel graders never share a gradebook. nbgrader restores
test cells from that gradebook, runs the notebook in a fresh kernel with the per-cell timeout of
``nbgrader_config.py`` and records its scores. Those scores come from the student's kernel, which the student's
code controls: the grader reports them next to the independent re-check (``recheck``), whose score is final.

With an ``isolation`` the kernel runs in an OS sandbox (``isolation``): nbgrader finds a ``python3`` kernel spec
whose command starts the kernel through bwrap, and talks to it over Unix sockets in a folder the sandbox shares
(``transport = ipc``: the sandbox has a network of its own, so TCP on the grader's loopback is out of its reach).
Every process the notebook starts (a torchrun job of a lab cell) runs inside that sandbox too.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from coursekit.course.authoring import Lab, generate, nbgrader_api
from coursekit.course.config import Course


def prepare_template(course: Course, lab: Lab, dest: Path) -> Path:
    """A course folder with ``source/<lab>``, ``release/<lab>`` and ``gradebook.db`` for ``lab``."""
    generate(course, lab, dest)
    return dest


def sandboxed_kernel(isolation, workdir: Path, sockets=None) -> dict:
    """Make nbgrader start its kernel in a sandbox; returns the config sections that point it there.

    The sockets' folder is a fresh one of its own (not inside ``workdir``, whose path and gradebook the kernel must
    not see), in ``sockets`` (the batch's, which it removes even when a grader is killed) or the temporary folder;
    the caller removes it."""
    sock = Path(tempfile.mkdtemp(prefix="kernel-", dir=sockets))
    os.chmod(sock, 0o777)  # the kernel's user creates its sockets here
    if isolation.mechanism == "subuid":
        from coursekit.course.isolation import make_reachable

        make_reachable(sock)
    spec = workdir / "kernel-sandbox.json"
    spec.write_text(json.dumps({"isolation": isolation.to_dict(), "socket_dir": str(sock)}))
    kdir = workdir / "jupyter" / "kernels" / "python3"
    kdir.mkdir(parents=True, exist_ok=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "coursekit.course.isolation", "kernel", str(spec), "{connection_file}"],
        "display_name": "Python 3 (coursekit sandbox)", "language": "python",
        "interrupt_mode": "message"}))  # a signal to bwrap would not reach the kernel in its own session
    os.environ["JUPYTER_PATH"] = str(workdir / "jupyter")  # this grader process grades one submission only
    return {"KernelManager": {"transport": "ipc", "ip": str(sock / "kernel")}}


def autograde(course: Course, lab: Lab, template: Path, student: str, notebook: Path, workdir: Path,
              isolation=None, sockets=None) -> dict:
    """Run nbgrader's autograde of ``notebook`` for ``student`` in ``workdir`` (a copy of ``template``).

    Returns ``{"success", "error", "score", "max_score", "cells": {grade_id: score}, "notebook": path}`` where
    ``notebook`` is the executed (autograded) notebook, or None if nbgrader did not write one.
    """
    shutil.copytree(template, workdir, dirs_exist_ok=True)
    sub = workdir / "submitted" / student / lab.name
    sub.mkdir(parents=True, exist_ok=True)
    shutil.copy(notebook, sub / f"{lab.name}.ipynb")  # the notebook only: no file of the student's travels
    sections = {}
    if lab.settings.cell_timeout:
        sections["Execute"] = {"timeout": int(lab.settings.cell_timeout)}
    if isolation is not None and isolation.on:
        sections.update(sandboxed_kernel(isolation, workdir, sockets))
    api = nbgrader_api(course, workdir, **sections)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = api.autograde(lab.name, student, force=True, create=True)
    finally:
        if "KernelManager" in sections:
            shutil.rmtree(Path(sections["KernelManager"]["ip"]).parent, ignore_errors=True)
    out = {"success": bool(res["success"]), "error": _short_error(res), "score": None, "max_score": None,
           "cells": {}, "notebook": None}
    graded = workdir / "autograded" / student / lab.name / f"{lab.name}.ipynb"
    if graded.is_file():
        out["notebook"] = str(graded)
    if res["success"]:
        from nbgrader.api import Gradebook

        with warnings.catch_warnings(), Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
            warnings.simplefilter("ignore")
            s = gb.find_submission(lab.name, student)
            out["score"], out["max_score"] = float(s.code_score), float(s.max_code_score)
            for nb in s.notebooks:
                for g in nb.grades:
                    out["cells"][g.name] = float(g.score) if g.score is not None else None
    return out


def _short_error(res: dict) -> str:
    """nbgrader's failure in one or two lines (its log holds the rest)."""
    if res["success"]:
        return ""
    text = (res.get("error") or "") + "\n" + (res.get("log") or "")
    # the exception line of the last traceback says what happened (a cell timeout, a dead kernel ...)
    causes = [ln.strip() for ln in text.splitlines() if re.match(r"^\s*[\w.]+(Error|Exception|Interrupt)\b", ln)]
    return (causes[-1] if causes else text.strip().splitlines()[-1] if text.strip() else "unknown error")[:300]
