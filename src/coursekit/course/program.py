"""What of a notebook's code the re-check runs: the definitions, never the exploration.

The re-check does not replay a student's notebook. From each code cell it keeps only the top-level statements that
*define* something — imports, functions, classes, and assignments that call nothing (or that assign an UPPER_CASE
constant) — and drops the rest: exploration, prints, demo runs, and whatever a cell does to its own kernel
(``get_ipython().input_transformers_cleanup.append(...)``, patching ``assert`` helpers …). Dropped lines become
blank lines, so a traceback's line numbers still match the cell.

``student_program`` assembles what the student's process runs for one submission: the lab's read-only setup cells
(the instructor's version, whatever the submission did to them), then the student's solution cells (matched by
nbgrader grade id) and any cells the student added, in notebook order. Test cells never run there.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_EFFECTS = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)


@dataclass
class Chunk:
    label: str  # shown as the file name in tracebacks, e.g. "<cell ex1_count_params>"
    source: str  # the kept statements, at their original line numbers
    dropped: int = 0  # top-level statements left out
    error: str | None = None  # the cell did not parse


def strip_magics(src: str) -> str:
    """IPython-only lines (``%magic``, ``!shell``) become blank; a ``%%cell magic`` cell becomes empty."""
    if src.lstrip().startswith("%%"):
        return ""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.split("\n"))


def _has_effect(node: ast.AST) -> bool:
    """Whether evaluating ``node`` may run code (a call …); lambda bodies do not run when assigned."""
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, _EFFECTS):
            return True
        if isinstance(n, ast.Lambda):  # only the defaults are evaluated when a lambda is created
            todo.extend(d for d in (*n.args.defaults, *n.args.kw_defaults) if d is not None)
        else:
            todo.extend(ast.iter_child_nodes(n))
    return False


def _names(target: ast.AST) -> list[str] | None:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        out = []
        for t in target.elts:
            sub = _names(t)
            if sub is None:
                return None
            out += sub
        return out
    return None  # attribute or subscript targets change other objects: never kept


def _is_constant_name(name: str) -> bool:
    return name.upper() == name and any(ch.isalpha() for ch in name)


def keeps(stmt: ast.stmt) -> bool:
    """Whether a top-level statement is a definition the re-check runs."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, *_DEFS)):
        return True
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [n for t in targets for n in (_names(t) or [None])]
        if not names or None in names:
            return False
        if stmt.value is None:
            return True
        return all(_is_constant_name(n) for n in names) or not _has_effect(stmt.value)
    return False


def definitions(source: str, label: str) -> Chunk:
    """The definitions of one cell (see the module docstring), at their original line numbers."""
    src = strip_magics(source)
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        return Chunk(label, "", 0, f"SyntaxError: {e.msg} (line {e.lineno})")
    src_lines = src.split("\n")
    out = [""] * len(src_lines)
    dropped = 0
    for stmt in tree.body:
        if not keeps(stmt):
            dropped += 1
            continue
        if isinstance(stmt, _DEFS):  # compound statements own whole lines, decorators included
            start = min([stmt.lineno] + [d.lineno for d in stmt.decorator_list])
            out[start - 1:stmt.end_lineno] = src_lines[start - 1:stmt.end_lineno]
            continue
        # simple statements may share a line with dropped ones (``import os; os._exit(0)``): take the exact segment
        for j, part in enumerate(ast.get_source_segment(src, stmt).split("\n")):
            i = stmt.lineno - 1 + j
            out[i] = f"{out[i]}; {part}" if j == 0 and out[i] else part
    return Chunk(label, "\n".join(out).rstrip() + "\n", dropped)


def defined_names(source: str) -> list[str]:
    """Top-level names a cell defines (functions, classes, assigned names), in order, without duplicates."""
    try:
        tree = ast.parse(strip_magics(source))
    except SyntaxError:
        return []
    out: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, _DEFS):
            found = [stmt.name]
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            found = [n for t in targets for n in (_names(t) or [])]
        else:
            found = []
        out += [n for n in found if n not in out]
    return out


def lab_prelude(lab) -> list[Chunk]:
    """The lab's read-only code cells (instructor's version), as definitions."""
    return [definitions(c.source, f"<setup cell {c.grade_id}>") for c in lab.cells if c.kind == "readonly"]


def interface(lab) -> list[str]:
    """Names the student's solution cells must define (from the instructor's solution cells)."""
    names: list[str] = []
    for c in lab.cells:
        if c.kind == "solution":
            names += [n for n in defined_names(c.source) if n not in names]
    return names


def student_program(lab, submission) -> tuple[list[Chunk], list[str]]:
    """(chunks the student's process runs, notes for the feedback) for a submitted notebook."""
    solution_ids = {c.grade_id for c in lab.cells if c.kind == "solution"}
    instructor_ids = {c.grade_id for c in lab.cells if c.grade_id}
    chunks, notes, used = lab_prelude(lab), [], set()
    for j, cell in enumerate(submission.cells):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        gid = meta.get("grade_id")
        if gid in solution_ids and gid not in used:
            used.add(gid)
            chunk = definitions(cell.get("source", ""), f"<cell {gid}>")
        elif gid in instructor_ids:
            continue  # a read-only or test cell: the instructor's version counts (or none, for tests)
        else:
            chunk = definitions(cell.get("source", ""), f"<your added cell {j}>")
        if chunk.error:
            notes.append(f"{chunk.label.strip('<>')}: {chunk.error}; nothing in this cell was graded")
        chunks.append(chunk)
    for gid in sorted(solution_ids - used):
        notes.append(f"solution cell {gid} is missing from the submission")
    return chunks, notes


def undefined_because(chunks: list[Chunk], load_errors: list[str]) -> dict[str, str]:
    """``{name: why}`` for names a student's cell would define but whose defining statement raised while loading
    (``ONE_NODE = training_plan(...)`` while ``training_plan`` still raises NotImplementedError), from the
    student's process's load errors (``"<label without brackets>, line N: Error: message"``)."""
    failed = {}
    for err in load_errors:
        head, sep, what = err.partition(": ")
        label, _, line = head.rpartition(", line ")
        if sep and line.isdigit():
            failed[(label, int(line))] = what
    out: dict[str, str] = {}
    for chunk in chunks:
        try:
            tree = ast.parse(chunk.source)
        except SyntaxError:
            continue
        for stmt in tree.body:
            what = failed.get((chunk.label.strip("<>"), stmt.lineno))
            if what is None:
                continue
            segment = ast.get_source_segment(chunk.source, stmt) or ""
            where = f"{chunk.label.strip('<>')}, line {stmt.lineno}"
            for name in defined_names(segment):
                out.setdefault(name, f"not implemented yet: computing {name} ({where}) raised {what}"
                               if what.startswith("NotImplementedError")
                               else f"{name} is not defined: computing it ({where}) raised {what}")
    return out
