"""Accelerate: DDP through `accelerate launch` on CPU for real, and DeepSpeed ZeRO-2 through Accelerate on CPU via
an explicit gloo backend (Accelerate's public InitProcessGroupKwargs) — both equal the reference trainer's DDP."""
import re

import pytest

from coursekit.launch import launch
from coursekit.zero.accel_train import accelerate_launch
from coursekit.zero.ds_config import CONFIG_DIR

ACCEL = CONFIG_DIR.parent / "accelerate"
ARGS = ["--steps", "3", "--seq", "32", "--global-batch", "8", "--seed", "0"]
LOSS_ATOL = 1e-5  # fp32, same data and init; only the gradient reduction order differs (see test_zero.py)


@pytest.fixture(scope="module")
def trainer_ddp():
    rec = launch("coursekit.train", ["--strategy", "ddp", "--model", "tiny-llama", "--quiet", *ARGS], nproc=2,
                 timeout=240, stream=False).results[0]
    return [s["loss"] for s in rec["steps"]]


def test_ddp_through_accelerate_launch_on_cpu(trainer_ddp, no_orphans):
    recs = accelerate_launch(ACCEL / "multi_cpu.yaml", ARGS, nproc=2, cpu=True)
    assert [r["rank"] for r in recs] == [0, 1]
    for r in recs:
        assert r["distributed_type"] == "MULTI_CPU" and r["world_size"] == 2 and r["torch_world"] == 2
        assert r["losses"] == pytest.approx(trainer_ddp, abs=LOSS_ATOL)


def test_deepspeed_through_accelerate_on_cpu_with_explicit_gloo(trainer_ddp, no_orphans, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as a notebook opened in labs/lab2_zero: the config's JSON path is the root's
    recs = accelerate_launch(ACCEL / "deepspeed_zero2.yaml", [*ARGS, "--gloo"], nproc=2, cpu=False,
                             env={"DS_ACCELERATOR": "cpu", "COURSEKIT_DEVICE": "cpu"})
    assert [r["rank"] for r in recs] == [0, 1]
    for r in recs:
        assert r["distributed_type"] == "DEEPSPEED" and r["model_class"] == "DeepSpeedEngine"
        assert r["zero_stage"] == 2 and r["world_size"] == 2 and r["torch_rank"] == r["rank"]
        assert r["losses"] == pytest.approx(trainer_ddp, abs=LOSS_ATOL)


@pytest.mark.slow
def test_deepspeed_through_accelerate_on_cpu_without_gloo_miscounts_ranks(no_orphans):
    """Why the lab passes --gloo for DeepSpeed through Accelerate on a CPU machine: without an explicit backend, on a
    machine with no GPU, Accelerate finds no backend and tells every process it is rank 0 of 1 (DeepSpeed's own
    group still has 2). If this starts failing, Accelerate fixed it: drop --gloo from the lab."""
    recs = accelerate_launch(ACCEL / "deepspeed_zero2.yaml", ARGS, nproc=2, cpu=False,
                             env={"DS_ACCELERATOR": "cpu", "COURSEKIT_DEVICE": "cpu"})
    assert {(r["rank"], r["world_size"], r["torch_world"]) for r in recs} == {(0, 1, 2)}


@pytest.mark.parametrize("text,needle", [
    ("distributed_type: MULTI_CPUU\nnum_processes: 2\n", "'MULTI_CPUU' is not a valid DistributedType"),
    ("distributed_type: MULTI_CPU\nnum_procesess: 2\n", "had unknown keys (['num_procesess'])"),
    ("distributed_type: MULTI_CPU\nnum_processes: two\n", "num_processes must be a positive integer, got 'two'"),
    ("- a\n- b\n", "an Accelerate config is a mapping of keys, got list"),
    ("a: [\n", "not valid YAML"),
])
def test_a_bad_accelerate_config_is_refused_before_launch(tmp_path, text, needle):
    """Accelerate's own loader (its enums, its key names) and what it lets through, in one line naming the file;
    nothing is launched (the check runs before the subprocess)."""
    from coursekit.zero.accel_train import check_config

    cfg = tmp_path / "mine.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\n" + text if not text.startswith(("-", "a:")) else text)
    with pytest.raises(ValueError, match=re.escape(needle)):
        accelerate_launch(cfg, ARGS, nproc=2, timeout=5)
    for shipped in sorted(ACCEL.glob("*.yaml")):
        check_config(shipped)  # every config the course ships passes
