"""coursekit.dist: the same code under torchrun, under srun-style variables, and forced onto the CPU."""
import os
import subprocess
import sys

import pytest

from coursekit import dist as ckdist
from coursekit.launch import launch


def test_expand_nodelist():
    assert ckdist.expand_nodelist("node[1-2]") == ["node1", "node2"]
    assert ckdist.expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert ckdist.expand_nodelist("single") == ["single"]


def test_layout_from_slurm_variables():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-10]",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_ID": "123456"}
    lay = ckdist.env_layout(env)
    assert (lay["source"], lay["rank"], lay["world_size"], lay["local_rank"]) == ("slurm", 5, 8, 1)
    assert lay["local_world_size"] == 2
    assert lay["master_addr"] == "gpu07"
    assert lay["master_port"] == 20000 + 123456 % 20000
    assert ckdist.env_layout(env | {"MASTER_PORT": "29999"})["master_port"] == 29999


def test_torchrun_variables_win_and_missing_port_is_a_clear_error():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert ckdist.env_layout(env)["source"] == "torchrun"
    with pytest.raises(ValueError, match="MASTER_PORT"):
        ckdist.env_layout({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    assert ckdist.env_layout({})["source"] == "single"
    ds_launcher = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "MASTER_ADDR": "h",
                   "MASTER_PORT": "1"}
    assert ckdist.env_layout(ds_launcher)["local_world_size"] == 2


def test_forced_cpu(monkeypatch):
    monkeypatch.setenv("COURSEKIT_DEVICE", "cpu")
    assert ckdist.device_kind() == "cpu" and ckdist.backend_for("cpu") == "gloo"
    monkeypatch.setenv("COURSEKIT_DEVICE", "tpu")
    with pytest.raises(ValueError, match="COURSEKIT_DEVICE"):
        ckdist.device_kind()


def test_seed_is_deterministic_per_rank():
    import torch

    ckdist.seed_all(7, rank=0)
    a = torch.rand(3)
    ckdist.seed_all(7, rank=1)
    b = torch.rand(3)
    ckdist.seed_all(7, rank=0)
    assert torch.equal(a, torch.rand(3)) and not torch.equal(a, b)


def test_check_job_under_torchrun(no_orphans):
    res = launch("coursekit.dist", nproc=2, timeout=120, stream=False)
    assert [r["rank"] for r in res.results] == [0, 1]
    assert all(r["allreduce"] == r["expected_allreduce"] == 3.0 for r in res.results)
    assert all(r["source"] == "torchrun" and r["backend"] == "gloo" for r in res.results)


def test_srun_style_ranks_without_torchrun(tmp_path):
    """Two plain processes that only see Slurm's variables find each other (what srun-launched ranks do)."""
    port = ckdist.free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
               "SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2", "MASTER_PORT": str(port),
               "COURSEKIT_RESULTS_DIR": str(tmp_path)}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
            env.pop(k, None)
        procs.append(subprocess.Popen([sys.executable, "-m", "coursekit.dist"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            assert p.wait(timeout=120) == 0, p.stdout.read().decode()[-2000:]
    finally:
        for p in procs:
            p.kill()
    import json

    recs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert all(r["source"] == "slurm" and r["world_size"] == 2 and r["allreduce"] == 3.0 for r in recs)
