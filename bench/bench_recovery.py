"""Module 5 figures: time from SIGKILL to the resumed step (restart from a checkpoint), and the trainer's MFU on
CPU per strategy against the measured matmul peak.

    .venv/bin/python bench/bench_recovery.py            # ddp and fsdp2 recovery, MFU of single/ddp/fsdp2 (~2 min idle)
    .venv/bin/python bench/bench_recovery.py --quick --json out.json   # ddp only, fewer steps

Recovery, per strategy (2 processes, tiny model, checkpoint every 2 steps, rank 1 SIGKILLed at step 5 with
``--max-restarts 1``): ``recovery_s`` = from the kill to the end of the first resumed step (the trainer's own
figure: torchrun notices the dead worker, stops the others, starts the group again, imports, loads the DCP
checkpoint, runs a step); ``lost steps`` = steps recomputed (kill step - resumed step); ``extra wall s`` = wall time
of the killed run minus that of the same run uninterrupted. torchft (``coursekit.ft.run``, when torchft is
installed: ``pip install -e '.[ft]'``): two replica groups, one SIGKILLed at step 10 and restarted; ``recovery_s`` =
kill -> the restarted group's first step back in the full quorum (it copied the state from its peer); ``lost
steps`` = steps the survivor did not commit (it went on alone); ``extra wall s`` = the survivor's stall (its longest
step after the kill minus its median step: torchft's timeout and a new quorum).

MFU: model FLOPs per step (``coursekit.flops``) / median step time / (processes x the measured 1-thread matmul peak
of the run's dtype, ``coursekit doctor --peak``). The tiny model's matmuls are 64-wide: far from a 512^3 matmul's
rate, and every step also pays the optimizer loop, norms, the loss all-reduce and waiting for the gradients.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from coursekit.launch import launch  # noqa: E402


def train(strategy, nproc, args, max_restarts=0, timeout=900):
    t0 = time.monotonic()
    res = launch("coursekit.train", ["--strategy", strategy, "--quiet", *map(str, args)], nproc=nproc,
                 timeout=timeout, stream=False, max_restarts=max_restarts)
    return res.results, time.monotonic() - t0


WHOLE = {}  # strategy -> rank 0's record of the uninterrupted run (its MFU row uses it too: no second launch)


def recovery(strategy, steps, seq):
    common = ["--steps", steps, "--seq", seq, "--save-every", 2]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        recs, whole = train(strategy, 2, [*common, "--ckpt-dir", a])
        WHOLE[strategy] = recs[0]
        recs, wall = train(strategy, 2, [*common, "--ckpt-dir", b, "--kill-at-step", steps - 1, "--kill-rank", 1],
                           max_restarts=1)
    f = recs[0]["final"]
    return {"strategy": strategy, "path": "checkpoint restart", "recovery_s": f["recovery_s"],
            "lost_steps": steps - 1 - f["resumed_from_step"], "extra_wall_s": wall - whole, "whole_wall_s": whole}


def mfu(strategy, steps, seq):
    """MFU of a run's steady steps; a strategy whose recovery row ran already reuses that uninterrupted run (the
    same steps and sequence length; checkpoints are written between steps, outside the timed step)."""
    rec = WHOLE.get(strategy)
    if rec is None:
        rec = train(strategy, 1 if strategy == "single" else 2, ["--steps", steps, "--seq", seq])[0][0]
    f = rec["final"]
    return {"strategy": strategy, "world": f["world_size"], "gflop_per_step": f["model_flops_per_step"] / 1e9,
            "achieved_gflops_per_device": f["achieved_flops_per_device"] / 1e9,
            "peak_gflops": f["peak_flops"] / 1e9, "mfu_pct": 100 * f["mfu"], "peak_source": f["peak_source"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="ddp only, fewer steps")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args(argv)
    steps, seq = (6, 32) if a.quick else (8, 64)
    rec = [recovery(s, steps, seq) for s in (["ddp"] if a.quick else ["ddp", "fsdp2"])]
    if importlib.util.find_spec("torchft") is not None:
        from coursekit.ft.run import run as ft_run

        r = ft_run(replicas=2, steps=150, kill_at_step=10, step_ms=200)
        rec.append({"strategy": "ddp", "path": "torchft heal", "recovery_s": r["heal_s"],
                    "lost_steps": r["survivor_lost_steps"], "extra_wall_s": r["survivor_stall_s"], "torchft": r})
    use = [mfu(s, steps, seq) for s in (["ddp"] if a.quick else ["single", "ddp", "fsdp2"])]
    print(f"{'strategy':<9} {'path':<20} {'kill->resumed step s':>21} {'lost steps':>10} {'extra wall s':>12}")
    for r in rec:
        print(f"{r['strategy']:<9} {r['path']:<20} {r['recovery_s']:>21.1f} {r['lost_steps']:>10} "
              f"{r['extra_wall_s']:>12.1f}")
    print(f"\n{'strategy':<9} {'world':>5} {'GFLOP/step':>10} {'GFLOP/s/dev':>11} {'peak GFLOP/s':>12} {'MFU %':>6}")
    for r in use:
        print(f"{r['strategy']:<9} {r['world']:>5} {r['gflop_per_step']:>10.3f} "
              f"{r['achieved_gflops_per_device']:>11.2f} {r['peak_gflops']:>12.1f} {r['mfu_pct']:>6.2f}")
    print(f"peak: {use[0]['peak_source']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"recovery": rec, "mfu": use}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
