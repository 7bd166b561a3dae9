"""``coursekit train``: check the run, launch the trainer on N processes, show progress, print the summary.

    coursekit train --strategy ddp --tp 2 --steps 20          # 4 processes (the degrees' product), progress bar
    coursekit train --strategy zero2 --nproc 2 --json         # every rank's records as one JSON object

Every check that needs no process group (``coursekit.parallel.validate.validate``) runs here first: a bad run costs no
launch and exits with code 2 and one line.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time

from coursekit.train import integrity


def run_training(train_args: list[str], *, nproc: int, timeout: float = 600, stream: bool = False,
                 progress=None, max_restarts: int = 0) -> dict:
    """Launch the reference trainer; returns rank 0's record plus every rank's final record and wall time."""
    from coursekit.launch import launch

    t0 = time.monotonic()
    args = list(train_args) if progress else ["--quiet", *train_args]
    res = launch("coursekit.train", args, nproc=nproc, timeout=timeout, stream=stream or bool(progress),
                 on_line=progress.feed if progress else None, max_restarts=max_restarts)
    if progress:
        progress.close()
    out = dict(res.results[0])
    out["ranks"] = [r["final"] for r in res.results]
    out["results"] = res.results
    out["wall_s"] = time.monotonic() - t0
    return out


def summary_table(runs: list[dict]) -> str:
    """One row per run: layout, world, first and final loss, tokens/s, step time, MFU, wall time; then a line per
    run naming its straggler (``coursekit.profiling.stragglers``) when one was measured."""
    from coursekit.profiling.stragglers import line
    head = (f"{'strategy':<10} {'layout':<22} {'world':>5} {'steps':>5}  {'first loss':>10} {'final loss':>10} "
            f"{'tokens/s':>9} {'step ms':>8} {'MFU %':>6} {'wall s':>7}")
    rows = [head, "-" * len(head)]
    for r in runs:
        f, steps = r["final"], r["steps"]
        lay = f.get("layout") or {}
        layout = " ".join(f"{k}{v}" for k, v in lay.items() if k != "world_size" and v > 1) or "-"
        if not steps:  # nothing left to run (resumed at the last step): say so instead of averaging nothing
            done = f.get("resumed_from_step")
            rows.append(f"{f['strategy']:<10} {layout:<22} {f['world_size']:>5} {0:>5}  no steps run"
                        + (f" (resumed at step {done}: the run was already complete)" if done is not None else ""))
            continue
        timed = steps[1:] or steps  # the first step includes warm-up
        tps = sum(s["tokens_per_s"] for s in timed) / len(timed)
        ms = 1000 * sum(s["step_time_s"] for s in timed) / len(timed)
        mfu = f"{100 * f['mfu']:>6.2f}" if f.get("mfu") is not None else f"{'-':>6}"
        rows.append(f"{f['strategy']:<10} {layout:<22} {f['world_size']:>5} {len(steps):>5}  "
                    f"{steps[0]['loss']:>10.4f} {steps[-1]['loss']:>10.4f} {tps:>9.0f} {ms:>8.1f} {mfu} "
                    f"{r['wall_s']:>7.1f}")
    notes = []
    for r in runs:
        f = r["final"]
        if f.get("peak_source"):
            notes.append(f"{f['strategy']}: MFU {f['model_flops_per_step'] / 1e9:.3g} GFLOP/step; peak "
                         f"{(f['peak_flops'] or 0) / 1e9:.3g} GFLOP/s per device ({f['peak_source']})"
                         + (f"; HFU {100 * f['hfu']:.2f} %" if f.get("hfu") and f["hfu"] != f["mfu"] else ""))
        if f.get("stragglers"):
            notes.append(f"{f['strategy']}: {line(f['stragglers'])}")
    return "\n".join(rows + notes)


def plan(argv) -> tuple:
    """Parse and check a ``coursekit train`` command line: (launcher options, trainer options, nproc)."""
    from coursekit import options
    from coursekit.launch import default_nproc
    from coursekit.spec import registry
    from coursekit.parallel.validate import default_world, validate

    ns = vars(options.build_parser(launcher=True).parse_args(argv))
    names = {f.name for f in dataclasses.fields(options.LaunchOptions)}
    lo = options.LaunchOptions(**{k: ns.pop(k) for k in list(ns) if k in names})
    options.check_ranges(lo)
    opts = options.build(ns)
    one = registry.entry(opts.parallel.strategy).world == "one"
    nproc = lo.nproc if lo.nproc is not None else default_world(opts) or (1 if one else default_nproc())
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    validate(copy.deepcopy(opts), nproc)  # fail before launching anything
    f = opts.faults
    for name in ("kill_rank", "slow_rank"):
        r = getattr(f, name)
        killing = f.kill_at_step is not None or f.kill_in_save is not None
        if r is not None and not 0 <= r < nproc and (name == "slow_rank" or killing):
            raise ValueError(f"--{name.replace('_', '-')} {r} is not a rank of {nproc} processes")
    for name in ("kill_at_step", "kill_in_save"):
        if getattr(f, name) is not None and (lo.max_restarts < 1 or not opts.ckpt.ckpt_dir):
            raise ValueError(f"--{name.replace('_', '-')} needs --max-restarts >= 1 and --ckpt-dir (the restart "
                             "resumes from it)")
    for flag, folder in (("--ckpt-dir", opts.ckpt.ckpt_dir), ("--profile-dir", opts.profile.profile_dir)):
        if folder:
            _check_folder(flag, folder)
    if opts.ckpt.ckpt_dir:  # checkpoints there but none whole (files missing or cut short): refuse before launching
        step, notes = integrity.choose(opts.ckpt.ckpt_dir, full=False)
        if step is None and notes:
            raise integrity.CheckpointError(f"--ckpt-dir {opts.ckpt.ckpt_dir}: no intact checkpoint to resume from "
                                            f"({'; '.join(notes[:-1]) or notes[-1]})")
    return lo, opts, nproc


def _check_folder(flag: str, folder: str) -> None:
    """A folder the ranks will write into: one, or one that can be made (its nearest existing parent writable)."""
    import os
    from pathlib import Path

    p = Path(folder)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {folder} is not a folder")
    parent = next((a for a in [p, *p.absolute().parents] if a.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {folder}: cannot write there ({parent} is not a writable folder)")


def main(argv=None) -> int:
    from coursekit.options import to_argv
    from coursekit.train.progress import Progress

    lo, opts, nproc = plan(list(sys.argv[1:] if argv is None else argv))
    show = not (lo.json or opts.output.quiet)
    res = run_training(to_argv(opts), nproc=nproc, timeout=lo.timeout, progress=Progress() if show else None,
                       max_restarts=lo.max_restarts)
    if lo.json:
        print(json.dumps({"nproc": nproc, "wall_s": res["wall_s"], "ranks": res["results"]}))
    else:
        print(summary_table([res]))
    return 0
