"""Process-group set-up that runs unchanged under torchrun, under srun, or as one plain process.

Where the rank comes from (first match wins):
  1. torchrun / torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
  2. Slurm (srun-launched ranks): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the master is the first host of
     SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, the port MASTER_PORT or 20000 + SLURM_JOB_ID % 20000.
  3. Nothing set: one process, world size 1 (a single-rank gloo/nccl group on a free local port, so code that calls
     collectives still runs).

Backend and device: nccl + cuda:LOCAL_RANK when CUDA devices exist, gloo + cpu otherwise.
``COURSEKIT_DEVICE=cpu`` forces gloo + cpu everywhere (launcher, trainer, labs, Slurm scripts), so GPU-style scripts
can be exercised on a CPU machine.

``python -m coursekit.dist`` is a check job: each rank reports who it is and the all-reduce of (rank + 1).
"""
from __future__ import annotations

import datetime
import os
import random
import re
import socket
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: str  # "cpu" or "cuda:N" (a string so it serialises; use torch.device(info.device))
    source: str  # "torchrun", "slurm" or "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def to_dict(self) -> dict:
        return asdict(self)


def device_kind() -> str:
    """'cuda' when CUDA GPUs are usable and not overridden by COURSEKIT_DEVICE, else 'cpu'."""
    forced = os.environ.get("COURSEKIT_DEVICE", "").strip().lower()
    if forced and forced not in ("cpu", "cuda", "auto"):
        raise ValueError(f"COURSEKIT_DEVICE={forced!r}: expected cpu, cuda or auto")
    if forced == "cpu":
        return "cpu"
    if forced == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("COURSEKIT_DEVICE=cuda but torch sees no CUDA device")
    return "cuda" if torch.cuda.is_available() else "cpu"


def backend_for(kind: str) -> str:
    return "nccl" if kind == "cuda" else "gloo"


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm hostlist such as 'gpu[01-03,07],login1' into host names (as `scontrol show hostnames`)."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(prefix + lo)
            else:
                width = len(lo)
                hosts.extend(f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
    return hosts


def env_layout(env: dict | None = None) -> dict:
    """Read rank, world size, local rank and rendezvous address from the environment (torchrun, then Slurm)."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
        if missing and int(env["WORLD_SIZE"]) > 1:
            raise ValueError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} not: start the job with "
                             "torchrun (or coursekit.launch), or export the rendezvous address")
        return dict(
            source="torchrun",
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            # torchrun sets LOCAL_WORLD_SIZE; DeepSpeed's launcher sets LOCAL_SIZE
            local_world_size=int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or 1),
            master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
            master_port=int(env.get("MASTER_PORT") or 0) or None,
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1"
        local_world = int(re.match(r"\d+", tasks_per_node).group(0))
        job_id = int(env.get("SLURM_JOB_ID", "0") or 0)
        return dict(
            source="slurm",
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_NTASKS"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=local_world,
            master_addr=env.get("MASTER_ADDR") or expand_nodelist(nodes)[0],
            master_port=int(env.get("MASTER_PORT") or 20000 + job_id % 20000),
        )
    return dict(source="single", rank=0, world_size=1, local_rank=0, local_world_size=1,
                master_addr="127.0.0.1", master_port=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_all(seed: int, rank: int = 0) -> int:
    """Seed python, torch (CPU and CUDA) deterministically per rank; returns the seed used (seed + rank)."""
    s = int(seed) + int(rank)
    random.seed(s)
    torch.manual_seed(s)
    try:
        import numpy as np

        np.random.seed(s % 2**32)
    except ImportError:
        pass
    return s


def init(timeout_s: float | None = None) -> DistInfo:
    """Initialise torch.distributed (idempotent) and return who this process is."""
    timeout_s = float(timeout_s or os.environ.get("COURSEKIT_PG_TIMEOUT", 300))
    lay = env_layout()
    kind = device_kind()
    backend = backend_for(kind)
    if kind == "cuda":
        torch.cuda.set_device(lay["local_rank"] % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    else:
        device = "cpu"
    if not dist.is_initialized():
        port = lay["master_port"] or free_port()
        os.environ.setdefault("MASTER_ADDR", lay["master_addr"])
        os.environ.setdefault("MASTER_PORT", str(port))
        kwargs = {}
        if backend == "nccl":
            kwargs["device_id"] = torch.device(device)
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{lay['master_addr']}:{port}" if lay["source"] != "torchrun" else "env://",
            rank=lay["rank"],
            world_size=lay["world_size"],
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    return DistInfo(rank=lay["rank"], world_size=lay["world_size"], local_rank=lay["local_rank"],
                    local_world_size=lay["local_world_size"], backend=backend, device=device,
                    source=lay["source"])


def destroy() -> None:
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


@contextmanager
def session(seed: int | None = None, timeout_s: float | None = None):
    """`with dist.session(seed=0) as info:` — init, seed per rank, tear down what it set up.

    A process group that already exists (a notebook pool's ranks, ``coursekit.pool``) is used and left standing:
    the group belongs to whoever made it, so an entry point run on warm ranks leaves them usable."""
    owned = not dist.is_initialized()
    info = init(timeout_s=timeout_s)
    if seed is not None:
        seed_all(seed, info.rank)
    try:
        yield info
    except BaseException:
        # a failing rank leaves without waiting for the others (its launcher stops them); no barrier here
        if owned and dist.is_initialized():
            dist.destroy_process_group()
        raise
    # normal exit: everyone arrives before the group goes away, else a fast rank's teardown can strand a peer
    if owned:
        destroy()


def _check() -> None:
    from coursekit.launch import report

    with session() as info:
        t = torch.tensor([float(info.rank + 1)], device=info.device)
        dist.all_reduce(t)
        rec = info.to_dict() | {"hostname": socket.gethostname(), "allreduce": t.item(),
                                "expected_allreduce": info.world_size * (info.world_size + 1) / 2}
        print(f"[rank {info.rank}/{info.world_size}] {rec}", flush=True)
        report(rec)


if __name__ == "__main__":
    _check()
