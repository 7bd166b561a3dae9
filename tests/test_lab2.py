"""Lab 2 (ZeRO with DeepSpeed): its syllabus, and hidden tests that catch answers the visible ones miss.

Grading of the whole lab (solution 100 %, release 0, partial in between, under nbgrader) is in test_course_labs.
"""
from pathlib import Path

import pytest

from coursekit.course.authoring import read_lab
from coursekit.course.config import Course
from coursekit.course.recheck import recheck
from coursekit.zero.ds_config import build_config

from lab_submission import submission

REPO = Path(__file__).resolve().parents[1]
COURSE = Course(REPO)
SYLLABUS = ["zero_bytes", "grad_partition_bytes", "budget_config", "bucket_tradeoff", "offload_step"]


@pytest.fixture(scope="module")
def lab():
    return read_lab(COURSE, "lab2_zero")


def test_exercises_follow_the_syllabus(lab):
    assert [e.name for e in lab.exercises] == SYLLABUS
    assert lab.max_points == 19
    assert lab.settings.call_timeout >= 240  # the budget test launches the trainer (and DDP) under torchrun


FP32_ONLY = '''
def zero_bytes(n_params, stage, world, dtype="fp32"):
    # right in fp32, but forgets that bf16 weights are 2 bytes and that stage 0 keeps fp32 copies in bf16
    P, N = n_params, world
    if stage == 0:
        return {"params": 4 * P, "grads": 4 * P, "master": 0, "optimizer": 8 * P, "fp32_grads": 0}
    return {"params": 4 * P // (N if stage == 3 else 1), "grads": 4 * P // (1 if stage == 1 else N),
            "master": 4 * P // N, "optimizer": 8 * P // N, "fp32_grads": 4 * P // N}
'''
NO_PADDING = '''
def grad_partition_bytes(numels, world, rank, dtype_bytes=4):
    size = sum(numels) // world  # forgets DeepSpeed's padding to a multiple of 2N elements
    start, end, held, offset = rank * size, (rank + 1) * size, 0, 0
    for n in numels:
        if offset < end and offset + n > start:
            held += n
        offset += n
    return dtype_bytes * held
'''
STRICT_BOUND = '''
def offload_step(n_params, world, tokens, flops, link_bytes_per_s, cpu_params_per_s):
    compute = 6 * n_params * tokens / world / flops
    transfer = 4 * n_params / world / link_bytes_per_s
    cpu = n_params / world / cpu_params_per_s
    step = max(compute, transfer) + cpu
    bound = "compute" if compute >= transfer + cpu else ("transfer" if transfer >= cpu else "cpu")  # tie wrong
    return {"compute_s": compute, "transfer_s": transfer, "cpu_s": cpu, "step_s": step, "gpu_busy": compute / step,
            "bound": bound}


SMALL_BATCH = offload_step(7e9, 8, 8 * 4096, 400e12, 25e9, 1e9)
LARGE_BATCH = offload_step(7e9, 8, 8 * 4096 * 64, 400e12, 25e9, 1e9)
'''


def test_hidden_tests_catch_what_visible_tests_miss(lab, tmp_path):
    sub = submission(COURSE, "lab2_zero", zero_bytes=FP32_ONLY, grad_partition_bytes=NO_PADDING, offload_step=STRICT_BOUND)
    only = {"zero_bytes_visible", "zero_bytes_hidden", "grad_partition_bytes_visible",
            "grad_partition_bytes_hidden", "offload_step_visible", "offload_step_hidden"}
    res = {t.grade_id: t for t in recheck(lab, sub, log_path=str(tmp_path / "student.log"), only=only).tests}
    assert set(res) == only
    for name in ("zero_bytes", "grad_partition_bytes", "offload_step"):
        assert res[f"{name}_visible"].passed, res[f"{name}_visible"].message
        assert not res[f"{name}_hidden"].passed, name
    assert "bf16" in res["zero_bytes_hidden"].message


def test_the_budget_cannot_be_met_without_offload():
    """The budget exercise is not a trick: every stage alone is over, the reference answer is under."""
    from coursekit.memory.deepspeed import deepspeed_bytes
    from coursekit.models import param_numels as model_numels

    numels, budget = model_numels("tiny-llama"), 600_000
    for stage in range(4):
        b = max(sum(deepspeed_bytes(numels, stage=stage, world=2, rank=r)["tiers"]["accelerator"].values())
                for r in (0, 1))
        assert b > budget, f"stage {stage} alone fits ({b:,} B)"
    cfg = build_config(3, offload_optimizer="cpu", offload_param="cpu", reduce_bucket_size=20_000)
    z = cfg["zero_optimization"]
    ref = deepspeed_bytes(numels, stage=3, world=2, rank=0, offload_optimizer="cpu", offload_param="cpu",
                          reduce_bucket_size=z["reduce_bucket_size"])
    assert sum(ref["tiers"]["accelerator"].values()) <= budget
