"""Lab 3 (PyTorch FSDP2): its syllabus, hidden tests that catch answers the visible ones miss, and the lab's stated
clusters really asking both questions (memory and communication).

Grading of the whole lab (solution 100 %, release 0, partial in between, under nbgrader) is in test_course_labs.
Default tier: the exercises whose visible tests are pure. Slow tier: the live visible tests (a 3-rank launch of a
wrong wrapping, DTensor shapes over the fake process group, QLoRA measured in one process) with wrong answers.
"""
from pathlib import Path

import pytest

from coursekit.course.authoring import read_lab
from coursekit.course.config import Course
from coursekit.course.program import definitions
from coursekit.course.recheck import recheck

from lab_submission import submission

REPO = Path(__file__).resolve().parents[1]
COURSE = Course(REPO)
SYLLABUS = ["shard_by_hand", "choose_sharding", "local_shape", "check_resume", "qlora_bytes"]


@pytest.fixture(scope="module")
def lab():
    return read_lab(COURSE, "lab3_fsdp")


def test_exercises_follow_the_syllabus(lab):
    assert [e.name for e in lab.exercises] == SYLLABUS
    assert lab.max_points == 21
    assert lab.settings.call_timeout >= 240  # the live tests launch 3 processes or measure QLoRA in one


WRAP = '''
def wrap(model):
    for block in blocks(model):
        fully_shard(block)
    fully_shard(model)
    return model
'''
NO_EMPTY_SHARDS = WRAP + '''

def fsdp2_bytes(shapes, world, rank):
    # right wherever every rank owns a row; a rank past the end gets a negative row count
    params = optimizer = 0
    for shape in shapes:
        d0, rest = shape[0], math.prod(shape[1:])
        per = -(-d0 // world)
        params += 4 * per * rest
        optimizer += 8 * min(per, d0 - rank * per) * rest + 4
    return {"params": params, "grads": params, "optimizer": optimizer}
'''
ROOT_ONLY = NO_EMPTY_SHARDS.replace("    for block in blocks(model):\n        fully_shard(block)\n", "")
IGNORES_MEMORY = '''
def choose_sharding(plans, memory, cluster):
    g, intra, inter = cluster["gpus_per_node"], cluster["intra_bytes_per_s"], cluster["inter_bytes_per_s"]
    comm = {n: sum(c["count"] * c["bytes"] * busbw_factor(c["op"], c["group_size"])
                   / (inter if c["group_size"] > g or c["op"] == "all_reduce" else intra) for c in calls)
            for n, calls in plans.items()}
    fits = {n: memory[n] <= cluster["memory_bytes"] for n in plans}
    return {"choice": min(plans, key=comm.get), "comm_s": comm, "fits": fits}  # the fastest, fitting or not
'''
NEGATIVE_ROWS = '''
def local_shape(global_shape, placements, mesh_shape, coords):
    shape = list(global_shape)
    for p, n, c in zip(placements, mesh_shape, coords):
        if p.startswith("Shard"):
            d = int(p.split("=")[1].rstrip(")"))
            per = -(-shape[d] // n)
            shape[d] = min(per, shape[d] - c * per)
    return shape
'''
NEVER_ASKS_IF_IT_RESUMED = '''
def check_resume(resumed, uninterrupted, atol=1e-5):
    base = {s["step"]: s["loss"] for s in uninterrupted[0]["steps"]}
    diffs = [abs(s["loss"] - base[s["step"]]) for r in resumed for s in r["steps"]]
    worst = max(diffs)
    return {"resumed_from": resumed[0]["final"]["resumed_from_step"], "steps": [s["step"] for s in resumed[0]["steps"]],
            "max_abs_diff": worst, "equal": worst <= atol}
'''
TABLE_SHARDED_TOO = '''
def qlora_bytes(shape, world, r=8, block=32, scaler_block=8):
    h, f, L, V = shape["hidden"], shape["ffn"], shape["layers"], shape["vocab"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    proj = [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]
    # the 68 bytes of fp32 mean + NF4 table per weight divided over the ranks too (they are replicated)
    nf4 = (L * sum(i * o // 2 + i * o // block + 4 * (i * o // block // scaler_block) for i, o in proj)
           + 68 * len(proj) * L) // world
    rest = V * h * (1 if shape["tied_embeddings"] else 2) + h * (2 * L + 1)
    lora = L * r * sum(i + o for i, o in proj)
    adapters = 4 * lora // world
    out = {"trainable_params": lora, "nf4_base": nf4, "rest": 4 * rest // world, "adapters": adapters,
           "adapter_grads": adapters, "adapter_optimizer": 2 * adapters + 4 * 2 * len(proj) * L}
    out["total"] = sum(v for k, v in out.items() if k != "trainable_params")
    out["full_finetune"] = 16 * (L * sum(i * o for i, o in proj) + rest) // world
    out["saving"] = out["full_finetune"] / out["total"]
    return out
'''
WRONG = dict(shard_by_hand=NO_EMPTY_SHARDS, choose_sharding=IGNORES_MEMORY, local_shape=NEGATIVE_ROWS,
             check_resume=NEVER_ASKS_IF_IT_RESUMED, qlora_bytes=TABLE_SHARDED_TOO)


def _results(lab, sub, only, log):
    res = {t.grade_id: t for t in recheck(lab, sub, log_path=str(log), only=only).tests}
    assert set(res) == only
    return res


def test_hidden_tests_catch_what_visible_tests_miss(lab, tmp_path):
    pure = ("shard_by_hand", "choose_sharding", "check_resume")  # visible tests without a launch or a measurement
    only = {f"{n}_{k}" for n in pure for k in ("visible", "hidden")} | {"local_shape_hidden", "qlora_bytes_hidden"}
    res = _results(lab, submission(COURSE, "lab3_fsdp", **WRONG), only, tmp_path / "student.log")
    for name in pure:
        assert res[f"{name}_visible"].passed, res[f"{name}_visible"].message
    for name in SYLLABUS:
        assert not res[f"{name}_hidden"].passed, name
    assert "memory first" in res["choose_sharding_hidden"].message or "at the budget" in \
        res["choose_sharding_hidden"].message
    assert "started over" in res["check_resume_hidden"].message


@pytest.mark.slow  # a 3-process launch, two fake-process-group runs and QLoRA in one process: about a minute
def test_live_visible_tests_pass_wrong_answers_and_catch_a_wrong_wrapping(lab, tmp_path, no_orphans):
    only = {"shard_by_hand_live", "local_shape_visible", "qlora_bytes_visible"}
    res = _results(lab, submission(COURSE, "lab3_fsdp", **WRONG), only, tmp_path / "wrong.log")
    assert all(t.passed for t in res.values()), {k: t.message for k, t in res.items() if not t.passed}
    root = _results(lab, submission(COURSE, "lab3_fsdp", shard_by_hand=ROOT_ONLY), {"shard_by_hand_live"},
                    tmp_path / "root.log")["shard_by_hand_live"]
    assert not root.passed and "units" in root.message  # the bytes are the same; the units are not


def test_the_stated_clusters_ask_both_questions(lab):
    """Section 2 is not a trick: on 2 nodes of 8 the answer is HSDP by communication (everything fits), on 4 nodes of
    8 with a 70B model FULL_SHARD by memory (it is the slowest to communicate, and the only one that fits)."""
    ns: dict = {}
    for c in lab.cells:
        if c.kind in ("readonly", "solution"):
            exec(compile(definitions(c.source, c.grade_id or "cell").source, f"<{c.grade_id}>", "exec"), ns)
    choose, plans, memory, h100 = ns["choose_sharding"], ns["layout_plans"], ns["layout_memory"], ns["H100"]
    eight = choose(plans("llama3-8b", 2, 8), memory("llama3-8b", 2, 8), dict(h100, gpus_per_node=8))
    assert eight["choice"] == "HSDP" and all(eight["fits"].values())
    assert eight["comm_s"]["HSDP"] < eight["comm_s"]["SHARD_GRAD_OP"] < eight["comm_s"]["FULL_SHARD"]
    seventy = choose(plans("llama3-70b", 4, 8), memory("llama3-70b", 4, 8), dict(h100, gpus_per_node=8))
    assert seventy["choice"] == "FULL_SHARD" and [k for k, v in seventy["fits"].items() if v] == ["FULL_SHARD"]
    assert max(seventy["comm_s"], key=seventy["comm_s"].get) == "FULL_SHARD"
