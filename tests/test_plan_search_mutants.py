"""``coursekit.plan.search``'s small rules checked by hand, as its docstrings state them: the enumeration's pieces
(divisors, data-parallel variants, EP degrees, filling a given layout's dp), the cluster's checks, which regimes a
prediction lies outside (``unchecked``), overlap names a layout can take, the Pareto front and ``explain``'s words.
Pure Python (no search); written against the mutation survivors of bench/bench_mutation.py plan.search."""
from __future__ import annotations

from dataclasses import replace

import pytest

from coursekit.memory.gpus import GiB
from coursekit.memory.shapes import ModelShape
from coursekit.plan.layout import Layout
from coursekit.plan.hardware import hardware, network
from coursekit.plan.search import (Candidate, _check, _divisors, _dp_variants, _ep_degrees, _fill, applicable,
                                   evaluate, explain, make_cluster, pareto, plan, unchecked)
from coursekit.plan.steptime import Prediction

DENSE = ModelShape(arch="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, max_positions=512)
MOE = ModelShape(arch="llama", family="mixtral", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256,
                 max_positions=512, experts=8, top_k=2)


def _pred(step=1.0, compute=0.0, bubble=0.0, exposed=None, optimizer=0.0, host=0.0, overlap=None, run=None):
    return Prediction(step_time_s=step, compute_s=compute, bubble_s=bubble, exposed_s=dict(exposed or {}),
                      optimizer_s=optimizer, host_s=host, microbatches=1, tokens_per_s_per_gpu=1.0, mfu=0.0, hfu=0.0,
                      overlap=dict(overlap or {}), run=dict(run or {}))


# -- the enumeration's pieces -----------------------------------------------------------------------------------------
def test_divisors_ep_degrees_and_the_data_parallel_variants():
    """The docstring's data parallel: DDP, ZeRO-1/2/3, FSDP2, and HSDP sharded within a node (what tp x cp leave of
    it) and replicated across when that divides dp; with pp > 1 only DDP, ZeRO-1 and FSDP2; dp 1: DDP alone.
    Catches the variants' lists cut or extended, the HSDP conditions shifted (1 < node_left < dp, dp % node_left)."""
    assert _divisors(12) == [1, 2, 3, 4, 6, 12] and _divisors(1) == [1]
    assert _ep_degrees(DENSE, 12) == [1]
    assert _ep_degrees(MOE, 12) == [1, 2, 4]  # divisors of the 12 dp x cp ranks that divide 8 experts
    assert _dp_variants(1, 1, 8) == [dict(engine="ddp")]
    base = [dict(engine="ddp", dp_replicate=16), dict(engine="deepspeed", zero=1, dp_replicate=16),
            dict(engine="fsdp2", dp_shard=16)]
    assert _dp_variants(16, 2, 8) == base
    zero23 = [dict(engine="deepspeed", zero=2, dp_replicate=16), dict(engine="deepspeed", zero=3, dp_replicate=16)]
    assert _dp_variants(16, 1, 8) == base + zero23 + [dict(engine="fsdp2", dp_shard=8, dp_replicate=2)]
    assert _dp_variants(16, 1, 16) == base + zero23  # the node holds all 16: FSDP2 already is within a node
    assert _dp_variants(16, 1, 1) == base + zero23  # one rank per node: nothing to shard within
    assert _dp_variants(16, 1, 32) == base + zero23
    six = [dict(engine="ddp", dp_replicate=6), dict(engine="deepspeed", zero=1, dp_replicate=6),
           dict(engine="fsdp2", dp_shard=6), dict(engine="deepspeed", zero=2, dp_replicate=6),
           dict(engine="deepspeed", zero=3, dp_replicate=6)]
    assert _dp_variants(6, 1, 4) == six  # 4 does not divide 6
    assert _dp_variants(6, 1, 2)[-1] == dict(engine="fsdp2", dp_shard=2, dp_replicate=3)
    assert all(type(v) is int for var in _dp_variants(16, 1, 8) for k, v in var.items() if k != "engine")  # counts


def test_a_given_layout_takes_what_tp_pp_cp_leave_of_the_gpus_as_its_data_parallel_degree():
    """evaluate's rule: a dict without dp degrees gets gpus / (tp x pp x cp) as dp_shard (fsdp2) or dp_replicate; with
    one of them given, the other fills the rest (at least 1). Catches the branches' conditions and products."""
    assert _fill({"tp": 2, "pp": 2}, 16) == Layout(tp=2, pp=2, dp_replicate=4)
    assert _fill({"tp": 2, "cp": 2, "engine": "fsdp2"}, 16) == Layout(tp=2, cp=2, dp_shard=4, engine="fsdp2")
    assert _fill({"engine": "fsdp2", "dp_replicate": 2, "tp": 2}, 16) == Layout(engine="fsdp2", dp_replicate=2,
                                                                                dp_shard=4, tp=2)
    assert _fill({"engine": "fsdp2", "dp_replicate": 16, "pp": 2, "cp": 2}, 16) == Layout(
        engine="fsdp2", dp_replicate=16, pp=2, cp=2)  # 16 / 64 rounds to 0: at least 1
    assert _fill({"engine": "fsdp2", "dp_shard": 2, "tp": 2, "pp": 2}, 16) == Layout(engine="fsdp2", dp_shard=2,
                                                                                     dp_replicate=2, tp=2, pp=2)
    assert _fill({"engine": "fsdp2", "dp_shard": 8, "cp": 4}, 16) == Layout(engine="fsdp2", dp_shard=8, cp=4)
    assert _fill({"tp": 2}, None) == Layout(tp=2)
    # a degree not given is 1
    assert _fill({"pp": 2}, 8) == Layout(pp=2, dp_replicate=4)
    assert _fill({"engine": "fsdp2", "dp_replicate": 2}, 8) == Layout(engine="fsdp2", dp_replicate=2, dp_shard=4)
    assert _fill({"engine": "fsdp2", "dp_replicate": 2, "pp": 2}, 8) == Layout(engine="fsdp2", dp_replicate=2,
                                                                               dp_shard=2, pp=2)
    assert _fill({"engine": "fsdp2", "dp_replicate": 2, "cp": 2}, 8) == Layout(engine="fsdp2", dp_replicate=2,
                                                                               dp_shard=2, cp=2)
    assert _fill({"engine": "fsdp2", "dp_shard": 2}, 8) == Layout(engine="fsdp2", dp_shard=2, dp_replicate=4)
    assert _fill({"dp_replicate": 2}, 8) == Layout(dp_replicate=2)  # both given (dp_shard's default): kept
    with pytest.raises(ValueError) as e:
        _fill({"tp": 3}, 8)
    assert str(e.value) == "tp x pp x cp = 3 does not divide --gpus 8"


def test_the_cluster_needs_whole_nodes():
    """Catches each check's bound or message changed and the node size not capped by the GPU count."""
    for kw, message in ((dict(gpus=0, gpus_per_node=8), "gpus must be a positive integer, got 0"),
                        (dict(gpus=8, gpus_per_node=0), "gpus_per_node must be a positive integer, got 0"),
                        (dict(gpus=8.0, gpus_per_node=8), "gpus must be a positive integer, got 8.0"),
                        (dict(gpus=12, gpus_per_node=8), "--gpus-per-node 8 does not divide --gpus 12: nodes must be "
                                                         "whole")):
        with pytest.raises(ValueError) as e:
            make_cluster(**kw)
        assert str(e.value) == message
    c = make_cluster(4, 8)
    assert (c.gpus, c.gpus_per_node, c.hw.name, c.net.name) == (4, 4, "H100-80GB", "ib-400")
    assert make_cluster(16, 8, "A100-80GB", "ib-200").gpus_per_node == 8
    assert make_cluster(16, 8, "A100-80GB", "ib-200").hw.name == "A100-80GB"
    assert make_cluster(1, 1).gpus_per_node == 1


# -- where a prediction lies outside the checked published runs -------------------------------------------------------
def test_unchecked_names_each_regime_outside_the_checked_runs():
    # (no 'published' in the name: bench/mutants_plan.py deselects tests/test_plan.py's published runs by -k)
    """Exposed communication above 30 % of the step; sharded data parallelism (FSDP2 with dp_shard > 1 or ZeRO-3)
    over more than 32 GPUs without TP or PP; cp above 2 or not ring; EP above 8; tp overlap; compile; fp8.
    Catches each threshold shifted (> -> >=), each condition's `and` / `or` swapped, and each message's words."""
    assert unchecked(DENSE, Layout(), _pred(exposed={"dp": 0.30})) == ()  # at the bound: covered
    assert unchecked(DENSE, Layout(), _pred(exposed={"dp": 0.2, "tp": 0.11})) == (
        "exposed communication 31% of the step (checked runs: <= 30%)",)
    sharded = ("sharded data parallelism over 64 GPUs without TP or PP (holds up to 32; beyond, published runs are "
               "up to 4x slower than predicted)",)
    assert unchecked(DENSE, Layout(dp_shard=64, engine="fsdp2"), _pred()) == sharded
    assert unchecked(DENSE, Layout(dp_replicate=64, engine="deepspeed", zero=3), _pred()) == sharded
    assert unchecked(DENSE, Layout(dp_replicate=32, dp_shard=2, engine="fsdp2"), _pred()) == sharded  # HSDP
    for covered in (Layout(dp_shard=32, engine="fsdp2"), Layout(dp_shard=64, tp=2, engine="fsdp2"),
                    Layout(dp_shard=64, pp=2, engine="fsdp2"), Layout(dp_replicate=64, engine="fsdp2"),
                    Layout(dp_replicate=64, engine="deepspeed", zero=2), Layout(dp_replicate=64)):
        assert unchecked(DENSE, covered, _pred()) == (), covered
    assert unchecked(DENSE, Layout(cp=4), _pred()) == ("context parallelism cp 4 ring (checked: ring, cp 2)",)
    assert unchecked(DENSE, Layout(cp=2, cp_impl="ulysses"), _pred()) == (
        "context parallelism cp 2 ulysses (checked: ring, cp 2)",)
    assert unchecked(DENSE, Layout(cp=2), _pred()) == ()
    assert unchecked(DENSE, Layout(cp=1, cp_impl="ulysses"), _pred()) == ()
    assert unchecked(MOE, Layout(dp_replicate=16, ep=16), _pred()) == (
        "experts over 16 EP ranks (checked: EP 8 inside a node)",)
    assert unchecked(MOE, Layout(dp_replicate=16, ep=8), _pred()) == ()
    assert unchecked(DENSE, Layout(dp_replicate=16, ep=16), _pred()) == ()  # no experts to spread
    assert unchecked(DENSE, Layout(), _pred(overlap={"tp": True}, run={"compile": True, "gemm_dtype": "fp8"})) == (
        "tp overlap: the one published pair (torchtitan async TP, Llama 3.1 70B) gained x1.06 where the model "
        "predicts x1.30: optimistic",
        "torch.compile: only its element-wise fusion is modelled (torchtitan's pairs: x1.05 predicted, x1.16 "
        "measured)",
        "fp8: checked on torchtitan's Float8 tensorwise rows only (x1.36 predicted, x1.28 measured)")
    assert unchecked(DENSE, Layout(), _pred(overlap={"tp": False}, run={"compile": False,
                                                                        "gemm_dtype": "bf16"})) == ()


# -- overlap names, the Pareto front, explain -------------------------------------------------------------------------
def test_applicable_keeps_the_overlap_names_that_act_on_the_layout():
    """Catches the '+' split changed, the no- prefix not removed before the check, the message's words / list."""
    L = Layout(tp=2, dp_replicate=2)
    assert applicable("tp+no-grad_reduce+prefetch+param_gather", L) == "tp+no-grad_reduce"
    assert applicable(" no-tp + ", L) == "no-tp"
    assert applicable("prefetch", Layout(dp_shard=2, engine="fsdp2")) == "prefetch"
    with pytest.raises(ValueError) as e:
        applicable("tp+fast", L)
    assert str(e.value) == "overlap 'fast': unknown; choose from grad_reduce, param_gather, prefetch, tp (no-NAME: off)"


def _cand(peak, step, cap=100, **parts):
    return Candidate(Layout(), _pred(step=step, **parts), peak, cap)


def test_the_pareto_front_is_by_memory_ascending_each_faster_than_the_last():
    """(peak, step): (10, 5) (20, 3) (30, 4) (15, 6) and an unfit (200, 1): the front is (10, 5), (20, 3); a tie on
    memory keeps the faster; fits means peak <= capacity (at it: fits). Catches the sort keys, < -> <=, the fit
    filter, the running best not updated."""
    a, b, c, d = _cand(10, 5), _cand(20, 3), _cand(30, 4), _cand(15, 6)
    unfit = _cand(200, 1)
    assert pareto([c, unfit, b, d, a]) == [a, b]
    same = _cand(10, 4)
    assert pareto([a, same, b]) == [same, b]
    assert pareto([_cand(10, 5), _cand(20, 5)])[1:] == []  # equal time: not faster, not on the front
    edge = _cand(100, 1)
    assert edge.fits and not _cand(101, 1).fits and pareto([a, edge]) == [a, edge]


def test_explain_gives_each_share_of_the_step_and_what_loses_to_the_best():
    """Shares of at least 1 % of the step (exactly 1 %: shown), in the order compute, bubble, each exposed dimension,
    optimizer, host; the memory in GiB; against the best: the step's relative excess and the part that grew most,
    in ms. Catches the 1 % bound (>= -> >, / -> x), the format, the excess's sign or scale."""
    parts = dict(compute=0.6, bubble=1.0, exposed={"tp": 0.2, "dp": 0.01}, optimizer=0.18, host=0.02)
    c = Candidate(Layout(), _pred(step=2.0, **parts), 40 * GiB, 76 * GiB)
    # of 2 s: 30 %, 50 %, 10 %, (dp 0.5 %: left out), 9 %, host 0.02 / 2 = exactly 1 %
    head = "compute 30%, bubble 50%, tp comm 10%, optimizer 9%, host 1%; 40.0 of 76.0 GiB"
    assert explain(c) == head and explain(c, c) == head
    best = Candidate(Layout(), _pred(step=1.1, compute=0.6, bubble=0.1, exposed={"tp": 0.2, "dp": 0.01},
                                     optimizer=0.18, host=0.02), 30 * GiB, 76 * GiB)
    # 2.0 / 1.1 - 1 = +81.8 %; the bubble grew most: 1.0 - 0.1 = 0.9 s = 900 ms
    assert explain(c, best) == head + "; +81.8% vs #1, mostly bubble (+900 ms)"


def test_a_candidates_json_row():
    c = _cand(10, 2.0)
    d = c.to_dict()
    assert (d["strategy"], d["summary"], d["fits"], d["peak_bytes"], d["capacity_bytes"], d["unchecked"]) == (
        "ddp", "ddp dp1 mb1", True, 10, 100, [])
    assert d["layout"] == Layout().to_dict() and d["step_time_s"] == 2.0


def test_plan_refuses_unknown_fixed_keys_and_bad_sizes():
    with pytest.raises(ValueError) as e:
        plan("tiny-llama", gpus=8, seq=64, global_batch=8, fixed={"warp": 1, "tp": 2})
    assert str(e.value).startswith("unknown fixed layout keys ['warp']; known: cp, cp_impl, dp_replicate, ")
    for kw, message in ((dict(seq=0, global_batch=8), "seq must be a positive integer, got 0"),
                        (dict(seq=64, global_batch=8.0), "global_batch must be a positive integer, got 8.0")):
        with pytest.raises(ValueError) as e:
            plan("tiny-llama", gpus=8, **kw)
        assert str(e.value) == message


def _refused(shape, layout, seq):
    with pytest.raises(ValueError) as e:
        _check(shape, layout, seq)
    return str(e.value)


def test_a_layout_is_checked_against_the_model_with_its_own_kv_heads_seq_kernel_sp_and_stages():
    """_check hands check_model (coursekit.spec.dims, whose rules the messages state) the model's K/V heads, the
    sequence, the CP kernel (only with cp > 1), SP only with tp > 1, and the virtual stages. Catches each argument
    dropped or None'd and its conditions shifted."""
    six = ModelShape(arch="llama", layers=4, hidden=96, heads=6, kv_heads=3, ffn=128, vocab=256, max_positions=512)
    assert _refused(six, Layout(tp=2), 64).startswith("3 key/value heads do not split over tp 2")
    assert _refused(DENSE, Layout(cp=2), 66).startswith("sequence length 66 is not divisible by 4")
    assert _refused(DENSE, Layout(cp=8, cp_impl="ulysses"), 256).startswith("Ulysses needs query heads % (tp x cp)")
    three = ModelShape(arch="llama", layers=4, hidden=48, heads=3, kv_heads=3, ffn=128, vocab=256, max_positions=512)
    assert _refused(three, Layout(cp=2, cp_impl="ulysses"), 256).startswith("Ulysses needs query heads")
    assert _refused(DENSE, Layout(tp=2), 65).startswith("sequence length 65 is not divisible by tp 2 x cp 1")
    _check(DENSE, Layout(tp=2, sp=False), 65)  # no SP: the sequence need not split
    _check(DENSE, Layout(sp=True), 65)  # tp 1: no SP either
    assert _refused(replace(DENSE, layers=3), Layout(pp=2, virtual_stages=2), 64).startswith(
        "3 layers cannot fill pp 2 x 2 stage(s) per rank")


def test_evaluate_fills_the_gpus_from_the_layout_and_checks_them():
    """gpus defaults to the layout's world; a different --gpus is refused with the degrees; 8 GPUs per node by
    default (16 GPUs: two whole nodes); the model check sees the sequence; hw / net given are the ones priced.
    Catches gpus = gpus and world, the message, the default node size, seq not passed, hw / net dropped."""
    c = evaluate("tiny-llama", Layout(dp_replicate=2), seq=64, global_batch=4)
    assert c.layout.world == 2 and c.fits
    with pytest.raises(ValueError) as e:
        evaluate("tiny-llama", Layout(dp_replicate=2, tp=2), gpus=8, seq=64, global_batch=4)
    assert str(e.value) == "layout uses 4 GPUs (dp 2 x tp 2 x pp 1 x cp 1) but --gpus is 8"
    assert evaluate("tiny-llama", {"dp_replicate": 16}, gpus=16, seq=64, global_batch=16).fits
    with pytest.raises(ValueError, match="sequence length 66 is not divisible by 4"):
        evaluate("tiny-llama", Layout(cp=2), seq=66, global_batch=2)
    small = replace(hardware("H100-80GB"), memory_bytes=10 * GiB)
    assert evaluate("tiny-llama", Layout(dp_replicate=2), seq=64, global_batch=4, hw=small).capacity_bytes == int(
        10 * GiB * 0.95)  # MEMORY_SLACK 5 %
    slow = replace(network("ib-400"), bw_per_gpu=1e6)  # 1 MB/s NICs, one GPU per node: the gradients cross them
    fast_p = evaluate("tiny-llama", Layout(dp_replicate=2), gpus_per_node=1, seq=64, global_batch=4)
    slow_p = evaluate("tiny-llama", Layout(dp_replicate=2), gpus_per_node=1, seq=64, global_batch=4, net=slow)
    assert slow_p.prediction.step_time_s > 10 * fast_p.prediction.step_time_s


def _degrees(shape, gpus, per_node, seq, batch):
    from coursekit.plan.search import layouts_of

    return [(L.tp, L.cp, L.cp_impl, L.pp, L.virtual_stages, L.strategy, L.dp_shard, L.dp_replicate)
            for L in layouts_of(shape, gpus, per_node, seq, batch)]


def test_the_enumeration_visits_what_its_docstring_lists():
    """cp only while each rank keeps >= 1024 tokens (seq 2048: cp 2 yes, cp 4 no; seq 1024: no cp) and seq splits
    over 2 cp; ring and Ulysses for cp > 1, ring alone at cp 1; pp up to the layer count, v in 1, 2, 4 while
    pp x v <= layers; ZeRO-2/3 and HSDP at pp 1; a dp the batch does not split skips that pp only; the sequence
    check sees seq. Catches each bound shifted, `or` -> `and`, break for continue, return for break."""
    got = _degrees(DENSE, 4, 4, 2048, 4)
    cps = {(cp, impl) for _, cp, impl, *_ in got}
    assert cps == {(1, "ring"), (2, "ring"), (2, "ulysses")}
    assert {(g[3], g[4]) for g in got} == {(1, 1), (2, 1), (2, 2), (4, 1)}  # 4 layers: pp 2 x v 4 and pp 4 x v 2 overflow
    assert {s for *_, s, _d, _r in got} >= {"ddp", "zero1", "zero2", "zero3", "fsdp2"}
    assert all(cp == 1 for _, cp, *_ in _degrees(DENSE, 4, 4, 1024, 4))
    assert _degrees(DENSE, 4, 4, 512, 4)  # short sequences still get cp 1 layouts
    assert any(pp == 2 for *_, pp, _v, _s, _d, _r in _degrees(DENSE, 4, 4, 512, 2))  # dp 4 does not split 2: pp 2
    two = replace(DENSE, layers=2)
    assert any(tp == 2 for tp, *_ in _degrees(two, 8, 8, 512, 8))  # pp 4 > 2 layers ends tp 1's pp loop only
    assert not any(tp == 4 for tp, *_ in _degrees(DENSE, 4, 4, 2050, 4))  # SP: 2050 tokens do not split over 4
    assert any(cp == 4 for _, cp, *_ in _degrees(DENSE, 12, 4, 8192, 12))  # cp 3 (8192 % 6) skipped, cp 4 kept
    hsdp = [g for g in _degrees(DENSE, 16, 8, 512, 16) if g[5] == "hsdp"]
    assert (1, 1, "ring", 1, 1, "hsdp", 8, 2) in hsdp
    assert not [g for g in _degrees(DENSE, 8, 2, 512, 8) if g[5] == "hsdp" and g[0] == 2]  # 1 rank per node left
