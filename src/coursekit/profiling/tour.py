"""Module 5 in ``coursekit demo``: a worker SIGKILLed mid-run, torchrun restarts the group and the run resumes from
its last complete checkpoint with bit-identical losses."""
from __future__ import annotations

import tempfile

from coursekit.tour import Check


def checks(tour) -> list[Check]:
    from coursekit.launch import launch

    out = []
    with tempfile.TemporaryDirectory(prefix="coursekit-tour-elastic-") as d:
        tour.say("  running ddp on 2 processes, SIGKILL of rank 1 at step 3, torchrun restarts it")
        args = ["--strategy", "ddp", *tour.common(), "--steps", "6", "--save-every", "2", "--ckpt-dir", d,
                "--kill-at-step", "3", "--kill-rank", "1"]
        recs = launch("coursekit.train", args, nproc=2, timeout=tour.timeout, stream=False, max_restarts=1).results
    whole = {s["step"]: s["loss"] for s in tour.train("ddp", 2, "--steps", "6")[0]["steps"]}
    f = recs[0]["final"]
    same = all(s["loss"] == whole[s["step"]] for r in recs for s in r["steps"])
    out.append(Check(5, "SIGKILL at step 3, elastic restart", "resume at step 2, bit-identical losses",
                     f"resumed at {f['resumed_from_step']} after {f['recovery_s']:.1f} s, "
                     f"{'identical' if same else 'DIFFERENT'}", same and f["resumed_from_step"] == 2))
    return out
