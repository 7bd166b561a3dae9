"""The pool's ranks as Slurm tasks, when the notebook runs inside an allocation (``coursekit.pool`` uses this).

Inside an allocation (``salloc -N 2 --ntasks-per-node 2``, then ``coursekit lab``: ``SLURM_JOB_ID`` is set and
``srun`` is on PATH) ``Pool(n)`` starts its engines as one job step, ``srun -n n ... python -m ipyparallel.engine``:
one engine per task, placed by Slurm on the allocation's nodes. Each rank's RANK, WORLD_SIZE and LOCAL_RANK are
that task's SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID; MASTER_ADDR is rank 0's node (the step's first node:
Slurm places task 0 there) and MASTER_PORT a port rank 0 found free there. The controller stays in the kernel's
process tree and listens on every interface: engines on other nodes connect to this host's name, which ipyparallel
passes them in ``$IPP_CONNECTION_INFO`` (no shared file system needed). Signals go to the step through ``scancel
--signal`` (srun turns a SIGINT into a status report and cannot forward a SIGKILL), so ``interrupt()`` and
``close()`` reach the ranks on every node, and ``close`` waits for the step's srun to exit: no task outlives the
pool. A hang's flight-recorder dumps come back from every node over a socket to the kernel (``coursekit.pool.
dumps``), so its diagnosis sees every rank.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess

from ipyparallel.cluster.launcher import MPIEngineSetLauncher
from traitlets import List, Unicode

from coursekit.dist import free_port

SCANCEL_TIMEOUT_S = 30.0


def in_allocation(env: dict | None = None) -> bool:
    """True where ``Pool`` starts Slurm tasks: inside an allocation (SLURM_JOB_ID) with srun at hand."""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_ID")) and shutil.which("srun", path=env.get("PATH")) is not None


class SrunEngineSetLauncher(MPIEngineSetLauncher):
    """ipyparallel's mpiexec launcher with srun in place of mpiexec (``srun -n N ... python -m ipyparallel.engine``)
    and without ``--mpi`` (the engines need no mpi4py: the pool reads each task's rank from Slurm's variables).
    ``step`` (``JOBID.STEPID``, set by the pool once the engines are up) makes ``signal`` go through scancel."""

    mpi_cmd = List(["srun"], config=True)
    # --overlap: a kernel started in salloc's interactive step (LaunchParameters=use_interactive_step) holds the
    # allocation's CPUs; without it the pool's step would wait for them forever. --kill-on-bad-exit: one engine
    # that dies ends the step instead of leaving the others waiting for it.
    mpi_args = List(["--overlap", "--kill-on-bad-exit=1", "--unbuffered"], config=True)
    step = Unicode("")

    @property
    def program(self):
        return list(self.engine_cmd)

    def signal(self, sig):
        if self.step and self.state == "running":
            name = signal.Signals(sig).name.removeprefix("SIG")
            subprocess.run(["scancel", "--quiet", f"--signal={name}", self.step], capture_output=True,
                           timeout=SCANCEL_TIMEOUT_S, stdin=subprocess.DEVNULL)
        else:
            super().signal(sig)


def start_and_connect(cluster):
    """The cluster's controller and srun step, and a client once every engine registered (ipyparallel fails at
    once when srun ends first); a failure says what srun said (more tasks than the allocation holds, say)."""
    try:
        return cluster.start_and_connect_sync(activate=False)
    except Exception as e:
        said = "".join(s.get_output()[-3000:] for s in cluster.engines.values()).strip()
        raise RuntimeError(f"the pool's srun step did not start its {cluster.n} engines ({type(e).__name__}: "
                           f"{e}); srun said:\n{said}") from e


# ipyparallel.Cluster's arguments for a pool of Slurm tasks: the controller listens on every interface
CLUSTER_OPTIONS = {"engines": SrunEngineSetLauncher, "controller_ip": "*"}


def task_info() -> dict:
    """Runs in each engine: who this task is in Slurm's eyes (the pool orders its ranks by ``procid``)."""
    env = os.environ
    return {"procid": int(env["SLURM_PROCID"]), "ntasks": int(env["SLURM_NTASKS"]),
            "localid": int(env.get("SLURM_LOCALID", 0)), "job": env.get("SLURM_JOB_ID", ""),
            "step": env.get("SLURM_STEP_ID", ""), "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
            "free_port": free_port()}


def layout(infos: list[dict], n: int) -> dict:
    """From every engine's ``task_info`` (in engine order): the engine index of each rank, each rank's local rank,
    the master's address and port, and the step (``JOBID.STEPID``); refuses a step that is not the pool's n tasks."""
    procids = sorted(i["procid"] for i in infos)
    if procids != list(range(n)) or {i["ntasks"] for i in infos} != {n}:
        raise RuntimeError(f"the pool's srun step should be {n} tasks with SLURM_PROCID 0..{n - 1}, got "
                           f"{[(i['procid'], i['ntasks']) for i in infos]}")
    steps = {f"{i['job']}.{i['step']}" for i in infos}
    if len(steps) != 1:
        raise RuntimeError(f"the pool's engines belong to several Slurm steps: {sorted(steps)}")
    by_rank = sorted(range(len(infos)), key=lambda e: infos[e]["procid"])
    first = infos[by_rank[0]]
    return {"engines": by_rank, "local_ranks": [infos[e]["localid"] for e in by_rank],
            "master_addr": first["node"], "port": first["free_port"], "step": steps.pop()}


def place(client, cluster, ids: list[int], timeout: float):
    """The engines ``ids`` ordered by rank (SLURM_PROCID), the group's port and address (rank 0's node), each
    rank's local rank and the step, which the engine sets' signals then go to."""
    placed = layout(client[ids].apply_async(task_info).get(timeout=timeout), len(ids))
    for engine_set in cluster.engines.values():
        engine_set.step = placed["step"]
    return ([ids[e] for e in placed["engines"]], placed["port"], placed["master_addr"], placed["local_ranks"],
            placed["step"])
