"""A real two-node Slurm on this machine (scripts/slurm-local.sh), and how tests submit to it and wait.

    cluster = LocalSlurm.start(tmp_dir)          # installs slurm+munge via apt when missing; ~1 s when installed
    job = cluster.sbatch("slurm/srun-ranks.sbatch", options=["--nodes=2"], env={...})
    res = cluster.wait(job, timeout=90)          # JobResult(state="COMPLETED", exit_code=0, restarts=0, output=...)
    cluster.stop()                               # by the PIDs the script recorded

Waiting polls ``scontrol show job`` every 0.2 s and, once Slurm has forgotten the job (MinJobAge=5 s), reads the
final state from the job-completion log, so no test depends on ``sbatch --wait``'s slow back-off. A job that
overruns the test's timeout is cancelled before the test fails, so nothing outlives the test.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-local.sh"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}
_EXIT = re.compile(r"(?<![A-Za-z])ExitCode=(\d+):(\d+)")


def _field(line: str, key: str) -> str | None:
    m = re.search(rf"(?<![A-Za-z]){key}=(\S*)", line)
    return m.group(1) if m else None


@dataclass
class JobResult:
    job_id: str
    state: str
    exit_code: int | None
    signal: int | None
    restarts: int
    output: str = field(repr=False, default="")
    history: list = field(default_factory=list)  # job-completion log states, one per attempt that ended

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.outputs: dict[str, Path] = {}

    # ---- lifecycle -------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, root: Path, timeout: float = 240) -> "LocalSlurm":
        proc = subprocess.run(["bash", str(SCRIPT), "up", str(root)], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"scripts/slurm-local.sh up failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return cls(root)

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", str(self.root)], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)

    def pids(self) -> dict[str, int]:
        out = {}
        for f in (self.root / "pids").glob("*.pid"):
            if f.name.endswith(".run.pid") or f.name == "munged.pid":
                try:
                    out[f.name.removesuffix(".pid")] = int(f.read_text().strip())
                except ValueError:
                    pass
        return out

    # ---- commands --------------------------------------------------------------------------------------------
    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def job_env(self, extra: dict | None = None) -> dict:
        """The submitting shell's environment for a test job: this venv first on PATH, gloo on CPU, 1 thread."""
        env = dict(self.env)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update({"COURSEKIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1"})
        env.update(extra or {})
        return env

    def sbatch(self, script: str | Path, *args: str, options=(), env: dict | None = None,
               output: Path | None = None) -> str:
        """Submit ``script`` (a path relative to the repo) from the repo root; returns the job id."""
        output = Path(output or self.root / "jobs" / f"{Path(script).stem}-{time.monotonic_ns()}.out")
        output.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["sbatch", "--parsable", f"--output={output}", *options, str(script), *map(str, args)]
        proc = subprocess.run(cmd, env=env or self.job_env(), cwd=REPO, capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
        job_id = proc.stdout.strip().split(";")[0]
        self.outputs[job_id] = output
        return job_id

    def show(self, job_id: str) -> str | None:
        """`scontrol show job -o` line, or None once Slurm has forgotten the job."""
        proc = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        line = proc.stdout.strip()
        return line if proc.returncode == 0 and line.startswith("JobId=") else None

    def jobcomp(self, job_id: str) -> list[str]:
        """The job-completion log lines of one job (one per ended attempt; requeues log as PENDING)."""
        log = self.root / "log" / "jobcomp.txt"
        if not log.exists():
            return []
        return [ln for ln in log.read_text().splitlines() if ln.startswith(f"JobId={job_id} ")]

    def cancel(self, job_id: str) -> None:
        self.run("scancel", job_id, check=False)

    def cancel_all(self) -> None:
        ids = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
        if ids:
            self.run("scancel", *ids, check=False)

    def signal_batch(self, job_id: str, sig: str = "USR1") -> None:
        """Send a signal to the job's batch shell only (what --signal=B:SIG@T does before the time limit)."""
        self.run("scancel", "--batch", f"--signal={sig}", job_id)

    def wait(self, job_id: str, timeout: float = 120, poll: float = 0.2) -> JobResult:
        """Block until the job ends (any terminal state); cancel it and fail when ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        state, line = "UNKNOWN", None
        while time.monotonic() < deadline:
            line = self.show(job_id)
            if line is None:  # purged: the completion log has its final state
                comp = self.jobcomp(job_id)
                if comp and _field(comp[-1], "JobState") in TERMINAL:
                    return self._result(job_id, comp[-1])
            else:
                state = _field(line, "JobState") or "UNKNOWN"
                if state in TERMINAL:
                    return self._result(job_id, line)
            time.sleep(poll)
        self.cancel(job_id)
        out = self.outputs.get(job_id)
        text = out.read_text(errors="replace") if out and out.exists() else ""
        raise TimeoutError(f"job {job_id} still {state} after {timeout:.0f} s (cancelled); last lines:\n"
                           + "\n".join(text.splitlines()[-40:]))

    def wait_array(self, job_id: str, timeout: float = 120, poll: float = 0.2) -> dict[int, JobResult]:
        """Block until every task of array job ``job_id`` has ended; returns {task id: JobResult}."""
        deadline = time.monotonic() + timeout
        seen: dict[int, str] = {}
        while time.monotonic() < deadline:
            proc = self.run("scontrol", "show", "job", "-o", job_id, check=False)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JobId=")]
            for ln in lines:
                task = _field(ln, "ArrayTaskId") or ""
                if task.isdigit():
                    seen[int(task)] = ln
            pending = [ln for ln in lines if _field(ln, "JobState") not in TERMINAL]
            if seen and not pending:
                return {t: self._result(_field(ln, "JobId"), ln) for t, ln in sorted(seen.items())}
            time.sleep(poll)
        self.cancel(job_id)
        raise TimeoutError(f"array job {job_id} not finished after {timeout:.0f} s (cancelled)")

    def _result(self, job_id: str, line: str) -> JobResult:
        m = _EXIT.search(line)
        out = self.outputs.get(job_id)
        comp = self.jobcomp(job_id)
        restarts = _field(line, "Restarts")
        return JobResult(job_id=job_id, state=_field(line, "JobState") or "UNKNOWN",
                         exit_code=int(m.group(1)) if m else None, signal=int(m.group(2)) if m else None,
                         restarts=int(restarts) if restarts is not None else max(0, len(comp) - 1),
                         output=out.read_text(errors="replace") if out and out.exists() else "",
                         history=[_field(c, "JobState") for c in comp])


def can_run_slurm() -> str | None:
    """None when a local Slurm can be started here, else the reason it cannot."""
    if sys.platform != "linux":
        return "Slurm on localhost needs Linux"
    if os.geteuid() != 0:
        return "starting slurmd needs root (CI runs as root)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "no slurm installed and no apt-get to install it"
    return None
