"""Fault injection for the course's recovery exercises (Module 5): fail on purpose at a chosen step."""
from __future__ import annotations


def maybe_crash(step: int, crash_at_step: int | None, resumed: bool) -> None:
    """Raise at ``crash_at_step`` in a run that did not resume from a checkpoint (so the resumed run finishes)."""
    if crash_at_step is not None and step == crash_at_step and not resumed:
        raise RuntimeError(f"injected failure at step {step} (--crash-at-step)")
