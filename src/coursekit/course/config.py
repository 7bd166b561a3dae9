"""Where a course lives (its root, ``solutions/``, ``labs/``) and nbgrader's settings for it.

The settings have one home, the course's ``nbgrader_config.py`` (read by nbgrader's own commands and JupyterLab's
formgrader as well). ``Course.nbgrader_config`` loads that file and re-points root and gradebook at a private
folder, so building or grading never touches the instructor's gradebook.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

CONFIG_FILE = "nbgrader_config.py"


@dataclass
class LabSettings:
    """Per-lab grading limits, read from the lab source's notebook metadata (``coursekit:`` in its header)."""

    call_timeout: float = 60.0
    """seconds one call of a student function may take in the re-check before its process is killed"""
    submission_timeout: float = 900.0
    """seconds for one whole submission (re-check, nbgrader autograde, feedback) before its grader is killed"""
    autograde_timeout: float = 600.0
    """seconds for nbgrader's autograde of one submission (a hang that ignores SIGINT stalls it until then)"""
    cell_timeout: int | None = None
    """nbgrader's per-cell timeout for this lab (default: Execute.timeout of nbgrader_config.py)"""
    ci_autograde: bool = False
    """grade this lab under nbgrader's autograde in the default test tier too (the slow tier always does); leave
    False for a lab whose notebook takes minutes: the default tier then re-checks it without nbgrader"""
    ci_recheck: bool = True
    """grade this lab (solution, release, partial) in the default test tier at all; False for a lab whose live runs
    take minutes even without nbgrader: it is then graded in the slow tier only (its structure, sync, leaks and
    hidden tests are still checked in the default tier)"""

    @classmethod
    def from_metadata(cls, meta: dict) -> "LabSettings":
        known = {f.name for f in fields(cls)}
        unknown = set(meta) - known
        if unknown:
            raise ValueError(f"unknown coursekit lab settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**meta)


def find_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: the working directory) holding nbgrader_config.py."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / CONFIG_FILE).is_file():
            return d
    raise FileNotFoundError(f"no {CONFIG_FILE} at or above {here}; run from the course repository or pass --root")


def ensure_tools_on_path() -> None:
    """nbgrader runs ``alembic`` from PATH when it creates a gradebook; kernels need the venv's tools too."""
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


class Course:
    """A course folder: ``nbgrader_config.py``, lab sources in ``solutions/``, generated labs in ``labs/``.

    ``overrides`` (``{"Execute": {"timeout": 10}}``) are applied on top of nbgrader_config.py (tests use them).
    """

    def __init__(self, root: str | os.PathLike | None = None, *, overrides: dict | None = None):
        self.root = Path(root).resolve() if root is not None else find_root()
        self.overrides = overrides or {}
        cfg = self._file_config()
        cd = cfg.get("CourseDirectory", {})
        self.solutions = self.root / cd.get("source_directory", "solutions")
        self.labs = self.root / cd.get("release_directory", "labs")

    def _file_config(self):
        from traitlets.config import Config
        from traitlets.config.loader import PyFileConfigLoader

        path = self.root / CONFIG_FILE
        cfg = PyFileConfigLoader(CONFIG_FILE, path=str(self.root)).load_config() if path.is_file() else Config()
        for section, values in self.overrides.items():
            for k, v in values.items():
                cfg[section][k] = v
        return cfg

    def nbgrader_config(self, course_root: str | os.PathLike, **sections):
        """nbgrader's config for a private course folder ``course_root`` (own gradebook, nbgrader's default
        sub-folder names), plus ``sections`` such as ``Execute={"timeout": 30}``."""
        cfg = self._file_config()
        course_root = Path(course_root).resolve()
        cd = cfg.CourseDirectory
        cd.root = str(course_root)
        cd.db_url = "sqlite:///" + str(course_root / "gradebook.db")
        for name in ("source", "release", "submitted", "autograded", "feedback", "solution"):
            cd[f"{name}_directory"] = name
        for section, values in sections.items():
            for k, v in values.items():
                cfg[section][k] = v
        ensure_tools_on_path()
        return cfg

    def cell_timeout(self) -> int:
        return int(self._file_config().get("Execute", {}).get("timeout", 30))

    def lab_names(self) -> list[str]:
        """Every ``solutions/<lab>/<lab>.py``, sorted."""
        if not self.solutions.is_dir():
            return []
        return sorted(d.name for d in self.solutions.iterdir() if (d / f"{d.name}.py").is_file())

    def source_path(self, lab: str) -> Path:
        path = self.solutions / lab / f"{lab}.py"
        if not path.is_file():
            known = ", ".join(self.lab_names()) or "none"
            raise FileNotFoundError(f"no lab source {path} (labs: {known})")
        return path

    def release_path(self, lab: str) -> Path:
        return self.labs / lab / f"{lab}.ipynb"
