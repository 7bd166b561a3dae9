"""Shared test set-up: every distributed job runs on CPU with gloo, one thread per process."""
import os

import psutil
import pytest

os.environ.setdefault("COURSEKIT_DEVICE", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def launched_processes(owner: int | None = None) -> set[int]:
    """PIDs of live processes that coursekit.launch started from ``owner`` (default: this test process).

    The launcher stamps COURSEKIT_LAUNCHED_BY=<its pid> into the environment of the agent and, through it, every
    worker; an orphan keeps that stamp after it is re-parented, so this finds leftovers of our own launches only.
    """
    owner = str(os.getpid() if owner is None else owner)
    out = set()
    for p in psutil.process_iter(["pid"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("COURSEKIT_LAUNCHED_BY") == owner:
                out.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


@pytest.fixture
def no_orphans():
    """Fails the test if a launch made from this process left any process behind."""
    yield
    left = launched_processes()
    assert not left, f"processes left behind by coursekit.launch: {sorted(left)}"
