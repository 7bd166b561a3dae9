"""Lab sources (jupytext percent files with nbgrader metadata) → instructor notebooks → student labs.

One source of truth per lab, ``solutions/<lab>/<lab>.py``. From it:

- ``read_lab`` parses it into a ``Lab``: every code cell classified (solution, test, read-only) and every test cell
  attached to the exercise (the nearest solution cell above it);
- ``build`` writes ``solutions/<lab>/<lab>.ipynb`` (for nbgrader and formgrader; not committed) and generates the
  student version with nbgrader into ``labs/<lab>/`` (committed), both in a canonical form (fixed cell ids,
  sorted keys) so that a rebuild of an unchanged source is byte-identical;
- ``drift`` rebuilds into a temporary folder and lists every difference with ``labs/`` (a test fails on any).

The notebooks carry the kernelspec and ``language_info`` exactly as JupyterLab's Python kernel (ipykernel) writes
them, so opening and saving a lab in JupyterLab leaves the committed file as it is. Only ``language_info.version``
(the Python that built it) may differ between machines: comparisons ignore it, and a build keeps the committed file
when nothing else changed. ``build`` also rewrites the README's list of labs from the labs' manifests
(``manifest``).
"""
from __future__ import annotations

import json
import platform
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from coursekit.course.config import Course, LabSettings

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
_ID_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JUPYTEXT_CELL_KEYS = ("lines_to_next_cell", "cell_marker", "region_name", "title")
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def language_info() -> dict:
    """What ipykernel reports (and JupyterLab saves into the notebook) for this Python."""
    return {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
            "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python", "pygments_lexer": "ipython3",
            "version": platform.python_version()}


@dataclass
class Cell:
    index: int
    kind: str  # "solution" | "test" | "readonly" | "markdown"
    grade_id: str | None
    source: str
    points: float = 0.0


@dataclass
class Exercise:
    name: str  # grade_id of its (first) solution cell
    solution_ids: list[str] = field(default_factory=list)
    tests: list[Cell] = field(default_factory=list)

    @property
    def points(self) -> float:
        return sum(t.points for t in self.tests)


@dataclass
class Lab:
    name: str
    notebook: nbformat.NotebookNode  # canonical instructor notebook (solutions and hidden tests included)
    cells: list[Cell]
    exercises: list[Exercise]
    settings: LabSettings
    problems: list[str]  # authoring mistakes found while parsing (``validate`` reports them)

    @property
    def max_points(self) -> float:
        return sum(e.points for e in self.exercises)

    def cell(self, grade_id: str) -> Cell:
        return next(c for c in self.cells if c.grade_id == grade_id)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def classify(cell) -> str:
    """``solution`` (students write it), ``test`` (graded, points), ``readonly`` (instructor code) or ``markdown``."""
    if cell.cell_type != "code":
        return "markdown"
    m = _meta(cell)
    if m.get("grade") and not m.get("solution"):
        return "test"
    if m.get("solution"):
        return "solution"
    return "readonly"


def normalise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Canonical form: no jupytext bookkeeping, no outputs, cell ids from grade ids (else the cell's position)."""
    nb = nbformat.from_dict(nb)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = language_info()
    nb.nbformat, nb.nbformat_minor = 4, 5
    for i, cell in enumerate(nb.cells):
        for k in _JUPYTEXT_CELL_KEYS:
            cell.metadata.pop(k, None)
        gid = _meta(cell).get("grade_id")
        cell["id"] = gid if gid and _ID_OK.match(gid) else f"cell-{i}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def write_notebook(nb: nbformat.NotebookNode, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(canonical_json(nb))


def canonical_json(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb, version=4).rstrip("\n") + "\n"


def same_file(a: Path, b: Path) -> bool:
    """Equal bytes, or two notebooks that differ only in the Python version that wrote ``language_info``."""
    da, db = a.read_bytes(), b.read_bytes()
    if da == db:
        return True
    if a.suffix != ".ipynb":
        return False
    try:
        ja, jb = json.loads(da), json.loads(db)
    except ValueError:
        return False
    for j in (ja, jb):
        j.get("metadata", {}).get("language_info", {}).pop("version", None)
    return ja == jb


def _same_tree(a: Path, b: Path) -> bool:
    files = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    if not b.is_dir() or files != {p.relative_to(b) for p in b.rglob("*") if p.is_file()}:
        return False
    return all(same_file(a / p, b / p) for p in files)


def parse_notebook(nb: nbformat.NotebookNode, name: str) -> Lab:
    """Classify cells, attach tests to exercises, and list authoring problems (without raising)."""
    nb = normalise(nb)
    problems: list[str] = []
    cells, exercises, seen = [], [], set()
    for i, c in enumerate(nb.cells):
        kind = classify(c)
        gid = _meta(c).get("grade_id")
        cell = Cell(i, kind, gid, c.source, float(_meta(c).get("points", 0) or 0))
        cells.append(cell)
        if kind == "markdown":
            continue
        where = f"{name}: code cell {i} ({c.source.strip().splitlines()[0][:40] if c.source.strip() else 'empty'})"
        if not gid:
            problems.append(f"{where} has no nbgrader grade_id: mark it read-only, solution or test")
            continue
        if gid in seen:
            problems.append(f"{where}: duplicate grade_id {gid!r}")
        seen.add(gid)
        if not _ID_OK.match(gid):
            problems.append(f"{where}: grade_id {gid!r} must match {_ID_OK.pattern}")
        if HIDDEN_BEGIN in c.source and kind != "test":
            problems.append(f"{where}: hidden tests outside a test cell")
        if kind == "solution":
            if SOLUTION_BEGIN not in c.source:
                problems.append(f"{where}: solution cell without {SOLUTION_BEGIN} / {SOLUTION_END}")
            if exercises and not exercises[-1].tests:  # consecutive solution cells form one exercise
                exercises[-1].solution_ids.append(gid)
            else:
                exercises.append(Exercise(gid, [gid]))
        elif kind == "test":
            if not exercises:
                problems.append(f"{where}: test cell before any solution cell")
                continue
            if cell.points <= 0:
                problems.append(f"{where}: test cell without points")
            exercises[-1].tests.append(cell)
    for e in exercises:
        if not e.tests:
            problems.append(f"{name}: exercise {e.name!r} has no test cell")
        elif not any(HIDDEN_BEGIN in t.source for t in e.tests):
            problems.append(f"{name}: exercise {e.name!r} has no hidden tests ({HIDDEN_BEGIN} in a test cell)")
    try:
        settings = LabSettings.from_metadata(nb.metadata.get("coursekit", {}) or {})
    except (TypeError, ValueError) as e:
        problems.append(f"{name}: {e}")
        settings = LabSettings()
    return Lab(name, nb, cells, exercises, settings, problems)


def read_lab(course: Course, lab: str) -> Lab:
    import jupytext

    return parse_notebook(jupytext.read(course.source_path(lab)), lab)


def _cache_alembic_version() -> None:
    """nbgrader asks ``alembic heads`` (a 2 s subprocess) for every new gradebook; the answer never changes."""
    import functools

    import nbgrader.api as nbapi

    if hasattr(nbapi, "get_alembic_version") and not hasattr(nbapi.get_alembic_version, "cache_info"):
        nbapi.get_alembic_version = functools.lru_cache(maxsize=1)(nbapi.get_alembic_version)


def nbgrader_api(course: Course, course_root: Path, **sections):
    from nbgrader.apps import NbGraderAPI

    _cache_alembic_version()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return NbGraderAPI(config=course.nbgrader_config(course_root, **sections))


def generate(course: Course, lab: Lab, course_root: Path) -> Path:
    """Run nbgrader's generate_assignment for ``lab`` in a private course folder ``course_root`` (which then also
    holds the gradebook a grader needs); returns the release folder of the lab."""
    write_notebook(lab.notebook, course_root / "source" / lab.name / f"{lab.name}.ipynb")
    extra = course.solutions / lab.name
    for f in extra.iterdir():  # data files a lab ships (never its source: that holds solutions and hidden tests)
        if f.is_file() and f.suffix not in (".ipynb", ".py") and f.name != ".gitignore":
            shutil.copy2(f, course_root / "source" / lab.name / f.name)
    api = nbgrader_api(course, course_root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = api.generate_assignment(lab.name, force=True, create=True)
    if not res["success"]:
        raise RuntimeError(f"nbgrader generate_assignment failed for {lab.name}:\n{res.get('error') or res['log']}")
    out = course_root / "release" / lab.name
    for nbfile in out.glob("*.ipynb"):  # canonical form: fixed ids, sorted keys, no jupytext bookkeeping
        write_notebook(normalise(nbformat.read(nbfile, as_version=4)), nbfile)
    return out


def _release_into(course: Course, lab: Lab, dest: Path) -> bool:
    """Generate ``lab``'s release into ``dest``; False (and ``dest`` untouched) when it is the same already."""
    with tempfile.TemporaryDirectory(prefix="coursekit-build-") as tmp:
        out = generate(course, lab, Path(tmp))
        if _same_tree(out, dest):
            return False
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(out, dest)
        return True


def readme_text(course: Course) -> str | None:
    """The course README with its list of labs made from the manifests in ``labs/`` (None: no README, or no
    list in it)."""
    from coursekit.course import manifest

    readme = course.root / "README.md"
    if not readme.is_file():
        return None
    return manifest.update_readme(readme.read_text(), manifest.load(course.labs), course.labs.name)


def build(course: Course, labs: list[str] | None = None, *, strict: bool = True) -> list[tuple[Path, bool]]:
    """Write each lab's instructor notebook and its student version into ``labs/``, then the README's list of
    labs; returns ``(path, changed)`` for each lab folder (and the README when it has a list of labs).

    With ``strict`` an authoring problem (a test cell without points, an exercise without hidden tests …) stops the
    build before anything is written."""
    from coursekit.course import manifest

    written = []
    for name in labs or course.lab_names():
        lab = read_lab(course, name)
        if strict and lab.problems:
            raise ValueError(f"lab {name} has authoring problems:\n  " + "\n  ".join(lab.problems))
        if (course.solutions / name / manifest.MANIFEST).is_file():
            manifest.read(course.solutions / name / manifest.MANIFEST)  # a broken manifest stops the build
        instructor = course.solutions / name / f"{name}.ipynb"
        if not (instructor.is_file() and instructor.read_text() == canonical_json(lab.notebook)):
            write_notebook(lab.notebook, instructor)
        written.append((course.labs / name, _release_into(course, lab, course.labs / name)))
    text = readme_text(course)
    if text is not None:
        readme = course.root / "README.md"
        changed = text != readme.read_text()
        if changed:
            readme.write_text(text)
        written.append((readme, changed))
    return written


def drift(course: Course, labs: list[str] | None = None) -> list[str]:
    """Differences between ``labs/`` and a fresh build of ``solutions/`` (empty when in sync)."""
    problems = []
    names = labs or course.lab_names()
    if labs is None and course.labs.is_dir():
        extra = sorted(d.name for d in course.labs.iterdir() if d.is_dir() and d.name not in names)
        problems += [f"labs/{n} has no source solutions/{n}/{n}.py" for n in extra]
    with tempfile.TemporaryDirectory(prefix="coursekit-drift-") as tmp:
        for name in names:
            fresh = Path(tmp) / name
            _release_into(course, read_lab(course, name), fresh)
            have = course.labs / name
            if not have.is_dir():
                problems.append(f"labs/{name} is missing: run `coursekit course build`")
                continue
            want_files = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
            have_files = {p.relative_to(have) for p in have.rglob("*") if p.is_file()}
            for p in sorted(want_files - have_files):
                problems.append(f"labs/{name}/{p} is missing")
            for p in sorted(have_files - want_files):
                problems.append(f"labs/{name}/{p} is not generated from solutions/ (stale or hand-added)")
            for p in sorted(want_files & have_files):
                if not same_file(fresh / p, have / p):
                    problems.append(f"labs/{name}/{p} differs from a fresh build of solutions/{name}/{name}.py")
    text = readme_text(course) if labs is None else None
    if text is not None and text != (course.root / "README.md").read_text():
        problems.append("README.md's list of labs differs from labs/<lab>/lab.json: run `coursekit course build`")
    return problems
