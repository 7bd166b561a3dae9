"""``coursekit lab``: start JupyterLab on the course, the one documented way, for learners and instructors.

    coursekit lab                  learners: JupyterLab on the course folder, opened on labs/
    coursekit lab --instructor     instructors: also writes solutions/<lab>/<lab>.ipynb, so formgrader lists every lab
    coursekit lab --print          show the command and the environment instead of starting it

What a bare ``.venv/bin/jupyter lab`` gets wrong, and this command sets up:

- the venv's ``bin`` goes first on PATH: nbgrader runs ``alembic`` from PATH to create formgrader's gradebook (else
  formgrader stays on "Loading, please wait…"), and kernels and torchrun jobs find the venv's tools;
- the nbgrader exchange folder (``Exchange.root`` of nbgrader_config.py, ``course/exchange`` unless
  COURSEKIT_EXCHANGE says otherwise) exists and is writable by everyone, so *Assignment List* and formgrader work;
- the server runs in the course folder, where nbgrader finds nbgrader_config.py;
- as root (a container), ``--allow-root`` is passed: JupyterLab refuses root without it.

Any further arguments go to ``jupyter lab`` unchanged (``coursekit lab --port 8890 --no-browser``).
"""
from __future__ import annotations

import argparse
import os
import shlex
import stat
import sys
from pathlib import Path

from coursekit.course.config import Course


def exchange_root(course: Course) -> Path:
    """The exchange folder nbgrader_config.py names (created, world-writable with the sticky bit, as nbgrader
    documents for a shared exchange)."""
    cfg = course._file_config()
    root = Path(cfg.get("Exchange", {}).get("root", course.root / "course" / "exchange"))
    root.mkdir(parents=True, exist_ok=True)
    mode = root.stat().st_mode
    want = stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO | stat.S_ISVTX
    if mode & want != want and os.access(root, os.W_OK):
        os.chmod(root, mode | want)
    return root


def instructor_notebooks(course: Course) -> list[Path]:
    """Write solutions/<lab>/<lab>.ipynb for every lab (formgrader's source notebooks); returns those written."""
    from coursekit.course.authoring import canonical_json, read_lab, write_notebook

    written = []
    for name in course.lab_names():
        path = course.solutions / name / f"{name}.ipynb"
        nb = read_lab(course, name).notebook
        if not path.is_file() or path.read_text() != canonical_json(nb):
            write_notebook(nb, path)
            written.append(path)
    return written


def command(course: Course, extra: list[str], *, instructor: bool) -> tuple[list[str], dict]:
    """(argv, environment) of the JupyterLab server for ``course``."""
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]
    env["PATH"] = os.pathsep.join([bindir, *path])
    env.pop("MPLBACKEND", None)  # kernels pick their inline backend: figures show in the notebook
    argv = [os.path.join(bindir, "jupyter"), "lab", f"--ServerApp.root_dir={course.root}"]
    if not any(a.startswith(("--LabApp.default_url", "--ServerApp.default_url")) for a in extra):
        # the instructor's page is JupyterLab's root (/lab): "/lab/tree/" names an empty path, which JupyterLab answers
        # with a "Path Not Found" dialog; a learner opens the labs folder
        argv.append(f"--LabApp.default_url={'/lab' if instructor else '/lab/tree/' + course.labs.name}")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
        argv.append("--allow-root")
    return argv + list(extra), env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit lab", description=__doc__.split("\n\n")[0].replace("``", ""),
                                epilog="other arguments are passed to `jupyter lab`")
    p.add_argument("--instructor", action="store_true",
                   help="write the instructor notebooks formgrader needs (solutions/<lab>/<lab>.ipynb) first")
    p.add_argument("--root", default=None, help="course folder (default: nearest folder with nbgrader_config.py)")
    p.add_argument("--print", dest="show", action="store_true", help="print the command and PATH; start nothing")
    return p


def main(argv=None) -> int:
    args, extra = _parser().parse_known_args(argv)
    course = Course(args.root)
    exchange = exchange_root(course)
    if args.instructor:
        for path in instructor_notebooks(course):
            print(f"wrote {path.relative_to(course.root)}", file=sys.stderr)
    argv, env = command(course, extra, instructor=args.instructor)
    if args.show:
        print(shlex.join(argv))
        print(f"PATH={env['PATH']}")
        print(f"exchange={exchange}")
        return 0
    print(f"coursekit lab: {'instructor' if args.instructor else 'learner'} mode in {course.root}"
          f"{' (Nbgrader -> Formgrader lists the labs)' if args.instructor else ''}", file=sys.stderr, flush=True)
    os.chdir(course.root)  # nbgrader reads nbgrader_config.py from the server's working directory
    os.execve(argv[0], argv, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
