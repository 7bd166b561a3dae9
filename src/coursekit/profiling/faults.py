"""Fault injection for the course's recovery exercises (Module 5): fail, die or lag on purpose.

- ``--crash-at-step N``: a Python exception at step N (the run fails; a rerun resumes from the checkpoint).
- ``--kill-at-step N --kill-rank R``: rank R SIGKILLs itself at step N in the first attempt only — no exception,
  no clean-up, as when a node dies; torchrun (``--max-restarts``) restarts every worker, which resume from the last
  complete checkpoint (under ``slurm/requeue.sbatch`` without in-job restarts, Slurm requeues the job instead). The
  moment of the kill is written first, so the restarted run can report its recovery time.
- ``--kill-in-save N`` (with ``--kill-rank R``): rank R SIGKILLs itself while it writes the checkpoint of step N
  (after the shards, before its RNG file and the ``latest`` marker), first attempt only: the restart must load the
  previous complete checkpoint, never this one.
- ``--slow-rank R --slow-ms M``: rank R sleeps M ms at the start of every step (a straggler the others wait for in
  the step's collectives; ``coursekit.profiling.stragglers`` finds it).

Recovery time, in the final record of a restarted attempt: ``recovery_s`` from the injected kill (``killed.json``,
``recovery_from: "kill"``) to the end of the first resumed step; after a failure nobody injected (a crash, an
``scontrol requeue``, a preemption, a node lost) from the end of the last step the failed attempt completed
(``last_step.json``, written by rank 0 after every step; ``recovery_from: "last_step"``) — the time the job lost.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

KILL_FILE = "killed.json"
LAST_STEP_FILE = "last_step.json"


_T0 = time.time()  # about when this process started (the trainer imports this module first thing)
_after_kill: bool | None = None  # whether an earlier attempt of this run was killed before this process started


def restart_count() -> int:
    """Which attempt this is (0: the first): torchrun's elastic restarts plus Slurm's requeues of the job
    (``SLURM_RESTART_COUNT``; a requeued job starts a fresh torchrun, whose own count is 0 again), and at least 1
    in a process started after an injected kill: torchrun counts restarts per agent, so on several nodes the agents
    whose workers did not fail restart theirs with TORCHELASTIC_RESTART_COUNT still 0."""
    n = sum(int(os.environ.get(k, "0") or 0) for k in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"))
    return max(n, int(bool(_after_kill)))


def _note_kill(ckpt_dir: str | None) -> None:
    global _after_kill
    if _after_kill is None:
        kill = killed_at(ckpt_dir)
        _after_kill = bool(kill and kill["time"] < _T0)


def maybe_crash(step: int, crash_at_step: int | None, resumed: bool) -> None:
    """Raise at ``crash_at_step`` in a run that did not resume from a checkpoint (so the resumed run finishes)."""
    if crash_at_step is not None and step == crash_at_step and not resumed:
        raise RuntimeError(f"injected failure at step {step} (--crash-at-step)")


def maybe_kill(step: int, faults, rank: int, ckpt_dir: str | None) -> None:
    _note_kill(ckpt_dir)
    if faults.kill_at_step is None or step != faults.kill_at_step or rank != faults.kill_rank or restart_count():
        return
    if ckpt_dir:
        Path(ckpt_dir, KILL_FILE).write_text(json.dumps({"step": step, "rank": rank, "time": time.time()}))
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in_save(faults, rank: int, ckpt_dir: str | None):
    """The hook ``Checkpointer.save`` calls between the shards and the marker, or None when no kill is planned."""
    _note_kill(ckpt_dir)
    n = getattr(faults, "kill_in_save", None)
    if n is None or rank != faults.kill_rank or restart_count():
        return None

    def hook(step: int) -> None:
        if step == n:
            if ckpt_dir:
                Path(ckpt_dir, KILL_FILE).write_text(json.dumps({"step": step, "rank": rank, "time": time.time(),
                                                                 "in_save": True}))
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


def maybe_slow(faults, rank: int) -> None:
    if faults.slow_rank is not None and rank == faults.slow_rank and faults.slow_ms > 0:
        time.sleep(faults.slow_ms / 1000)


def killed_at(ckpt_dir: str | None) -> dict | None:
    f = Path(ckpt_dir, KILL_FILE) if ckpt_dir else None
    return json.loads(f.read_text()) if f and f.exists() else None


def note_step(ckpt_dir: str | None, step: int) -> None:
    """Rank 0 after each completed step: when it ended (atomically replaced, so a reader never sees half a file)."""
    if ckpt_dir:
        tmp = Path(ckpt_dir, LAST_STEP_FILE + ".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"step": step, "time": time.time()}))
        os.replace(tmp, Path(ckpt_dir, LAST_STEP_FILE))


def last_step_at(ckpt_dir: str | None) -> dict | None:
    """The failed attempt's last completed step, read before this attempt writes its own."""
    f = Path(ckpt_dir, LAST_STEP_FILE) if ckpt_dir else None
    try:
        return json.loads(f.read_text()) if f and f.exists() else None
    except (OSError, ValueError):
        return None


def recovery(ckpt_dir: str | None, before: dict | None) -> tuple[float | None, str | None]:
    """(seconds, since what) for the first step of a restarted attempt; (None, None) in a first attempt."""
    if not restart_count():
        return None, None
    kill = killed_at(ckpt_dir)
    if kill:
        return time.time() - kill["time"], "kill"
    if before:
        return time.time() - before["time"], "last_step"
    return None, None
