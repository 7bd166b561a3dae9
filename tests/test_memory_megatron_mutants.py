"""What the Megatron split (``coursekit.memory.engines.megatron``) gives each pipeline stage, on a hand-built
activation report and a tiny model: layers and tensors per stage, the tied embedding's copy, micro-batches in
flight (GPipe all m, 1F1B min(pp - i, m), LoopedBFS all v·m), the loss buffers, and what torch's runtime pins. Every
expected number is worked out in the comments from the rules of the module's docstring, never read from the code.
Where bench/bench_mutation.py found no test. Pure Python, well under a second."""
from __future__ import annotations

import re

import pytest

from coursekit.memory.activations import ActivationReport
from coursekit.memory.engines import megatron as mg
from coursekit.memory.engines.megatron import Stage
from coursekit.memory.shapes import ModelShape
from coursekit.memory.train_config import TrainConfig

# 4 layers of h 4, 2 heads, f 6, V 10, tied: a layer's 144 parameters (norms 4 + 4, q 16, k + v 32, o 16, gate + up
# 48, down 24) on 9 tensors; the embedding's 40 on 1; the final norm's 4 on 1 (no head: tied)
TIED = ModelShape(layers=4, hidden=4, heads=2, vocab=10, ffn=6, tied_embeddings=True)
# one micro-batch's saved bytes: a layer 6 + 10 (its first norm's input kept as it is), RoPE tables 7, the embedding
# 3 (ids) + 5, the head 2 (labels) + 11 (log-softmax) + 4 (total weight) + 13 (norm)
ACTS = ActivationReport(per_layer={"attn_norm.input": 6, "x": 10}, embed={"input_ids(int64)": 3, "emb": 5},
                        shared={"rope": 7}, head={"loss.labels(int64)": 2, "loss.logsoftmax": 11,
                                                  "loss.total_weight": 4, "norm": 13}, layers=4, attention_kernel="x")
LAYER, SHARED, EMBED, HEAD = 16, 7, 8, 30


def cfg(**kw):
    return TrainConfig(**{"batch": 1, "seq": 8, **kw})


def test_stages_per_rank_and_their_global_stages():
    """Catches a wrong count of stages per rank: 1 without pipelining (whatever the schedule), the schedule's own
    (interleaved 1F1B: 2), or pp_virtual; rank 1 of 2 holds stages 1, 3 (and 5 with three per rank); the V puts
    stages 0 and 3 on rank 0."""
    assert mg.virtual(cfg(pp_schedule="interleaved-1f1b")) == 1
    assert mg.virtual(cfg(pp=2, pp_schedule="interleaved-1f1b")) == 2
    assert mg.virtual(cfg(pp=3, pp_schedule="gpipe")) == 1
    assert mg.virtual(cfg(pp=2, pp_schedule="interleaved-1f1b", pp_virtual=3)) == 3
    assert mg.rank_stages(cfg(pp_schedule="interleaved-1f1b"), 0) == [0]
    assert mg.rank_stages(cfg(pp=2, pp_schedule="interleaved-1f1b", pp_virtual=3), 1) == [1, 3, 5]
    assert mg.rank_stages(cfg(pp=2, pp_schedule="zbv"), 0) == [0, 3]


def test_chunk_layers_front_loaded():
    """Catches a wrong split: 7 layers over 2·2 stages are 1 each and the first 3 one more: 2, 2, 2, 1."""
    c = cfg(pp=2, pp_schedule="interleaved-1f1b")
    assert [mg.chunk_layers(TIED.with_(layers=7), c, g) for g in range(4)] == [2, 2, 2, 1]


def test_stage_by_hand():
    """Catches a wrong Stage: parameters, the tied embedding's copy (only with pp > 1, on the last stage), tensors
    (9 per layer + the embedding's on the first + the final norm's and the tied copy's on the last) and micro-batches
    in flight (GPipe: all m; 1F1B: min(pp - i, m); no pipeline: 1; LoopedBFS: all v·m chunk micro-batches)."""
    assert mg.stage(TIED, cfg(), 0) == Stage(0, 4, True, True, 144, 40, 4, 4 * 9 + 1 + 1, 1, 0, 1)
    gpipe = cfg(pp=2)  # m = pp = 2
    assert mg.stage(TIED, gpipe, 0) == Stage(0, 2, True, False, 144, 40, 0, 2 * 9 + 1, 2, 0, 1)
    assert mg.stage(TIED, gpipe, 1) == Stage(1, 2, False, True, 144, 0, 4 + 40, 2 * 9 + 1 + 1, 2, 0, 1)
    f1b = cfg(pp=2, pp_schedule="1f1b", microbatches=4)
    assert [mg.stage(TIED, f1b, i).in_flight for i in (0, 1)] == [2, 1]
    bfs = cfg(pp=2, pp_schedule="looped-bfs", microbatches=2)  # rank 0: stages 0 and 2, one layer each
    assert mg.stage(TIED, bfs, 0) == Stage(0, 2, True, False, 144, 40, 0, 2 * 9 + 1, 2 * 2, 0, 1)
    # an explicit pp_virtual (not the schedule's 2): 6 layers over 2 x 3 stages, rank 0 holds 0, 2, 4 (one layer
    # each) and every one of its 3 x 2 chunk micro-batches; the cached stage must not be the default's
    bfs3 = cfg(pp=2, pp_schedule="looped-bfs", pp_virtual=3, microbatches=2)
    six = TIED.with_(layers=6)
    assert mg.stage(six, bfs3, 0) == Stage(0, 3, True, False, 144, 40, 0, 3 * 9 + 1, 3 * 2, 0, 1)
    assert mg.stage(six, bfs, 0).in_flight == 2 * 2
    # LoopedBFS holds every chunk micro-batch at its peak: 2 x (chunk 0: a layer, RoPE tables, the embedding; chunks
    # 2 and 4: a layer and RoPE tables each)
    held = mg.saved_bytes(ACTS, mg.stage(six, bfs3, 0), bfs3, six)
    assert held == 2 * ((LAYER + SHARED + EMBED) + 2 * (LAYER + SHARED))
    zbv = cfg(pp=2, pp_schedule="zbv")  # rank 0 holds the first and the last stage of the V
    st = mg.stage(TIED, zbv, 0)
    assert (st.first, st.last, st.embed_params, st.head_params, st.tensors) == (True, True, 40, 44, 2 * 9 + 1 + 2)


def test_expert_slices_of_a_rank():
    """Catches experts / ep as a float or ep dropped: a mixtral layer of 4 experts (gate_up 2·8·4 + down 8·4 = 96
    each) over ep 2 keeps 2 of them: 192 expert parameters per layer, ep 2 recorded."""
    moe = ModelShape(layers=2, hidden=4, heads=2, vocab=10, ffn=8, family="mixtral", experts=4)
    st = mg.stage(moe, cfg(engine="fsdp2", dp=2, ep=2), 0)
    assert (st.expert_per_layer, st.ep) == (2 * 96, 2) and type(st.expert_per_layer) is int


@pytest.mark.parametrize("kw,want", [
    (dict(), [0]), (dict(pp=3), [0, 1, 2]),  # torch's runtime: every stage (receive buffers pin)
    (dict(pp=3, pp_runtime="megatron"), [0, 2]),  # in-flight inputs only: the first and the last
])
def test_the_stages_estimated(kw, want):
    assert [s.index for s in mg.stages(TIED, cfg(**kw))] == want


def test_saved_bytes_without_pipelining_and_one_stage_per_rank():
    """Catches a wrong held/pinned sum. A stage of 2 layers holds 2·16 + 7 (+ 8 on the first, + 30 on the last).
    1F1B, 4 micro-batches, torch's runtime: stage 0 holds 2 in flight (2·47) and pins the ids of the 2 done (2·3);
    stage 1 holds 1 (69) and pins the labels and its receive buffer (the first norm's input) of the 3 done: 3·(2 +
    6). Megatron's runtime pins nothing; graph_only counts the ids and labels but not the receive buffer."""
    whole = Stage(0, 4, True, True, 0, 0, 0, 0, 1)
    assert mg.saved_bytes(ACTS, whole) == 4 * LAYER + SHARED + EMBED + HEAD
    assert mg.saved_bytes(ACTS, whole, cfg()) == 4 * LAYER + SHARED + EMBED + HEAD
    c = cfg(pp=2, pp_schedule="1f1b", microbatches=4)
    s0, s1 = mg.stage(TIED, c, 0), mg.stage(TIED, c, 1)
    first, last = 2 * LAYER + SHARED + EMBED, 2 * LAYER + SHARED + HEAD
    assert mg.saved_bytes(ACTS, s0, c, TIED) == 2 * first + 2 * 3
    assert mg.saved_bytes(ACTS, s1, c, TIED) == last + 3 * (2 + 6)
    assert mg.saved_bytes(ACTS, s1, c, TIED, graph_only=True) == last + 3 * 2
    meg = cfg(pp=2, pp_schedule="1f1b", microbatches=4, pp_runtime="megatron")
    assert mg.saved_bytes(ACTS, s1, meg, TIED) == last
    assert mg.saved_bytes(ACTS, s1, meg, TIED, graph_only=True) == last + 3 * 2
    per = mg.per_stage(TIED, c, ACTS)
    assert per == [{"stage": 0, "layers": 2, "in_flight": 2, "saved_activations_bytes": 2 * first + 2 * 3},
                   {"stage": 1, "layers": 2, "in_flight": 1, "saved_activations_bytes": last + 3 * (2 + 6)}]


@pytest.mark.parametrize("runtime", ["torch", "megatron"])
def test_saved_bytes_of_looped_bfs_hold_every_chunk_micro_batch(runtime):
    """Catches a wrong chunk: LoopedBFS runs every micro-batch through each of the rank's stages before any
    backward, so its peak is all v·m chunk micro-batches whole (the step's ids / labels included once per micro-batch,
    either held whole or as views). 4 layers over 2·2 stages of 1 layer, m 2: rank 0 holds stages 0 (first: 16 + 7 +
    8) and 2 (16 + 7); rank 1 stages 1 and 3 (last: 16 + 7 + 30)."""
    c = cfg(pp=2, pp_schedule="looped-bfs", microbatches=2, pp_runtime=runtime)
    r0, r1 = mg.stage(TIED, c, 0), mg.stage(TIED, c, 1)
    assert mg.saved_bytes(ACTS, r0, c, TIED) == 2 * ((LAYER + SHARED + EMBED) + (LAYER + SHARED))
    assert mg.saved_bytes(ACTS, r1, c, TIED) == 2 * ((LAYER + SHARED) + (LAYER + SHARED + HEAD))
    with pytest.raises(ValueError, match="^" + re.escape("saved_bytes of a multi-stage pipeline rank needs the model "
                                                         "shape") + "$"):
        mg.saved_bytes(ACTS, r0, c)


def test_step_views_loss_buffers_and_pinned_storages_by_hand():
    """Catches a wrong key, sign or stage test: the step's views are the ids (first stage, 3) and the labels (last,
    2); the loss buffers an input pass frees are the loss terms but the labels (11 + 4); a later stage pins its
    receive buffer where the first block keeps its input as it is (a checkpoint's input first, else the norm's;
    an fp32 norm input only in fp32 runs), nothing for a stage of no layers."""
    both, first, last, mid = (Stage(0, 1, True, True, 0, 0, 0, 0, 1), Stage(0, 1, True, False, 0, 0, 0, 0, 1),
                              Stage(1, 1, False, True, 0, 0, 0, 0, 1), Stage(1, 1, False, False, 0, 0, 0, 0, 1))
    assert [mg.step_shared(ACTS, s) for s in (both, first, last, mid)] == [5, 3, 2, 0]
    bare = ActivationReport(per_layer={"x": 1}, embed={}, shared={}, head={}, layers=1, attention_kernel="x")
    assert mg.step_shared(bare, both) == 0 and mg.pinned_bytes(bare, both, cfg(), buffers=False) == 0
    assert [mg.loss_bytes(ACTS, s) for s in (both, first)] == [11 + 4, 0]
    c = cfg()
    assert mg.pinned_bytes(ACTS, last, c) == 2 + 6 and mg.pinned_bytes(ACTS, last, c, buffers=False) == 2
    assert mg.pinned_bytes(ACTS, first, c) == 3 and mg.pinned_bytes(ACTS, mid, c) == 6
    assert mg.pinned_bytes(ACTS, Stage(1, 0, False, True, 0, 0, 0, 0, 1), c) == 2
    ckpt = ActivationReport(per_layer={"layer_input(checkpoint)": 4, "attn_norm.input": 6}, embed={}, shared={},
                            head={}, layers=1, attention_kernel="x")
    assert mg.pinned_bytes(ckpt, mid, c) == 4
    fp32 = ActivationReport(per_layer={"attn_norm.input_fp32": 9, "x": 1}, embed={}, shared={}, head={}, layers=1,
                            attention_kernel="x")
    assert mg.pinned_bytes(fp32, mid, cfg(dtype="fp32")) == 9 and mg.pinned_bytes(fp32, mid, c) == 0


@pytest.mark.parametrize("kw,want", [
    (dict(), 8 * 2 * 8 * 10),  # two fp32 b·s·V buffers: 8 bytes x 2 sequences x 8 tokens x V 10
    (dict(cp=2), 8 * 2 * 4 * 10),  # cp splits the sequence
    (dict(impl="fused", tp=2), 8 * 2 * 8 * 5),  # vocab-parallel cross-entropy: V / tp
    (dict(impl="hf", tp=2), 8 * 2 * 8 * 10),  # HF's loss sees the whole vocabulary
    (dict(impl="fused", tp=3), 8 * 2 * 8 * 10),  # 10 does not split over 3: whole
])
def test_logits_bytes_by_hand(kw, want):
    """Catches a wrong loss-buffer size (8·b·(s/cp)·V_local on the last stage), or one on another stage."""
    c = cfg(batch=2, **({"seq": 24} if kw.get("tp") == 3 else {}), **kw)
    seq_scale = 3 if kw.get("tp") == 3 else 1
    assert mg.logits_bytes(TIED, c, Stage(0, 1, True, True, 0, 0, 0, 0, 1)) == want * seq_scale
    assert mg.logits_bytes(TIED, c, Stage(0, 1, True, False, 0, 0, 0, 0, 1)) == 0


MOE = ModelShape(layers=2, hidden=8, heads=2, vocab=16, ffn=8, family="mixtral", experts=4)


@pytest.mark.parametrize("shape,kw,option,without", [
    (TIED, dict(dtype="fp32"), dict(dtype="fp32"), dict()),
    (TIED, dict(attention="eager"), dict(attention="eager"), dict()),
    (TIED, dict(impl="fused"), dict(impl="fused"), dict()),
    (TIED, dict(kernels="meta"), dict(kernels="meta"), dict()),
    (TIED, dict(dropout=0.1), dict(dropout=0.1), dict()),
    (TIED, dict(tp=2, sp=True), dict(tp=2, sp=True), dict(tp=2)),
    (TIED, dict(tp=2, sp=True, sp_style="megatron"), dict(tp=2, sp=True, sp_style="megatron"), dict(tp=2, sp=True)),
    (TIED, dict(cp=2, cp_impl="ulysses"), dict(cp=2, cp_impl="ulysses"), dict(cp=2)),
    (TIED, dict(position_ids="per-sequence"), dict(position_ids="per-sequence"), dict()),
    (TIED, dict(tp=2), dict(tp=2), dict()),
    (TIED, dict(cp=2), dict(cp=2), dict()),
    (MOE, dict(engine="fsdp2", dp=2, ep=2), dict(ep=2, aux_loss=True), dict(aux_loss=True)),
    # the router's loss, with the model's coefficient 0.001; with a coefficient 0 none is saved
    (MOE, dict(engine="fsdp2"), dict(aux_loss=True), dict()),
    (MOE.with_(aux_loss_coef=0), dict(engine="fsdp2"), dict(), dict(aux_loss=True)),
])
def test_each_option_reaches_the_activation_model(shape, kw, option, without):
    """Catches an option of the configuration not passed to ``activation_bytes`` (it then takes that function's
    default): the report equals activation_bytes called with the option, which differs from leaving it out.
    2 sequences of 8 tokens (per-sequence RoPE tables are b times larger)."""
    from coursekit.memory.activations import activation_bytes

    acts, working = mg.activations(shape, cfg(batch=2, **kw))
    assert working == 0
    assert acts == activation_bytes(shape, 2, 8, **option)
    assert acts != activation_bytes(shape, 2, 8, **without)


def test_the_recompute_working_set():
    """Catches a wrong working set: under full recompute, one whole layer's activations (backward re-runs one layer
    at a time); under selective, the attention core it drops (the plain layer minus the selective one); recompute of
    the first N layers only keeps the plain layer's bytes and shared tables for the other layers."""
    from coursekit.memory.activations import activation_bytes

    plain = activation_bytes(TIED, 1, 8)
    for mode in ("full", "selective"):
        acts, working = mg.activations(TIED, cfg(recompute=mode))
        mine = activation_bytes(TIED, 1, 8, recompute=mode)
        assert acts == mine and working == plain.layer_bytes - (mine.layer_bytes if mode == "selective" else 0)
        assert working > 0
    acts, working = mg.activations(TIED, cfg(recompute="full", recompute_layers=1))
    full = activation_bytes(TIED, 1, 8, recompute="full")
    assert (acts.recompute_layers, acts.plain_layer_bytes, acts.plain_shared) == (1, plain.layer_bytes,
                                                                                   dict(plain.shared))
    assert acts.per_layer == full.per_layer and working == plain.layer_bytes
