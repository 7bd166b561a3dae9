"""Progress of a running trainer, drawn by the launcher from rank 0's ``step {json}`` lines.

A terminal gets a bar that redraws in place; a notebook gets tqdm's widget; a log (CI, a file, a pipe) gets one plain
line per step. Each shows the step, the loss, tokens/s and the time left (from the mean step time so far).
"""
from __future__ import annotations

import json
import re
import sys

_STEP = re.compile(r"^\[rank 0\] step (\{.*\})$")


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


class Progress:
    def __init__(self, stream=None, mode: str | None = None):
        self.out = stream or sys.stdout
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        self.mode = mode or ("notebook" if _in_notebook() else "bar" if tty else "lines")
        self.bar, self.last, self.times = None, None, []

    def feed(self, line: str) -> bool:
        """Handle one launcher line; True when it was a step line (shown here, not echoed)."""
        m = _STEP.match(line)
        if not m:
            return False
        rec = json.loads(m.group(1))
        self.last = rec
        done, total = rec["step"] + 1, rec.get("steps") or rec["step"] + 1
        self.times.append(rec["step_time_s"])
        timed = self.times[1:] or self.times  # the first step pays the warm-up
        eta = sum(timed) / len(timed) * max(total - done, 0)
        text = f"loss {rec['loss']:.4f}  {rec['tokens_per_s']:,.0f} tokens/s  ETA {eta:.0f}s"
        if self.mode == "notebook":
            if self.bar is None:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc="train", initial=rec["step"])
            self.bar.update(1)
            self.bar.set_postfix_str(text)
        elif self.mode == "bar":
            width = 24
            fill = int(width * done / total)
            self.out.write(f"\rstep {done:>{len(str(total))}}/{total} [{'#' * fill}{'.' * (width - fill)}] {text}")
            if done == total:
                self.out.write("\n")
            self.out.flush()
        else:
            print(f"step {done}/{total}  {text}", file=self.out, flush=True)
        return True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "bar" and self.last and self.last["step"] + 1 != self.last.get("steps"):
            self.out.write("\n")
