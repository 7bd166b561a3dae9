"""Shared test set-up: every distributed job runs on CPU with gloo, one thread per process."""
import os

import psutil
import pytest

os.environ.setdefault("COURSEKIT_DEVICE", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _torchrun_procs() -> set[int]:
    out = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if "torch.distributed.run" in " ".join(p.info["cmdline"] or []):
                out.add(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


@pytest.fixture
def no_orphans():
    """Fails the test if it leaves a torchrun agent behind."""
    before = _torchrun_procs()
    yield
    left = _torchrun_procs() - before
    assert not left, f"torchrun processes left behind: {sorted(left)}"
