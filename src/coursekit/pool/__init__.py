"""Persistent ranks for notebooks: N processes with one process group, started once and kept across cells.

    from coursekit.pool import Pool
    pool = Pool(2)                                  # 2 ranks, gloo on CPU (NCCL, one GPU per rank, on a GPU node)
    pool.run("import torch; x = torch.ones(4) * (rank + 1)")       # on every rank; x stays there
    pool.run("dist.all_reduce(x); print(x.tolist())")              # a later cell uses it: [rank 0] [3.0, ...]
    pool.run(fn, *args)                             # fn(*args) on every rank: the list of results, by rank
    pool.train("--strategy", "fsdp2", "--steps", "2")  # coursekit train on these ranks: every rank's record
    pool.probe("coursekit.tp.probe", "--tp", "2")      # a lab probe's run(argv) (and coursekit.pool.live.Job)
    pool.magics()                                   # then %%ranks as a cell magic: the cell on every rank
    pool.interrupt()                                # KeyboardInterrupt in every rank's running cell (state kept)
    pool.restart(); pool.resize(4); pool.close()    # fresh ranks (state gone); another size; stop (also at exit)

Inside a Slurm allocation (``SLURM_JOB_ID`` set, ``salloc -N 2 ...`` then ``coursekit lab``) the ranks are the tasks
of one ``srun`` step on the allocation's nodes, rank = SLURM_PROCID (``coursekit.pool.slurm``); ``slurm=False``
keeps them local.

Each rank is an ipyparallel engine (a kernel of its own); ``rank``, ``world_size``, ``device``, ``torch`` and
``dist`` (torch.distributed, initialised) are defined in it. A cell's output comes back labelled by rank. An
exception on any rank raises :class:`RankError` with each failing rank's traceback, the cell's own frames first, and
the pool stays usable. The notebook's interrupt (or ``interrupt()``, from another thread) stops a running cell on
every rank (SIGINT: ``KeyboardInterrupt`` in each rank's cell; ``run`` raises it, or ``RankError`` under
``interrupt()``); the ranks and their state stay. A cell that does not finish within ``timeout`` seconds (a
collective one rank never joins) raises ``TimeoutError`` naming the ranks still running, with the flight-recorder
diagnosis Module 5 teaches (``coursekit.profiling.hangs``: every rank dumps its recorder on request, from a thread
of its own, so a rank blocked in a collective dumps too, and sends it back over a socket, from any node: ``coursekit.
pool.dumps``; the error says which collective which ranks never reached),
and the pool is restarted: a rank stuck inside a collective cannot be interrupted, only replaced. Every process
carries the launch stamp (``coursekit.launch.stamped_env``), so the test suite's orphan guard sees them, and
``close`` stops what is left; a kernel killed without ``close`` leaves nothing either (``coursekit.pool.watchdog``).

Why ipyparallel (9.x): a maintained project (Jupyter), engines that are real kernels (state across cells, rich
output), a controller that routes one cell to all engines in milliseconds, per-engine errors (``CompositeError``)
and a signal/stop API. nbdistributed and jupyter-distributed (0.1) do the same on top of plain ZMQ/torchrun but are
single-author 0.1 releases; starting ranks with torchrun per cell is what this module avoids.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from coursekit.pool import dumps as pool_dumps, slurm as pool_slurm
from coursekit.pool.output import Echo, traceback_of, until_done
from coursekit.dist import free_port
from coursekit.launch import LAUNCH_ID_ENV, notebook_progress, reap, stamped_env
from coursekit.profiling import frwrap, hangs  # light: no torch at import


class RankError(RuntimeError):
    """A cell raised on one or more ranks: ``failures`` maps rank -> that rank's traceback (text)."""

    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        ranks = ", ".join(map(str, sorted(failures)))
        body = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items()))
        super().__init__(f"the cell failed on rank(s) {ranks}\n{body}")


def init_rank(rank: int, world: int, port: int, device: str, addr: str = "127.0.0.1",
              local_rank: int | None = None) -> str:
    """Runs in each engine (``Pool`` calls it): this rank's device and its process group; returns the device."""
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device((rank if local_rank is None else local_rank) % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    return device


_SETUP = """import os
os.environ.update(RANK="{rank}", WORLD_SIZE="{world}", LOCAL_RANK="{local_rank}", MASTER_ADDR={addr!r},
                  MASTER_PORT="{port}")  # as torchrun's; the flight recorder's dumps are named by rank
import torch
import torch.distributed as dist
from coursekit.pool import init_rank as _init_rank
from coursekit.pool.dumps import serve as _serve_dumps
rank, world_size = {rank}, {world}
device = _init_rank(rank, world_size, {port}, {device!r}, {addr!r}, {local_rank!r})
_serve_dumps({dump_host!r}, {dump_port}, rank)
"""
FR_WAIT_S = 10.0  # how long a hang's diagnosis waits for every rank's dump
# ipyparallel for a pool (2 engines up 6.5 -> 1.9 s, close 6.4 -> 0.2 s here): an engine joins at a heartbeat (3 s by
# default; the same 30 s of misses), and its nanny (unused) outlived it, so close() waited out reap's SIGTERM grace
HEARTBEAT = ["--HeartMonitor.period=200", "--HeartMonitor.max_heartmonitor_misses=150"]
NO_NANNY = ["--IPEngine.enable_nanny=False"]
INTERRUPT_WAIT_S = 5.0  # how long an interrupted run waits for every rank's cell to stop


class Pool:
    def __init__(self, n: int = 2, *, timeout: float = 60.0, start_timeout: float = 120.0,
                 device: str | None = None, slurm: bool | None = None):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"a pool needs a whole number of ranks >= 1, got {n!r}")
        self.n, self.timeout, self.start_timeout = n, timeout, start_timeout
        self.device = device or os.environ.get("COURSEKIT_DEVICE") or ("cuda" if _has_cuda() else "cpu")
        self.slurm = pool_slurm.in_allocation() if slurm is None else slurm  # ranks = tasks of an srun step
        self.step = None  # that step, JOBID.STEPID
        self._cluster = self._client = self._keeper = None
        atexit.register(self.close)
        self._start()

    # -- life cycle ------------------------------------------------------------------------------------------------
    def _start(self) -> None:
        import ipyparallel as ipp
        from traitlets.config import Config

        t0 = time.monotonic()
        self._launch_id = uuid.uuid4().hex
        self._fr = tempfile.mkdtemp(prefix="coursekit-pool-fr-")
        saved = dict(os.environ)
        # the engines inherit the launch stamp and the flight recorder's settings (gloo records, never writes)
        os.environ.update(stamped_env({LAUNCH_ID_ENV: self._launch_id}), TORCH_FR_BUFFER_SIZE="2000",
                          **{frwrap.DIR_ENV: self._fr})
        # each rank's flight-recorder dump comes back over a socket (ranks on other nodes too)
        self._dump_host = socket.gethostname() if self.slurm else "127.0.0.1"
        self._dumps = pool_dumps.Collector("0.0.0.0" if self.slurm else "127.0.0.1")
        # if this kernel dies without close() (SIGKILL, a crash), its keeper stops the pool's processes
        self._keeper = subprocess.Popen([sys.executable, "-m", "coursekit.pool.watchdog", self._launch_id,
                                         str(os.getpid())], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        launcher = "SrunEngineSetLauncher" if self.slurm else "LocalEngineSetLauncher"
        options = pool_slurm.CLUSTER_OPTIONS if self.slurm else {"engines": "local"}
        try:
            self._cluster = ipp.Cluster(n=self.n, log_level=40, controller_args=HEARTBEAT, **options,
                                        engine_timeout=int(self.start_timeout),  # ipyparallel's wait: 60 s
                                        config=Config({launcher: {"engine_args": NO_NANNY}}))
            if self.slurm:
                self._client = pool_slurm.start_and_connect(self._cluster)
            else:
                self._client = self._cluster.start_and_connect_sync(activate=False)
            self._client.wait_for_engines(self.n, timeout=self.start_timeout)
            up = time.monotonic()
            self._join_group()
        except BaseException:
            self.close()  # a pool that did not start leaves nothing behind (an srun step waiting for CPUs, say)
            raise
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self._start_s = {"engines up": up - t0, "torch, process group": time.monotonic() - up}  # bench_pool

    def _join_group(self) -> None:
        """Each engine gets its rank; every rank joins the group at once: the cells' names (rank, device, dist)."""
        ids = sorted(self._client.ids)[: self.n]
        port, addr, local_ranks = free_port(), "127.0.0.1", list(range(self.n))
        if self.slurm:  # rank = SLURM_PROCID, the group's store on rank 0's node; signals go to the step
            ids, port, addr, local_ranks, self.step = pool_slurm.place(self._client, self._cluster, ids,
                                                                         self.start_timeout)
        self._engines = {rank: self._client[e] for rank, e in enumerate(ids)}
        self._view = self._client[ids]
        setup = {r: v.execute(_SETUP.format(rank=r, world=self.n, port=port, device=self.device, addr=addr,
                                            local_rank=local_ranks[r], dump_host=self._dump_host,
                                            dump_port=self._dumps.port), block=False)
                 for r, v in self._engines.items()}
        for ar in setup.values():
            ar.get(timeout=self.start_timeout)
        self.devices = {r: d for r, d in zip(self._engines, self._view.pull("device", block=True))}

    def close(self) -> None:
        """Stop every rank (and the controller); idempotent."""
        if self._keeper is None:
            return
        try:
            if self._client is not None:
                self._client.close()
            if self._cluster is not None:
                # a rank's state goes with the pool: SIGKILL spares each engine Python's teardown of torch (~1.5 s)
                self._cluster.signal_engines_sync(signal.SIGKILL)
                self._cluster.stop_cluster_sync()
        finally:
            self._cluster = self._client = None
            reap(self._launch_id)  # the keeper too
            self._keeper.wait(timeout=10)
            self._keeper = None
            self._dumps.close()
            shutil.rmtree(self._fr, ignore_errors=True)

    def interrupt(self) -> None:
        """SIGINT to every rank: its running cell raises ``KeyboardInterrupt`` (a rank inside a collective gets it
        when the collective returns; one that never does needs ``restart``). The ranks and their state stay."""
        if self._cluster is not None:
            self._cluster.signal_engines_sync(signal.SIGINT)  # signal_engines is a coroutine: it must be run

    def restart(self) -> None:
        """Fresh ranks of the same size (every rank's state is gone)."""
        self.close()
        self._start()

    def resize(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"a pool needs a whole number of ranks >= 1, got {n!r}")
        self.close()
        self.n = n
        self._start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- running cells ---------------------------------------------------------------------------------------------
    def run(self, cell, *args, timeout: float | None = None, quiet: bool = False):
        """``cell`` (source text, or a function called with ``args``) on every rank. Source: each rank's output
        printed as it arrives, labelled ``[rank r]`` (unless ``quiet``), returns None; a function: the list of its
        results, by rank."""
        if self._cluster is None:
            raise RuntimeError("this pool is closed: make a new one or call restart()")
        timeout = self.timeout if timeout is None else timeout
        if callable(cell):
            import ipyparallel as ipp

            # the notebook's (or a test's) function sees the rank's names (rank, dist, what earlier cells made);
            # the library's keeps its own module (coursekit.pool.live.train, a probe's run)
            fn = cell if cell.__module__.partition(".")[0] == "coursekit" else ipp.interactive(cell)
            pending = {r: v.apply_async(fn, *args) for r, v in self._engines.items()}
        else:
            code = textwrap.dedent(cell)
            pending = {r: v.execute(code, silent=False, block=False) for r, v in self._engines.items()}
        echo = Echo(pending, quiet=quiet or callable(cell))
        self._wait(pending, timeout, echo)
        failures, out = {}, {}
        for r, ar in pending.items():
            try:
                out[r] = ar.get(0)
            except Exception as e:  # noqa: BLE001 (an engine's error, reported per rank below)
                failures[r] = traceback_of(e)
        if failures:
            raise RankError(failures)
        return [out[r] for r in sorted(out)] if callable(cell) else None

    def train(self, *args, timeout: float | None = None) -> list:
        """``coursekit train ARGS`` on these ranks (``coursekit.pool.live.train``): every rank's record, by rank, as
        ``launch("coursekit.train", ARGS, nproc=n).results`` gives it, without the launch. In a notebook, one line
        when it starts and one when it ends (as a quiet launch)."""
        return self._job("coursekit.train", "train", [], args, timeout)

    def probe(self, module: str, *args, timeout: float | None = None) -> list:
        """A course probe's ``run(ARGS)`` on these ranks (e.g. ``coursekit.tp.probe``): every rank's result."""
        return self._job(module, "probe", [module], args, timeout)

    def _job(self, what: str, entry: str, first: list, args, timeout) -> list:
        from coursekit.pool import live  # the trainer's imports, on the ranks' side; here only the names

        argv = [str(a) for a in args]
        say = notebook_progress(what, argv, self.n, by="pool", ranks="pool rank(s)")
        t0 = time.monotonic()
        try:
            out = self.run(getattr(live, entry), *first, argv, timeout=timeout)
        except BaseException:
            if say:
                say(f"failed after {time.monotonic() - t0:.1f} s")
            raise
        if say:
            say(f"done in {time.monotonic() - t0:.1f} s")
        return out

    def _wait(self, pending: dict, timeout: float, echo) -> None:
        try:
            until_done(pending, timeout, echo.flush)
        except KeyboardInterrupt:  # the notebook's interrupt: every rank's cell gets it too
            self.interrupt()
            until_done(pending, INTERRUPT_WAIT_S)  # a rank aborts a cell sent while it stops one: wait for its end
            raise
        stuck = sorted(r for r, ar in pending.items() if not ar.ready())
        if stuck:
            echo.flush()
            diagnosis = self._diagnose()
            self.restart()
            raise TimeoutError(f"the cell did not finish within {timeout:g} s on rank(s) "
                               f"{', '.join(map(str, stuck))} (a collective some rank never joined?); the pool "
                               f"was restarted with {self.n} fresh ranks\n{diagnosis}")
        for ar in pending.values():
            ar.wait_for_output(timeout=5)
        echo.flush()

    def _diagnose(self) -> str:
        """Every rank's flight-recorder dump, then ``coursekit.profiling.hangs``' reading of them (text)."""
        keep = Path(tempfile.mkdtemp(prefix="coursekit-pool-hang-"))  # outlives the restart, for torchfrtrace
        answered = self._dumps.collect(keep, FR_WAIT_S)
        missing = sorted(set(range(self.n)) - set(answered))
        note = f" (no dump from rank(s) {', '.join(map(str, missing))})" if missing else ""
        try:
            return "flight recorder: " + hangs.summary(hangs.diagnose(keep, world=self.n, timed_out=True)) + note
        except Exception as e:  # noqa: BLE001 (the timeout stands without a diagnosis)
            return f"flight recorder: no diagnosis ({type(e).__name__}: {e}); dumps in {keep}"

    def magics(self) -> None:
        """Register ``%%ranks`` in this IPython session: the cell runs on every rank of this pool."""
        from IPython import get_ipython

        ip = get_ipython()
        if ip is None:
            raise RuntimeError("%%ranks needs an IPython kernel (a notebook)")
        ip.register_magic_function(lambda line, cell: self.run(cell), "cell", "ranks")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
