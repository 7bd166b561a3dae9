"""The tour behind ``coursekit demo``: per course module, real runs on 2–4 processes and one row per check — what the
course predicts, what was measured, whether they agree.

Each course module contributes a ``tour.py`` in its own folder (``coursekit/<folder>/tour.py``) that declares
``MODULE`` (its number in the course), ``TITLE`` and a function ``checks(tour) -> list[Check]``; ``TOURS`` is found
from those files, so the tour grows as modules land and neither this file nor ``coursekit demo`` changes. ``Tour`` gives them a shared, cached way to run the trainer, so a
single-process baseline is trained once for every module that compares with it.
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import time
from dataclasses import asdict, dataclass, field


def discover() -> dict[int, tuple[str, str]]:
    """Course module -> (title, "package.tour:checks"), from every ``coursekit/<folder>/tour.py``."""
    import coursekit

    found: dict[int, tuple[str, str]] = {}
    for info in pkgutil.iter_modules(coursekit.__path__):
        name = f"coursekit.{info.name}.tour"
        if not info.ispkg or importlib.util.find_spec(name) is None:
            continue
        mod = importlib.import_module(name)  # light: a tour imports its heavy parts inside checks()
        if mod.MODULE in found:
            raise RuntimeError(f"two tours claim module {mod.MODULE}: {found[mod.MODULE][1]} and {name}")
        found[mod.MODULE] = (mod.TITLE, f"{name}:checks")
    return dict(sorted(found.items()))


@dataclass
class Check:
    module: int
    what: str
    predicted: str
    measured: str
    agree: bool
    note: str = ""


@dataclass
class Tour:
    nproc: int = 2
    quick: bool = False
    timeout: float = 300
    seq: int = 32
    steps: int = 4
    log: list = field(default_factory=list)
    _cache: dict = field(default_factory=dict)

    def common(self) -> list[str]:
        return ["--model", "tiny-llama", "--steps", str(self.steps), "--seq", str(self.seq), "--global-batch", "8",
                "--seed", "0", "--quiet"]

    def train(self, strategy: str, nproc: int, *extra) -> list[dict]:
        """Every rank's record of a trainer run (cached by its arguments)."""
        from coursekit.launch import launch

        key = (strategy, nproc, *map(str, extra))
        if key not in self._cache:
            self.say(f"  running {strategy} on {nproc} process(es) {' '.join(map(str, extra))}".rstrip())
            args = ["--strategy", strategy, *self.common(), *map(str, extra)]
            self._cache[key] = launch("coursekit.train", args, nproc=nproc, timeout=self.timeout,
                                      stream=False).results
        return self._cache[key]

    def single(self) -> dict:
        return self.train("single", 1)[0]

    def ddp(self) -> list[dict]:
        """DDP on 2 processes with its last step counted (collectives, saved activations): shared by the modules
        that compare with DDP."""
        return self.train("ddp", 2, "--count-step")

    def say(self, text: str) -> None:
        self.log.append(text)
        print(text, flush=True)

    @staticmethod
    def losses(rec) -> list[float]:
        return [s["loss"] for s in rec["steps"]]

    def equal_losses(self, module: int, what: str, recs: list[dict], atol: float = 1e-5) -> Check:
        """Every rank's losses vs the single-process run's (fp32: float rounding only, see tests/parity.py)."""
        base = self.losses(self.single())
        worst = max(abs(a - b) for r in recs for a, b in zip(self.losses(r), base))
        return Check(module, what, f"= single ({base[-1]:.5f} at the last step)",
                     f"max |Δloss| {worst:.1e} on {len(recs)} ranks", worst <= atol)


def modules(only: int | None = None) -> list[int]:
    return [m for m in sorted(TOURS) if only is None or m == only]


def run(tour: Tour, only: int | None = None) -> list[Check]:
    out = []
    for m in modules(only):
        title, target = TOURS[m]
        t0 = time.monotonic()
        tour.say(f"module {m}: {title}")
        mod, fn = target.split(":")
        try:
            checks = getattr(importlib.import_module(mod), fn)(tour)
        except Exception as e:  # a module whose runs fail is a disagreement, shown with its reason
            checks = [Check(m, "its runs", "run", f"failed: {str(e).splitlines()[0][:120]}", False)]
        out += checks
        tour.say(f"  {sum(c.agree for c in checks)}/{len(checks)} agree ({time.monotonic() - t0:.0f} s)")
    return out


def table(checks: list[Check]) -> str:
    w = max([len(c.what) for c in checks] + [5])
    p = max([len(c.predicted) for c in checks] + [9])
    head = f"{'module':>6}  {'check':<{w}}  {'predicted':<{p}}  {'measured':<40} agree"
    rows = [head, "-" * len(head)]
    for c in checks:
        rows.append(f"{c.module:>6}  {c.what:<{w}}  {c.predicted:<{p}}  {c.measured:<40} "
                    f"{'yes' if c.agree else 'NO'}")
    return "\n".join(rows)


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]


TOURS = discover()  # module -> (title, "module:function"); last, as each tour imports Check from here
