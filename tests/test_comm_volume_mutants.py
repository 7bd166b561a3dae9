"""coursekit.comm.volume at its edges, each number worked by hand from the definitions (nccl-tests' bus-bandwidth
factors, Megatron's TP operators, the strategies' docstrings): the cases bench/bench_mutation.py found untested.
Pure Python, no torch."""
from __future__ import annotations

import re

import pytest

from coursekit.comm import volume

C = volume.Collective


def _raises(message, call, *args, **kw):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call(*args, **kw)


def test_a_one_rank_group_moves_nothing_whatever_the_collective():
    # nccl-tests' factors give 1 for broadcast, reduce and send at any n; on one rank nothing leaves it
    for op in volume.OPS:
        assert volume.busbw_factor(op, 1) == 0.0, op
        assert volume.wire_bytes(op, 1000, 1) == 0.0, op
    assert volume.busbw_factor("broadcast", 2) == volume.busbw_factor("send", 2) == 1.0


def test_bad_collectives_and_group_sizes_are_named():
    _raises("unknown collective 'allreduce'; known: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, "
            "reduce, gather, scatter, send, recv, barrier", volume.busbw_factor, "allreduce", 2)
    _raises("group size must be >= 1, got 0", volume.busbw_factor, "all_reduce", 0)


def test_sizes_are_checked_each_on_its_own():
    # a model of 0 parameters and a world of 1 rank are valid (num_params >= 0, world >= 1): nothing moves
    assert volume.ddp(0, 2) == [C("all_reduce", 0, 1, 2)]
    assert volume.ddp(10, 1) == [C("all_reduce", 40, 1, 1)] and volume.send_bytes_per_rank(volume.ddp(10, 1)) == 0
    _raises("need num_params >= 0, world >= 1, micro_batches >= 1; got -1, 2, 1", volume.ddp, -1, 2)
    _raises("need num_params >= 0, world >= 1, micro_batches >= 1; got 10, 0, 1", volume.ddp, 10, 0)
    # each strategy checks its own three numbers: parameters, ranks, micro-batches
    for call in (lambda: volume.zero(1, -1, 2), lambda: volume.zero(1, 10, 0),
                 lambda: volume.zero(2, 10, 2, micro_batches=0),
                 lambda: volume.fsdp(-1, 2), lambda: volume.fsdp(10, 0), lambda: volume.fsdp(10, 2, micro_batches=0),
                 lambda: volume.tensor_parallel(1, 4, -1, 2), lambda: volume.tensor_parallel(1, 4, 8, 0),
                 lambda: volume.tensor_parallel(1, 4, 8, 2, micro_batches=0)):
        with pytest.raises(ValueError, match="^need num_params >= 0, world >= 1, micro_batches >= 1; got "):
            call()
    _raises("grad_op must be 'reduce_scatter' or 'all_reduce', got 'all_gather'", volume.zero, 1, 10, 2,
            grad_op="all_gather")
    # a context-parallel sequence of 0 tokens is refused (0 % cp == 0 would let it through otherwise)
    _raises("need positive sizes and seq divisible by cp; got batch=1, seq=0, kv_heads=1, head_dim=1, cp=2, "
            "layers=1", volume.ring_attention, 1, 0, 1, 1, 2)


def test_default_element_sizes():
    # ZeRO and FSDP default to fp32 parameters and gradients (4 bytes); TP's activations and the lecture table to
    # 16-bit (2 bytes): ZeRO-1 on 2 ranks, 10 parameters: a reduce-scatter and an all-gather of 40 bytes
    assert volume.zero(1, 10, 2) == [C("all_gather", 40, 1, 2), C("reduce_scatter", 40, 1, 2)]
    assert volume.tensor_parallel(1, 3, 5, 2) == [C("all_reduce", 3 * 5 * 2, 4, 2)]
    # the table for Ψ = 1000 on 4 ranks in 2-byte elements: DDP 2·3/4·2000, ZeRO-1/2 the same, ZeRO-3 3·3/4·2000
    assert volume.textbook_table(1000, 4) == pytest.approx({"ddp": 3000, "zero1": 3000, "zero2": 3000, "zero3": 4500})


def test_micro_batches_multiply_the_per_micro_batch_collectives():
    # TP: 4 all-reduces per layer and micro-batch: 3 layers x 2 micro-batches = 24
    assert volume.tensor_parallel(3, 4, 8, 2, micro_batches=2) == [C("all_reduce", 4 * 8 * 2, 24, 2)]
    # ring attention, 2 layers x 3 micro-batches x (cp 4 - 1) = 18 K/V exchanges forward, as many backward, and 18
    # dK/dV exchanges: block 2·b 1·kv 1·(s 8 / 4)·d 2 = 8 elements, 2-byte K/V, 4-byte gradients
    plan = volume.ring_attention(1, 8, 1, 2, 4, layers=2, micro_batches=3)
    assert set(plan) == {C("send", 16, 36, 4), C("recv", 16, 36, 4), C("send", 32, 18, 4), C("recv", 32, 18, 4)}


def test_vocab_parallel_embedding_and_head_add_two_all_reduces_and_the_logits_gather():
    """tp 2, 2 layers, 3 tokens of hidden 5 in 2 bytes (30-byte activations), vocabulary 7, 2 micro-batches: the
    blocks' 4 x 2 x 2 = 16 all-reduces, the embedding's forward and the head input's backward all-reduce (2 per
    micro-batch: 4 more of the same 30 bytes), and the head's logits gathered once per micro-batch (3 x 7 x 2 =
    42 bytes, Megatron's f/g operators and coursekit.tp.plan.vocab_parallel)."""
    assert volume.tensor_parallel(2, 3, 5, 2, vocab=7, micro_batches=2) == [C("all_gather", 42, 2, 2),
                                                                           C("all_reduce", 30, 20, 2)]
    # with sequence parallelism the blocks' calls split, the vocabulary's stay
    assert set(volume.tensor_parallel(2, 3, 5, 2, vocab=7, sequence_parallel=True)) == {
        C("all_gather", 30, 8, 2), C("reduce_scatter", 30, 8, 2), C("all_reduce", 30, 2, 2), C("all_gather", 42, 1, 2)}
    # on one TP rank nothing is split: the blocks' (empty-group) all-reduces only
    assert volume.tensor_parallel(2, 3, 5, 1, vocab=7) == [C("all_reduce", 30, 8, 1)]


def test_payloads_stay_exact_integers_however_large():
    """Byte counts are Python ints: no float rounding past 2**53 (a float would round 2·3**35 to a neighbour).
    Ulysses, cp 3: q/out payload b·(s/C)·heads·d·bytes with b = 3**25, s 6, one head of d = 3**10, 2 bytes; K/V at
    max(kv_heads 1, C 3) = 3 heads. Ring, cp 3: block 2·b·kv·(s/C)·d with b = 3**20, d = 3**15."""
    n = 3 ** 25 * 2 * 3 ** 10 * 2
    assert n > 2 ** 53
    assert volume.ulysses_attention(3 ** 25, 6, 1, 1, 3 ** 10, 3) == [C("all_to_all", n, 4, 3),
                                                                      C("all_to_all", 3 * n, 4, 3)]
    block = 2 * 3 ** 20 * 2 * 3 ** 15
    assert set(volume.ring_attention(3 ** 20, 6, 1, 3 ** 15, 3, backward=False)) == {
        C("send", block * 2, 2, 3), C("recv", block * 2, 2, 3)}


def test_expert_rows_edges_and_a_moe_step_in_16_bits_forward_only():
    # one EP rank keeps every row (3 + 4) itself; an empty group is refused, named (not an IndexError)
    assert volume.expert_rows([[3, 4]], 1) == ([[7]], [[7]])
    with pytest.raises(ValueError, match="^need one count per expert for each of the 0 EP ranks"):
        volume.expert_rows([], 0)
    with pytest.raises(ValueError, match="^need one count per expert for each of the 2 EP ranks"):
        volume.expert_rows([], 2)
    # test_comm's two-layer group (rank 0 sends 10 then 7 rows, its experts compute 9 and 9), act_bytes 2, hidden
    # 8, forward only: per layer the 4 int64 counts (32 B), the dispatch and the combine once each
    counts = [[3, 1, 2, 4], [5, 0, 1, 1]]
    plan, rows = volume.moe_step([[counts[0], counts[1]], [counts[1], counts[0]]], 0, hidden=8, experts=4,
                                 act_bytes=2, backward=False)
    assert rows == [9, 9]
    assert plan == [C("all_to_all", 32, 2, 2), C("all_to_all", 7 * 8 * 2, 1, 2), C("all_to_all", 9 * 8 * 2, 2, 2),
                    C("all_to_all", 10 * 8 * 2, 1, 2)]


def test_megatron_sequence_parallelism_gathers_the_sequence_again_in_backward():
    """Megatron's sequence parallelism (Korthikanti et al. 2022, §4.2.2) saves each column-parallel linear's input as
    the sequence shard and all-gathers it again in backward for the weight gradient: per layer and micro-batch 2 + 2
    all-gathers and 2 + 2 reduce-scatters as torch's plan, plus those 2 gathers. 3 layers x 2 micro-batches: 36
    all-gathers and 24 reduce-scatters of 4 tokens x 8 hidden x 2 bytes."""
    plan = volume.tensor_parallel(3, 4, 8, 2, sequence_parallel=True, micro_batches=2, sp_style="megatron")
    assert plan == [C("all_gather", 64, 36, 2), C("reduce_scatter", 64, 24, 2)]
    assert volume.tensor_parallel(3, 4, 8, 2, sequence_parallel=True, micro_batches=2) == [
        C("all_gather", 64, 24, 2), C("reduce_scatter", 64, 24, 2)]
    _raises("sp_style must be torch or megatron, got 'nemo'", volume.tensor_parallel, 3, 4, 8, 2, sp_style="nemo")
