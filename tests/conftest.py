"""Shared test set-up: every distributed job runs on CPU with gloo, one thread per process."""
import os
import sys

import psutil
import pytest

from coursekit.launch import OWNER_ENV, STAMP_ENV

os.environ.setdefault("COURSEKIT_DEVICE", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# grading tests use the OS sandbox where one can be built (tests/test_course_isolation.py requires it, or skips)
os.environ.setdefault("COURSEKIT_ISOLATION", "auto")
# This test process owns every launch made below it, also those made by a subprocess (a CLI run, a notebook
# kernel, a grader): coursekit.launch stamps their processes with this pid (see launch.launch_stamp).
os.environ[OWNER_ENV] = str(os.getpid())


def launched_processes(owner: int | None = None) -> set[int]:
    """PIDs of live processes that coursekit.launch started on behalf of ``owner`` (default: this test process).

    Every process of a launch carries COURSEKIT_LAUNCHED_BY=<owner>; the owner is inherited through subprocesses,
    so a job started by ``python -m coursekit.cli train`` from a test is stamped with the test's pid too. An orphan
    keeps the stamp after it is re-parented, so this finds leftovers of this process's launches and of no other.
    """
    owner = str(os.getpid() if owner is None else owner)
    out = set()
    for p in psutil.process_iter(["pid"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(STAMP_ENV) == owner:
                out.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def assert_no_orphans(owner: int | None = None) -> None:
    left = launched_processes(owner)
    assert not left, f"processes left behind by coursekit.launch: {sorted(left)}"


@pytest.fixture
def no_orphans():
    """Fails the test if a launch made from this process, or from a subprocess of it, left any process behind.
    (Every test has the same check, ``_orphan_guard`` below; naming it says the test launches.)"""
    yield
    assert_no_orphans()


@pytest.fixture(autouse=True)
def _orphan_guard(request):
    """Every test: no process the library stamped (coursekit.launch.stamped_env: launches, graders, sandboxes,
    torchft replicas, local pods) outlives it. A module-scoped fixture's processes are torn down with it, so the
    check runs after the test's own teardown; a fixture that keeps processes across tests marks its module with
    ``pytestmark = pytest.mark.keeps_processes``."""
    yield
    if request.node.get_closest_marker("keeps_processes") is None:
        assert_no_orphans()


@pytest.fixture(autouse=True)
def _stage_caches_cleared():
    """The calculator caches its pipeline-stage walks (coursekit.memory.engines.megatron: _stage, _in_flight,
    _peak_bytes; the planner asks the same ones thousands of times): each test starts without them, so a result
    cached by an earlier test (or by mutmut's first run, before it forks per mutant) cannot stand in for the code."""
    mg = sys.modules.get("coursekit.memory.engines.megatron")
    if mg is not None:
        for f in (mg._stage, mg._in_flight, mg._peak_bytes):
            f.cache_clear()
