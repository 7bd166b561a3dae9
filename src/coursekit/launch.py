"""The one launcher: run a module or script under torchrun as a subprocess and gather per-rank JSON results.

    res = launch("coursekit.train", ["--strategy", "ddp", "--steps", "3"], nproc=2, timeout=120)
    res.results[1]["final"]          # what rank 1 passed to report()

How it works
  * ``sys.executable -c AGENT``: torchrun's main (so it works from a notebook kernel whose PATH lacks the venv),
    whose process leaves without its interpreter's teardown once the job succeeded,
    ``--standalone`` (the agent binds a free port itself), ``--tee 3`` so every worker line comes back and
    is re-prefixed ``[rank N]``; per-rank logs also land in a private temporary folder. On CPU a target that can
    be preloaded (``coursekit.train``) runs in workers forked from the agent once it imported the run (``agent``).
  * Workers call ``report(obj)``; it writes ``$COURSEKIT_RESULTS_DIR/rank-<RANK>.json``. The launcher reads the
    files back into ``LaunchResult.results`` (a list indexed by rank).
  * Timeout or failure: SIGTERM to the agent and every descendant it started (torchrun puts workers in their own
    sessions, so a process-group kill would miss them), then SIGKILL whatever is left after a grace period. No
    orphan survives; ``LaunchError`` carries the failing rank and its traceback.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RESULTS_ENV = "COURSEKIT_RESULTS_DIR"
# Every process of a launch carries STAMP_ENV=<owner>, so leftovers can be found even after they are re-parented.
# The owner is inherited: OWNER_ENV if the caller's environment names one (the test suite sets it to its own pid,
# so jobs started through a CLI subprocess or a notebook kernel are stamped with it too), else the stamp this
# process itself carries (a launch from inside a launched job), else this process's pid.
STAMP_ENV, OWNER_ENV = "COURSEKIT_LAUNCHED_BY", "COURSEKIT_LAUNCH_OWNER"


def launch_stamp() -> str:
    """The owner stamped into every process a launch from here starts (see STAMP_ENV above)."""
    return os.environ.get(OWNER_ENV) or os.environ.get(STAMP_ENV) or str(os.getpid())


def stamped_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with the launch stamp: every process the library starts carries it, so a
    test's orphan check (tests/conftest.py) sees whatever is left behind, whichever path started it."""
    return {**(os.environ if env is None else env), STAMP_ENV: launch_stamp()}


LAUNCH_ID_ENV = "COURSEKIT_LAUNCH_ID"  # one launch's own mark: its leftovers, not a concurrent launch's processes


def reap(launch_id: str, grace_s: float = 5.0) -> list[int]:
    """Stop every live process of one launch (its environment carries ``launch_id``): a worker's child that outlived
    it and was re-parented, whatever session it is in. The pids stopped."""
    me, left = os.getpid(), []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != me and p.status() != psutil.STATUS_ZOMBIE and p.environ().get(LAUNCH_ID_ENV) == launch_id:
                left.append(p)
        except (OSError, psutil.Error):
            pass
    for p in left:
        kill_tree(p, grace_s=grace_s)
    return [p.pid for p in left]


_PREFIX = re.compile(r"^\[default(\d+)\]:")


class LaunchError(RuntimeError):
    """A launched job failed or timed out. ``rank`` is the first failing rank (or None), ``log`` the whole output."""

    def __init__(self, message: str, *, rank: int | None = None, traceback: str = "", log: str = "",
                 returncode: int | None = None, timed_out: bool = False):
        super().__init__(message)
        self.rank, self.traceback, self.log = rank, traceback, log
        self.returncode, self.timed_out = returncode, timed_out


@dataclass
class LaunchResult:
    results: list  # per rank: the object the rank passed to report(), or None
    returncode: int
    elapsed_s: float
    log: str = field(repr=False, default="")

    def __getitem__(self, rank: int):
        return self.results[rank]

    def __len__(self) -> int:
        return len(self.results)


def report(obj, rank: int | None = None) -> None:
    """Worker side: record this rank's JSON-able result (the last call wins). A no-op outside a launch."""
    out = os.environ.get(RESULTS_ENV)
    if not out:
        return
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0))) if rank is None else rank
    path = Path(out) / f"rank-{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, default=_jsonable))
    os.replace(tmp, path)  # atomic: a reader never sees half a file


def finish(rc: int = 0):
    """A launched worker's last line, once its results are reported and its process group destroyed: leave at once.

    Python's finalization of a process that imported torch, transformers and datasets takes ~1.8 s here (modules
    and millions of objects torn down one by one), longer than most of the course's CPU runs train; the launcher
    waits for the slowest worker, so every launch paid it. Outside a launch, under ``--diagnose``'s wrapper (whose
    exit dump runs after the target returns), or while the worker still has child processes (DCP's async process,
    inductor's compile workers: their atexit hooks stop them), this is a plain ``sys.exit``."""
    # a worker the agent forked (``agent``) hands its exit to torchrun's wrapper, which leaves without teardown
    if (os.environ.get(RESULTS_ENV) and not os.environ.get("COURSEKIT_FR_DIR") and not multiprocessing.parent_process()
            and not psutil.Process().children(recursive=True)):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc or 0)
    sys.exit(rc)


def _jsonable(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def default_nproc() -> int:
    """GPUs present (unless COURSEKIT_DEVICE=cpu), else 2."""
    if os.environ.get("COURSEKIT_DEVICE", "").lower() != "cpu":
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.device_count()
        except ImportError:
            pass
    return 2


def _die_with_parent(parent: int):
    """A ``preexec_fn``: the child gets SIGTERM when the process that launched it dies, however it dies (SIGKILL
    included; Linux's PR_SET_PDEATHSIG). torchrun then stops its workers as on any SIGTERM, so no process of a
    launch outlives the command (or notebook kernel) that started it. Elsewhere: nothing (the timeout and the
    handlers for SIGTERM / Ctrl-C still stop the job)."""
    def arm():
        if not sys.platform.startswith("linux"):
            return
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
    return arm


def kill_tree(proc: psutil.Process | int, grace_s: float = 5.0) -> None:
    """Terminate a process and all its descendants (found before the first signal), then kill the stragglers."""
    try:
        root = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


# a rank whose traceback matches this died because a peer went away: a consequence, not the cause
_SECONDARY = re.compile(r"Connection closed by peer|Connection reset by peer|DistBackendError|DistNetworkError|"
                        r"Broken pipe|SignalException|got signal")


def _first_failure(log: str, logdir: Path) -> tuple[int | None, str]:
    """Which rank failed first and that rank's last traceback.

    Among ranks whose log holds a traceback, a primary error (not a lost peer) beats a secondary one, and an
    earlier last write beats a later one; torchrun's own 'Root Cause' (order in which it saw exits) comes last.
    """
    per_rank: dict[int, tuple[str, float]] = {}
    for f in logdir.rglob("stderr.log"):
        try:
            per_rank[int(f.parent.name)] = (f.read_text(errors="replace"), f.stat().st_mtime)
        except ValueError:
            continue
    for f in logdir.rglob("error.json"):  # a forked worker's (``agent``): torchrun's wrapper wrote its traceback here
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            stack = json.loads(f.read_text())["message"]["extraInfo"]["py_callstack"]
            r, tb = int(f.parent.name), _frames_of_the_job(stack)
            per_rank[r] = (per_rank.get(r, ("", 0))[0] + "\n" + tb, f.stat().st_mtime)
    failed = [r for r, (text, _) in per_rank.items() if "Traceback" in text]
    m = re.search(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", log, re.S)
    rank = int(m.group(1)) if m else None
    if failed:
        best = min(failed, key=lambda r: (bool(_SECONDARY.search(per_rank[r][0])), per_rank[r][1]))
        # only lost-peer tracebacks: the rank that really failed exited without one (sys.exit, os._exit, a
        # signal); torchrun's summary lists it with its exit code (a code of its own before a signal's)
        quiet = sorted((int(c) < 0, int(r)) for r, c in re.findall(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)",
                                                              log) if int(c) != 0 and int(r) not in failed)
        rank = quiet[0][1] if quiet and _SECONDARY.search(per_rank[best][0]) else best
    text = per_rank.get(rank, ("", 0))[0] if rank is not None else ""
    if "Traceback" not in text:  # logs not written (early crash): search the combined output
        text = "\n".join(_PREFIX.sub("", ln) for ln in log.splitlines()
                         if rank is None or ln.startswith(f"[rank {rank}]"))
    k = text.rfind("Traceback (most recent call last)")
    return rank, (text[k:].strip() if k >= 0 else text.strip()[-4000:])


_WRAPPER_FRAME = re.compile(r'  File "(<frozen runpy>|[^"]*/torch/distributed/(run\.py|elastic/)[^"]*)"')


def _frames_of_the_job(tb: str) -> str:
    """A traceback without the frames of torchrun's wrapper and runpy that run a forked worker's script (the last
    frame, which carries the exception's lines, always stays)."""
    head, _, rest = tb.partition("\n")
    frames = [f for f in re.split(r"(?m)^(?=  File )", rest) if f]
    return head + "\n" + "".join([f for f in frames[:-1] if not _WRAPPER_FRAME.match(f)] + frames[-1:])


def _sigterm_raises():
    """While a job runs, SIGTERM to this (main-thread) caller raises SystemExit, so the clean-up above stops the
    job's whole tree instead of orphaning it. Returns the function that puts the old handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, old)


def launch(target: str, args=(), *, nproc: int | None = None, timeout: float | None = None,
           env: dict | None = None, cwd: str | None = None, stream: bool = True, max_restarts: int = 0,
           torchrun_args=(), check: bool = True, sandbox=None, on_line=None, diagnose=None) -> LaunchResult:
    """Run ``target`` (a module name like ``coursekit.train`` or a path to a ``.py`` file) on ``nproc`` processes.

    ``timeout`` seconds (default $COURSEKIT_LAUNCH_TIMEOUT or 600) bounds the whole job. ``stream`` prints worker
    lines live, prefixed ``[rank N]``. With ``check`` a failure raises LaunchError; else the result is returned with
    its return code. ``max_restarts`` > 0 lets torchrun restart failed workers (elastic recovery).
    ``sandbox`` (a ``coursekit.course.isolation.Isolation``) runs the whole job in a fresh sandbox (grading).
    ``diagnose`` (a folder) runs each worker under ``coursekit.profiling.frwrap``, which writes its flight-recorder
    dump there; on a timeout every worker is asked to dump before it is stopped (``coursekit.profiling.hangs``).
    """
    nproc = default_nproc() if nproc is None else int(nproc)
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    timeout = float(timeout if timeout is not None else os.environ.get("COURSEKIT_LAUNCH_TIMEOUT", 600))
    target = str(target)
    is_script = target.endswith(".py") or os.sep in target
    if is_script and not Path(target).is_file():
        raise FileNotFoundError(f"no such script: {target}")
    work = Path(tempfile.mkdtemp(prefix="coursekit-launch-"))
    results_dir, logdir = work / "results", work / "logs"
    results_dir.mkdir()
    cmd, full_env = _torchrun(target, is_script, args, nproc=nproc, max_restarts=max_restarts, logdir=logdir,
                              results_dir=results_dir, torchrun_args=torchrun_args, diagnose=diagnose, env=env)
    t0 = time.monotonic()
    if sandbox is not None and sandbox.on:  # the job's user writes its results and logs here, reads the script
        os.chmod(work, 0o1777)
        os.chmod(results_dir, 0o1777)
        cmd = sandbox.wrap(cmd, rw=[work], ro=[Path(target).parent] if is_script else [], env=full_env)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=full_env, cwd=cwd, text=True, errors="replace", start_new_session=True,
                            preexec_fn=_die_with_parent(os.getpid()))
    say = notebook_progress(target, args, nproc) if not stream else None  # a quiet launch in a notebook: 2 lines
    lines, timed_out = _supervise(proc, timeout=timeout, stream=stream, on_line=on_line, diagnose=diagnose,
                                  launch_id=full_env[LAUNCH_ID_ENV])
    elapsed = time.monotonic() - t0
    if say:
        say(f"done in {elapsed:.1f} s" if proc.returncode == 0 and not timed_out else f"failed after {elapsed:.1f} s")
    try:
        return _outcome(target, proc, "\n".join(lines), results_dir, logdir, nproc=nproc, timeout=timeout,
                        timed_out=timed_out, check=check, elapsed=elapsed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _in_kernel() -> bool:
    """A notebook kernel runs this process (ipykernel merely imported, as ipyparallel's client does, is not one)."""
    app = sys.modules.get("ipykernel.kernelapp")
    return app is not None and app.IPKernelApp.initialized()


def notebook_progress(target: str, args, nproc: int, *, by: str = "launch", ranks: str = "rank(s)"):
    """In a notebook kernel (ipykernel loaded): print that a quiet launch starts, and return how to say it ended,
    so a cell that launches several jobs shows one line per run as it goes. None elsewhere (tests, CLIs) and under
    grading (``COURSEKIT_PROGRESS=0``, set by ``coursekit.course.grading``: a graded cell's output is the lab's)."""
    if not _in_kernel() or os.environ.get("COURSEKIT_PROGRESS") == "0":
        return None
    what = Path(target).name if target.endswith(".py") else target
    a = [str(x) for x in args]
    flags = "".join(f" {a[i]} {a[i + 1]}" for i in range(len(a) - 1)
                    if a[i] in ("--strategy", "--tp", "--pp", "--cp", "--ep", "--dp-replicate", "--dp-shard"))
    print(f"[{by}] {what} on {nproc} {ranks}{flags} …", flush=True)
    return lambda text: print(f"[{by}] {what}: {text}", flush=True)


# torchrun's agent (``torch.distributed.run``'s main) that leaves at once when the job succeeded: its interpreter
# imported torch, and tearing it down after the job is over cost every launch ~0.5 s on 2 CPU cores (the workers
# skip theirs: ``finish``). A failure raises as under ``-m torch.distributed.run`` (its summary, exit code 1).
AGENT = "from coursekit.launch import agent; agent()"
FORK_ENV = "COURSEKIT_LAUNCH_FORK"  # "0": every worker its own interpreter, even where the target could be forked
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")  # an NVIDIA or AMD (ROCm) GPU node: workers are never forked there


def agent(argv=None) -> None:
    """torchrun's main in this process, then ``os._exit(0)`` once the job succeeded (see AGENT).

    A module target whose package defines ``preload(args)`` (``coursekit.train``) on CPU: the agent imports what the
    run needs once (torch, transformers, the model's modules) and torchrun forks the workers from it
    (``--run-path --start-method fork``: torchrun's own way to run a script in forked workers, here the package's
    ``__main__.py``), so no worker starts an interpreter or imports torch itself (~2/3 of a small run's wall time on
    2 cores). Not on a GPU node (a process must not fork after the driver is touched, and the workers are
    separate interpreters there as ever), not under ``$COURSEKIT_LAUNCH_FORK=0``, not when the command already
    names a start method, nor when ``preload`` fails (the workers then meet the error in their own interpreters)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = _forking(argv)
    from torch.distributed.run import main

    main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _forking(argv: list) -> list:
    """The torchrun argv for forked workers of a preloaded target (see ``agent``), or ``argv`` as it is."""
    if (os.environ.get(FORK_ENV) == "0" or "-m" not in argv or {"--start-method", "--run-path", "-r"} & set(argv)
            or (os.environ.get("COURSEKIT_DEVICE", "").lower() != "cpu" and any(map(os.path.exists, GPU_DEVICES)))):
        return argv
    i = argv.index("-m")
    target, args = argv[i + 1], argv[i + 2:]
    try:
        preload = getattr(importlib.import_module(target), "preload", None)
        main = importlib.util.find_spec(f"{target}.__main__") if preload else None
    except ImportError:  # torchrun reports it, as for any target
        return argv
    if main is None or not main.origin:
        return argv
    try:
        preload(args)
    except Exception:  # noqa: BLE001 - whatever failed, the workers meet it in their own interpreters and say so
        return argv
    os.register_at_fork(after_in_child=_fresh_signals)
    return [*argv[:i], "--run-path", "--start-method", "fork", main.origin, *args]


def _fresh_signals() -> None:
    """A forked worker's signals as a fresh interpreter has them: torchrun's agent handles SIGTERM, SIGINT, SIGHUP
    and SIGQUIT by raising an exception (its way to stop its own loop), which a worker would inherit."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _torchrun(target: str, is_script: bool, args, *, nproc: int, max_restarts: int, logdir: Path, results_dir: Path,
              torchrun_args, diagnose, env) -> tuple[list[str], dict]:
    """The torchrun command line and the workers' environment."""
    # --standalone: c10d rendezvous on localhost:0, so the OS hands the agent a free port atomically (a port picked
    # here and released would race with a concurrent launch) and every launch has its own run id.
    cmd = [sys.executable, "-c", AGENT, "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", str(max_restarts),
           "--tee", "3", "--log-dir", str(logdir), *map(str, torchrun_args)]
    if diagnose:  # the wrapper runs the target and dumps the flight recorder on demand
        cmd += ["-m", "coursekit.profiling.frwrap"]
        env = {"COURSEKIT_FR_DIR": str(diagnose), "TORCH_FR_BUFFER_SIZE": "2000", **(env or {})}
    cmd += [target] if is_script else ["-m", target]
    cmd += [str(a) for a in args]
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                "PYTHONUNBUFFERED": "1", RESULTS_ENV: str(results_dir), "COURSEKIT_LAUNCH_T0": repr(time.time()),
                STAMP_ENV: launch_stamp(), LAUNCH_ID_ENV: secrets.token_hex(8),
                **(env or {})}
    if max_restarts:
        # restarted gloo workers otherwise read the previous attempt's addresses from the shared store
        full_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return cmd, full_env


def _supervise(proc, *, timeout: float, stream: bool, on_line, diagnose, launch_id: str = "") -> tuple[list[str], bool]:
    """Pump the job's output (labelled per rank) until it ends or times out; on a timeout (after asking each worker
    for its flight-recorder dump when diagnosing) and on any interruption, kill the whole process tree."""
    lines: list[str] = []

    def pump():
        for raw in proc.stdout:
            line = _PREFIX.sub(lambda m: f"[rank {m.group(1)}] ", raw.rstrip("\n"))
            lines.append(line)
            if on_line is not None and on_line(line):
                continue
            if stream:
                print(line, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    restore = _sigterm_raises()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:  # KeyboardInterrupt in a notebook, SIGTERM to the caller: leave nothing behind
        kill_tree(proc.pid)
        raise
    finally:
        restore()
        if timed_out:
            if diagnose:
                request_dumps(diagnose)
            kill_tree(proc.pid)
        proc.wait()
        if launch_id:  # on success too: a worker's child that outlived it (re-parented, any session)
            reap(launch_id)
        reader.join(timeout=10)
    return lines, timed_out


def _outcome(target: str, proc, log: str, results_dir: Path, logdir: Path, *, nproc: int, timeout: float,
             timed_out: bool, check: bool, elapsed: float) -> LaunchResult:
    """Every rank's reported result; a LaunchError naming the first failing rank (or the timeout) when ``check``."""
    results = []
    for r in range(nproc):
        f = results_dir / f"rank-{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else None)
    if timed_out or proc.returncode != 0:
        rank, tb = _first_failure(log, logdir) if not timed_out else (None, "")
        if timed_out:
            msg = f"{target} timed out after {timeout:.0f}s on {nproc} processes; all processes were stopped"
        else:
            where = f"rank {rank}" if rank is not None else "a rank"
            msg = f"{target} failed on {where} (exit code {proc.returncode}):\n{tb or log[-3000:]}"
        if check:
            raise LaunchError(msg, rank=rank, traceback=tb, log=log, returncode=proc.returncode, timed_out=timed_out)
    return LaunchResult(results=results, returncode=proc.returncode, elapsed_s=elapsed, log=log)


def launch_code(code: str, args=(), **kw) -> LaunchResult:
    """Write ``code`` to a temporary script and launch it (for notebook cells that define a distributed function)."""
    with tempfile.TemporaryDirectory(prefix="coursekit-code-") as d:
        path = Path(d) / "job.py"
        path.write_text(code)
        if kw.get("sandbox") is not None:
            os.chmod(d, 0o755)  # readable by the sandbox's user
        return launch(str(path), args, **kw)


# -- hang diagnosis: the launcher asks each worker for a flight-recorder dump before it kills a job that timed out
def sidecars(folder) -> dict[int, dict]:
    out = {}
    for f in Path(folder).glob("fr_trace_*.json"):
        with contextlib.suppress(ValueError, OSError):
            side = json.loads(f.read_text())
            out[int(side["rank"])] = side
    return out


def request_dumps(folder, wait_s: float = 5.0) -> list[int]:
    """SIGUSR1 to every live worker of ``folder``'s job (the flight-recorder wrapper, ``coursekit.profiling.frwrap``,
    writes a sidecar ``fr_trace_<rank>.json`` with its pid and dumps); wait until each has written a fresh dump.
    Returns the ranks asked."""
    t0, asked = time.time(), []
    for rank, side in sidecars(folder).items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(side["pid"]), signal.SIGUSR1)
            asked.append(rank)
    while time.time() - t0 < wait_s:
        fresh = {r for r, s in sidecars(folder).items() if s["dumps"] and s["dumps"][-1]["time"] >= t0}
        if fresh >= set(asked):
            break
        time.sleep(0.1)
    return sorted(asked)
