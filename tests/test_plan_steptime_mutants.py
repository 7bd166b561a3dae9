"""More of the step-time model (``coursekit.plan.steptime``) worked out by hand: the cases its mutation survivors
showed no test priced (bench/bench_mutation.py plan.steptime). Pure Python, the toy GPU and toy models of
tests/test_plan_steptime.py (1 TFLOP/s, every GEMM at the peak, flash at half of it, 1 TB/s usable HBM, every
collective inside the node alpha 10 us + payload x busbw factor / 1 GB/s)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from coursekit.memory.shapes import ModelShape
from coursekit.plan.layout import Layout
from test_plan_steptime import (ALPHA, LAYER, MB, MOE, SEQ, SHAPE, TOY, A, E, G, HEAD, T, _layer, _layer_time, call,
                                cluster, predict)  # the fused element-wise hand count, as there

GPT = ModelShape(arch="gpt2", layers=4, hidden=64, heads=4, vocab=256, max_positions=512)  # ffn 4h = 256, MHA


def _moe_layer(L):
    return _layer_time(MOE, L, TOY, t=T, seq=SEQ, act=2, dtype="bf16", attention="flash", sp=False)[0]


# -- recompute="op": torchtitan's per-op policy re-runs every second mm (k, o, the MLP's up) + the element-wise forward
def test_op_recompute_reruns_k_o_and_the_mlp_up_by_hand():
    """Catches: the op branch never taken (== 'op' -> != / a misspelt key), the redo list replaced or emptied, the
    MoE block priced as a dense MLP (or its router dropped), f x tp in place of f / tp, the element-wise third
    mis-weighted (elem / 3 -> elem x 3, elem / 4, g_op - elem / 3)."""
    # toy llama, tp 1: k (1024 x 64 @ 64 x 32), o (64 x 64), up (64 x 128): K·N 2048 + 4096 + 8192 = 14,336 at the
    # peak (each compute-bound: k 4.2 us of FLOPs against 0.2 us of traffic), plus a third of E (the forward's)
    op, _, _ = _layer(Layout(micro_batch=MB, recompute="op"))
    assert op == pytest.approx(LAYER + 2 * T * 14336 / 1e12 + E / 3, rel=1e-12)
    # tp 2 (no SP): 2 heads, 1 K/V head, ffn 64: k 64·16, o 32·64, up 64·64 -> K·N 7,168; the layer itself as in
    # test_tensor_parallel_layer_splits_heads_and_ffn_and_sp_the_hidden_vectors (3 g2 + 3.5 A/2 + e2)
    g2, e2 = 2 * T * 18432 / 1e12, T * (32 * 64 + 8 * 64) * 2 / 1e12
    op2, _, _ = _layer(Layout(tp=2, micro_batch=MB, recompute="op"))
    assert op2 == pytest.approx(3 * g2 + 3.5 * A / 2 + e2 + 2 * T * 7168 / 1e12 + e2 / 3, rel=1e-12)
    # gpt2 (one MLP input GEMM), tp 2: 2 of 4 MHA heads of 16, ffn 256 / 2 = 128. Forward K·N: c_attn 64·(2+2·2)·16
    # = 6,144, c_proj 32·64 = 2,048, c_fc 64·128 = 8,192, mlp c_proj 128·64 = 8,192 -> 24,576; op re-runs k 64·32,
    # o 32·64 and the MLP's proj 128·64: 12,288
    e_g = T * (32 * 64 + 8 * 128) * 2 / 1e12
    gop, *_ = _layer_time(GPT, Layout(tp=2, micro_batch=MB, recompute="op"), TOY, t=T, seq=SEQ, act=2, dtype="bf16",
                          attention="flash", sp=False)
    assert gop == pytest.approx(3 * 2 * T * 24576 / 1e12 + 3.5 * A / 2 + e_g + 2 * T * 12288 / 1e12 + e_g / 3,
                                rel=1e-12)
    # the toy MoE, tp 1: the layer of test_an_moe_layer_runs_router_and_grouped_expert_gemms_over_t_times_k_rows;
    # op re-runs k (2,048), o (4,096), the router (64·4 = 256) over 1024 tokens and both expert GEMMs (16,384 +
    # 8,192) over the 2048 (token, choice) rows
    g = 2 * T * (8192 + 4096 + 256) / 1e12 + 2 * (2 * T) * (16384 + 8192) / 1e12
    e = T * (32 * 64 + 8 * 256) * 2 / 1e12
    redo = 2 * T * (2048 + 4096 + 256) / 1e12 + 2 * (2 * T) * (16384 + 8192) / 1e12
    assert _moe_layer(Layout(micro_batch=MB, recompute="op")) == pytest.approx(3 * g + 3.5 * A + e + redo + e / 3,
                                                                               rel=1e-12)


# -- recompute_layers: Megatron's block method over the first N layers of each model chunk ---------------------------
def test_recompute_layers_beyond_a_chunk_recompute_every_layer_once():
    """Catches rc_frac's cap min(1, N·v / layers) raised (min(2, ...)): 8 layers asked of a 4-layer chunk re-run
    each of the 4 once, as recompute full does (G + A + E/3 more per layer), not twice."""
    p = predict(SHAPE, Layout(micro_batch=MB, recompute="full", recompute_layers=8), cluster(1), seq=SEQ,
                global_batch=8)
    assert p.compute_s == pytest.approx(2 * (4 * (LAYER + G + A + E / 3) + HEAD), rel=1e-12)


def test_partial_recompute_repeats_its_share_of_the_tp_and_cp_communication():
    """recompute_layers 1 of the toy's 4 layers (rc_frac 1/4): the re-run forward repeats its 2 TP all-reduces in a
    quarter of the layers (4 + 2/4 = 4.5 per layer on average) and the CP ring's forward pass (x (1 + 0.5/4)).
    Catches: rc_frac not handed to the communication (priced as full recompute: 6 per layer, x 1.5), 2 / rc_frac,
    0.5 / rc_frac."""
    rc = dict(recompute="full", recompute_layers=1)
    # 2 micro-batches x 4 layers of all-reduces of 4 x 256 x 64 bf16 = 131,072 B (2 ranks: busbw factor 1)
    p = predict(SHAPE, Layout(tp=2, micro_batch=MB, sp=False, **rc), cluster(2), seq=SEQ, global_batch=8)
    assert p.exposed_s["tp"] == pytest.approx(2 * 4 * call(1, 131072, 4.5), rel=1e-12)
    # cp 2 ring: 65,536 B of K/V per step, exposed beyond the A/2 forward and 2.5 A/2 backward attention (as in
    # test_ring_attention_exposes_only_what_outlasts_the_attention_block), x (1 + 0.5 x 1/4)
    ring = call(1, 65536)
    per_layer = max(0.0, ring - A / 2) + max(0.0, 2 * ring - 2.5 * A / 2)
    q = predict(SHAPE, Layout(cp=2, micro_batch=MB, **rc), cluster(2), seq=SEQ, global_batch=8)
    assert q.exposed_s["cp"] == pytest.approx(1.125 * 2 * 4 * per_layer, rel=1e-12)


def test_partial_recompute_of_an_moe_under_tp_repeats_half_a_pair_per_layer():
    """The toy MoE (2 layers), tp 2, recompute_layers 1: rc_frac 1/2, so per layer 4 + 2/2 = 5 attention-side calls,
    2.5 all-reduces + 2.5 all-gathers of the 131,072 B payload. Catches the count rounded down to whole pairs
    (tp_calls // 2 = 2: the recompute's repeat dropped; a bug fixed with this test)."""
    p = predict(MOE, Layout(tp=2, micro_batch=MB, sp=False, recompute="full", recompute_layers=1), cluster(2),
                seq=SEQ, global_batch=8)
    per_layer = call(1, T * 64 * 2, 2.5) + call(0.5, T * 64 * 2, 2.5)
    grads = call(1, (4 * 64 + 4 * 3 * 128 * 64) * 4 / 3, 3 * 2)  # router + experts, 3 tensors x 2 layers, fp32
    assert p.exposed_s["tp"] == pytest.approx(2 * 2 * per_layer + grads, rel=1e-12)


# -- the sparse block's post-backward gradient sum over TP, under FSDP2 ---------------------------------------------
def test_moe_tp_gradient_sum_covers_this_ranks_fsdp2_shard_over_dp_shard_x_cp():
    """FSDP2 over dp_shard 2 x cp 2 (4 ranks), ep 2: the router's 256 parameters sharded over the 4 (64), each expert
    slice (98,304 / 2 = 49,152) over the 4 / 2 = 2 ranks holding it (24,576). Catches dp_shard / cp in place of
    dp_shard x cp, and the expert part multiplied by the holders instead of divided."""
    p = predict(MOE, Layout(tp=2, cp=2, dp_shard=2, engine="fsdp2", ep=2, micro_batch=MB, sp=False), cluster(8),
                seq=SEQ, global_batch=16)  # 16 / (dp 2 x 4) = 2 micro-batches
    payload = 4 * 256 / 2 * 64 * 2  # 512 tokens of this CP rank: 65,536 B
    per_layer = call(1, payload, 2) + call(0.5, payload, 2)
    grads = call(1, (64 + 24576) * 4 / 3, 3 * 2)
    assert p.exposed_s["tp"] == pytest.approx(2 * 2 * per_layer + grads, rel=1e-12)


def test_moe_tp_gradient_sum_of_an_unevenly_held_expert_slice_is_the_whole_slice():
    """HSDP 2 x 3 with ep 2: ParallelDims puts ep innermost in the dp ranks (ep index = dp index % 2), so the shard
    group {0, 1, 2} holds slice 0 on ranks 0 and 2 but slice 1 on rank 1 alone: whole ranks per slice, 3 // 2 = 1,
    and the busiest rank sums its whole 49,152-parameter slice (the router: 256 / 3). Catches 3 / 2 = 1.5 (a
    fraction of a rank)."""
    p = predict(MOE, Layout(dp_replicate=2, dp_shard=3, engine="fsdp2", ep=2, tp=2, micro_batch=MB, sp=False),
                cluster(12), seq=SEQ, global_batch=48)  # 48 / (dp 6 x 4) = 2 micro-batches; tp inside a node
    per_layer = call(1, T * 64 * 2, 2) + call(0.5, T * 64 * 2, 2)
    grads = call(1, (256 / 3 + 49152) * 4 / 3, 3 * 2)
    assert p.exposed_s["tp"] == pytest.approx(2 * 2 * per_layer + grads, rel=1e-12)


# -- DeepSpeed's buckets and the parameter all-gather overlap ---------------------------------------------------------
HUGE = ModelShape(arch="llama", layers=4, hidden=4096, heads=32, kv_heads=32, ffn=8192, vocab=256, max_positions=512)
N_HUGE = 672174080  # test_zero3_reduces_in_2e9_byte_buckets...: 4 x 167,780,352 + 4096 + 256·4096 (the last stage)


def _huge_micro_batch():
    """One micro-batch of HUGE on the toy GPU, by hand: K·N q,k,v 4096·96·128, o 4096², gate+up 4096·16384, down
    8192·4096 = 167,772,160 (compute-bound: the smallest, o, is 34 ms of FLOPs against 50 us of traffic); flash over
    32 heads of 128; E_H = 32 hidden and E_F = 8 ffn vectors per token; the head 3 x (1024 x 4096 @ 4096 x 256) and
    6 passes over the fp32 logits."""
    g = 2 * T * 167772160 / 1e12
    a = 4 * MB * 32 * SEQ * SEQ * 128 * 0.5 / (1e12 * 0.5)
    e = T * (32 * 4096 + 8 * 8192) * 2 / 1e12
    head = 3 * 2 * T * 4096 * 256 / 1e12 + 6 * T * 256 * 4 / 1e12
    return 4 * (3 * g + 3.5 * a + e) + head


def test_zero1_reduces_in_deepspeeds_5e8_element_buckets_of_fp32_bytes():
    """ZeRO-1's reduce_bucket_size is 5e8 elements: 2e9 B of fp32 gradients, so the 2.69e9 B of HUGE's gradients
    go in 2 reduce-scatters of half (not 22 of 1.25e8 B: 5e8 / 4 bytes). Nothing overlaps (overlap 0); then the
    2 all-gathers (ceil(N / 5e8)) of the bf16 parameters."""
    hw = replace(TOY, overlap=0.0)
    p = predict(HUGE, Layout(dp_replicate=2, engine="deepspeed", zero=1, micro_batch=MB), cluster(2, hw), seq=SEQ,
                global_batch=16)
    assert p.exposed_s["dp"] == pytest.approx(call(0.5, N_HUGE * 4 / 2, 2) + call(0.5, N_HUGE * 2 / 2, 2), rel=1e-12)


def test_param_gather_hides_behind_a_third_of_a_micro_batch():
    """ZeRO-1 with param_gather on a 100 MB/s all-gather: 2 buckets of N bf16 parameters / 2 take 6.72 s, more
    than the next step's first forward (a third of the micro-batch's compute, ~1.4 s) hides: exposed
    gather - compute / 3, above the one bucket left at least. Catches compute x 3 and compute / 4 as the window.
    The gradients: 2 reduce-scatters, all but the last behind the backward (2/3 of the micro-batch)."""
    hw = replace(TOY, collectives={**TOY.collectives, "all_gather": (ALPHA, 1e8)})
    p = predict(HUGE, Layout(dp_replicate=2, engine="deepspeed", zero=1, micro_batch=MB, overlap="param_gather"),
                cluster(2, hw), seq=SEQ, global_batch=16)
    mb = _huge_micro_batch()
    assert p.compute_s == pytest.approx(2 * mb, rel=1e-12)
    gather = 2 * (ALPHA + N_HUGE * 2 / 2 * 0.5 / 1e8)
    assert gather - mb / 3 > gather / 2  # the window is shorter than all but one bucket
    red = call(0.5, N_HUGE * 4 / 2, 2)
    assert red - 2 / 3 * mb < red / 2  # the backward hides all but the last reduce-scatter
    assert p.exposed_s["dp"] == pytest.approx(red / 2 + gather - mb / 3, rel=1e-12)
