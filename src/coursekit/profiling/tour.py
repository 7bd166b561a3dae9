"""Module 5 in ``coursekit demo``: a worker SIGKILLed mid-run, torchrun restarts the group and the run resumes from
its last complete checkpoint with bit-identical losses; DDP's overlap % read from a profiler trace; a slowed rank
named as the straggler by the trainer and by the trace."""
from __future__ import annotations

import tempfile

from coursekit.tour import Check

MODULE, TITLE = 5, "Profiling and fault recovery"  # found by coursekit.tour.discover()


def checks(tour) -> list[Check]:
    from coursekit.launch import launch

    out = []
    with tempfile.TemporaryDirectory(prefix="coursekit-tour-elastic-") as d:
        tour.say("  running ddp on 2 processes, SIGKILL of rank 1 at step 3, torchrun restarts it")
        args = ["--strategy", "ddp", *tour.common(), "--save-every", "2", "--ckpt-dir", d, "--kill-at-step", "3",
                "--kill-rank", "1"]
        recs = launch("coursekit.train", args, nproc=2, timeout=tour.timeout, stream=False, max_restarts=1).results
    # the uninterrupted run: the same arguments without checkpoints (saving changes no loss), Module 1's DDP run
    whole = {s["step"]: s["loss"] for s in tour.ddp()[0]["steps"]}
    f = recs[0]["final"]
    same = all(s["loss"] == whole[s["step"]] for r in recs for s in r["steps"])
    out.append(Check(5, "SIGKILL at step 3, elastic restart", "resume at step 2, bit-identical losses",
                     f"resumed at {f['resumed_from_step']} after {f['recovery_s']:.1f} s, "
                     f"{'identical' if same else 'DIFFERENT'}", same and f["resumed_from_step"] == 2))
    out += [overlap(tour), straggler(tour)]
    return out


def overlap(tour) -> Check:
    """Small DDP buckets: gradient all-reduces start during backward, so part of the communication is hidden."""
    from coursekit.profiling.trace import analyse

    with tempfile.TemporaryDirectory(prefix="coursekit-tour-trace-") as d:
        tour.train("ddp", 2, "--bucket-mb", "0.1", "--profile-dir", d, "--profile-steps", "1:4")
        res = analyse(d)
    pct = [r["total"]["overlap_pct"] for r in res["ranks"]]
    ok = all(p is not None and p > 0 for p in pct)
    return Check(5, "overlap from a trace (ddp, 0.1 MB buckets)", "overlap % > 0 on every rank",
                 "overlap " + ", ".join(f"r{r['rank']} {p:.0f} %" for r, p in zip(res["ranks"], pct) if p is not None),
                 ok)


def straggler(tour, slow_ms: int = 150) -> Check:
    """Rank 1 sleeps ``slow_ms`` per step: the trainer's per-collective waits and the trace both name it."""
    from coursekit.profiling.trace import analyse

    with tempfile.TemporaryDirectory(prefix="coursekit-tour-slow-") as d:
        f = tour.train("ddp", 2, "--slow-rank", "1", "--slow-ms", str(slow_ms), "--profile-dir", d,
                       "--profile-steps", "1:4")[0]["final"]["stragglers"]
        tr = analyse(d)["straggler"]
    est = f["slowdown_ms"] or 0
    ok = f["rank"] == 1 and (tr or {}).get("rank") == 1 and slow_ms / 2 <= est <= 2 * slow_ms
    return Check(5, f"straggler (rank 1 sleeps {slow_ms} ms per step)", "rank 1, slowdown within 2x",
                 f"trainer: rank {f['rank']} ~{est:.0f} ms; trace: rank {(tr or {}).get('rank')}", ok)
