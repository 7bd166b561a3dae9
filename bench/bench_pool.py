"""How live a notebook session is: persistent ranks (``coursekit.pool``) against a launch per cell.

    .venv/bin/python bench/bench_pool.py            # 2 and 4 ranks
    .venv/bin/python bench/bench_pool.py --nproc 2 --reps 3

Prints, side by side in one run (issue 30's goals in brackets; figures, not a test):
- the floor: a bare ``torchrun`` of N processes that import torch, join a gloo group and pass a barrier (wall s);
- the pool's start (N engines, their process group) [<= 1.3 x the floor];
- a small collective cell on N warm ranks (an all-reduce of 4 floats, its output back) [<= 0.5 s];
- ``coursekit train --nproc N --steps 1`` (tiny-llama) [<= 1.5 x the floor]: as it runs on CPU, its workers forked
  from torchrun's agent once it imported the run (``coursekit.launch.agent``), and "unforked", with
  ``COURSEKIT_LAUNCH_FORK=0`` (a fresh interpreter per worker, as on GPUs).

Then where each one's time goes (rank 0's clock, the last repetition): the floor's and the trainer's phases from
timestamps (the trainer's through a ``sitecustomize`` of this bench's own that times every import and marks the end
of ``coursekit.dist.init``, ``build_run``, the last ``train_step``, the start of ``coursekit.dist.destroy`` and
``finish``; the CLI's own imports too), the pool's from ``Pool``'s start (engines up, then torch and the group).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = """import json, os, time
t = {"main": time.time()}
import torch.distributed as dist
t["imports"] = time.time()
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
t["group"] = time.time()
if os.environ["RANK"] == "0":
    Path = __import__("pathlib").Path
    Path(os.environ["BENCH_PHASES"], "floor.json").write_text(json.dumps(t))
"""

# imported by every process of the timed `coursekit train` (PYTHONPATH): the import clock, then in a worker the marks
SITE = r'''import importlib._bootstrap as _b, json, os, sys, threading, time
_T0, _IMP, _MAIN = time.time(), [0.0], threading.main_thread()
_load = _b._find_and_load
def _timed(name, import_):
    if threading.current_thread() is not _MAIN or getattr(_timed, "busy", False):
        return _load(name, import_)
    _timed.busy, t = True, time.perf_counter()
    try:
        return _load(name, import_)
    finally:
        _IMP[0] += time.perf_counter() - t
        _timed.busy = False
_b._find_and_load = _timed
_OUT, marks = os.environ["BENCH_PHASES"], [("main", _T0, 0.0)]
def mark(what):
    marks.append((what, time.time(), _IMP[0]))
def _hooks():
    import coursekit.dist as _d, coursekit.launch as _l, coursekit.parallel.run as _r
    def _after(f, what):
        def g(*a, **k):
            out = f(*a, **k)
            mark(what)
            return out
        return g
    def _build(*a, **k):
        run = _built(*a, **k)
        mark("build")
        run.strategy.train_step = _after(run.strategy.train_step, "step")
        return run
    def _destroy(*a, **k):
        mark("final")
        return _destroy0(*a, **k)
    def _finish(rc=0):
        mark("teardown")
        if os.environ["RANK"] == "0":
            launch = float(os.environ["COURSEKIT_LAUNCH_T0"])
            open(os.path.join(_OUT, "rank0.json"), "w").write(json.dumps({"launch": launch, "marks": marks}))
        return _finish0(rc)
    _built, _destroy0, _finish0 = _r.build_run, _d.destroy, _l.finish
    _d.init, _d.destroy, _r.build_run, _l.finish = _after(_d.init, "init"), _destroy, _build, _finish
if os.environ.get("LOCAL_RANK") is not None:  # a worker with an interpreter of its own
    _hooks()
elif sys.argv and sys.argv[0] == "-c":  # torchrun's agent (launch.AGENT): a worker it forks marks the fork
    def _forked():
        mark("fork")
        _hooks()
    os.register_at_fork(after_in_child=_forked)
else:
    def _parent():
        if sys.argv and sys.argv[0].endswith("cli.py"):
            open(os.path.join(_OUT, "cli.json"), "w").write(json.dumps({"imports": _IMP[0]}))
    __import__("atexit").register(_parent)
'''


def _wall(cmd: list[str], timeout: float = 300, env: dict | None = None) -> tuple[float, float, float]:
    """The command's wall seconds, and its start and end (time.time, the clock the phases use)."""
    t0, w0 = time.perf_counter(), time.time()
    subprocess.run(cmd, check=True, capture_output=True, timeout=timeout,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "COURSEKIT_DEVICE": "cpu", **(env or {})})
    return time.perf_counter() - t0, w0, time.time()


def floor_s(nproc: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "floor.py"
        script.write_text(FLOOR)
        wall, w0, w1 = _wall([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc-per-node={nproc}", str(script)], env={"BENCH_PHASES": d})
        t = json.loads((Path(d) / "floor.json").read_text())
    return wall, {"torchrun, python start": t["main"] - w0, "import torch": t["imports"] - t["main"],
                  "gloo init, barrier": t["group"] - t["imports"], "exit": w1 - t["group"]}


def train_s(nproc: int, fork: bool = True) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "sitecustomize.py").write_text(SITE)
        path = os.pathsep.join(filter(None, [d, os.environ.get("PYTHONPATH")]))
        wall, w0, w1 = _wall([sys.executable, "-m", "coursekit.cli", "train", "--strategy",
                              "ddp" if nproc > 1 else "single", "--nproc", str(nproc), "--steps", "1", "--quiet"],
                             env={"PYTHONPATH": path, "BENCH_PHASES": d, "COURSEKIT_LAUNCH_FORK": "1" if fork else "0"})
        marks = json.loads(Path(d, "rank0.json").read_text())
        cli = json.loads(Path(d, "cli.json").read_text())
    return wall, phases(marks, w0, w1, cli["imports"])


ORDER = (("init", "init (process group)"), ("build", "build (model, data)"), ("step", "step"),
         ("final", "final record"), ("teardown", "teardown (close, destroy)"))


def phases(worker: dict, w0: float, w1: float, cli_imports: float) -> dict:
    """Wall seconds per phase of ``coursekit train``: the CLI up to the launch (its imports apart), torchrun up to
    the worker's first line, the worker's imports (all of them), each marked phase less its imports, the exit. A
    worker forked from the agent (``coursekit.launch.agent``): the agent's start, its imports of the run before the
    fork, and the worker's own imports after it."""
    at = {what: (t, imp) for what, t, imp in worker["marks"]}  # the last of each (the last step's)
    out = {"CLI imports": cli_imports, "CLI checks, launch": worker["launch"] - w0 - cli_imports}
    if "fork" in at:
        out["torchrun agent, python start"] = at["main"][0] - worker["launch"]
        out["agent imports the run"] = at["fork"][1]
        out["agent, up to the fork"] = at["fork"][0] - at["main"][0] - at["fork"][1]
        out["worker imports (after the fork)"] = at["teardown"][1] - at["fork"][1]
        prev = at["fork"]
    else:
        out["torchrun, python start"] = at["main"][0] - worker["launch"]
        out["worker imports"] = at["teardown"][1]
        prev = at["main"]
    for what, name in ORDER:
        t, imp = at[what]
        out[name] = (t - prev[0]) - (imp - prev[1])
        prev = at[what]
    out["exit (worker, torchrun, CLI)"] = w1 - at["teardown"][0]
    return out


def pool_s(nproc: int, cells: int = 5) -> tuple[float, float, dict]:
    from coursekit.pool import Pool

    t0 = time.perf_counter()
    pool = Pool(nproc)
    start = time.perf_counter() - t0
    parts = dict(pool._start_s)
    try:
        times = []
        for _ in range(cells):
            t0 = time.perf_counter()
            pool.run("x = torch.ones(4); dist.all_reduce(x); print(x.tolist())", quiet=True)
            times.append(time.perf_counter() - t0)
    finally:
        t0 = time.perf_counter()
        pool.close()
        parts["(close)"] = time.perf_counter() - t0
    return start, statistics.median(times), parts


def _line(name: str, wall: float, parts: dict) -> str:
    rest = wall - sum(v for k, v in parts.items() if not k.startswith("("))
    body = " + ".join(f"{k} {v:.2f}" for k, v in parts.items())
    return f"  {name}: {wall:.2f} s = {body}" + (f" + other {rest:.2f}" if abs(rest) >= 0.005 else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=1, help="repeat each launch, keep the median")
    a = p.parse_args(argv)
    print(f"{'ranks':>5} {'floor s':>8} {'pool start s':>13} {'x floor':>8} {'cell s':>7} {'train 1 step s':>15} "
          f"{'x floor':>8} {'unforked s':>11} {'x floor':>8}")
    where = []
    for n in a.nproc:
        floors = [floor_s(n) for _ in range(a.reps)]
        pools = [pool_s(n) for _ in range(a.reps)]
        trains = [train_s(n) for _ in range(a.reps)]
        unforked = [train_s(n, fork=False) for _ in range(a.reps)]
        fl = statistics.median(r[0] for r in floors)
        start, cell = statistics.median(r[0] for r in pools), statistics.median(r[1] for r in pools)
        tr, un = statistics.median(r[0] for r in trains), statistics.median(r[0] for r in unforked)
        print(f"{n:>5} {fl:8.2f} {start:13.2f} {start / fl:8.2f} {cell:7.3f} {tr:15.2f} {tr / fl:8.2f} {un:11.2f} "
              f"{un / fl:8.2f}")
        where += [f"{n} ranks, where the time goes (s):", _line("floor", *floors[-1]),
                  _line("pool start", pools[-1][0], pools[-1][2]), _line("train --steps 1", *trains[-1]),
                  _line("train --steps 1, a fresh interpreter per worker", *unforked[-1])]
    print("\n".join(where))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
