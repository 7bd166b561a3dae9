"""Start a torchft lighthouse and N replica groups (one process each), SIGKILL one mid-run, restart it, and report.

    python -m coursekit.ft.run --replicas 2 --steps 120 --kill-at-step 10 --json

What is reported (from the replicas' per-step JSON lines, on one machine's clock):
- ``survivor_stall_s``: the longest step of a surviving group after the kill minus its median step: the time it
  waited for the dead group (torchft's timeout, then a new quorum without it);
- ``survivor_lost_steps``: survivor steps that did not commit (0: it went on without a restart);
- ``heal_s``: from the kill to the restarted group's first committed step (it copied the state from a peer);
- ``healed_at_step``: the step it resumed at (the peer's, not a checkpoint's);
- ``steps_without_it``: steps the job took while the killed group was away (healed_at_step - its last step - 1);
  none is recomputed: the survivors committed them (with fewer participants: a smaller global batch).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from coursekit.launch import stamped_env
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def run(replicas: int = 2, steps: int = 120, kill_at_step: int = 10, kill: int = 1, step_ms: float = 100,
        timeout: float = 600, workdir: str | None = None) -> dict:
    socket.getaddrinfo(socket.gethostname(), None)  # torchft advertises this name to its peers: it must resolve
    d = Path(workdir or tempfile.mkdtemp(prefix="coursekit-ft-"))
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="localhost", RANK="0", WORLD_SIZE="1")
    lh_port = _free_port()
    env["TORCHFT_LIGHTHOUSE"] = f"http://localhost:{lh_port}"
    lh_bin = shutil.which("torchft_lighthouse") or Path(sys.executable).with_name("torchft_lighthouse")
    if not Path(lh_bin).exists():
        raise RuntimeError("torchft_lighthouse not found (pip install torchft==0.2.0)")
    lh_cmd = [str(lh_bin)]
    procs = []

    def start(i, extra, name):
        cmd = [sys.executable, "-m", "coursekit.ft.replica", "--replica", str(i), "--steps", str(steps),
               "--step-ms", str(step_ms), "--out", str(d / f"{name}.jsonl"), *extra]
        p = subprocess.Popen(cmd, env=stamped_env(dict(env, MASTER_PORT=str(_free_port()))),
                             stdout=open(d / f"{name}.log", "w"),
                             stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    deadline = time.monotonic() + timeout
    lh = subprocess.Popen([*lh_cmd, "--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000",
                           "--bind", f"[::]:{lh_port}"], env=stamped_env(), stdout=open(d / "lighthouse.log", "w"),
                          stderr=subprocess.STDOUT)
    try:
        groups = {i: start(i, ["--kill-at-step", str(kill_at_step)] if i == kill else [], f"r{i}")
                  for i in range(replicas)}
        victim = groups[kill]
        victim.wait(timeout=max(1, deadline - time.monotonic()))
        restarted = start(kill, [], f"r{kill}b")
        for p in [*(g for i, g in groups.items() if i != kill), restarted]:
            rc = p.wait(timeout=max(1, deadline - time.monotonic()))
            if rc != 0:
                raise RuntimeError(f"a replica group failed (exit {rc}); logs in {d}")
    finally:
        for p in [*procs, lh]:
            if p.poll() is None:
                p.kill()
                p.wait()
    return dict(report(d, replicas, kill, kill_at_step), victim_exit=victim.returncode)


def report(d: Path, replicas: int, kill: int, kill_at_step: int) -> dict:
    """The figures of the module docstring, from the replicas' JSON lines in ``d``."""
    d = Path(d)
    survivors = [_lines(d / f"r{i}.jsonl") for i in range(replicas) if i != kill]
    before, after = _lines(d / f"r{kill}.jsonl"), _lines(d / f"r{kill}b.jsonl")
    killed_t = before[-1]["t1"]  # it SIGKILLs itself at the top of the next step
    s = survivors[0]
    dur = sorted(r["t1"] - r["t0"] for r in s)
    med = dur[len(dur) // 2]
    post = [r for r in s if r["t1"] > killed_t]
    # healed: back in a full quorum (its first step may already jump to the peer's step: the state is copied in
    # that step's quorum)
    healed = next((r for r in after if r["participants"] == replicas and r["committed"]), None)
    last_before = max((r["step"] for r in before if r["committed"]), default=-1)
    return {"path": "torchft", "replicas": replicas, "kill_at_step": kill_at_step,
            "survivor_steps": len(s), "survivor_median_step_s": med,
            "survivor_stall_s": max(r["t1"] - r["t0"] for r in post) - med if post else None,
            "survivor_lost_steps": sum(not r["committed"] for r in s),
            "heal_s": healed["t1"] - killed_t if healed else None,
            "healed_at_step": healed["step"] if healed else None,
            "steps_without_it": healed["step"] - last_before - 1 if healed else None,
            "rejoined_participants": max((r["participants"] for r in after), default=0), "workdir": str(d)}

def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0].replace("``", ""))
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--kill-at-step", type=int, default=10)
    p.add_argument("--step-ms", type=float, default=100)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    res = run(a.replicas, a.steps, a.kill_at_step, step_ms=a.step_ms, timeout=a.timeout)
    print(json.dumps(res, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
