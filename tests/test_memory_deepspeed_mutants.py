"""DeepSpeed's exact per-rank layout (``coursekit.memory.deepspeed``) on parameter lists small enough to work by
hand from the rules its docstring cites from ``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py`` and
``swap_tensor``: ZeRO-1/2's flat buffer padded to 2N, the overlapping-parameter gradient partition, ZeRO-3's
ceil(n/N) partitions and sub-groups, ZeRO-Infinity's file sizes. Every expected number is derived in the comments,
never read from the code. Where bench/bench_mutation.py found no test. Pure Python, well under a second."""
from __future__ import annotations

import re

import pytest

from coursekit.memory import deepspeed as layout
from coursekit.memory.errors import ConfigError

MiB = 1 << 20
# [6, 6, 4] over 2 ranks: Ψ 16, padded to 16 (a multiple of 2N = 4), a partition of 8 per rank. Rank 0's [0, 8)
# overlaps tensors 0 (0..6) and 1 (6..12): 12 elements; rank 1's [8, 16) overlaps tensors 1 and 2 (12..16): 10.
# ZeRO-3: ceil(6/2), ceil(6/2), ceil(4/2) = 3 + 3 + 2 = 8 per rank.
NUMELS = [6, 6, 4]


def whole(message):
    return "^" + re.escape(message) + "$"


def ints(d):
    """Every byte count a whole number of bytes (an int, not a float that equals one)."""
    for k, v in d.items():
        if isinstance(v, dict):
            ints(v)
        else:
            assert v is None or type(v) is int, (k, v)


@pytest.mark.parametrize("kw,want", [
    # stage 0, fp32 (4 bytes), AdamW (2 fp32 states: 8 bytes): everything whole, one fp32 step per tensor (4 x 3)
    (dict(stage=0, rank=0), dict(params=64, grads=64, fp32_grads=0, master=0, optimizer=128, buffers=0, scalars=12,
                                 grads_peak=64, tiers={"accelerator": dict(params=64, grads=64, optimizer=128)})),
    # stage 0, bf16 (FP16_UnfusedOptimizer): bf16 weights and grads, fp32 copies of the weights and of their grads
    (dict(stage=0, rank=0, dtype="bf16"),
     dict(params=32, grads=32, fp32_grads=64, master=64, optimizer=128, buffers=0, scalars=12, grads_peak=32,
          tiers={"accelerator": dict(params=32, grads=32, fp32_grads=64, master=64, optimizer=128)})),
    # stage 1, fp32, rank 0: all 16 padded params, its 12 overlapping gradient elements, a partition of 8 for the
    # master, states and fp32 gradients; the step and the grad norm (8 bytes); the whole 16 gradients at the peak
    (dict(stage=1, rank=0), dict(params=64, grads=48, fp32_grads=32, master=32, optimizer=64, buffers=0, scalars=8,
                                 grads_peak=64, tiers={"accelerator": dict(params=64, grads=48, fp32_grads=32,
                                                                           master=32, optimizer=64)})),
    # stage 2, bf16, rank 1: its 10 overlapping gradient elements in bf16; the peak depends on bucket timing
    (dict(stage=2, rank=1, dtype="bf16"),
     dict(params=32, grads=20, fp32_grads=32, master=32, optimizer=64, buffers=0, scalars=8, grads_peak=None,
          tiers={"accelerator": dict(params=32, grads=20, fp32_grads=32, master=32, optimizer=64)})),
    # stage 2 + CPU offload, 2 micro-batches, rank 1: its 10 overlapping gradients accumulate on the host (2·10);
    # the host's bf16 partition copy + a largest-parameter gradient buffer 2·(8 + 6) = 28, the accelerator's
    # largest-parameter buffer 2·6 = 12; no scalars (per-parameter norms)
    (dict(stage=2, rank=1, dtype="bf16", offload_optimizer="cpu", micro_batches=2),
     dict(params=32, grads=20, fp32_grads=32, master=32, optimizer=64, buffers=40, scalars=None, grads_peak=20,
          tiers={"cpu": dict(grads=20, fp32_grads=32, master=32, optimizer=64, buffers=28),
                 "accelerator": dict(params=32, buffers=12)})),
    # stage 1 + CPU offload, one micro-batch: nothing accumulates; the whole bf16 gradients at the peak
    (dict(stage=1, rank=1, dtype="bf16", offload_optimizer="cpu"),
     dict(params=32, grads=0, fp32_grads=32, master=32, optimizer=64, buffers=40, scalars=None, grads_peak=32,
          tiers={"cpu": dict(fp32_grads=32, master=32, optimizer=64, buffers=28),
                 "accelerator": dict(params=32, buffers=12)})),
    # stage 3, bf16: partitions of 8; the whole reduce bucket of 5e5 bf16 elements; one sub-group: Adam's step 4
    # + the fp64 grad norm 8 + the overflow flag 1
    (dict(stage=3, rank=0, dtype="bf16"),
     dict(params=16, grads=16, fp32_grads=32, master=32, optimizer=64, buffers=1_000_000, scalars=13, grads_peak=16,
          tiers={"accelerator": dict(params=16, grads=16, fp32_grads=32, master=32, optimizer=64,
                                     buffers=1_000_000)})),
    # sub-groups of >= 4 elements: [3, 3] and [2]; the step holds the larger's fp32 gradients (4·6), two steps
    (dict(stage=3, rank=0, dtype="bf16", sub_group_size=4),
     dict(params=16, grads=16, fp32_grads=24, master=32, optimizer=64, buffers=1_000_000, scalars=17, grads_peak=16,
          tiers={"accelerator": dict(params=16, grads=16, fp32_grads=24, master=32, optimizer=64,
                                     buffers=1_000_000)})),
    # stage 3 + optimizer offload: the whole fp32 gradient partition on the host; the gradients stay on the GPU
    (dict(stage=3, rank=0, dtype="bf16", offload_optimizer="cpu"),
     dict(params=16, grads=16, fp32_grads=32, master=32, optimizer=64, buffers=1_000_000, scalars=None, grads_peak=16,
          tiers={"cpu": dict(fp32_grads=32, master=32, optimizer=64),
                 "accelerator": dict(params=16, grads=16, buffers=1_000_000)})),
    # stage 3 + parameter offload only
    (dict(stage=3, rank=0, dtype="bf16", offload_param="cpu"),
     dict(params=16, grads=16, fp32_grads=32, master=32, optimizer=64, buffers=1_000_000, scalars=None, grads_peak=16,
          tiers={"cpu": dict(params=16), "accelerator": dict(grads=16, fp32_grads=32, master=32, optimizer=64,
                                                             buffers=1_000_000)})),
])
def test_deepspeed_bytes_whole_dict_by_hand(kw, want):
    """Catches any category of DeepSpeed's layout set wrong, left at its initial value, renamed, put on the wrong
    device or computed as a float."""
    got = layout.deepspeed_bytes(NUMELS, world=2, **kw)
    assert got == want
    ints(got)


def test_deepspeed_bytes_refuses_a_rank_or_stage_out_of_range():
    """Catches rank == world accepted (ranks are 0..N-1) and the messages lost."""
    with pytest.raises(ValueError, match=whole("rank must be in [0, 2), got 2")):
        layout.deepspeed_bytes(NUMELS, stage=1, world=2, rank=2)
    with pytest.raises(ValueError, match=whole("ZeRO stage must be 0-3, got 4")):
        layout.deepspeed_bytes(NUMELS, stage=4, world=2, rank=0)


def test_sub_groups_follow_deepspeeds_create_fp16_sub_groups():
    """Catches a wrong packing rule (stage3._create_fp16_sub_groups: all in one if the sum is at most
    sub_group_size; else close a group once it reaches sub_group_size, the last one at the last parameter)."""
    assert layout.zero3_sub_groups([3, 3, 2], 4) == [[3, 3], [2]]
    assert layout.zero3_sub_groups([3, 3, 3, 1], 4) == [[3, 3], [3, 1]]  # the last group closed exactly: no empty one
    assert layout.zero3_sub_groups([3, 3, 2, 0], 8) == [[3, 3, 2, 0]]  # sum == sub_group_size: one group
    assert layout.zero3_sub_groups([3, 3, 2], 1) == [[3], [3], [2]]


def test_the_fullest_rank_under_offload_ignores_the_padding():
    """Catches the offload rule of fullest_rank lost: [4, 1, 4, 1] over 3 ranks pads Ψ 10 to 12 (partitions of 4).
    Overlapping elements: rank 0 [0, 4) tensor 0: 4; rank 1 [4, 8) tensors 1, 2: 5; rank 2 [8, 12) tensors 2, 3: 5,
    plus 2 padding elements -> 7. The fullest gradient partition is rank 2's; under offload (host accumulation:
    overlapping parameters only) ranks 1 and 2 tie at 5 and the first, rank 1, is reported."""
    assert layout.fullest_rank([4, 1, 4, 1], 3) == 2
    assert layout.fullest_rank([4, 1, 4, 1], 3, offload=True) == 1
    assert layout.grad_partition_numels([4, 1, 4, 1], 3) == (4, 5, 7)
    assert type(layout.tail_padding(10, 3, 2)) is int and layout.tail_padding(10, 3, 2) == 2


@pytest.mark.parametrize("kw,message", [
    (dict(zero=2, offload="none", offload_params="cpu"),
     "parameter offload needs ZeRO-3 or FSDP2 (parameters must be sharded)"),
    (dict(zero=0, offload="cpu", offload_params="none"),
     "DeepSpeed offloads optimizer state with ZeRO stage 1, 2 or 3, not 0"),
    (dict(zero=2, offload="nvme", offload_params="none"), "NVMe offload (ZeRO-Infinity) needs ZeRO stage 3"),
])
def test_offload_rules_with_the_whole_message(kw, message):
    with pytest.raises(ConfigError, match=whole(message)):
        layout.check_offload(**kw)


def test_state_bytes_defaults_offload_nothing_over_one_micro_batch():
    """Catches a changed default of state_bytes: no offload (stage 2, 2 ranks, bf16: rank 0 keeps its 12 overlapping
    gradient elements, 2·12 bytes) and, under CPU offload, one micro-batch (nothing accumulates on the host: no
    gradients at all; 2 micro-batches would keep rank 0's 12 there)."""
    st, rank = layout.state_bytes(NUMELS, precision="16psi", dtype="bf16", optimizer="adamw", zero=2, shard=2, rank=0)
    assert (rank, st.gradients, st.parameters, st.cpu) == (0, 24, 32, 0)
    st, _ = layout.state_bytes(NUMELS, precision="16psi", dtype="bf16", optimizer="adamw", zero=2, shard=2, rank=0,
                               offload="cpu")
    # host: master 4·8, AdamW 8·8, fp32 gradient partition 4·8, the bf16 partition copy + largest-param buffer 28
    assert (st.gradients, st.cpu, st.offload_buffers) == (0, 32 + 64 + 32 + 28, 12)


def test_state_bytes_default_sub_group_is_deepspeeds_1e9_elements():
    """Catches a changed default sub_group_size: [2e9, 2] over 2 ranks is partitions [1e9, 1]; with sub-groups of
    1e9 elements they are two sub-groups, and under NVMe offload the 1e9 one goes to files: fp32 master + 2 states,
    3·4·1e9 (1e9 is a multiple of the 256-element alignment), and its fp32 gradients 4·1e9; the 1-element sub-group
    stays on the host. One sub-group of 1e9 + 1 would round its files up to 1e9 + 256 elements."""
    st, _ = layout.state_bytes([2 * 10**9, 2], precision="16psi", dtype="bf16", optimizer="adamw", zero=3, shard=2,
                               rank=0, offload="nvme")
    assert st.nvme == 12 * 10**9 + 4 * 10**9


def test_nvme_files_and_what_stays_on_the_host_by_hand():
    """Catches a wrong ZeRO-Infinity rule (swap_tensor): a tensor goes to a file if it is >= 1 MiB; files are
    aligned to 1024 bytes (512 bf16 or 256 fp32 elements); gradients are cut *down* to the alignment.

    Parameters (bf16) [1000, 524288, 2000, 524388, 10] on one rank, sub-groups of >= 1000 elements: [1000],
    [524288], [2000], [524388], [10]. Parameter files: 524288·2 = 1 MiB exactly (swapped, aligned) and 524388 -> 525
    ·1024 = 524800 elements·2 = 1049600 B; kept 2·(1000 + 2000 + 10) = 6020 B. Optimizer: the 524288 sub-group, 3 fp32
    tensors of 524288 (aligned): 6291456 B; 524388 -> 2049·256 = 524544 elements: 3·4·524544 = 6294528 B; the small
    sub-groups stay: 12·(1000 + 2000 + 10) = 36120 B and their fp32 gradients 4·3010 = 12040 B, plus one buffer of the
    largest swapped sub-group, 4·524388. Gradient files: 524288 and 524388 cut down to 524288 elements each: 2·2 MiB."""
    got = layout.nvme_file_bytes([1000, 524288, 2000, 524388, 10], world=1, sub_group_size=1000)
    assert got == dict(params=MiB + 1049600, optimizer=6291456 + 6294528, grads=2 * 2 * MiB, kept_params=6020,
                       kept_optimizer=36120, kept_grads=12040 + 4 * 524388)
    ints(got)


def test_nvme_file_thresholds_at_exactly_one_mebibyte():
    """Catches a >= turned into >, or a wrong bytes-per-element: a 262144-element fp32 sub-group is 1 MiB exactly and
    is swapped (its gradient file 1 MiB too); a 250000-element one (1,000,000 B) is not: 12·250000 B of master and
    states and 4·250000 of gradients stay, with the 4·262144 shared buffer."""
    got = layout.nvme_file_bytes([262144, 250000], world=1, dtype="fp32", offload_param="none", sub_group_size=1)
    assert got == dict(params=0, optimizer=3 * MiB, grads=MiB, kept_params=0, kept_optimizer=3_000_000,
                       kept_grads=1_000_000 + MiB)


def test_nvme_alignment_follows_intra_op_parallelism():
    """Catches a wrong alignment (1024 bytes x intra_op_parallelism). With 3: 3072 bytes, 768 fp32 elements. One
    sub-group of 512144 elements: files 3·4·667·768 (512144 rounded up to 512256); its gradients cut down: 262144 ->
    341·768 = 261888 elements, 1047552 B, now below 1 MiB: not written; 250000 was never >= 1 MiB. bf16 parameters
    align to 1536 elements: 524388 -> 342·1536 = 525312 elements, 1050624 B."""
    got = layout.nvme_file_bytes([262144, 250000], world=1, offload_param="none", intra_op_parallelism=3)
    assert got == dict(params=0, optimizer=3 * 4 * 667 * 768, grads=0, kept_params=0, kept_optimizer=0,
                       kept_grads=4 * 512144)
    got = layout.nvme_file_bytes([524388], world=1, offload_optimizer="none", intra_op_parallelism=3)
    assert got["params"] == 1050624


def test_nvme_minimum_is_the_larger_of_one_mebibyte_and_the_aio_block():
    """Catches the 1 MiB floor lost: with 1 KiB aio blocks a 4000-byte parameter still stays on the host."""
    assert layout.nvme_file_bytes([2000], world=1, offload_optimizer="none", aio_block_size=1024) == dict(
        params=0, optimizer=0, grads=0, kept_params=4000, kept_optimizer=0, kept_grads=0)


def test_nvme_default_sub_group_is_1e9_elements():
    """Catches a changed default sub_group_size of nvme_file_bytes: [1e9, 1] is two sub-groups; the 1e9 one is
    swapped (3·4·1e9 of files, 4·1e9 of gradient files), the 1-element one stays (12 B + 4 B) with the 4·1e9 buffer."""
    got = layout.nvme_file_bytes([10**9, 1], world=1, offload_param="none")
    assert got == dict(params=0, optimizer=12 * 10**9, grads=4 * 10**9, kept_params=0, kept_optimizer=12,
                       kept_grads=4 + 4 * 10**9)


def test_deepspeed_bytes_default_sub_group_is_1e9_elements():
    """Catches a changed default sub_group_size of deepspeed_bytes: ZeRO-3 partitions [1e9, 1] of [2e9, 2] over 2
    ranks are two sub-groups of DeepSpeed's default 1e9 (two Adam steps: 4·2 + 9 scalar bytes), the step's fp32
    gradients the larger one's 4·1e9."""
    got = layout.deepspeed_bytes([2 * 10**9, 2], stage=3, world=2, rank=0)
    assert (got["scalars"], got["fp32_grads"]) == (4 * 2 + 9, 4 * 10**9)
