"""The step-time model (``coursekit.plan.steptime``) worked out by hand on a toy machine and a toy model. Pure Python.

The toy GPU has round figures, so each term of the model's stated rules (the module's docstring) can be computed on
paper: 1 TFLOP/s bf16 (0.5 fp32), every GEMM at the full peak (gemm_fraction 1, no small-GEMM curve: half-dim 0),
flash attention at half the peak, 1 TB/s of usable HBM (hbm_bw · HBM_FRACTION), no kernel floor; every collective
inside the node measured at alpha 10 us and bus bandwidth 1 GB/s (``Hardware.collectives``), so a call costs
alpha + payload x busbw factor / 1 GB/s, with the factors of 2 ranks: all-reduce 2(n-1)/n = 1, all-gather,
reduce-scatter and all-to-all (n-1)/n = 1/2.

The toy Llama: 4 layers, h 64, 4 heads of 16, 2 K/V heads, SwiGLU ffn 128, vocab 256 (untied), seq 256, micro-batch 4:
t = 1024 tokens per micro-batch. Its parameters, by hand: a layer 64 (norm) + 64·64 (q) + 2·64·32 (k, v) + 64·64 (o)
+ 64 (norm) + 2·64·128 (gate, up) + 128·64 (down) = 36,992 in 9 tensors; first stage 256·64 = 16,384 (1 tensor); last
stage 64 + 256·64 = 16,448 (2 tensors).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest

from coursekit.flops import flops_per_step
from coursekit.memory.shapes import ModelShape
from coursekit.plan.hardware import Hardware, Network
from coursekit.plan.layout import Layout
from coursekit.plan import steptime
from coursekit.plan.steptime import Cluster, gemm_time

# The toy's element-wise term on paper: the fused kernels' hand count (FUSED_H 32 hidden-vector and FUSED_F 8
# MLP-vector passes per token); the eager coefficients (the default) are worked out by hand in
# test_eager_elementwise_by_hand below and checked against op-by-op counts in tests/test_elementwise.py.
predict = partial(steptime.predict, elementwise="fused")
_layer_time = partial(steptime._layer_time, elementwise="fused")

ALPHA, BW = 10e-6, 1e9
TOY = Hardware(name="toy", memory_bytes=10**12, peak_flops={"bf16": 1e12, "fp32": 0.5e12}, hbm_bw=1e12 / 0.85,
               link_bw=1e9, gemm_fraction=1.0, gemm_half_dim=0, attn_fraction=0.5, kernel_floor_s=0.0,
               overlap_slowdown=0.0,  # the hidden collectives' cost to compute: its own test below
               collectives={op: (ALPHA, BW) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                       "send")})
NET = Network(name="toy-net", bw_per_gpu=1e9)
SHAPE = ModelShape(arch="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, max_positions=512)
SEQ, MB = 256, 4
T = MB * SEQ  # 1024 tokens
PER_LAYER, FIRST, LAST, TENSORS = 36992, 16384, 16448, 9

# One layer, one micro-batch, tp 1 (all GEMMs compute-bound: e.g. o_proj 2·1024·64·64 FLOP = 8.4 us against
# 2·(1024·64 + 64·64 + 1024·64) B = 0.27 us of traffic):
# GEMM K·N: q,k,v 64·(4+2·2)·16 = 8192, o 64·64 = 4096, gate+up 64·256 = 16384, down 128·64 = 8192 -> 36,864
G = 2 * T * 36864 / 1e12  # forward GEMMs: 75.5 us; the layer runs them 3x (forward + two backward GEMMs)
A = 4 * MB * 4 * SEQ * SEQ * 16 * 0.5 / (1e12 * 0.5)  # causal flash: 4·b·a·s²·d/2 FLOP at half the peak: 67.1 us
E = T * (32 * 64 + 8 * 128) * 2 / 1e12  # element-wise (fused): 32 hidden + 8 ffn vectors per token, bf16: 6.3 us
LAYER = 3 * G + A + 2.5 * A + E  # backward attention = 2.5 x forward
# LM head: 3 x (1024 x 64 @ 64 x 256) = 3 · 33.6 us; the loss reads / writes fp32 logits 6 times: 6·1024·256·4 B
HEAD = 3 * 2 * T * 64 * 256 / 1e12 + 6 * T * 256 * 4 / 1e12
STAGE_PARAMS = 4 * PER_LAYER + max(FIRST, LAST)  # the busiest (last) stage: 164,416
OPT = STAGE_PARAMS * 32 / 1e12  # AdamW: 32 B of HBM traffic per parameter


def cluster(gpus, hw=TOY, per_node=8):
    return Cluster(hw, NET, gpus, min(gpus, per_node))


def call(op_factor, payload, calls=1):
    """``calls`` collectives of ``payload`` bytes on the toy link (2 ranks: the busbw factor given)."""
    return calls * (ALPHA + payload * op_factor / BW)


# -- building blocks ---------------------------------------------------------------------------------------------------
def test_gemm_time_is_the_largest_of_flops_bytes_and_the_floor():
    hw = replace(TOY, gemm_half_dim=100)  # e(d) = d / (d + 100): 100 -> 1/2, 200 -> 2/3, 300 -> 3/4
    # (100 x 200) @ (200 x 300): 2·6e6 FLOP at 1e12 x (1/2 · 2/3 · 3/4 = 1/4): 48 us, 3 of them 144 us
    assert gemm_time(100, 200, 300, hw, "bf16", 3) == pytest.approx(3 * 48e-6, rel=1e-12)
    assert gemm_time(100, 200, 300, hw, "fp32") == pytest.approx(96e-6, rel=1e-12)  # fp32: half the peak
    # memory-bound at 1 MB/s usable: (100·200 + 200·300 + 100·300) = 110,000 elements of 2 B (fp32: 4 B)
    slow = replace(hw, hbm_bw=1e6 / 0.85)
    assert gemm_time(100, 200, 300, slow, "bf16") == pytest.approx(0.22, rel=1e-12)
    assert gemm_time(100, 200, 300, slow, "fp32") == pytest.approx(0.44, rel=1e-12)
    assert gemm_time(100, 200, 300, replace(hw, kernel_floor_s=1.0), "bf16", 2) == 2.0  # 2 kernels at the floor


def _layer(L, t=T, hw=TOY, **kw):
    """(layer, attention forward, attention backward) of one micro-batch of the toy model, bf16, flash, no SP."""
    return _layer_time(SHAPE, L, hw, t=t, **(dict(seq=SEQ, act=2, dtype="bf16", attention="flash", sp=False) | kw))[:3]


def test_one_layer_flash_and_eager_by_hand():
    layer, a_fwd, a_bwd = _layer(Layout(micro_batch=MB))
    assert (a_fwd, a_bwd) == (pytest.approx(A, rel=1e-12), pytest.approx(2.5 * A, rel=1e-12))
    assert layer == pytest.approx(LAYER, rel=1e-12)
    # eager: 16 (b·a) batched QK^T and ·V GEMMs of (256 x 16) @ (16 x 256), 2·256·16·256 FLOP each = 2.1 us, plus the
    # s x s scores written / read 12/2 times in the forward: 6·16·256·256·2 B; backward twice the forward
    e_fwd = 2 * 16 * (2 * 256 * 16 * 256 / 1e12) + 6 * 16 * 256 * 256 * 2 / 1e12
    layer, a_fwd, a_bwd = _layer(Layout(micro_batch=MB), attention="eager")
    assert (a_fwd, a_bwd) == (pytest.approx(e_fwd, rel=1e-12), pytest.approx(2 * e_fwd, rel=1e-12))
    assert layer == pytest.approx(3 * G + 3 * e_fwd + E, rel=1e-12)


def test_recompute_reruns_the_forward_it_dropped():
    full, _, _ = _layer(Layout(micro_batch=MB, recompute="full"))
    assert full == pytest.approx(LAYER + G + A + E / 3, rel=1e-12)  # GEMMs, attention, the forward third of elem
    selective, _, _ = _layer(Layout(micro_batch=MB, recompute="selective"))
    assert selective == pytest.approx(LAYER + A, rel=1e-12)  # the attention core only


def test_tensor_parallel_layer_splits_heads_and_ffn_and_sp_the_hidden_vectors():
    # tp 2: 2 heads, 1 K/V head, ffn 64: K·N = 64·(2+2)·16 + 32·64 + 64·128 + 64·64 = 18,432, half of tp 1's
    g2 = 2 * T * 18432 / 1e12
    e2 = T * (32 * 64 + 8 * 64) * 2 / 1e12  # every rank does all hidden-vector passes, half the ffn ones
    layer, a_fwd, _ = _layer(Layout(tp=2, micro_batch=MB))
    assert a_fwd == pytest.approx(A / 2, rel=1e-12)
    assert layer == pytest.approx(3 * g2 + 3.5 * A / 2 + e2, rel=1e-12)
    e2_sp = T * (32 * 64 / 2 + 8 * 64) * 2 / 1e12  # SP splits the hidden-vector passes over the 2 ranks too
    layer_sp, _, _ = _layer(Layout(tp=2, micro_batch=MB), sp=True)
    assert layer_sp == pytest.approx(3 * g2 + 3.5 * A / 2 + e2_sp, rel=1e-12)
    # tp 4 > 2 K/V heads: each rank keeps 1 (replicated); 1 query head, ffn 32:
    # K·N = 64·(1+2)·16 + 16·64 + 64·64 + 32·64 = 10,240
    layer4, _, _ = _layer(Layout(tp=4, micro_batch=MB))
    e4 = T * (32 * 64 + 8 * 32) * 2 / 1e12
    assert layer4 == pytest.approx(3 * 2 * T * 10240 / 1e12 + 3.5 * A / 4 + e4, rel=1e-12)


def test_context_parallel_layer_holds_its_share_of_the_tokens():
    # cp 2: 512 tokens per rank; flash FLOPs 4·b·a·(s/2)·s·d/2: half; eager: (128 x 16) @ (16 x 256) batched GEMMs
    layer, a_fwd, _ = _layer(Layout(cp=2, micro_batch=MB), t=T / 2)
    assert a_fwd == pytest.approx(A / 2, rel=1e-12)
    assert layer == pytest.approx(3 * G / 2 + 3.5 * A / 2 + E / 2, rel=1e-12)
    _, e_fwd, _ = _layer(Layout(cp=2, micro_batch=MB), t=T / 2, attention="eager")
    assert e_fwd == pytest.approx(2 * 16 * (2 * 128 * 16 * 256 / 1e12) + 6 * 16 * 128 * 256 * 2 / 1e12, rel=1e-12)


def test_kernel_floors_bound_the_elementwise_work_and_attention():
    # 211 element-wise kernels per layer at 1 us each = 211 us > the 6.3 us of traffic; the GEMMs (>= 8.4 us) and
    # flash attention (67 us) stay above the floor
    layer, _, _ = _layer(Layout(micro_batch=MB), hw=replace(TOY, kernel_floor_s=1e-6))
    assert layer == pytest.approx(LAYER - E + 211e-6, rel=1e-12)
    _, a_fwd, _ = _layer(Layout(micro_batch=MB), hw=replace(TOY, kernel_floor_s=1.0))
    assert a_fwd == 1.0  # a tiny attention is one kernel floor


# -- one step ----------------------------------------------------------------------------------------------------------
def test_one_gpu_step_is_microbatches_of_layers_and_head_plus_the_optimizer():
    p = predict(SHAPE, Layout(micro_batch=MB), cluster(1), seq=SEQ, global_batch=8)
    compute_mb = 4 * LAYER + HEAD
    assert p.microbatches == 2  # 8 sequences / micro-batch 4
    assert p.compute_s == pytest.approx(2 * compute_mb, rel=1e-12)
    assert p.optimizer_s == pytest.approx(OPT, rel=1e-12)
    assert p.step_time_s == pytest.approx(2 * compute_mb + OPT, rel=1e-12)
    assert p.bubble_s == 0 and p.host_s == 0 and p.links == {}
    assert p.exposed_s == {"tp": 0, "cp": 0, "pp": 0, "dp": 0}
    assert p.tokens_per_s_per_gpu == pytest.approx(8 * SEQ / p.step_time_s, rel=1e-12)
    # MFU counts the model's FLOPs (coursekit.flops) over the step at the 1 TFLOP/s peak; HFU also the recompute
    assert p.mfu == pytest.approx(flops_per_step(SHAPE, 8, SEQ)["total"] / (p.step_time_s * 1e12), rel=1e-12)
    rc = predict(SHAPE, Layout(micro_batch=MB, recompute="full"), cluster(1), seq=SEQ, global_batch=8)
    assert rc.hfu == pytest.approx(flops_per_step(SHAPE, 8, SEQ, recompute="full")["total"] / (rc.step_time_s * 1e12),
                                   rel=1e-12)
    assert rc.mfu == pytest.approx(flops_per_step(SHAPE, 8, SEQ)["total"] / (rc.step_time_s * 1e12), rel=1e-12)
    assert p.to_dict()["step_time_s"] == p.step_time_s and p.to_dict()["exposed_s"] == p.exposed_s


def test_floors_bound_the_loss_and_the_optimizer_pays_per_tensor_kernels():
    hw = replace(TOY, kernel_floor_s=1e-6, optimizer_ops_per_tensor=9)
    p = predict(SHAPE, Layout(micro_batch=MB), cluster(1, hw), seq=SEQ, global_batch=4)
    # the loss: 79 kernels outside the layers at 1 us beat 6.3 us of logits traffic; each layer's element-wise work
    # 211 us; the optimizer: 9 kernels for each of the last stage's 4·9 + 2 = 38 tensors (no DTensor: one GPU)
    head = 3 * 2 * T * 64 * 256 / 1e12 + 79e-6
    assert p.compute_s == pytest.approx(4 * (LAYER - E + 211e-6) + head, rel=1e-12)
    assert p.optimizer_s == pytest.approx(OPT + 9 * 38 * 1e-6, rel=1e-12)


@pytest.mark.parametrize("kw,needles", [
    (dict(attention="ring"), ["attention must be flash or eager", "'ring'"]),
    (dict(global_batch=10), ["global batch 10", "dp 1 x micro_batch 4"]),
    (dict(layout=Layout(micro_batch=MB, microbatches=3)), ["microbatches 3 != global batch 8", "= 2"]),
])
def test_bad_input_names_the_bad_value(kw, needles):
    args = dict(layout=Layout(micro_batch=MB), global_batch=8) | kw
    with pytest.raises(ValueError) as e:
        predict(SHAPE, args.pop("layout"), cluster(1), seq=SEQ, **args)
    for n in needles:
        assert n in str(e.value)


# -- communication -----------------------------------------------------------------------------------------------------
def test_tensor_parallel_all_reduces_are_exposed_four_per_layer():
    # payload: micro-batch 4 x 256 tokens x 64 x 2 B = 131,072 B; m = 8 / 4 = 2 micro-batches, 4 layers each
    p = predict(SHAPE, Layout(tp=2, micro_batch=MB, sp=False), cluster(2), seq=SEQ, global_batch=8)
    assert p.exposed_s["tp"] == pytest.approx(2 * 4 * call(1, 131072, 4), rel=1e-12)
    assert p.links == {"tp": "nvlink"}
    # SP: an all-gather and a reduce-scatter (busbw factor 1/2 each) in place of each all-reduce
    sp = predict(SHAPE, Layout(tp=2, micro_batch=MB, sp=True), cluster(2), seq=SEQ, global_batch=8)
    assert sp.exposed_s["tp"] == pytest.approx(2 * 4 * 2 * call(0.5, 131072, 4), rel=1e-12)
    # Megatron's SP style gathers each block input (attention, MLP) again in backward: 6 all-gathers, 4 reduce-scatters
    mega = predict(SHAPE, Layout(tp=2, micro_batch=MB, sp=True, sp_style="megatron"), cluster(2), seq=SEQ,
                   global_batch=8)
    assert mega.exposed_s["tp"] == pytest.approx(2 * 4 * (call(0.5, 131072, 6) + call(0.5, 131072, 4)), rel=1e-12)
    # full recompute re-runs the forward's 2 all-reduces per layer: 6 in all
    rc = predict(SHAPE, Layout(tp=2, micro_batch=MB, sp=False, recompute="full"), cluster(2), seq=SEQ, global_batch=8)
    assert rc.exposed_s["tp"] == pytest.approx(2 * 4 * call(1, 131072, 6), rel=1e-12)
    # ... and every exposed second is in the step: compute + exposed comm + optimizer (no bubble, dp, host)
    assert p.step_time_s == pytest.approx(p.compute_s + p.exposed_s["tp"] + p.optimizer_s + p.host_s, rel=1e-12)


def test_dtensor_dispatch_of_tp_layers_is_host_work_hidden_only_behind_compute():
    # nothing hides: 94 DTensor ops per layer (144 with SP) and 14 in the vocab-parallel embedding and head, 1 ms each
    hw = replace(TOY, dtensor_op_s=1e-3, overlap=0.0)
    p = predict(SHAPE, Layout(tp=2, micro_batch=MB, sp=False), cluster(2, hw), seq=SEQ, global_batch=8)
    assert p.host_s == pytest.approx(2 * (4 * 94 + 14) * 1e-3, rel=1e-12)
    sp = predict(SHAPE, Layout(tp=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=8)
    assert sp.host_s == pytest.approx(2 * (4 * 144 + 14) * 1e-3, rel=1e-12)
    # overlap 1: a micro-batch's compute hides that much of its host work; 0.390 s of host work is more than it
    half = predict(SHAPE, Layout(tp=2, micro_batch=MB, sp=False), cluster(2, replace(hw, overlap=1.0)), seq=SEQ,
                   global_batch=8)
    assert half.host_s == pytest.approx(2 * (4 * 94 + 14) * 1e-3 - half.compute_s, rel=1e-12)
    assert half.step_time_s == pytest.approx(half.compute_s + half.exposed_s["tp"] + half.host_s + half.optimizer_s,
                                             rel=1e-12)


def test_ddp_and_zero_reduce_gradients_over_dp():
    # fp32 gradients of the stage: 164,416 x 4 = 657,664 B, one bucket (< 25 MiB): the last bucket is all of it
    grads = STAGE_PARAMS * 4
    ddp = predict(SHAPE, Layout(dp_replicate=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=16)
    assert ddp.microbatches == 2
    assert ddp.exposed_s["dp"] == pytest.approx(call(1, grads), rel=1e-12)  # one all-reduce, after the last micro-batch
    assert ddp.links == {"dp": "nvlink"}
    assert ddp.optimizer_s == pytest.approx(OPT, rel=1e-12)  # replicated: every rank steps all parameters
    assert ddp.step_time_s == pytest.approx(ddp.compute_s + ddp.exposed_s["dp"] + OPT, rel=1e-12)
    # ZeRO-1: a reduce-scatter per step, then an all-gather of the updated bf16 parameters; each rank steps half
    z1 = predict(SHAPE, Layout(dp_replicate=2, engine="deepspeed", zero=1, micro_batch=MB), cluster(2), seq=SEQ,
                 global_batch=16)
    gather = call(0.5, STAGE_PARAMS * 2)
    assert z1.exposed_s["dp"] == pytest.approx(call(0.5, grads) + gather, rel=1e-12)
    assert z1.optimizer_s == pytest.approx(OPT / 2, rel=1e-12)
    assert z1.dp_comm_s == pytest.approx(call(0.5, grads) + gather, rel=1e-12)  # all exposed: the same whole
    # ZeRO-2 reduce-scatters every micro-batch (2 here)
    z2 = predict(SHAPE, Layout(dp_replicate=2, engine="deepspeed", zero=2, micro_batch=MB), cluster(2), seq=SEQ,
                 global_batch=16)
    assert z2.exposed_s["dp"] == pytest.approx(2 * call(0.5, grads) + gather, rel=1e-12)
    assert z2.dp_comm_s == pytest.approx(2 * call(0.5, grads) + gather, rel=1e-12)


def test_a_gradient_reduce_longer_than_the_backward_is_exposed_beyond_it():
    # a 1 kB/s link: the 657,664 B all-reduce takes ~658 s, far beyond the backward window (2/3 of a micro-batch,
    # overlap 1): exposed = all of it minus that window (more than the single bucket's share, which is all of it
    # here too: one bucket). With overlap 0 nothing hides.
    slow = replace(TOY, collectives={"all_reduce": (ALPHA, 1e3)})
    for overlap in (0.0, 1.0):
        hw = replace(slow, overlap=overlap)
        p = predict(SHAPE, Layout(dp_replicate=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=16)
        assert p.exposed_s["dp"] == pytest.approx(ALPHA + STAGE_PARAMS * 4 / 1e3, rel=1e-12)


def test_loss_sync_is_one_small_all_reduce_per_step():
    """The loss all-reduce spans pp x dp x cp: here the 2 data-parallel ranks of one node, so NVLink (the group
    named in mesh order, pp outermost; named dp, cp, pp it looked like a group strided across nodes: the network)."""
    hw = replace(TOY, loss_sync=True)
    p = predict(SHAPE, Layout(dp_replicate=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=16)
    assert p.exposed_s["dp"] == pytest.approx(call(1, STAGE_PARAMS * 4) + call(1, 4), rel=1e-12)  # a 4-byte loss
    assert p.dp_comm_s == pytest.approx(call(1, STAGE_PARAMS * 4) + call(1, 4), rel=1e-12)  # in the whole too
    one = predict(SHAPE, Layout(micro_batch=MB), cluster(1, hw), seq=SEQ, global_batch=8)
    assert one.exposed_s["dp"] == 0  # one rank: nothing to reduce


def test_fsdp2_gathers_each_block_twice_and_exposes_the_first_gather_and_last_reduce():
    L = Layout(dp_shard=2, engine="fsdp2", micro_batch=MB)
    # per micro-batch: 2 x 4 all-gathers of a layer's 36,992 bf16 parameters, 4 reduce-scatters of their fp32 grads
    gather, reduce = call(0.5, PER_LAYER * 2, 8), call(0.5, PER_LAYER * 4, 4)
    p = predict(SHAPE, L, cluster(2), seq=SEQ, global_batch=16)
    assert p.exposed_s["dp"] == pytest.approx(2 * (gather / 8 + reduce / 4), rel=1e-12)  # the rest hides
    assert p.step_time_s == pytest.approx(_parts(p), rel=1e-12)  # the exposed gathers add to the step
    assert p.optimizer_s == pytest.approx(OPT / 2, rel=1e-12)
    none = predict(SHAPE, L, cluster(2, replace(TOY, overlap=0.0)), seq=SEQ, global_batch=16)
    assert none.exposed_s["dp"] == pytest.approx(2 * (gather + reduce), rel=1e-12)  # nothing hides
    # the per-tensor optimizer loop: 9 kernels (1 us) + 7 DTensor ops (10 us) on each of 38 tensors
    hw = replace(TOY, optimizer_ops_per_tensor=9, kernel_floor_s=1e-6)
    loop = predict(SHAPE, L, cluster(2, hw), seq=SEQ, global_batch=16)
    assert loop.optimizer_s == pytest.approx(OPT / 2 + 38 * (9 * 1e-6 + 7 * 10e-6), rel=1e-12)
    ddp = predict(SHAPE, Layout(dp_replicate=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=16)
    assert ddp.optimizer_s == pytest.approx(OPT + 38 * 9 * 1e-6, rel=1e-12)  # plain tensors: no DTensor dispatch


def test_hsdp_also_all_reduces_the_shards_across_replicas():
    L = Layout(dp_replicate=2, dp_shard=2, engine="fsdp2", micro_batch=MB)
    p = predict(SHAPE, L, cluster(4, replace(TOY, overlap=0.0)), seq=SEQ, global_batch=32)
    # shard group of 2 and replicate group of 2 (busbw factors as for 2 ranks); each replica all-reduces its
    # half-layer fp32 gradient shard (36,992 x 4 / 2 B) after each of the 4 reduce-scatters
    comm = call(0.5, PER_LAYER * 2, 8) + call(0.5, PER_LAYER * 4, 4) + call(1, PER_LAYER * 4 / 2, 4)
    assert p.exposed_s["dp"] == pytest.approx(2 * comm, rel=1e-12)
    assert p.optimizer_s == pytest.approx(OPT / 4, rel=1e-12)  # fsdp2 shards the step over all 4 dp ranks


def test_zero3_fetches_every_tensor_and_pays_its_hooks():
    L = Layout(dp_replicate=2, engine="deepspeed", zero=3, micro_batch=MB)
    hw = replace(TOY, overlap=0.0, zero3_hook_s=1e-4)
    p = predict(SHAPE, L, cluster(2, hw), seq=SEQ, global_batch=16)
    # 38 tensors fetched for forward and for backward (76 gathers of 164,416 / 38 bf16 parameters each); the fp32
    # gradients (657,664 B) fit one 2e9 B bucket: one reduce-scatter; hooks 100 us per tensor per micro-batch
    comm = call(0.5, STAGE_PARAMS / 38 * 2, 76) + call(0.5, STAGE_PARAMS * 4, 1)
    assert p.exposed_s["dp"] == pytest.approx(2 * comm, rel=1e-12)
    assert p.host_s == pytest.approx(2 * 38 * 1e-4, rel=1e-12)
    assert p.optimizer_s == pytest.approx(OPT / 2, rel=1e-12)


def test_pipeline_sends_and_bubble():
    # pp 2: ceil(4/2) = 2 layers per stage; the last stage holds 2 layers + 16,448 head parameters; forward and
    # backward each send the 1024 x 64 bf16 activations (131,072 B) once per virtual stage
    for v in (1, 2):
        L = Layout(pp=2, micro_batch=MB, virtual_stages=v)
        p = predict(SHAPE, L, cluster(2), seq=SEQ, global_batch=8)
        sends = call(1, T * 64 * 2, 2 * v)
        mb_time = 2 * LAYER + HEAD + sends
        assert p.exposed_s["pp"] == pytest.approx(2 * sends, rel=1e-12)
        assert p.bubble_s == pytest.approx(mb_time / v, rel=1e-12)  # (p - 1) / v micro-batch times
        opt = (2 * PER_LAYER + LAST) * 32 / 1e12
        assert p.step_time_s == pytest.approx(2 * mb_time + mb_time / v + opt, rel=1e-12)
    # tp 2 x pp 2: the send is scattered over the 2 TP ranks (half each)
    p = predict(SHAPE, Layout(pp=2, tp=2, micro_batch=MB), cluster(4), seq=SEQ, global_batch=8)
    assert p.exposed_s["pp"] == pytest.approx(2 * call(1, T * 64 * 2 / 2, 2), rel=1e-12)


def test_ring_attention_exposes_only_what_outlasts_the_attention_block():
    # cp 2: 512 tokens per rank; K and V of 2 heads of 16 in bf16: 2·512·2·16·2 = 65,536 B per ring step, one step
    # (cp - 1) forward, two backward, against the forward / backward attention of A/2 and 2.5·A/2
    L = Layout(cp=2, micro_batch=MB)
    p = predict(SHAPE, L, cluster(2), seq=SEQ, global_batch=8)
    ring = call(1, 65536)
    per_layer = max(0.0, ring - A / 2) + max(0.0, 2 * ring - 2.5 * A / 2)
    assert per_layer > 0
    assert p.exposed_s["cp"] == pytest.approx(2 * 4 * per_layer, rel=1e-12)
    fast = predict(SHAPE, L, cluster(2, replace(TOY, collectives={**TOY.collectives, "send": (0.0, 1e12)})), seq=SEQ,
                   global_batch=8)
    assert fast.exposed_s["cp"] == 0  # a fast ring hides behind the attention
    rc = predict(SHAPE, Layout(cp=2, micro_batch=MB, recompute="full"), cluster(2), seq=SEQ, global_batch=8)
    assert rc.exposed_s["cp"] == pytest.approx(1.5 * 2 * 4 * per_layer, rel=1e-12)  # the forward's ring again


def test_ulysses_all_to_alls_are_exposed():
    # cp 2, 512 tokens per rank: q and out (2 x 512·4·16·2·2 = 2 x 131,072 B send buffer) and k, v (65,536 x 2 B),
    # forward and backward
    p = predict(SHAPE, Layout(cp=2, cp_impl="ulysses", micro_batch=MB), cluster(2), seq=SEQ, global_batch=8)
    per_layer = 2 * (call(0.5, 2 * 131072) + call(0.5, 65536 * 2))
    assert p.exposed_s["cp"] == pytest.approx(2 * 4 * per_layer, rel=1e-12)
    assert p.links == {"cp": "nvlink", "dp": "nvlink"}  # CP ranks hold the same weights: gradients reduce over cp


def test_expert_parallel_all_to_alls_four_per_layer():
    moe = ModelShape(arch="llama", family="mixtral", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256,
                     max_positions=512, experts=4, top_k=2)
    p = predict(moe, Layout(dp_replicate=2, ep=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=16)
    # dispatch + combine, forward and backward: 4 all-to-alls of 1024 tokens x top-2 rows of 64 bf16 per layer
    assert p.exposed_s["ep"] == pytest.approx(2 * 2 * call(0.5, T * 2 * 64 * 2, 4), rel=1e-12)
    assert "ep" not in predict(moe, Layout(dp_replicate=2, micro_batch=MB), cluster(2), seq=SEQ,
                               global_batch=16).exposed_s


# -- more of the stated rules: whole-step bookkeeping, other shapes, the overlap windows ------------------------------
def _parts(p):
    """The step as the module states it: compute + exposed communication + bubble + optimizer + host work + what
    the hidden communication costs the compute beside it."""
    return p.compute_s + sum(p.exposed_s.values()) + p.bubble_s + p.optimizer_s + p.host_s + p.interference_s


def test_json_row_and_per_gpu_rates_of_a_two_gpu_step():
    p = predict(SHAPE, Layout(dp_replicate=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=16)
    assert type(p.microbatches) is int and p.microbatches == 2  # 16 / (2 x 4): a count, printed as one
    assert p.to_dict() == {"step_time_s": p.step_time_s, "compute_s": p.compute_s, "bubble_s": p.bubble_s,
                           "exposed_s": p.exposed_s, "optimizer_s": p.optimizer_s, "host_s": p.host_s,
                           "microbatches": 2, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "mfu": p.mfu,
                           "hfu": p.hfu, "links": {"dp": "nvlink"},
                           # DDP's one overlap (its reducer's buckets behind backward), on by default; fp32 gradients
                           "overlap": {"grad_reduce": True, "grad_reduce_dtype": "fp32"},
                           "run": {"gemm_dtype": "bf16", "compile": False, "elementwise": "fused"},
                           "interference_s": 0.0, "dp_comm_s": p.dp_comm_s}
    # DDP's one bucket of fp32 gradients (164,416 x 4 B, all-reduce factor 1), before overlap (the toy GPU has no
    # per-step loss sync)
    assert p.dp_comm_s == pytest.approx(call(1, STAGE_PARAMS * 4), rel=1e-12)
    # 16 x 256 tokens per step over 2 GPUs; MFU / HFU: the step's FLOPs over 2 GPUs x 1 TFLOP/s
    assert p.tokens_per_s_per_gpu == pytest.approx(16 * SEQ / p.step_time_s / 2, rel=1e-12)
    assert p.mfu == pytest.approx(flops_per_step(SHAPE, 16, SEQ)["total"] / (p.step_time_s * 2e12), rel=1e-12)
    assert p.hfu == pytest.approx(p.mfu, rel=1e-12)  # no recompute
    eager = predict(SHAPE, Layout(micro_batch=MB), cluster(1), seq=SEQ, global_batch=8, attention="eager")
    e_fwd = 2 * 16 * (2 * 256 * 16 * 256 / 1e12) + 6 * 16 * 256 * 256 * 2 / 1e12
    assert eager.compute_s == pytest.approx(2 * (4 * (3 * G + 3 * e_fwd + E) + HEAD), rel=1e-12)


def test_tp_step_compute_splits_the_head_and_sp_the_hidden_vectors():
    # tp 2 with SP: the layer as in test_tensor_parallel_layer...; the head's GEMM and its loss over V/2 = 128
    g2, e2_sp = 2 * T * 18432 / 1e12, T * (32 * 64 / 2 + 8 * 64) * 2 / 1e12
    head2 = 3 * 2 * T * 64 * 128 / 1e12 + 6 * T * 128 * 4 / 1e12
    p = predict(SHAPE, Layout(tp=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=8)
    assert p.compute_s == pytest.approx(2 * (4 * (3 * g2 + 3.5 * A / 2 + e2_sp) + head2), rel=1e-12)
    assert p.step_time_s == pytest.approx(_parts(p), rel=1e-12)
    # tp 2 x cp 2: the TP all-reduce carries this rank's 4 x 128 tokens; the ring's K/V are 1 head per TP rank
    tc = predict(SHAPE, Layout(tp=2, cp=2, micro_batch=MB, sp=False), cluster(4), seq=SEQ, global_batch=8)
    assert tc.exposed_s["tp"] == pytest.approx(2 * 4 * call(1, 4 * 128 * 64 * 2, 4), rel=1e-12)
    ring = call(1, 2 * 512 * 1 * 16 * 2)  # K and V: 512 tokens x 1 head x 16, bf16
    a2 = A / 2 / 2  # cp 2 and tp 2 each halve the flash FLOPs
    assert tc.exposed_s["cp"] == pytest.approx(2 * 4 * (max(0, ring - a2) + max(0, 2 * ring - 2.5 * a2)), rel=1e-12)
    # Ulysses under tp 2: 2 query heads per TP rank in the q / out send buffer, 1 K/V head
    tu = predict(SHAPE, Layout(tp=2, cp=2, cp_impl="ulysses", micro_batch=MB), cluster(4), seq=SEQ, global_batch=8)
    q_bytes = 512 * 2 * 16 * 2 * 2
    assert tu.exposed_s["cp"] == pytest.approx(
        2 * 4 * 2 * (call(0.5, 2 * q_bytes) + call(0.5, 2 * 512 * 16 * 2 * 2)), rel=1e-12)


def test_a_longer_ring_sends_cp_minus_1_blocks():
    # cp 4: 256 tokens per rank, 3 ring steps of 2·256·2·16·2 = 32,768 B each way, against A/4 of attention
    p = predict(SHAPE, Layout(cp=4, micro_batch=MB), cluster(4), seq=SEQ, global_batch=8)
    ring = call(1, 32768, 3)
    assert p.exposed_s["cp"] == pytest.approx(2 * 4 * (max(0, ring - A / 4) + max(0, 2 * ring - 2.5 * A / 4)),
                                              rel=1e-12)
    # the gradients of CP ranks (same weights) reduce over them: DDP's all-reduce over the 4 CP ranks (busbw 2·3/4)
    assert p.exposed_s["dp"] == pytest.approx(call(1.5, STAGE_PARAMS * 4), rel=1e-12)
    assert p.step_time_s == pytest.approx(_parts(p), rel=1e-12)
    # tp 4 > 2 K/V heads: each TP rank keeps 1 (replicated) and sends it round the ring: 2·512·1·16·2 B
    q = predict(SHAPE, Layout(tp=4, cp=2, micro_batch=MB, sp=False), cluster(8), seq=SEQ, global_batch=8)
    ring, a8 = call(1, 32768), A / 2 / 4  # attention: half the rows, a quarter of the heads
    assert q.exposed_s["cp"] == pytest.approx(2 * 4 * (max(0, ring - a8) + max(0, 2 * ring - 2.5 * a8)), rel=1e-12)
    # FSDP2 over cp alone shards the optimizer step over the 2 CP ranks
    f = predict(SHAPE, Layout(cp=2, engine="fsdp2", micro_batch=MB), cluster(2), seq=SEQ, global_batch=8)
    assert f.optimizer_s == pytest.approx(OPT / 2, rel=1e-12)


def test_a_gpt2_layer_has_one_mlp_input_gemm():
    gpt = ModelShape(arch="gpt2", layers=4, hidden=64, heads=4, vocab=256, max_positions=512)  # ffn 4h = 256
    # K·N: c_attn 64·(4+2·4)·16 = 12,288, c_proj 4,096, c_fc 64·256 = 16,384, mlp c_proj 256·64 = 16,384 -> 49,152
    layer, *_ = _layer_time(gpt, Layout(micro_batch=MB), TOY, t=T, seq=SEQ, act=2, dtype="bf16", attention="flash",
                              sp=False)
    e = T * (32 * 64 + 8 * 256) * 2 / 1e12
    assert layer == pytest.approx(3 * 2 * T * 49152 / 1e12 + 3.5 * A + e, rel=1e-12)


MOE = ModelShape(arch="llama", family="mixtral", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256,
                 max_positions=512, experts=4, top_k=2)  # expert ffn 128


def test_an_moe_layer_runs_router_and_grouped_expert_gemms_over_t_times_k_rows():
    # K·N per token: q,k,v 8192 + o 4096 + router 64·4 = 256; per (token, choice) row, 2t = 2048 rows:
    # gate+up 64·256 = 16384, down 128·64 = 8192; element-wise over top_k x 128 = 256 MLP-width per token
    layer, *_ = _layer_time(MOE, Layout(micro_batch=MB), TOY, t=T, seq=SEQ, act=2, dtype="bf16",
                              attention="flash", sp=False)
    g = 2 * T * (8192 + 4096 + 256) / 1e12 + 2 * (2 * T) * (16384 + 8192) / 1e12
    e = T * (32 * 64 + 8 * 256) * 2 / 1e12
    assert layer == pytest.approx(3 * g + 3.5 * A + e, rel=1e-12)


def test_moe_under_tp_splits_the_sparse_blocks_tokens():
    """TP on an MoE model (coursekit.tp.plan: expert TP 1): attention split by heads, the sparse block whole on each
    TP rank over its half of the tokens; per layer 2 attention all-reduces and 2 all-gathers (the block's output,
    its input's gradient); after backward the router's and experts' fp32 gradients summed over the TP ranks."""
    # one layer, tp 2: K·N per token q 64·2·16 + k, v 2·64·1·16 = 4096, o 2048; 512 tokens through the router
    # (64·4 = 256); 512 x top-2 = 1024 rows through the experts (16384 + 8192); attention on 2 of 4 heads; the
    # element-wise MLP width: top-2 x 128 over half the tokens
    layer, *_ = _layer_time(MOE, Layout(tp=2, micro_batch=MB, sp=False), TOY, t=T, seq=SEQ, act=2, dtype="bf16",
                              attention="flash", sp=False)
    g = 2 * T * (4096 + 2048) / 1e12 + 2 * (T / 2) * 256 / 1e12 + 2 * T * (16384 + 8192) / 1e12
    e = T * (32 * 64 + 8 * 256 / 2) * 2 / 1e12
    assert layer == pytest.approx(3 * g + 3.5 * A / 2 + e, rel=1e-12)
    p = predict(MOE, Layout(tp=2, micro_batch=MB, sp=False), cluster(2), seq=SEQ, global_batch=8)  # 2 micro-batches
    per_layer = call(1, T * 64 * 2, 2) + call(0.5, T * 64 * 2, 2)  # all-reduce x 2 + all-gather x 2 (2 ranks)
    grads = call(1, (4 * 64 + 4 * 3 * 128 * 64) * 4 / 3, 3 * 2)  # router + experts, 3 tensors x 2 layers, fp32
    assert p.exposed_s["tp"] == pytest.approx(2 * 2 * per_layer + grads, rel=1e-12)
    assert p.step_time_s == pytest.approx(_parts(p), rel=1e-12)
    # full recompute repeats the forward's all-reduce and all-gather
    r = predict(MOE, Layout(tp=2, micro_batch=MB, sp=False, recompute="full"), cluster(2), seq=SEQ, global_batch=8)
    assert r.exposed_s["tp"] == pytest.approx(2 * 2 * 1.5 * per_layer + grads, rel=1e-12)
    # under SP the attention's all-gather + reduce-scatter instead; the sparse block keeps the rank's 512 tokens
    q = predict(MOE, Layout(tp=2, micro_batch=MB, sp=True), cluster(2), seq=SEQ, global_batch=8)
    assert q.exposed_s["tp"] == pytest.approx(2 * 2 * (call(0.5, T * 64 * 2, 2) + call(0.5, T * 64 * 2, 2)) + grads,
                                              rel=1e-12)
    # with EP 2 over dp 2 as well: each TP rank dispatches its 512 tokens x top-2 rows
    q = predict(MOE, Layout(tp=2, dp_replicate=2, ep=2, micro_batch=MB, sp=False), cluster(4), seq=SEQ,
                global_batch=16)
    assert q.exposed_s["ep"] == pytest.approx(2 * 2 * call(0.5, T / 2 * 2 * 64 * 2, 4), rel=1e-12)
    # the post-backward TP sum covers this rank's part only: under EP 2 half of the 98,304 expert parameters (the
    # router's 256 whole); under FSDP2 over dp_shard 2 also half of the router, the expert slices whole (2 ranks
    # hold each slice: 2 // ep = 1)
    assert q.exposed_s["tp"] == pytest.approx(2 * 2 * per_layer + call(1, (256 + 49152) * 4 / 3, 6), rel=1e-12)
    f = predict(MOE, Layout(tp=2, dp_shard=2, engine="fsdp2", ep=2, micro_batch=MB, sp=False), cluster(4), seq=SEQ,
                global_batch=16)
    assert f.exposed_s["tp"] == pytest.approx(2 * 2 * per_layer + call(1, (128 + 49152) * 4 / 3, 6), rel=1e-12)


def test_expert_parallel_params_reduce_and_shard():
    # ep 2: each rank holds half of a layer's 98,304 expert parameters: 12,672 dense + 49,152 = 61,824 per layer;
    # the last stage 2 x 61,824 + 16,448 = 140,096. DDP all-reduces their fp32 gradients over the 2 dp ranks
    p = predict(MOE, Layout(dp_replicate=2, ep=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=16)
    assert p.exposed_s["dp"] == pytest.approx(call(1, 140096 * 4), rel=1e-12)
    assert p.links == {"dp": "nvlink", "ep": "nvlink"}
    assert p.step_time_s == pytest.approx(_parts(p), rel=1e-12)
    assert p.optimizer_s == pytest.approx(140096 * 32 / 1e12, rel=1e-12)  # replicated step
    # FSDP2 shards the step over dp 2; the expert slices count ep times (both slices' holders are the shard ranks):
    # 140,096 + (2 - 1) x 2 layers x 49,152 = 238,400, over 2
    f = predict(MOE, Layout(dp_shard=2, engine="fsdp2", ep=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=16)
    assert f.optimizer_s == pytest.approx(238400 / 2 * 32 / 1e12, rel=1e-12)
    # a dense model has no all-to-alls, whatever ep says
    assert predict(SHAPE, Layout(dp_replicate=2, ep=2, micro_batch=MB), cluster(2), seq=SEQ,
                   global_batch=16).exposed_s["ep"] == 0


def test_pipeline_links_and_a_tp_send_without_sp():
    p = predict(SHAPE, Layout(pp=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=8)
    assert p.links == {"pp": "nvlink"} and p.step_time_s == pytest.approx(_parts(p), rel=1e-12)
    net = Network(name="toy-net", bw_per_gpu=1e9, collectives=TOY.collectives)  # the network priced as NVLink
    far = predict(SHAPE, Layout(pp=2, micro_batch=MB), Cluster(TOY, net, 2, 1), seq=SEQ, global_batch=8)
    assert far.links == {"pp": "network"}  # one GPU per node: the stages sit on two nodes
    # tp 2 without SP still scatters the send over the TP ranks
    q = predict(SHAPE, Layout(pp=2, tp=2, sp=False, micro_batch=MB), cluster(4), seq=SEQ, global_batch=8)
    assert q.exposed_s["pp"] == pytest.approx(2 * call(1, T * 64 * 2 / 2, 2), rel=1e-12)


def test_the_per_tensor_optimizer_loop_pays_dtensor_dispatch_on_torch_native_composition():
    hw = replace(TOY, optimizer_ops_per_tensor=9, kernel_floor_s=1e-6)
    loop = lambda tensors: tensors * (9 * 1e-6 + 7 * 10e-6)  # noqa: E731  9 kernels + 7 DTensor ops per tensor
    # DDP over TP (38 tensors, each half the size) or over PP (the last stage: 2 layers x 9 + 2 = 20 tensors)
    tp = predict(SHAPE, Layout(tp=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=8)
    assert tp.optimizer_s == pytest.approx((4 * 18560 + 8256) * 32 / 1e12 + loop(38), rel=1e-12)
    pp = predict(SHAPE, Layout(pp=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=8)
    assert pp.optimizer_s == pytest.approx((2 * PER_LAYER + LAST) * 32 / 1e12 + loop(20), rel=1e-12)
    # DeepSpeed steps flat partitions: no DTensor, even over TP
    ds = predict(SHAPE, Layout(tp=2, engine="deepspeed", zero=1, micro_batch=MB), cluster(2, hw), seq=SEQ,
                 global_batch=8)
    assert ds.optimizer_s == pytest.approx((4 * 18560 + 8256) * 32 / 1e12 + 38 * 9e-6, rel=1e-12)


def test_dp_over_tp_reduces_this_ranks_shard_and_zero3_adds_hooks_to_dtensor_work():
    # tp 2: a layer's local parameters 64 + 2048 (q) + 2048 (k, v: 1 head) + 2048 (o) + 64 + 8192 + 4096 = 18,560;
    # last stage 64 + 8192: 82,496 per rank, their fp32 gradients all-reduced over dp 2
    p = predict(SHAPE, Layout(dp_replicate=2, tp=2, micro_batch=MB), cluster(4), seq=SEQ, global_batch=16)
    assert p.exposed_s["dp"] == pytest.approx(call(1, (4 * 18560 + 8256) * 4), rel=1e-12)
    hw = replace(TOY, overlap=0.0, zero3_hook_s=1e-4, dtensor_op_s=1e-3)
    z3 = predict(SHAPE, Layout(dp_replicate=2, tp=2, engine="deepspeed", zero=3, micro_batch=MB), cluster(4, hw),
                 seq=SEQ, global_batch=16)
    assert z3.host_s == pytest.approx(2 * ((4 * 144 + 14) * 1e-3 + 38 * 1e-4), rel=1e-12)  # SP's DTensor ops + hooks


def test_overlap_windows_of_gradient_reduces_and_fsdp_gathers():
    # a model whose fp32 gradients span buckets: 2 layers of h 1024 (8 heads of 128, MHA, ffn 2048), vocab 256:
    # 2·1024 + 4·1024² + 3·1024·2048 = 10,487,808 per layer; last stage 1024 + 256·1024: 21,238,784 parameters
    big = ModelShape(arch="llama", layers=2, hidden=1024, heads=8, kv_heads=8, ffn=2048, vocab=256, max_positions=512)
    grads = 21238784 * 4  # 84,955,136 B: 4 DDP buckets of 25 MiB (one all-reduce each), < one 2e9 B DeepSpeed bucket
    red = call(1, grads / 4, 4)
    for overlap in (1.0, 0.1):
        hw = replace(TOY, overlap=overlap)
        p = predict(big, Layout(dp_replicate=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=16)
        window = overlap * (p.compute_s / 2) * 2 / 3  # backward: 2/3 of a micro-batch's compute
        # at least the last bucket's all-reduce; with a short window what does not fit in it
        assert p.exposed_s["dp"] == pytest.approx(max(red / 4, red - window), rel=1e-12)
        assert (overlap == 1.0) == (red / 4 > red - window)  # each branch taken once
        z1 = predict(big, Layout(dp_replicate=2, engine="deepspeed", zero=1, micro_batch=MB), cluster(2, hw),
                     seq=SEQ, global_batch=16)
        z_red = call(0.5, grads)  # one DeepSpeed bucket: nothing reduces before the last one
        assert z1.exposed_s["dp"] == pytest.approx(z_red + call(0.5, 21238784 * 2), rel=1e-12)
    # FSDP2 on a slow link (1 MB/s): the gathers and reduces outlast the compute; exposed what it does not cover
    slow = replace(TOY, collectives={op: (ALPHA, 1e6) for op in TOY.collectives})
    f = predict(SHAPE, Layout(dp_shard=2, engine="fsdp2", micro_batch=MB), cluster(2, slow), seq=SEQ, global_batch=16)
    comm = 8 * (ALPHA + PER_LAYER * 2 * 0.5 / 1e6) + 4 * (ALPHA + PER_LAYER * 4 * 0.5 / 1e6)
    assert f.exposed_s["dp"] == pytest.approx(2 * (comm - f.compute_s / 2), rel=1e-12)


def test_zero3_reduces_in_2e9_byte_buckets_and_hsdp_divides_by_the_shard_group():
    # 4 layers of h 4096 (32 heads, MHA, ffn 8192), vocab 256: 2·4096 + 4·4096² + 3·4096·8192 = 167,780,352 per
    # layer, last stage 4096 + 256·4096: 672,174,080 parameters; fp32 gradients 2.69e9 B: 2 buckets
    big = ModelShape(arch="llama", layers=4, hidden=4096, heads=32, kv_heads=32, ffn=8192, vocab=256,
                     max_positions=512)
    n = 672174080
    hw = replace(TOY, overlap=0.0, zero3_hook_s=0.0)
    p = predict(big, Layout(dp_replicate=2, engine="deepspeed", zero=3, micro_batch=MB), cluster(2, hw), seq=SEQ,
                global_batch=16)
    comm = call(0.5, n / 38 * 2, 76) + call(0.5, n / 2 * 4, 2)  # 38 tensors fetched twice; 2 half-size reduces
    assert p.exposed_s["dp"] == pytest.approx(2 * comm, rel=1e-12)
    # HSDP with one GPU per node (the network priced as the toy link): the shard group still has 2 members
    net = Network(name="toy-net", bw_per_gpu=1e9, collectives=TOY.collectives)
    h = predict(SHAPE, Layout(dp_replicate=2, dp_shard=2, engine="fsdp2", micro_batch=MB),
                Cluster(replace(TOY, overlap=0.0), net, 4, 1), seq=SEQ, global_batch=32)
    comm = call(0.5, PER_LAYER * 2, 8) + call(0.5, PER_LAYER * 4, 4) + call(1, PER_LAYER * 4 / 2, 4)
    assert h.exposed_s["dp"] == pytest.approx(2 * comm, rel=1e-12)


def test_overlap_options_per_engine_by_hand():
    """Each overlap switch of ``coursekit.plan.overlap`` changes only its own term, as its rule says."""
    big = ModelShape(arch="llama", layers=2, hidden=1024, heads=8, kv_heads=8, ffn=2048, vocab=256, max_positions=512)
    grads = 21238784 * 4  # the stage of test_overlap_windows_of_gradient_reduces_and_fsdp_gathers: 4 DDP buckets
    red = call(1, grads / 4, 4)
    on = predict(big, Layout(dp_replicate=2, micro_batch=MB), cluster(2), seq=SEQ, global_batch=16)
    off = predict(big, Layout(dp_replicate=2, micro_batch=MB, overlap="no-grad_reduce"), cluster(2), seq=SEQ,
                  global_batch=16)
    assert on.exposed_s["dp"] == pytest.approx(red / 4, rel=1e-12)  # the last bucket
    assert off.exposed_s["dp"] == pytest.approx(red, rel=1e-12)  # reduced after backward: all of it
    assert off.overlap == {"grad_reduce": False, "grad_reduce_dtype": "fp32"}
    assert off.compute_s == on.compute_s
    # bf16 gradients on the wire: half the bytes, in 2 buckets (42,477,568 B over 25 MiB)
    bf = predict(big, Layout(dp_replicate=2, micro_batch=MB, overlap="no-grad_reduce", grad_reduce_dtype="bf16"),
                 cluster(2), seq=SEQ, global_batch=16)
    assert bf.exposed_s["dp"] == pytest.approx(call(1, grads / 4, 2), rel=1e-12)
    # ZeRO-1's parameter all-gather behind the next step's first forward, bucket by bucket: 4 layers of h 4096 hold
    # 672,174,080 parameters, two 5e8-element buckets' worth (two all-gathers of half), so one of them stays exposed
    # (the forward of one micro-batch, a third of its ~4 s of compute, outlasts the other)
    huge = ModelShape(arch="llama", layers=4, hidden=4096, heads=32, kv_heads=32, ffn=8192, vocab=256,
                      max_positions=512)
    n = 672174080
    z = dict(dp_replicate=2, engine="deepspeed", zero=1, micro_batch=MB)
    plain = predict(huge, Layout(**z), cluster(2), seq=SEQ, global_batch=16)
    hidden = predict(huge, Layout(**z, overlap="param_gather"), cluster(2), seq=SEQ, global_batch=16)
    gather = call(0.5, n * 2 / 2, 2)
    assert plain.exposed_s["dp"] - hidden.exposed_s["dp"] == pytest.approx(gather / 2, rel=1e-9)
    assert hidden.overlap["param_gather"] and not plain.overlap["param_gather"]
    # FSDP2 without prefetch: every gather and reduce-scatter exposed (as with overlap 0 in the test above)
    f = predict(SHAPE, Layout(dp_shard=2, engine="fsdp2", micro_batch=MB, overlap="no-prefetch"), cluster(2),
                seq=SEQ, global_batch=16)
    assert f.exposed_s["dp"] == pytest.approx(2 * (call(0.5, PER_LAYER * 2, 8) + call(0.5, PER_LAYER * 4, 4)),
                                              rel=1e-12)
    # TP overlap under SP: each layer's all-gathers + reduce-scatters (4 + 4 of 131,072 B) pipelined with the
    # layer's GEMMs (3 x G / 2 at tp 2): exposed what the GEMMs leave, at least one tp-th
    tp_s = 2 * call(0.5, 131072, 4)
    expect = max(tp_s / 2, tp_s - 3 * G / 2)
    assert expect == tp_s - 3 * G / 2  # here the GEMMs are shorter than the communication
    tp = predict(SHAPE, Layout(tp=2, micro_batch=MB, overlap="tp"), cluster(2), seq=SEQ, global_batch=8)
    assert tp.exposed_s["tp"] == pytest.approx(2 * 4 * expect, rel=1e-12)
    fast = replace(TOY, collectives={**TOY.collectives, "all_gather": (0.0, 1e12), "reduce_scatter": (0.0, 1e12)})
    quick = predict(SHAPE, Layout(tp=2, micro_batch=MB, overlap="tp"), cluster(2, fast), seq=SEQ, global_batch=8)
    q_s = 2 * 4 * 131072 * 0.5 / 1e12
    assert quick.exposed_s["tp"] == pytest.approx(2 * 4 * q_s / 2, rel=1e-12)  # hidden but the first chunk


@pytest.mark.parametrize("layout, needle", [
    (dict(dp_replicate=2, overlap="tp"), "needs tp > 1 with sequence parallelism"),
    (dict(tp=2, sp=False, overlap="tp"), "needs tp > 1 with sequence parallelism"),
    (dict(dp_replicate=2, overlap="prefetch"), "sharded engine"),
    (dict(dp_shard=2, engine="fsdp2", overlap="grad_reduce"), "DDP and ZeRO-1/2"),
    (dict(dp_replicate=2, overlap="param_gather"), "zero 1 or 2"),
    (dict(dp_replicate=2, overlap="fast"), "unknown"),
    (dict(dp_replicate=2, grad_reduce_dtype="fp8"), "grad_reduce_dtype"),
])
def test_an_overlap_that_cannot_act_is_refused(layout, needle):
    with pytest.raises(ValueError, match=needle):
        Layout(**layout)


def test_fp8_compile_and_per_layer_recompute_by_hand():
    """One toy GPU with an FP8 peak of 2 TFLOP/s: the linear GEMMs take half their bf16 time and each linear's
    input, weight (twice: forward and backward) and output gradient pay an amax + cast pass, 5 B per element:
    q/k/v (1024 x 64 @ 64 x 128) 2·65,536 + 2·8,192 + 131,072, o 2·65,536 + 2·4,096 + 65,536, gate+up 2·65,536 +
    2·16,384 + 262,144, down 2·131,072 + 2·8,192 + 65,536: 1,253,376 elements, 6.27 µs at 1 TB/s per layer; the LM
    head and attention stay bf16, and MFU counts against the bf16 peak. torch.compile keeps a third of the
    element-wise traffic. recompute_layers 1 of the 4 layers re-runs a quarter of full recompute's forward."""
    hw = replace(TOY, peak_flops={**TOY.peak_flops, "fp8": 2e12})
    cast = 5 * 1253376 / 1e12
    fp8 = predict(SHAPE, Layout(micro_batch=MB), cluster(1, hw), seq=SEQ, global_batch=8, dtype="fp8")
    assert fp8.compute_s == pytest.approx(2 * (4 * (LAYER - 1.5 * G + cast) + HEAD), rel=1e-12)
    assert fp8.mfu == pytest.approx(flops_per_step(SHAPE, 8, SEQ)["total"] / (fp8.step_time_s * 1e12), rel=1e-12)
    assert fp8.run == {"gemm_dtype": "fp8", "compile": False, "elementwise": "fused"}
    with pytest.raises(ValueError, match="no fp8 peak"):
        predict(SHAPE, Layout(micro_batch=MB), cluster(1), seq=SEQ, global_batch=8, dtype="fp8")
    comp = predict(SHAPE, Layout(micro_batch=MB), cluster(1), seq=SEQ, global_batch=8, compile=True)
    assert comp.compute_s == pytest.approx(2 * (4 * (LAYER - E + E / 3) + HEAD), rel=1e-12)
    both = predict(SHAPE, Layout(micro_batch=MB), cluster(1, hw), seq=SEQ, global_batch=8, dtype="fp8", compile=True)
    assert both.compute_s == pytest.approx(2 * (4 * (LAYER - 1.5 * G - E + E / 3 + cast) + HEAD), rel=1e-12)
    part = predict(SHAPE, Layout(micro_batch=MB, recompute="full", recompute_layers=1), cluster(1), seq=SEQ,
                   global_batch=8)
    assert part.compute_s == pytest.approx(2 * (4 * (LAYER + (G + A + E / 3) / 4) + HEAD), rel=1e-12)
    plain, full = (flops_per_step(SHAPE, 8, SEQ, recompute=rc)["total"] for rc in ("none", "full"))
    assert part.hfu == pytest.approx((plain + (full - plain) / 4) / (part.step_time_s * 1e12), rel=1e-12)
    # 2 layers of each chunk under pp 2 x v 2 (8 layers, 4 chunks of 2): recompute_layers 1 is half of each chunk
    deep = replace(SHAPE, layers=8)
    args = dict(seq=SEQ, global_batch=16)
    half = predict(deep, Layout(pp=2, virtual_stages=2, micro_batch=MB, recompute="full", recompute_layers=1),
                   cluster(2), **args)
    none = predict(deep, Layout(pp=2, virtual_stages=2, micro_batch=MB), cluster(2), **args)
    fullp = predict(deep, Layout(pp=2, virtual_stages=2, micro_batch=MB, recompute="full"), cluster(2), **args)
    assert half.compute_s - none.compute_s == pytest.approx((fullp.compute_s - none.compute_s) / 2, rel=1e-12)


def test_eager_elementwise_by_hand():
    """The default (eager) element-wise term from ELEMENTWISE's coefficients, by hand: h, the query width, the K/V
    width and the MLP width per TP rank, biases one pass of their output each, gpt2's gelu_new and dropout, a MoE
    block's top_k x expert_ffn and top_k x h over the TP ranks' token split; fused is FUSED_H x h + FUSED_F x f.
    Catches a coefficient on the wrong width, a TP or SP division dropped or added, biases or extras ignored."""
    per_token = steptime.elementwise_per_token
    llama = 152.19 * 64 + 27.49 * 64 + 25.79 * 32 + 14.24 * 128 + 3.2
    assert per_token(SHAPE) == pytest.approx(llama, rel=1e-12)
    assert per_token(SHAPE, elementwise="fused") == pytest.approx(32 * 64 + 8 * 128, rel=1e-12)
    # tp 2: heads, K/V heads and ffn split; the hidden-width work whole unless SP splits it
    tp2 = 27.49 * 32 + 25.79 * 16 + 14.24 * 64 + 3.2
    assert per_token(SHAPE, tp=2) == pytest.approx(152.19 * 64 + tp2, rel=1e-12)
    assert per_token(SHAPE, tp=2, sp=True) == pytest.approx(152.19 * 32 + tp2, rel=1e-12)
    # tp 4 over 2 K/V heads: each rank keeps one K/V head (16 wide)
    assert per_token(SHAPE, tp=4) == pytest.approx(152.19 * 64 + 27.49 * 16 + 25.79 * 16 + 14.24 * 32 + 3.2,
                                                   rel=1e-12)
    # qwen2: q, k, v biased (+ q + 2 kv), o_proj not; and every bias of a llama with mlp_bias: + 2 f + h
    qwen2 = ModelShape(arch="llama", family="qwen2", layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256,
                       qkv_bias=True)
    assert per_token(qwen2) == pytest.approx(llama + 64 + 2 * 32, rel=1e-12)
    assert per_token(replace(SHAPE, mlp_bias=True)) == pytest.approx(llama + 2 * 128 + 64, rel=1e-12)
    # gpt2 (biased q, k, v, o, fc, proj; tanh GELU by default): 28.06 h + 5 f + 8, + 41 f, + 5 h + f of biases;
    # a residual dropout adds 24 h
    gpt = ModelShape(arch="gpt2", layers=4, hidden=64, heads=4, vocab=256, max_positions=512)  # ffn 256
    g = 28.06 * 64 + 5 * 256 + 8 + 41 * 256 + (3 * 64 + 64 + 256 + 64)
    assert per_token(gpt) == pytest.approx(g, rel=1e-12)
    assert per_token(replace(gpt, resid_dropout=0.1)) == pytest.approx(g + 24 * 64, rel=1e-12)
    assert per_token(replace(gpt, activation="gelu")) == pytest.approx(g - 41 * 256, rel=1e-12)
    # mixtral (top 2 of its experts, each ffn 128): no dense MLP term; the sparse block's terms split over TP
    moe = 159.54 * 64 + 29.88 * 64 + 20.77 * 32 + 1470.5
    assert per_token(MOE) == pytest.approx(moe + 17.97 * 256 + 40.73 * 128, rel=1e-12)
    assert per_token(MOE, tp=2) == pytest.approx(159.54 * 64 + 29.88 * 32 + 20.77 * 16 + 1470.5
                                                 + (17.97 * 256 + 40.73 * 128) / 2, rel=1e-12)
    assert per_token(MOE, elementwise="fused") == pytest.approx(32 * 64 + 8 * 256, rel=1e-12)
    # biased experts (the dense rule, one pass of each output: gate, up and down of each of the 2 routed experts),
    # over the TP ranks' token split
    assert per_token(replace(MOE, mlp_bias=True), tp=2) == pytest.approx(
        per_token(MOE, tp=2) + 2 * (2 * 128 + 64) / 2, rel=1e-12)
    with pytest.raises(ValueError, match="elementwise must be one of eager, fused"):
        per_token(SHAPE, elementwise="triton")
    # in the layer: t tokens x 2 bytes at 1 TB/s, in place of the fused term E
    eager_layer = steptime._layer_time(SHAPE, Layout(micro_batch=MB), TOY, t=T, seq=SEQ, act=2, dtype="bf16",
                                       attention="flash", sp=False)[0]
    assert eager_layer == pytest.approx(LAYER - E + T * llama * 2 / 1e12, rel=1e-12)
    with pytest.raises(ValueError, match="elementwise must be one of"):
        steptime.predict(SHAPE, Layout(micro_batch=MB), cluster(1), seq=SEQ, global_batch=8, elementwise="x")
    plain = steptime.predict(SHAPE, Layout(micro_batch=MB), cluster(1), seq=SEQ, global_batch=8)  # the default
    assert plain.run["elementwise"] == "eager" and plain.compute_s == pytest.approx(2 * (4 * eager_layer + HEAD), rel=1e-12)


def test_hidden_communication_slows_the_compute_beside_it():
    """Hardware.overlap_slowdown s: compute beside a collective runs (1 + s) slower (s = 0.25 here: 1 / (1 + s) =
    0.8). While the compute window outlasts the collectives, the step grows by hidden x s / (1 + s) = 0.2 x hidden;
    once they outlast it, by what of the slowed compute outlasts them: window - comm x 0.8, never below 0. By hand:
    FSDP2 over 2 ranks hides 2 x (8 gathers + 4 reduce-scatters) but the first gather and last reduce of each
    micro-batch, inside the compute; DDP's one bucket is exposed whole (nothing hidden); TP overlap on the toy link
    outlasts its GEMMs by far (0), and on a fast link hides all but one chunk (0.2 x that). With nothing hidden
    (overlap 0) nothing is charged; the default is Lee et al.'s mean slowdown (0.189)."""
    from coursekit.plan.hardware import HARDWARE, OVERLAP_SLOWDOWN

    stretch = steptime._stretch
    assert stretch(10.0, 2.0, 20.0, 0.25) == pytest.approx(0.2 * 8.0)  # inside the window: 0.2 x hidden
    assert stretch(10.0, 2.0, 10.0, 0.25) == pytest.approx(0.2 * 8.0)  # at its edge (comm == window) still
    assert stretch(11.0, 1.0, 10.0, 0.25) == pytest.approx(10.0 - 11.0 * 0.8)  # beyond it: 1.2 s of slowed compute
    assert stretch(13.0, 3.0, 10.0, 0.25) == 0.0  # 13 x 0.8 = 10.4 > 10: the compute ends under the collectives
    assert stretch(5.0, 5.0, 20.0, 0.25) == 0.0 and stretch(5.0, 6.0, 20.0, 0.25) == 0.0  # nothing hidden

    hw = replace(TOY, overlap_slowdown=0.25)
    L = Layout(dp_shard=2, engine="fsdp2", micro_batch=MB)
    gather, reduce = call(0.5, PER_LAYER * 2, 8), call(0.5, PER_LAYER * 4, 4)
    base = predict(SHAPE, L, cluster(2), seq=SEQ, global_batch=16)
    slow = predict(SHAPE, L, cluster(2, hw), seq=SEQ, global_batch=16)
    hidden = 2 * (gather + reduce) - 2 * (gather / 8 + reduce / 4)
    assert 2 * (gather + reduce) < base.compute_s  # inside the compute window
    assert slow.dp_comm_s == pytest.approx(2 * (gather + reduce), rel=1e-12)
    assert slow.interference_s == pytest.approx(0.2 * hidden, rel=1e-12)
    assert slow.step_time_s == pytest.approx(base.step_time_s + 0.2 * hidden, rel=1e-12)
    assert slow.step_time_s == pytest.approx(_parts(slow), rel=1e-12)
    assert slow.exposed_s == base.exposed_s and slow.compute_s == base.compute_s  # only the new term moves
    none = predict(SHAPE, L, cluster(2, replace(hw, overlap=0.0)), seq=SEQ, global_batch=16)
    assert none.interference_s == 0.0  # nothing hides, nothing interferes
    ddp = predict(SHAPE, Layout(dp_replicate=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=16)
    assert ddp.interference_s == 0.0  # one bucket: its reduce is the last bucket, exposed whole
    tp = predict(SHAPE, Layout(tp=2, micro_batch=MB, overlap="tp"), cluster(2, hw), seq=SEQ, global_batch=8)
    assert 2 * call(0.5, 131072, 4) * 0.8 > 3 * G / 2 and tp.interference_s == 0.0  # outlasts the GEMMs by far
    fast = replace(hw, collectives={**TOY.collectives, "all_gather": (0.0, 1e12), "reduce_scatter": (0.0, 1e12)})
    quick = predict(SHAPE, Layout(tp=2, micro_batch=MB, overlap="tp"), cluster(2, fast), seq=SEQ, global_batch=8)
    q_s = 2 * 4 * 131072 * 0.5 / 1e12  # far inside the GEMMs: all but the first of 2 chunks hidden
    assert quick.interference_s == pytest.approx(2 * 4 * 0.2 * q_s / 2, rel=1e-12)
    assert OVERLAP_SLOWDOWN == 0.189 and Hardware(name="x", memory_bytes=1, peak_flops={}, hbm_bw=1,
                                                  link_bw=1).overlap_slowdown == OVERLAP_SLOWDOWN
    assert {h.overlap_slowdown for h in HARDWARE.values()} == {0.189}


def test_hidden_gradient_buckets_and_parameter_gathers_slow_the_compute_too():
    """The data-parallel engines' hidden parts, s = 0.25 (0.2 x hidden inside the window). DDP on the 2-layer h 1024
    model: 4 buckets of 25 MiB, all but the last hidden behind backward (overlap 1) -> 0.2 x 3/4 of the all-reduce;
    ZeRO-2 reduces every micro-batch (2 here) in one DeepSpeed bucket, exposed whole (0); ZeRO-1 on the 4-layer
    h 4096 model: its fp32 gradients (2.69e9 B) fill 2 DeepSpeed buckets, the first hidden -> 0.2 x half the
    reduce-scatter, and under param_gather one of its 2 gather buckets hidden behind the next step's first forward
    -> 0.2 x half the gather more."""
    hw = replace(TOY, overlap_slowdown=0.25)
    big = ModelShape(arch="llama", layers=2, hidden=1024, heads=8, kv_heads=8, ffn=2048, vocab=256, max_positions=512)
    red = call(1, 21238784 * 4 / 4, 4)
    ddp = predict(big, Layout(dp_replicate=2, micro_batch=MB), cluster(2, hw), seq=SEQ, global_batch=16)
    assert ddp.exposed_s["dp"] == pytest.approx(red / 4, rel=1e-12)  # inside the backward window
    assert ddp.interference_s == pytest.approx(0.2 * red * 3 / 4, rel=1e-12)
    z2 = predict(big, Layout(dp_replicate=2, engine="deepspeed", zero=2, micro_batch=MB), cluster(2, hw), seq=SEQ,
                 global_batch=16)
    assert z2.interference_s == 0.0 and z2.dp_comm_s == pytest.approx(z2.exposed_s["dp"], rel=1e-12)
    huge = ModelShape(arch="llama", layers=4, hidden=4096, heads=32, kv_heads=32, ffn=8192, vocab=256,
                      max_positions=512)
    z = dict(dp_replicate=2, engine="deepspeed", zero=1, micro_batch=MB)
    gather, reduce = call(0.5, 672174080 * 2 / 2, 2), call(0.5, 672174080 * 4 / 2, 2)
    plain = predict(huge, Layout(**z), cluster(2, hw), seq=SEQ, global_batch=16)
    assert plain.interference_s == pytest.approx(0.2 * reduce / 2, rel=1e-9)
    shown = predict(huge, Layout(**z, overlap="param_gather"), cluster(2, hw), seq=SEQ, global_batch=16)
    assert shown.interference_s == pytest.approx(0.2 * (reduce / 2 + gather / 2), rel=1e-9)


def test_collectives_that_outlast_their_window_cost_only_the_slowed_compute_beyond_them():
    """s = 0.25 (1 / (1 + s) = 0.8). FSDP2 on links slow enough that one micro-batch's 8 gathers and 4 reduce-
    scatters (3/16 of them the first gather and last reduce) take r x its compute (overlap 1: the window): r = 1.1,
    the first and last exposed and the rest (0.894x) inside the window: 0.2 x that; r = 1.24, the window full
    (0.24x exposed) and the compute slowed beside them ends 1 - 1.24 x 0.8 = 0.008x after them; r = 1.3, under them
    (0). ZeRO-1's parameter gather of the 4-layer h 4096 model in 2 buckets at g x the next forward's third: g = 1.8,
    one bucket exposed (0.9x), 0.9x hidden inside the window: 0.2 x 0.9x; g = 2.2, the window full: 1 - 1.76 < 0.
    With nothing hidden (prefetch off) nothing is charged, outlasting or not."""
    assert steptime._stretch(11.0, 11.0, 10.0, 0.25) == 0.0  # all exposed: no compute beside it
    assert steptime._stretch(11.0, 2.0, 10.0, 0.25) == pytest.approx(0.2 * 9.0)  # 9 s hidden inside 10 s
    assert steptime._stretch(12.0, 2.0, 10.0, 0.25) == pytest.approx(10.0 - 12.0 * 0.8)  # 10 s hidden: full
    hw = replace(TOY, overlap_slowdown=0.25)
    L = Layout(dp_shard=2, engine="fsdp2", micro_batch=MB)
    mb = predict(SHAPE, L, cluster(2, hw), seq=SEQ, global_batch=16).compute_s / 2  # one micro-batch's compute
    for r in (1.1, 1.24, 1.3):
        bw = 16 * PER_LAYER / (r * mb - 12 * ALPHA)  # 8 gathers of 2 x P x 0.5 B + 4 reduces of 4 x P x 0.5 B
        comm, first_last = 12 * ALPHA + 16 * PER_LAYER / bw, 2 * ALPHA + 3 * PER_LAYER / bw  # = r x mb; 1 + 1 of them
        exposed = max(first_last, comm - mb)
        extra = {1.1: 0.2 * (comm - first_last), 1.24: mb - comm * 0.8, 1.3: 0.0}[r]
        assert (exposed == first_last) == (r == 1.1) and (extra > 0) == (r < 1.3)  # each branch, each sign
        link = replace(hw, collectives={op: (ALPHA, bw) for op in TOY.collectives})
        p = predict(SHAPE, L, cluster(2, link), seq=SEQ, global_batch=16)
        assert p.dp_comm_s == pytest.approx(2 * r * mb, rel=1e-9)
        assert p.exposed_s["dp"] == pytest.approx(2 * exposed, rel=1e-9), r
        assert p.interference_s == pytest.approx(2 * extra, rel=1e-9, abs=1e-15), r
        off = predict(SHAPE, replace(L, overlap="no-prefetch"), cluster(2, link), seq=SEQ, global_batch=16)
        assert off.interference_s == 0.0
    huge = ModelShape(arch="llama", layers=4, hidden=4096, heads=32, kv_heads=32, ffn=8192, vocab=256,
                      max_positions=512)
    n = 672174080
    z = Layout(dp_replicate=2, engine="deepspeed", zero=1, micro_batch=MB, overlap="param_gather")
    window = predict(huge, z, cluster(2, hw), seq=SEQ, global_batch=16).compute_s / 2 / 3
    reduce = call(0.5, n * 4 / 2, 2)  # the gradients' 2 DeepSpeed buckets, the first hidden behind backward
    for g, extra in ((1.8, 0.2 * 0.9), (2.2, 0.0)):
        bw = n * 2 * 0.5 / (g * window - 2 * ALPHA)  # 2 all-gathers of half the bf16 parameters: g x the window
        gat = replace(hw, collectives={**TOY.collectives, "all_gather": (ALPHA, bw)})
        p = predict(huge, z, cluster(2, gat), seq=SEQ, global_batch=16)
        assert p.interference_s == pytest.approx(0.2 * reduce / 2 + extra * window, rel=1e-9), g
