"""A pool cell's output and errors: each rank's lines labelled as they arrive, an engine's error as its traceback."""
from __future__ import annotations

import re
import time


class Echo:
    """Each rank's new output since the last flush, printed line by line with its rank."""

    def __init__(self, pending: dict, quiet: bool):
        self.pending, self.quiet, self.shown = pending, quiet, {r: 0 for r in pending}
        self.partial = {r: "" for r in pending}

    def flush(self) -> None:
        if self.quiet:
            return
        for r, ar in self.pending.items():
            text = _text(ar.stdout) + _text(ar.stderr) if ar.ready() else _text(ar.stdout)
            new, self.shown[r] = text[self.shown[r]:], len(text)
            lines = (self.partial[r] + new).split("\n")
            self.partial[r] = lines.pop()  # a line still being written waits for its end
            for line in lines:
                print(f"[rank {r}] {line}", flush=True)
            if ar.ready() and self.partial[r]:
                print(f"[rank {r}] {self.partial[r]}", flush=True)
                self.partial[r] = ""


def until_done(pending: dict, timeout: float, tick=lambda: None) -> None:
    end = time.monotonic() + timeout
    while not all(ar.ready() for ar in pending.values()) and time.monotonic() < end:
        tick()
        time.sleep(0.05)


def _text(x) -> str:
    return x if isinstance(x, str) else "".join(x or [])


def traceback_of(e: BaseException) -> str:
    """One engine's error as text: ipyparallel's RemoteError carries the remote traceback."""
    if getattr(e, "elist", None):  # a CompositeError of one engine: its first (only) error
        e = e.elist[0]
        return _strip_ansi(e[2] if len(e) > 2 and e[2] else f"{e[0]}: {e[1]}")
    tb = getattr(e, "traceback", None)
    if isinstance(tb, list):
        tb = "\n".join(tb)
    return _strip_ansi(tb or f"{type(e).__name__}: {e}")


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
