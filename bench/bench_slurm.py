"""Seconds from a clean machine to a ready local Slurm, and per submitted test job.

    sudo .venv/bin/python bench/bench_slurm.py                 # time install (if missing) + start, then the jobs
    sudo .venv/bin/python bench/bench_slurm.py --from-clean    # apt-get purge slurm+munge first: a clean machine
    sudo .venv/bin/python bench/bench_slurm.py --repeat 5 --json bench/results/slurm.json
    sudo .venv/bin/python bench/bench_slurm.py --repeat 1 --only empty,"1 node"    # jobs whose label has a word

Phases: ``install`` (apt, only when slurm/munge are missing), ``start`` (config, munged, slurmctld, two slurmd,
both nodes idle), one line per job kind (submit -> COMPLETED, as tests/test_slurm.py submits them: CPU/gloo via
COURSEKIT_DEVICE=cpu, 2 ranks per node), and ``stop`` (cancel, daemons stopped by PID). The ``empty job`` line
(``--wrap true``) is Slurm's own overhead; the rest is mostly Python and torch start-up on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from slurm_cluster import SCRIPT, LocalSlurm  # noqa: E402

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
# what apt pulls in with them on Debian 12: purged too when nothing else needs them
DEPENDENCIES = ["slurm-wlm-basic-plugins", "libmunge2", "libhwloc15", "liblua5.1-0"]

# (label, script, program args, sbatch options): the jobs of tests/test_slurm.py, check-job flavour
JOBS = [
    ("empty job (--wrap true)", None, [], ["--wrap", "true"]),
    ("torchrun, 1 node x 2", "slurm/torchrun-single-node.sbatch", [], ["--gpus-per-node=2"]),
    ("torchrun, 2 nodes x 2", "slurm/torchrun-multi-node.sbatch", [], ["--nodes=2", "--gpus-per-node=2"]),
    ("srun ranks, 2 nodes x 2", "slurm/srun-ranks.sbatch", [],
     ["--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2"]),
    ("deepspeed launcher, 2 nodes x 2", "slurm/deepspeed.sbatch", [], ["--nodes=2", "--gpus-per-node=2"]),
    ("train ddp 5 steps, 2 nodes x 1", "slurm/torchrun-multi-node.sbatch",
     ["-m", "coursekit.train", "--strategy", "ddp", "--model", "tiny-llama", "--micro-batch", "4", "--seq", "64",
      "--steps", "5", "--seed", "0", "--quiet"], ["--nodes=2", "--gpus-per-node=1"]),
]


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t0, out


def installed() -> bool:
    return all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged"))


def purge() -> list[str]:
    """Remove slurm, munge and their libraries, but never a package that something else on the machine needs."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wanted = PACKAGES + DEPENDENCIES
    sim = subprocess.run(["apt-get", "-s", "purge", *wanted], capture_output=True, text=True, env=env)
    removed = {ln.split()[1] for ln in sim.stdout.splitlines() if ln.startswith("Purg ")}
    if sim.returncode != 0 or not removed <= set(wanted):
        wanted = PACKAGES  # a library is shared with something else: keep the libraries
    subprocess.run(["apt-get", "purge", "-y", "-qq", *wanted], check=True, capture_output=True, env=env)
    return wanted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-clean", action="store_true", help="apt-get purge slurm and munge first (root)")
    ap.add_argument("--repeat", type=int, default=3, help="submissions per job kind (default 3)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--only", default=None, help="comma list of words: run the job kinds whose label has one")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("run as root (installs packages, starts slurmd)")
    words = args.only.split(",") if args.only else None
    jobs = [j for j in JOBS if words is None or any(w in j[0] for w in words)]
    if not jobs:
        ap.error(f"--only {args.only!r} matches no job kind: {'; '.join(j[0] for j in JOBS)}")

    rows: list[tuple[str, list[float]]] = []
    if args.from_clean and installed():
        purge()
    was_installed = installed()
    t_install = 0.0
    if not was_installed:
        t_install, proc = timed(subprocess.run, ["bash", str(SCRIPT), "install"], capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
    root = Path(tempfile.mkdtemp(prefix="coursekit-slurm-bench-"))
    t_start, cluster = timed(LocalSlurm.start, root)
    rows.append(("install slurm+munge (apt)" if not was_installed else "install (already installed: skipped)",
                 [t_install]))
    rows.append(("start: config, munged, slurmctld, 2 slurmd, idle", [t_start]))
    rows.append(("clean machine -> ready Slurm", [t_install + t_start]))
    try:
        for label, script, prog, opts in jobs:
            times = []
            for i in range(args.repeat):
                run_dir = root / "runs" / f"{len(rows)}-{i}"
                env = cluster.job_env({"COURSEKIT_RUN_DIR": str(run_dir),
                                       "COURSEKIT_RESULTS_DIR": str(run_dir / "results")})
                t0 = time.perf_counter()
                if script is None:
                    out = root / "jobs" / f"empty-{i}.out"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    job = subprocess.run(["sbatch", "--parsable", f"--output={out}", "--time=00:02:00", *opts],
                                         env=env, cwd=REPO, capture_output=True, text=True, check=True
                                         ).stdout.strip()
                else:
                    job = cluster.sbatch(script, *prog, options=[*opts, "--time=00:02:00"], env=env)
                res = cluster.wait(job, timeout=240, poll=0.05)
                dt = time.perf_counter() - t0
                if res.state != "COMPLETED":
                    raise RuntimeError(f"{label}: job {job} {res.state}\n{res.tail()}")
                times.append(dt)
            rows.append((f"job: {label}", times))
    finally:
        t_stop, _ = timed(cluster.stop)
        rows.append(("stop: cancel jobs, daemons by PID", [t_stop]))
        shutil.rmtree(root, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print(f"{'phase':<{width}}  {'median s':>9}  {'min s':>7}  {'max s':>7}  n")
    for label, ts in rows:
        print(f"{label:<{width}}  {statistics.median(ts):9.2f}  {min(ts):7.2f}  {max(ts):7.2f}  {len(ts)}")
    print(f"(machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({label: ts for label, ts in rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
