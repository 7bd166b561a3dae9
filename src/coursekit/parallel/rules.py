"""What a strategy refuses before any process group exists, without torch: the CLI checks a run here before it
launches (``coursekit.parallel.validate``), each worker again on start.

A strategy's rules class (``Entry.rules`` in ``coursekit.spec.registry``) holds ``supports``, ``why_not`` and
``check``; the strategy itself (``coursekit.parallel.api.Strategy``, which imports torch) inherits them, so the
checks are written once.
"""
from __future__ import annotations

from coursekit.spec import registry


class Rules:
    """The checks every strategy runs: what it supports (checkpoints, compile, each parallelism) and why not."""

    name = "base"
    supports = {"checkpoint": True, "compile": True, "tp": True, "pp": True, "cp": True}
    why_not: dict = {}

    @classmethod
    def check(cls, opts, dims) -> None:
        """Checks that need no process group (run by the CLI before launching): refuse what this strategy
        cannot do, with one clear message."""
        run = f"--strategy {opts.parallel.strategy}"
        asks = {"checkpoint": bool(opts.ckpt.ckpt_dir), "compile": opts.train.compile}
        for what, wanted in asks.items():
            if wanted and not cls.supports.get(what, False):
                raise ValueError(f"{run} does not support {what} ({cls.why_not.get(what, 'not implemented')})")
        for name in dims.enabled:  # the parallelisms this run switches on: the registry says what composes
            if name in registry.PARALLELISMS and not registry.composes(cls, opts.parallel.strategy, name):
                raise ValueError(f"{run} does not support {name} ({cls.why_not.get(name, 'not implemented')})")
