"""Persistent ranks for notebooks (``coursekit.pool``): one pool of 2 ranks started once for the whole file and
kept across "cells", as a notebook keeps it; its processes are stamped, and the file's last test closes it and
checks nothing is left (the module fixture is marked ``keeps_processes`` for the per-test orphan guard)."""
import os
import re
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.keeps_processes


@pytest.fixture(scope="module")
def pool():
    from coursekit.pool import Pool

    p = Pool(2, timeout=30)
    yield p
    p.close()


def test_state_lives_across_cells_and_collectives_run_on_warm_ranks(pool, capsys):
    """A tensor built in one cell is all-reduced in the next; the output comes back labelled by rank; a small
    collective cell on warm ranks takes well under a second (printed, not asserted: speed is bench/'s)."""
    pool.run("x = torch.ones(3) * (rank + 1)")
    t0 = time.perf_counter()
    pool.run("dist.all_reduce(x); print(x.tolist(), world_size)")
    took = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert "[rank 0] [3.0, 3.0, 3.0] 2" in out and "[rank 1] [3.0, 3.0, 3.0] 2" in out, out
    print(f"collective cell on 2 warm ranks: {took * 1e3:.0f} ms")


def test_a_function_runs_on_every_rank_and_returns_by_rank(pool):
    def scaled(k):
        return rank * k + world_size  # noqa: F821 (names of the rank's namespace)

    assert pool.run(scaled, 10) == [2, 12]


def test_the_ranks_cell_magic_runs_the_cell_on_every_rank(pool, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()  # a notebook kernel's shell, without the kernel
    pool.magics()
    ip.run_cell_magic("ranks", "", "print('magic', rank * 7)")
    out = capsys.readouterr().out
    assert "[rank 0] magic 0" in out and "[rank 1] magic 7" in out, out


def test_an_error_on_one_rank_shows_its_traceback_and_the_pool_stays_usable(pool, capsys):
    from coursekit.pool import RankError

    cell = "def check(v):\n    raise ValueError(f'rank {v} disagrees')\nif rank == 1:\n    check(rank)\n"
    with pytest.raises(RankError) as e:
        pool.run(cell)
    assert set(e.value.failures) == {1}
    tb = e.value.failures[1]
    # the cell's own frames, outermost first: the call in the cell (line 4), then the raise inside check (line 2)
    assert "ValueError: rank 1 disagrees" in tb and tb.index("----> 4") < tb.index("----> 2")
    pool.run("print('still here', rank)")
    assert "[rank 0] still here 0" in capsys.readouterr().out


def test_the_trainer_on_warm_ranks_equals_one_process_job_after_job(pool):
    """``coursekit train``'s own loop on the pool's group (``live.train``), twice on the same ranks (TP 2, then
    FSDP2): each equals the single-process run step by step, so a job leaves no state (seeds, groups) that moves
    the next one, and the ranks' group outlives both (``dist.session`` leaves a group it did not make). A session
    that tore the group down, or a second job seeded from the first one's RNG, fails it."""
    from types import SimpleNamespace

    from parity import COMMON, assert_equal_to_single, baseline

    base = baseline()
    for layout in (["--strategy", "ddp", "--tp", "2"], ["--strategy", "fsdp2"]):
        records = pool.train(*layout, *COMMON)
        assert_equal_to_single(SimpleNamespace(results=records), base, nproc=2)
    assert pool.run(_group_size) == [2, 2]


def test_a_probe_on_warm_ranks_counts_what_the_volume_model_says(pool):
    """Lab 4's TP probe on the pool (``Pool.probe``), TP 2 without SP: each rank's counted collectives of one
    forward + backward are coursekit.comm.volume's (4 all-reduces of b·s·h per layer, 2 for the vocab-parallel
    embedding and head, the logits' all-gather: 11), and each block saves what the calculator predicts (the first
    also the eager causal mask, b·s·s fp32). The default tier's cover of test_tp's slow "tp" case."""
    results = pool.probe("coursekit.tp.probe", "--model", "tiny-llama", "--tp", 2, "--seq", 32, "--micro-batch", 2)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        counted, modelled = sorted(map(tuple, r["counted"])), sorted(map(tuple, r["modelled"]))
        assert counted == modelled and sum(k for *_, k in counted) == 11, r["rank"]
        first, *rest = r["saved_per_layer"]
        assert rest == [r["predicted_per_layer"]] * (r["layers"] - 1)
        assert first - r["predicted_per_layer"] == 4 * 2 * 32 * 32


def _group_size():
    import torch.distributed as dist

    dist.barrier()
    return dist.get_world_size()


def test_a_job_built_in_one_cell_is_stepped_in_the_next(pool):
    """``live.Job``: the trainer's set-up made in one cell and stepped one cell at a time is the trainer's run: the
    same losses as the single process, the same Σw² after them, and each FSDP2 rank holds what the calculator
    says for its shard (the exact per-tensor layout)."""
    from coursekit.memory import estimate
    from parity import COMMON, LOSS_ATOL, PARAM_RTOL, STEPS, baseline, losses

    base = baseline()
    pool.run(f"from coursekit.pool import live\njob = live.Job({['--strategy', 'fsdp2', *COMMON]!r})")
    stepped = [pool.run(_step_job) for _ in range(STEPS)]  # one "cell" per step: [loss on rank 0, on rank 1]
    for rank in (0, 1):
        assert [s[rank] for s in stepped] == pytest.approx(losses(base), abs=LOSS_ATOL), rank
    for rank, (held, sq) in enumerate(pool.run(_held_job)):
        assert sq == pytest.approx(base["final"]["param_sq_sum"], rel=PARAM_RTOL)
        c = estimate("tiny-llama", micro_batch=4, seq=32, dtype="fp32", precision="fp32", strategy="fsdp2",
                     dp_shard=2, dp_rank=rank).categories
        assert held == {"params": c["parameters"], "grads": c["gradients"], "optimizer": c["optimizer_states"]}
    pool.run("job.close(); del job")


def _step_job():
    return job.step()  # noqa: F821 (the rank's namespace: made by the cell above)


def _held_job():
    return job.held(), job.param_sq_sum()  # noqa: F821


def test_lab_jobs_on_warm_ranks_deepspeed_sweep_and_a_traced_run(pool, tmp_path):
    """What Labs 2 and 5 run on their pools: ``run_sweep(..., pool=)`` builds DeepSpeed engines on the warm ranks
    (ZeRO-1 keeps the fp32 parameters whole, 4Ψ, and half the AdamW states, 8Ψ/2; ZeRO-3 shards the parameters,
    4Ψ/2: Ψ = 125,248 for tiny-llama, fp32, 2 ranks), and ``labruns.train(..., pool=)`` writes one profiler trace per
    rank that ``coursekit trace`` reads with every recorded step. A sweep that fell back to a launch would not see
    the pool's ranks; a profiler that wrote rank 0's trace only would fail the trace count."""
    from coursekit.profiling import labruns
    from coursekit.profiling.trace import analyse
    from coursekit.zero.sweep import run_sweep

    psi = 125_248
    rows = run_sweep([{"name": "z1", "stage": 1}, {"name": "z3", "stage": 3}], steps=3, seq=32, pool=pool,
                     per_rank=True)
    for rank_rows in rows:
        z1, z3 = rank_rows
        assert (z1["params_bytes"], z1["optimizer_bytes"]) == (4 * psi, 8 * psi // 2)
        assert z3["params_bytes"] == 4 * psi // 2
    records = labruns.train("tiny-llama", ["--strategy", "ddp", "--steps", 3, "--seq", 32, "--global-batch", 4,
                                           "--profile-dir", tmp_path, "--profile-steps", "1:3"], pool=pool)
    assert [r["rank"] for r in records] == [0, 1]
    trace = analyse(tmp_path)  # --profile-steps 1:3 records steps 1 and 2 (as Lab 5's 1:5 records 1-4)
    assert [(r["rank"], [s["step"] for s in r["steps"]]) for r in trace["ranks"]] == [(0, [1, 2]), (1, [1, 2])]


def test_interrupt_stops_a_cell_looping_on_every_rank_and_the_ranks_stay(pool, capsys):
    """``interrupt()`` (from another thread, as a notebook's interrupt button) stops a cell looping on every rank
    within seconds: each rank raises KeyboardInterrupt inside its loop; the ranks keep their state (not restarted:
    same pids, same names) and the next cell's collective runs. An interrupt that reaches no rank, or one rank only,
    leaves a rank looping: the looping cell then times out instead (TimeoutError, not RankError)."""
    from coursekit.pool import RankError

    pool.run("import os, time; kept, n = os.getpid(), 0")
    threading.Timer(1.0, pool.interrupt).start()
    t0 = time.perf_counter()
    with pytest.raises(RankError) as e:
        pool.run("while True:\n    n += 1\n    time.sleep(0.01)\n", timeout=20)
    took = time.perf_counter() - t0
    assert set(e.value.failures) == {0, 1}, e.value.failures
    assert all("KeyboardInterrupt" in tb and "n += 1" in tb for tb in e.value.failures.values()), e.value.failures
    assert took < 8, f"the interrupt took {took:.1f} s to stop the cell"
    capsys.readouterr()
    pool.run("t = torch.tensor([rank + 1]); dist.all_reduce(t); print(kept == os.getpid(), n > 0, t.item())",
             timeout=10)
    out = capsys.readouterr().out
    assert "[rank 0] True True 3" in out and "[rank 1] True True 3" in out, out


def test_the_notebooks_interrupt_reaches_every_rank(pool, capsys):
    """A notebook's interrupt is SIGINT to the kernel while ``run`` waits: ``run`` raises KeyboardInterrupt here
    and passes the interrupt on to every rank, so the next cell (queued behind the looping one on each rank) runs
    at once; had the ranks not been told, it would time out."""
    import tempfile

    looping = Path(tempfile.mkdtemp()) / "looping"

    def interrupt_once_both_loop():  # not at a fixed delay: on a loaded machine the cell may not be sent yet
        end = time.monotonic() + 20
        while len(list(looping.parent.glob("looping-*"))) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    # a kernel's SIGINT raises KeyboardInterrupt; a suite started in the background (`cmd &` in a script) inherits
    # SIGINT ignored, so the test puts Python's own handler in place for its duration
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_both_loop, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            pool.run(f"import time\nopen('{looping}-' + str(rank), 'w').close()\nwhile True:\n    time.sleep(0.01)\n",
                     timeout=30)
    finally:
        signal.signal(signal.SIGINT, old)
    pool.run("t = torch.ones(1); dist.all_reduce(t); print('after', t.item())", timeout=10)
    out = capsys.readouterr().out
    assert "[rank 0] after 2.0" in out and "[rank 1] after 2.0" in out, out


def _pid():
    import os

    return os.getpid()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_restart_gives_fresh_ranks_in_a_fresh_process_group(pool, capsys):
    """``restart()``: new processes (none of the old pids), the old state gone, a new process group of the same
    size whose collectives run (a restart that re-ran the set-up on the old ranks would keep their pids and state;
    one that skipped the set-up would leave ``dist`` uninitialised)."""
    before = pool.run(_pid)
    pool.run("old = 1")
    pool.restart()
    after = pool.run(_pid)
    assert len(set(after)) == 2 and not set(before) & set(after), (before, after)
    assert not [pid for pid in before if _alive(pid)], "the old ranks still run"
    pool.run("t = torch.tensor([rank + 1]); dist.all_reduce(t); print('old' in dir(), dist.get_world_size(), t.item())")
    out = capsys.readouterr().out
    assert "[rank 0] False 2 3" in out and "[rank 1] False 2 3" in out, out


def test_a_hang_times_out_naming_the_rank_and_the_pool_restarts(pool, capsys):
    """Rank 0 enters an all-reduce rank 1 never joins: a TimeoutError names rank 0 and carries the flight
    recorder's diagnosis (every rank dumped on request, rank 0 from inside the collective: rank 1 never reached
    that collective, rank 0's line of the cell); the pool comes back with fresh ranks (the old state is gone) that
    run collectives again."""
    pool.run("y = 1; dist.all_reduce(torch.ones(2))")
    with pytest.raises(TimeoutError, match=r"rank\(s\) 0 .*restarted with 2 fresh ranks") as e:
        pool.run("if rank == 0:\n    dist.all_reduce(torch.ones(3))\n", timeout=3)
    msg = str(e.value)
    assert re.search(r"flight recorder: TIMEOUT: rank\(s\) 1 had not reached collective #\d+", msg), msg
    assert "rank 0: all_reduce in [[3]]" in msg and "dist.all_reduce(torch.ones(3))" in msg, msg
    pool.run("print('y' in dir()); t = torch.tensor([rank + 1]); dist.all_reduce(t); print(t.item())")
    out = capsys.readouterr().out
    assert "[rank 1] False" in out and "[rank 0] 3" in out and "[rank 1] 3" in out


def test_resize_then_close_leaves_no_process(pool, capsys):
    from coursekit.launch import LAUNCH_ID_ENV

    pool.resize(3)  # a resize that kept the old group: 2 ranks, a sum of 2
    pool.run("t = torch.tensor([1]); dist.all_reduce(t); print(world_size, dist.get_world_size(), t.item())")
    out = capsys.readouterr().out
    assert all(f"[rank {r}] 3 3 3" in out for r in range(3)), out
    launch_id = pool._launch_id
    pool.close()
    time.sleep(0.5)
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(LAUNCH_ID_ENV) == launch_id:
                left.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    assert left == []
    from conftest import launched_processes

    assert not launched_processes(), "a pool of before the restarts and the resize left processes"
    with pytest.raises(RuntimeError, match="this pool is closed"):
        pool.run("1")


def test_bad_sizes_are_refused():
    from coursekit.pool import Pool

    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="whole number of ranks"):
            Pool(bad)


def _with_launch_id(launch_id: str) -> list[int]:
    from coursekit.launch import LAUNCH_ID_ENV

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(LAUNCH_ID_ENV) == launch_id:
                found.append(p.pid)
        except (OSError, psutil.Error):
            pass
    return found


def test_a_kernel_killed_without_close_leaves_no_process():
    """SIGKILL to the process that made a pool (a kernel that crashed or was killed: no atexit, no close): the
    pool's keeper stops its controller and ranks within seconds. Without it they were re-parented to init and
    lived on (seen with ipyparallel 9: the controller, its schedulers and the engines)."""
    import subprocess
    import sys

    script = ("import time\nfrom coursekit.pool import Pool\np = Pool(1)\nprint(p._launch_id, flush=True)\n"
              "time.sleep(300)\n")
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        launch_id = kernel.stdout.readline().strip()
        assert launch_id, "the pool did not start"
        assert len(_with_launch_id(launch_id)) >= 3  # controller, one rank, the keeper
    finally:
        kernel.kill()
        kernel.wait()
    deadline = time.monotonic() + 20
    while _with_launch_id(launch_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _with_launch_id(launch_id) == [], "the pool outlived its kernel"



def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_count() == 0, reason="needs CUDA GPUs: a pool's ranks on NCCL, one GPU per rank")
def test_a_pool_on_gpus_runs_nccl_with_one_gpu_per_rank():
    """On a GPU node: each rank takes its own GPU and joins an NCCL group; a collective and the trainer's loop
    (``Pool.train``) run there, the record saying cuda and nccl."""
    from coursekit.pool import Pool

    n = min(2, _cuda_count())
    with Pool(n, device="cuda", timeout=120) as p:
        assert p.run(_device_and_backend) == [(f"cuda:{r}", "nccl") for r in range(n)]
        p.run("t = torch.ones(1, device=device) * (rank + 1); dist.all_reduce(t)")
        assert p.run(_t_value) == [n * (n + 1) / 2] * n
        records = p.train("--strategy", "ddp", "--model", "tiny-llama", "--steps", 2, "--seq", 32,
                          "--global-batch", 2 * n, "--quiet")
        assert [(r["final"]["device"], r["final"]["backend"]) for r in records] == [(f"cuda:{r}", "nccl")
                                                                                  for r in range(n)]


def _device_and_backend():
    return str(device), dist.get_backend()  # noqa: F821 (the rank's names)


def _t_value():
    return t.item()  # noqa: F821
