"""Lab 1 (memory math and collectives): its syllabus, and hidden tests that catch answers the visible ones miss.

Grading of the whole lab (solution 100 %, release 0, partial in between, under nbgrader) is in test_course_labs.
"""
from pathlib import Path

import pytest

from coursekit.course.authoring import read_lab
from coursekit.course.config import Course
from coursekit.course.recheck import recheck

from lab_submission import submission

REPO = Path(__file__).resolve().parents[1]
COURSE = Course(REPO)

SYLLABUS = ["count_params", "model_state_bytes", "layer_activation_bytes", "measured_layer_bytes", "collectives",
            "ring_all_reduce", "plot_memory", "training_plan"]


@pytest.fixture(scope="module")
def lab():
    return read_lab(COURSE, "lab1_memory")


def test_exercises_follow_the_syllabus(lab):
    assert [e.name for e in lab.exercises] == SYLLABUS
    assert lab.max_points == 21
    assert lab.settings.call_timeout >= 120  # a 4-process benchmark or a torchrun launch per call


WRONG_COUNT = '''
def count_params(shape):
    # forgets that a tied head shares the embedding: right for Llama 3 8B, wrong for Llama 3.2 1B
    h, L, f, V = shape["hidden"], shape["layers"], shape["ffn"], shape["vocab"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    return 2 * V * h + L * (2 * h + 2 * h * q + 2 * h * kv + 3 * h * f) + h
'''
CHEATING_RING = '''
def ring_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor
'''
STATES_ONLY_16PSI = '''
def model_state_bytes(n_params, precision="16psi", optimizer="adamw"):
    return {"parameters": 2 * n_params, "gradients": 2 * n_params, "master_weights": 4 * n_params,
            "optimizer_states": 8 * n_params, "total": 16 * n_params}
'''


def test_hidden_tests_catch_what_visible_tests_miss(lab, tmp_path):
    sub = submission(COURSE, "lab1_memory", count_params=WRONG_COUNT, ring_all_reduce=CHEATING_RING,
                      model_state_bytes=STATES_ONLY_16PSI)
    only = {"count_params_visible", "count_params_hidden", "model_state_bytes_visible", "model_state_bytes_hidden",
            "ring_all_reduce_visible", "plot_memory_hidden"}
    res = {t.grade_id: t for t in recheck(lab, sub, log_path=str(tmp_path / "student.log"), only=only).tests}
    assert set(res) == only
    assert res["count_params_visible"].passed and not res["count_params_hidden"].passed
    assert "count_params is wrong for llama3.2-1b" in res["count_params_hidden"].message
    assert res["model_state_bytes_visible"].passed and not res["model_state_bytes_hidden"].passed
    assert not res["ring_all_reduce_visible"].passed  # the sums are right, but dist.all_reduce is not a ring
    assert "not dist.all_reduce" in res["ring_all_reduce_visible"].message
    assert not res["plot_memory_hidden"].passed and not res["plot_memory_hidden"].line  # hidden lines never shown
