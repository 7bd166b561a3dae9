"""Lab 4 (tensor, pipeline and context parallelism): its syllabus, the premises its exercises state, and hidden
tests that catch answers the visible ones miss.

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
SYLLABUS = ["tp_mlp", "mlp_collectives", "bubble", "online_softmax", "choose_cp", "mesh_3d", "explain_plan", "moe_a2a",
            "moe_params"]


@pytest.fixture(scope="module")
def lab():
    return read_lab(COURSE, "lab4_parallel")


def test_exercises_follow_the_syllabus(lab):
    assert [e.name for e in lab.exercises] == SYLLABUS
    assert lab.max_points == 32
    assert lab.problems == []


HARD_CODED_TP2 = '''
def shard_mlp(w_gate, w_up, w_down, tp, rank):
    w_gate, w_up, w_down = (torch.as_tensor(w) for w in (w_gate, w_up, w_down))
    half = w_gate.shape[0] // 2  # written for tp = 2 only
    rows = slice(rank * half, (rank + 1) * half)
    return {"gate": w_gate[rows], "up": w_up[rows], "down": w_down[:, rows]}


def rank_mlp(x, shard):
    x = torch.as_tensor(x)
    g, u, d = (torch.as_tensor(shard[k]) for k in ("gate", "up", "down"))
    return (F.silu(x @ g.T) * (x @ u.T)) @ d.T
'''
SP_IGNORED = '''
def mlp_collectives(tokens, hidden, dtype_bytes, sequence_parallel=False):
    n = tokens * hidden * dtype_bytes  # sequence parallelism forgotten: still two all-reduces
    return [("forward", "all_reduce", n, "down"), ("backward", "all_reduce", n, "gate_up")]
'''
ROUNDS_DOWN = '''
def bubble_fraction(p, m, v=1):
    return (p - 1) / (v * m + p - 1)


def microbatches_for(p, target, v=1):
    return max(1, int((p - 1) * (1 / target - 1) / v))  # truncates instead of rounding up
'''
UNSTABLE_MERGE = '''
def block_attention(q, k, v):
    q, k, v = (torch.as_tensor(t) for t in (q, k, v))
    s = q @ k.T / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[:, None]) @ v, lse


def merge_blocks(o1, lse1, o2, lse2):
    o1, lse1, o2, lse2 = (torch.as_tensor(t) for t in (o1, lse1, o2, lse2))
    w1, w2 = torch.exp(lse1), torch.exp(lse2)  # right in exact arithmetic, overflows for large scores
    return (o1 * w1[:, None] + o2 * w2[:, None]) / (w1 + w2)[:, None], torch.log(w1 + w2)
'''
ULYSSES_ANY_HEADS = '''
def cp_exposed_s(impl, batch, seq, heads, kv_heads, head_dim, cp, link_bytes_per_s, flops_per_s, dtype_bytes=2):
    n = batch * seq / cp * head_dim
    if impl == "ulysses":  # forgets that Ulysses splits heads over the C ranks
        return (2 * n * heads + 2 * n * max(kv_heads, cp)) * (cp - 1) / cp * dtype_bytes / link_bytes_per_s
    send = 2 * n * kv_heads * dtype_bytes / link_bytes_per_s
    compute = 2 * batch * heads * (seq / cp) ** 2 * head_dim / flops_per_s
    return (cp - 1) * max(0.0, send - compute)


def choose_cp(batch, seq, heads, kv_heads, head_dim, cp, link_bytes_per_s, flops_per_s, dtype_bytes=2):
    args = (batch, seq, heads, kv_heads, head_dim, cp, link_bytes_per_s, flops_per_s, dtype_bytes)
    return "ulysses" if cp_exposed_s("ulysses", *args) < cp_exposed_s("ring", *args) else "ring"
'''
EVERYTHING_BUT_TP_CROSSES = '''
def layout_3d(nodes, gpus_per_node, model_parallel, heads, layers):
    world = nodes * gpus_per_node
    if world % model_parallel:
        return None
    tp = max(t for t in range(1, gpus_per_node + 1) if model_parallel % t == 0 and heads % t == 0)
    pp = model_parallel // tp
    if pp > layers:
        return None
    return {"tp": tp, "pp": pp, "dp": world // model_parallel, "order": ["pp", "dp", "tp"]}


def cross_node(degrees, order, gpus_per_node):
    return sorted(a for a in order if degrees[a] > 1 and a != "tp")  # as if only tp ever fit in a node
'''
NO_OPTIMIZER = '''
def explain_plan(candidate):
    c = candidate
    parts = {"compute": c["compute_s"], "bubble": c["bubble_s"], **c["exposed_s"], "optimizer": c["optimizer_s"],
             "interference": c["interference_s"]}
    over = max(("bubble", "tp", "cp", "pp", "dp", "interference"), key=lambda k: parts[k])  # the optimizer overlooked
    p, v, m = c["layout"]["pp"], c["layout"]["virtual_stages"], c["microbatches"]
    return {"parts": parts, "largest_overhead": over, "compute_share": c["compute_s"] / c["step_time_s"],
            "bubble_fraction": (p - 1) / (v * m + p - 1)}
'''
ONLY_SENDS_TO_OTHERS = '''
def a2a_payloads(counts, rank, hidden, dtype_bytes):
    n, E = len(counts), len(counts[0])
    local = E // n
    mine = range(rank * local, (rank + 1) * local)
    sent = sum(counts[rank])
    received = sum(c[e] for c in counts for e in mine)
    if len(set(counts[rank])) == 1:  # right when the router is balanced ...
        return sent * hidden * dtype_bytes, received * hidden * dtype_bytes
    return sent * hidden * dtype_bytes, sent * hidden * dtype_bytes  # ... the combine assumed to mirror the dispatch
'''
ROUTER_SPLIT_TOO = '''
def expert_params_per_rank(experts, hidden, expert_ffn, ep):
    return experts * hidden + experts // ep * 3 * expert_ffn * hidden  # 8 experts on 3 ranks: silently 2 each
'''
WRONG = {"tp_mlp": HARD_CODED_TP2, "mlp_collectives": SP_IGNORED, "bubble": ROUNDS_DOWN,
         "online_softmax": UNSTABLE_MERGE, "choose_cp": ULYSSES_ANY_HEADS, "mesh_3d": EVERYTHING_BUT_TP_CROSSES,
         "explain_plan": NO_OPTIMIZER, "moe_a2a": ONLY_SENDS_TO_OTHERS, "moe_params": ROUTER_SPLIT_TOO}


def test_hidden_tests_catch_what_visible_tests_miss(lab, tmp_path):
    assert set(WRONG) == set(SYLLABUS)
    sub = submission(COURSE, "lab4_parallel", **WRONG)
    only = {f"{n}_{kind}" for n in SYLLABUS for kind in ("visible", "hidden")}
    res = {t.grade_id: t for t in recheck(lab, sub, log_path=str(tmp_path / "student.log"), only=only).tests}
    assert set(res) == only
    for name in SYLLABUS:
        assert res[f"{name}_visible"].passed, (name, res[f"{name}_visible"].message)
        assert not res[f"{name}_hidden"].passed, name
    assert "Ulysses impossible" in res["choose_cp_hidden"].message or "12 heads" in res["choose_cp_hidden"].message


def test_the_planner_section_states_what_the_planner_chooses():
    """Section 7's text and questions describe the planner's top choice for the stated cluster: pipeline across
    the nodes, data and tensor parallel inside them, several virtual stages (more pp sends, a smaller bubble), and an
    FSDP2 candidate behind it that loses mostly to the compute its hidden gathers slow. A planner change that moves
    the choice must update the lab too."""
    from coursekit.plan import evaluate, plan

    cluster = dict(gpus=32, gpus_per_node=8, gpu="H100-80GB", network="roce-100", seq=4096, global_batch=64)
    cands = [c.to_dict() for c in plan("llama3-70b", **cluster)]
    top = cands[0]
    assert top["layout"]["pp"] == 4 and top["layout"]["virtual_stages"] > 1 and top["microbatches"] == 32
    assert top["links"]["pp"] == "network" and all(top["links"][k] == "nvlink" for k in top["links"] if k != "pp")
    fsdp = next(c for c in cands if c["layout"]["engine"] == "fsdp2")
    lost = fsdp["step_time_s"] - top["step_time_s"]
    assert lost > 0 and fsdp["interference_s"] - top["interference_s"] > lost / 2  # mostly the interference
    alt = evaluate("llama3-70b", dict(engine="fsdp2", dp_shard=2, tp=8, pp=2, virtual_stages=2), **cluster).to_dict()
    assert alt["links"]["dp"] == "network" and alt["exposed_s"]["dp"] > alt["compute_s"]


def test_cp_compare_counts_what_the_volume_model_says():
    """The lab's measured Ulysses-vs-Ring cell (coursekit.cp.compare): both run, and the bytes each rank sends equal
    coursekit.comm.volume's model."""
    from coursekit.launch import launch

    rows = launch("coursekit.cp.compare", ["--seqs", "32", "64", "--heads", "4", "--head-dim", "8", "--iters", "1"],
                  nproc=2, timeout=180, stream=False).results[0]
    assert [(r["seq"], r["impl"]) for r in rows] == [(32, "ulysses"), (32, "ring"), (64, "ulysses"), (64, "ring")]
    b, heads, d, C, P = 1, 4, 8, 2, 4  # the arguments above; fp32; K/V heads = heads
    for r in rows:
        chunk = b * (r["seq"] // C) * heads * d * P  # one rank's q (or k, v, out) in bytes
        if r["impl"] == "ulysses":  # 4 all-to-alls forward (q, k, v, out), 4 backward; a rank keeps 1/C of each
            want = 8 * chunk * (C - 1) / C
        else:  # K and V blocks to the next rank, C-1 times forward, C-1 again backward, plus dK and dV C-1 times
            want = 3 * (C - 1) * 2 * chunk
        assert r["sent_bytes"] == want == r["model_bytes"], r  # derived here, not through volume.busbw_factor
        assert r["ms"] > 0
    assert rows[2]["sent_bytes"] == 2 * rows[0]["sent_bytes"]  # bytes grow linearly with the sequence
