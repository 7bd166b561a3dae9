"""Run a script so that its flight recorder can be dumped on demand (``coursekit launch --diagnose`` uses it).

    torchrun ... -m coursekit.profiling.frwrap SCRIPT.py [ARGS]
    torchrun ... -m coursekit.profiling.frwrap -m MODULE [ARGS]

NCCL writes its flight recorder to a file when a collective times out; gloo records the same entries
(``TORCH_FR_BUFFER_SIZE``) but never writes them. This wrapper runs the script as ``__main__`` and writes
``$COURSEKIT_FR_DIR/fr_trace_<rank>.pkl`` (``torch._C._distributed_c10d._dump_fr_trace()``, the pickle torch's
analyser reads; at once without the collectives' stacks, then with them: the first such dump is slow, so a thread
pays that once in the background as soon as a collective is recorded) plus ``fr_trace_<rank>.json`` (why and
when it dumped, the main thread's Python stack at that moment, this rank's live process groups) whenever
  * it receives SIGUSR1 -- the launcher sends it to every worker when the job hangs. A thread waits for the signal
    (``sigwait``), so a dump happens even while the main thread is blocked inside a collective;
  * it receives SIGTERM (torchrun stopping the survivors after one rank failed): dump, then exit with 143;
  * the script raises, or ends;
  * with ``$COURSEKIT_FR_PG_TIMEOUT`` set: every process group the script creates gets that timeout (seconds), so a
    hang becomes an error after seconds, not after torch's default 30 minutes; and a watchdog thread ends the rank
    (exit 124, after a dump) whose main thread has waited in one collective 5 s longer than that, since gloo's
    timeout does not fire when all ranks are present but disagree on sizes.
"""
from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

DIR_ENV, TIMEOUT_ENV = "COURSEKIT_FR_DIR", "COURSEKIT_FR_PG_TIMEOUT"
_lock = threading.Lock()
_history: list[dict] = []
_MAIN = threading.main_thread().ident
_seen_groups: dict = {}


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def _groups() -> dict:
    """{pg name: {desc, ranks}} of the live process groups (the repair of the dump's pg_config uses them)."""
    try:
        from torch.distributed import distributed_c10d as c10d

        w = c10d._world
        return {str(name): {"desc": pg.group_desc, "ranks": sorted(w.pg_group_ranks[pg])}
                for pg, name in w.pg_names.items()}
    except Exception:  # no process group yet, or torch internals moved: the repair falls back on the entries
        return {}


def _write_side(out: Path) -> None:
    side = {"rank": _rank(), "world_size": int(os.environ.get("WORLD_SIZE", 1)), "pid": os.getpid(),
            "groups": _groups() or _seen_groups, "dumps": _history}  # destroyed groups: as seen when made
    tmp = out / f".fr_trace_{_rank()}.json.tmp"
    tmp.write_text(json.dumps(side, default=str))
    os.replace(tmp, out / f"fr_trace_{_rank()}.json")


def dump(reason: str, error: str | None = None, tb=None) -> None:
    """Write this rank's flight-recorder pickle and its sidecar (the sidecar keeps every dump's reason).

    The sidecar's ``stack``: where the main thread was (a signal), or where the exception came from (``tb``)."""
    out = Path(os.environ[DIR_ENV])
    with _lock:
        frame = sys._current_frames().get(_MAIN) if reason in ("signal", "terminated", "stuck") else None
        frames = traceback.extract_stack(frame) if frame else traceback.extract_tb(tb) if tb else []
        stack = [f"{f.filename}:{f.lineno} in {f.name}: {f.line or ''}".strip() for f in frames
                 if "frozen runpy" not in f.filename and not f.filename.endswith("frwrap.py")]
        torch = sys.modules.get("torch")  # never import it here: the main thread may hold the import lock
        try:  # first without the collectives' stacks: instant, so a dump is on disk whatever comes next
            blob = torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=_warm.is_set())
        except Exception as e:  # torch not imported (yet) by the script, or no recorder: say so in the sidecar
            blob, error = None, (error or "") + f" [no flight-recorder dump: {e!r}]"
        if blob is not None:
            _write_pkl(out, blob)
        _history.append({"reason": reason, "time": time.time(), "error": error, "stack": stack[-12:],
                         "stacks": _warm.is_set()})
        _write_side(out)
        if blob is not None and not _warm.is_set():  # then with them (slow the first time, see _warm_up)
            _write_pkl(out, torch._C._distributed_c10d._dump_fr_trace())
            _warm.set()
            _history[-1]["stacks"] = True
            _write_side(out)


def _write_pkl(out: Path, blob: bytes) -> None:
    tmp = out / f".fr_trace_{_rank()}.tmp"
    tmp.write_bytes(blob)
    os.replace(tmp, out / f"fr_trace_{_rank()}.pkl")


_warm = threading.Event()


def _warm_up() -> None:
    """The first dump that includes the collectives' stacks initialises torch's symbolizer: 5-20 s of CPU on a loaded
    2-core machine (later dumps take microseconds). Pay it in the background once the recorder holds an entry, not
    when the launcher asks for a dump and waits 5 s before it stops the job. The call releases the GIL."""
    import pickle

    while not _warm.is_set():
        time.sleep(0.5)
        try:
            c10d = sys.modules["torch"]._C._distributed_c10d
            if pickle.loads(c10d._dump_fr_trace(includeStackTraces=False)).get("entries"):
                c10d._dump_fr_trace()
                _warm.set()
        except Exception:  # torch not (fully) imported yet, or no process group: try again
            continue


def _signal_thread() -> None:
    while True:
        sig = signal.sigwait({signal.SIGUSR1, signal.SIGTERM})
        dump("signal" if sig == signal.SIGUSR1 else "terminated")
        if sig == signal.SIGTERM:
            os._exit(128 + signal.SIGTERM)


def _c10d_frame():
    """The innermost torch.distributed.distributed_c10d frame of the main thread (it is inside a collective)."""
    f = sys._current_frames().get(_MAIN)
    while f is not None and not f.f_code.co_filename.endswith("distributed_c10d.py"):
        f = f.f_back
    return f


def _watchdog(limit_s: float) -> None:
    """NCCL's watchdog, for gloo: a collective waited on longer than ``limit_s`` ends the rank, after a dump.

    gloo's own timeout fires while it waits for a peer that is absent, but not when the peers are there and
    disagree about sizes (each waits for bytes that never come): without this, such a job hangs until killed."""
    import pickle

    while True:
        time.sleep(1.0)
        f = _c10d_frame()
        if f is None:
            continue
        entries = pickle.loads(sys.modules["torch"]._C._distributed_c10d._dump_fr_trace()).get("entries") or []
        age = (time.time_ns() - entries[-1]["time_created_ns"]) / 1e9 if entries else 0.0
        if age > limit_s and _c10d_frame() is f:
            dump("stuck", f"in {f.f_code.co_name} for {age:.0f} s, past the group timeout; this rank exits")
            os._exit(124)


def _short_timeouts(seconds: float) -> None:
    """Every init_process_group/new_group gets ``seconds`` as its timeout (a shorter explicit one is kept)."""
    import datetime

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    limit = datetime.timedelta(seconds=seconds)
    c10d.default_pg_timeout = limit

    def wrap(fn):
        def inner(*a, **kw):
            kw["timeout"] = min(kw.get("timeout") or limit, limit)
            pg = fn(*a, **kw)
            _seen_groups.update(_groups())
            return pg

        return inner

    dist.init_process_group = c10d.init_process_group = wrap(c10d.init_process_group)
    dist.new_group = c10d.new_group = wrap(c10d.new_group)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    out = Path(os.environ.setdefault(DIR_ENV, os.getcwd()))
    out.mkdir(parents=True, exist_ok=True)
    # block the two signals in this thread before any other starts (threads inherit the mask), then wait for
    # them in one thread of our own; children made by fork get the signals back
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
    os.register_at_fork(after_in_child=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK,
                                                                       {signal.SIGUSR1, signal.SIGTERM}))
    threading.Thread(target=_signal_thread, name="coursekit-frwrap", daemon=True).start()
    _write_side(out)  # the launcher finds this worker's pid here
    threading.Thread(target=_warm_up, name="coursekit-frwarm", daemon=True).start()
    if os.environ.get(TIMEOUT_ENV):
        limit = float(os.environ[TIMEOUT_ENV])
        _short_timeouts(limit)
        threading.Thread(target=_watchdog, args=(limit + 5,), name="coursekit-frwatch", daemon=True).start()
    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    sys.argv = [target] + args
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(target).resolve().parent))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        dump("exit" if e.code in (None, 0) else "exception", None if e.code in (None, 0) else f"exit {e.code}")
        raise
    except BaseException as e:
        dump("exception", f"{type(e).__name__}: {e}", e.__traceback__)
        raise
    dump("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
