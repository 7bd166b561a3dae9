"""A checkpoint's own integrity: the size and SHA-256 of every file it holds, written inside the atomic commit and
checked before anything is loaded. Pure Python (hashlib): the CLI checks a folder before it launches.

    write(folder, world_size=2)     # rank 0, after every rank's shards are written and before the marker moves
    problem(folder)                 # None, or one line naming the damaged file and what is wrong with it
    choose(ckpt_dir)                # (step to resume from or None, notes saying what was refused and why)

The order of a save (``coursekit.train.checkpoint``): every rank writes its shards and its RNG file into
``step-N/``; all ranks meet; rank 0 writes ``checksums.json`` here (write-then-rename), then the marker ``latest``.
So a marker only ever names a folder whose checksums were written after all of its files were complete. On resume
the folder the marker names is verified; when it is damaged (a flipped byte, a truncated shard, a missing
``.metadata``) or the marker itself is (not a step number), the newest *intact* older folder is used, and the notes
say so. A folder without ``checksums.json`` is one whose save never finished (killed mid-save) — or a checkpoint of
an older coursekit, which the marker may still name: loaded unverified, with a note.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

class CheckpointError(ValueError):
    """A checkpoint folder that holds checkpoints, none of them intact (the CLI prints it as one line)."""


MANIFEST = "checksums.json"
MARKER = "latest"
_STEP = re.compile(r"^step-(\d+)$")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp"))


def write(folder: str | os.PathLike, *, world_size: int) -> None:
    """Record every file of a complete checkpoint folder (call once, on one rank, after all ranks wrote)."""
    folder = Path(folder)
    files = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in _files(folder)}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"world_size": world_size, "files": files}, indent=1))
    os.replace(tmp, folder / MANIFEST)


def manifest(folder: str | os.PathLike) -> dict | None:
    """The folder's checksums, or None when it has none (or they cannot be read)."""
    try:
        m = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("files"), dict) else None


def problem(folder: str | os.PathLike, *, full: bool = True) -> str | None:
    """None when every recorded file is there with its size and SHA-256; else one line naming the first that is not.
    ``full=False`` checks presence and sizes only (what the CLI checks before it launches: no file is read)."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder.name}: the folder is missing"
    m = manifest(folder)
    if m is None:
        return f"{folder.name}/{MANIFEST}: missing or unreadable (a save that did not finish)"
    if ".metadata" not in m["files"]:
        return f"{folder.name}/{MANIFEST}: lists no .metadata (not a DCP checkpoint)"
    for name, want in m["files"].items():
        p = folder / name
        if not p.is_file():
            return f"{folder.name}/{name}: missing"
        size = p.stat().st_size
        if size != want.get("bytes"):
            return f"{folder.name}/{name}: {size} bytes, {want.get('bytes')} when saved (truncated or rewritten)"
        if full and _sha256(p) != want.get("sha256"):
            return f"{folder.name}/{name}: its SHA-256 differs from the one saved (damaged bytes)"
    return None


def steps(ckpt_dir: str | os.PathLike) -> list[int]:
    """The step folders present, newest first."""
    d = Path(ckpt_dir)
    found = [int(m.group(1)) for p in d.iterdir() if p.is_dir() and (m := _STEP.match(p.name))] if d.is_dir() else []
    return sorted(found, reverse=True)


def marker(ckpt_dir: str | os.PathLike) -> tuple[int | None, str | None]:
    """(the step the marker names, or None; a note when the marker exists but names no step)."""
    f = Path(ckpt_dir) / MARKER
    if not f.exists():
        return None, None
    text = f.read_text(errors="replace").strip()
    if not text.isdigit():
        return None, f"{MARKER}: holds {text[:40]!r}, not a step number"
    return int(text), None


def choose(ckpt_dir: str | os.PathLike, *, full: bool = True) -> tuple[int | None, list[str]]:
    """The step to resume from and the notes to print: the marker's step when intact (or written before
    checksums existed), else the newest older folder that is intact. (None, notes) when none is; (None, []) for a
    folder holding no checkpoint at all."""
    d = Path(ckpt_dir)
    last, note = marker(d)
    notes = [note] if note else []
    if last is not None:
        bad = problem(d / f"step-{last}", full=full)
        if bad is None:
            return last, notes
        legacy = not (d / f"step-{last}" / MANIFEST).exists() and (d / f"step-{last}" / ".metadata").is_file()
        if legacy:
            return last, [f"step-{last} has no {MANIFEST} (saved by an older coursekit): loaded unverified"]
        notes.append(bad)
    older = [s for s in steps(d) if last is None or s < last]
    for s in older:
        bad = problem(d / f"step-{s}", full=full)
        if bad is None:
            if notes:
                notes.append(f"resuming from step-{s}, the newest intact checkpoint")
            return s, notes
        if (d / f"step-{s}" / MANIFEST).exists():  # a folder without checksums never finished: not worth a line
            notes.append(bad)
    if notes:
        notes.append("no intact checkpoint is left")
    return None, notes


def set_aside(ckpt_dir: str | os.PathLike, chosen: int | None) -> list[str]:
    """Rename the checkpoints ``choose`` refused (checksummed, newer than ``chosen``, not newer than the marker) to
    ``step-N.damaged``: kept for a look, out of every later choice and of ``prune``. The notes to print."""
    d = Path(ckpt_dir)
    last, _ = marker(d)
    notes = []
    for s in steps(d):
        if (chosen is None or s > chosen) and (last is None or s <= last) and (d / f"step-{s}" / MANIFEST).exists():
            dest = d / f"step-{s}.damaged"
            n = 1
            while dest.exists():
                n += 1
                dest = d / f"step-{s}.damaged{n}"
            os.replace(d / f"step-{s}", dest)
            notes.append(f"step-{s} set aside as {dest.name}")
    return notes


def prune(ckpt_dir: str | os.PathLike, keep: int, latest: int) -> list[int]:
    """Delete checkpoints older than the ``keep`` newest (the marker's ``latest`` always stays; an older
    coursekit's, without checksums, count as checkpoints) and folders of unfinished saves older than it; the steps
    removed. Rank 0 only, right after the marker moved."""
    d = Path(ckpt_dir)
    complete = [s for s in steps(d) if s <= latest and (manifest(d / f"step-{s}") is not None
                                                        or (d / f"step-{s}" / ".metadata").is_file())]
    kept = set(complete[:keep]) | {latest}
    gone = [s for s in steps(d) if s < latest and s not in kept]
    for s in gone:
        shutil.rmtree(d / f"step-{s}", ignore_errors=True)
    return gone
