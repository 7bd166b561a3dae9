"""ZeRO helpers that need no process group: config builder and files, layout model, communication expectations."""
import json
import re

import pytest

from coursekit.memory import deepspeed as layout, estimate
from coursekit.memory.cli import main as memory_main
from coursekit.models import param_numels
from coursekit.zero import collectives as comm, ds_config as config


@pytest.mark.parametrize("name", sorted(config.STANDARD))
def test_config_files_are_generated_from_build_config(name):
    """configs/deepspeed/*.json has one source of truth: regenerate with `python -m coursekit.zero.ds_config`."""
    path = config.CONFIG_DIR / f"{name}.json"
    assert json.loads(path.read_text()) == config.build_config(**config.STANDARD[name]), \
        f"{path} is out of date: run python -m coursekit.zero.ds_config configs/deepspeed"


@pytest.mark.parametrize("name", sorted(config.STANDARD))
def test_config_files_parse_with_deepspeed(name):
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = config.build_config(**config.STANDARD[name])
    ds = DeepSpeedConfig(config.finalize(cfg, micro_batch=4, grad_accum=1, world=1,  # no process group: world 1
                                         dtype="bf16" if cfg["bf16"]["enabled"] else "fp32")[0])
    assert ds.zero_optimization_stage == cfg["zero_optimization"]["stage"]
    assert ds.gradient_clipping == 0.0  # DeepSpeed's default is 1.0: explicit, or ZeRO would not match DDP


def test_finalize_writes_the_trainers_batch_and_makes_clipping_explicit():
    cfg = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 16}
    out, notes = config.finalize(cfg, micro_batch=2, grad_accum=2, world=2, dtype="fp32", stage=2)
    assert out["train_micro_batch_size_per_gpu"] == 2 and out["train_batch_size"] == 8
    assert out["gradient_clipping"] == 0.0 and out["bf16"] == {"enabled": False}
    assert any("train_micro_batch_size_per_gpu: config 16 -> 2" in n for n in notes)
    assert any("gradient_clipping" in n for n in notes)
    assert cfg["train_micro_batch_size_per_gpu"] == 16  # the caller's dict is not modified


@pytest.mark.parametrize("cfg,kw,needle", [
    ({"zero_optimization": {"stage": 3}}, {"stage": 2}, "use --strategy zero3"),
    ({"bf16": {"enabled": True}}, {}, "pass --dtype bf16"),
    ({"fp16": {"enabled": True}}, {}, "fp16 is not supported"),
    ({"zero_optimization": {"stage": 5}}, {}, "must be one of"),
])
def test_finalize_refuses_contradictions(cfg, kw, needle):
    with pytest.raises(ValueError, match=needle):
        config.finalize(cfg, micro_batch=1, grad_accum=1, world=2, dtype="fp32", **kw)


@pytest.mark.parametrize("kw,needle", [
    (dict(stage=4), "stage must be"),
    (dict(stage=0, offload_optimizer="cpu"), "needs ZeRO stage 1, 2 or 3"),
    (dict(stage=2, offload_param="cpu"), "needs ZeRO stage 3"),
    (dict(stage=3, offload_param="nvme"), "needs nvme_path"),
    (dict(stage=2, offload_optimizer="disk"), "must be one of"),
])
def test_build_config_validates(kw, needle):
    with pytest.raises(ValueError, match=needle):
        config.build_config(**kw)


def test_offload_configs_choose_the_optimizer_explicitly():
    assert config.build_config(2, offload_optimizer="cpu")["optimizer"]["type"] == "AdamW"  # DeepSpeedCPUAdam
    torch_adam = config.build_config(2, offload_optimizer="cpu", ds_optimizer=False)
    assert "optimizer" not in torch_adam and torch_adam["zero_force_ds_cpu_optimizer"] is False
    assert "optimizer" not in config.build_config(2)  # the trainer's torch AdamW, as DDP


def test_load_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        config.load_config(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{stage: 2")
    with pytest.raises(ValueError, match="not valid JSON"):
        config.load_config(tmp_path / "bad.json")


def test_partition_params_holds_straddling_parameters_on_both_sides():
    # 3 tensors of 6, 6, 4 elements on 2 ranks: padded to 16 (multiple of 2N=4), 8 per rank; tensor 1 spans 6..12
    assert layout.partition_params([6, 6, 4], 2, 0) == [0, 1]
    assert layout.partition_params([6, 6, 4], 2, 1) == [1, 2]
    b = [layout.deepspeed_bytes([6, 6, 4], stage=2, world=2, rank=r)["grads"] for r in (0, 1)]
    assert b == [4 * 12, 4 * 10]  # > 4·16/2 on both ranks


def test_layout_is_the_textbook_when_nothing_straddles():
    numels, n = [64] * 4, 4  # every partition boundary falls between two tensors
    psi = sum(numels)
    z2 = layout.deepspeed_bytes(numels, stage=2, world=n, rank=1)
    assert (z2["params"], z2["grads"], z2["master"], z2["optimizer"], z2["fp32_grads"]) == \
        (4 * psi, 4 * psi // n, 4 * psi // n, 8 * psi // n, 4 * psi // n)
    z3 = layout.deepspeed_bytes(numels, stage=3, world=n, rank=1, dtype="bf16")
    assert (z3["params"], z3["grads"], z3["master"]) == (2 * psi // n, 2 * psi // n, 4 * psi // n)


@pytest.mark.parametrize("stage,volume", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_expected_collectives_are_the_papers_volume(stage, volume):
    psi = 1000
    per_op = comm.expected(stage, psi, 4, elem_bytes=2)
    assert comm.paper_volume(per_op, psi, 2) == volume
    if stage in (1, 2):  # DeepSpeed's default all-reduces the buckets: DDP's traffic plus the all-gather
        assert comm.paper_volume(comm.expected(stage, psi, 4, multi_rank_allreduce=True), psi, 4) == 3


def test_stage2_reduces_every_micro_batch_stage1_once():
    assert comm.expected(1, 100, 2, micro_batches=4)["reduce"] == 400
    assert comm.expected(2, 100, 2, micro_batches=4)["reduce"] == 4 * 400


def test_per_rank_overlap_equals_the_partition_walk():
    """The calculator's O(tensors + ranks) per-rank sums against DeepSpeed's partition rule, tensor by tensor."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        numels = [rng.choice([1, 3, 64, 100, 4096]) * rng.randint(1, 9) for _ in range(rng.randint(1, 30))]
        n = rng.choice([1, 2, 3, 4, 8, 64])
        per = layout.overlap_numels(tuple(numels), n)
        for r in range(n):
            assert per[r] == sum(numels[i] for i in layout.partition_params(numels, n, r)), (numels, n, r)
        pad = [layout.tail_padding(sum(numels), n, r) for r in range(n)]
        assert sum(pad) == layout.padded(sum(numels), n) - sum(numels)  # the flat buffer's padding, once
        held = [a + b for a, b in zip(per, pad)]
        assert held[layout.fullest_rank(numels, n)] == max(held)


def test_estimate_wires_the_layout_rules_per_rank():
    """Wiring, not an independent check: ``estimate`` and ``deepspeed_bytes`` share the rules
    (``coursekit.memory.deepspeed``); this proves ``estimate`` reads the preset's tensor list in the real model's
    order and reports the right rank, stage, dtype and category, for a model whose Ψ is not a multiple of 2N
    (padding) and whose boundaries straddle. The rules themselves are checked against live DeepSpeed engines, per
    rank and category, in test_zero.py."""
    from coursekit.memory import estimate

    numels = param_numels("tiny-gpt2")
    n = 3
    assert sum(numels) % (2 * n)  # padding matters
    for stage in (1, 2, 3):
        for dtype in ("fp32", "bf16"):
            for rank in range(n):
                want = layout.deepspeed_bytes(numels, stage=stage, world=n, rank=rank, dtype=dtype)
                e = estimate("tiny-gpt2", batch=1, seq=16, dtype=dtype, dp=n, zero=stage, dp_rank=rank)
                c = e.categories
                assert e.dp_rank == rank
                assert (c["parameters"], c["master_weights"], c["optimizer_states"], c["step_grad_copy"]) == (
                    want["params"], want["master"], want["optimizer"], want["fp32_grads"])
                assert c["gradients"] == (want["grads_peak"] if stage == 1 else want["grads"])
    grads = [estimate("tiny-gpt2", batch=1, seq=16, dp=n, zero=2, dp_rank=r).categories["gradients"]
             for r in range(n)]
    assert len(set(grads)) > 1  # the ranks really differ here
    assert estimate("tiny-gpt2", batch=1, seq=16, dp=n, zero=2).categories["gradients"] == max(grads)


def test_estimate_wires_the_offload_host_side():
    """Wiring (the same rules on both sides; the live comparison is in test_zero.py). ZeRO-Offload stages 1-2: host = fp32 master + states + fp32 grad partition + DeepSpeed's staging copy of the
    partition and one largest-parameter gradient buffer (+ accumulated gradients with several micro-batches); the
    accelerator keeps one largest-parameter gradient buffer."""
    from coursekit.memory import estimate

    numels = param_numels("tiny-llama")
    for stage in (1, 2):
        for m in (1, 2):
            want = layout.deepspeed_bytes(numels, stage=stage, world=2, rank=1, offload_optimizer="cpu",
                                          micro_batches=m)
            e = estimate("tiny-llama", batch=1, seq=16, dtype="fp32", dp=2, zero=stage, offload="cpu",
                         microbatches=m, dp_rank=1, runtime_bytes=0)
            assert e.cpu_bytes == sum(want["tiers"]["cpu"].values())
            assert e.categories["master_weights"] == e.categories["optimizer_states"] == 0
            assert e.categories["communication_buckets"] >= 4 * max(numels)


def test_calculator_nvme_files_follow_deepspeeds_swap_rules():
    """ZeRO-Infinity writes a tensor to a file only from 1 MiB up: nothing of tiny-llama, most of a wider model;
    what is not written stays in host memory. (The files are measured against live runs in test_zero_offload.py.)"""
    from coursekit.memory import ModelShape, estimate
    from coursekit.memory.deepspeed import nvme_file_bytes

    kw = dict(batch=1, seq=16, dp=2, zero=3, offload="nvme", offload_params="nvme")
    tiny = estimate("tiny-llama", **kw)
    part = sum(-(-x // 2) for x in param_numels("tiny-llama"))
    assert tiny.nvme_bytes == 0 and tiny.cpu_bytes == (2 + 4 + 8 + 4) * part  # all on the host
    wide = ModelShape(arch="llama", layers=2, hidden=528, heads=8, ffn=1100, vocab=4001, max_positions=128)
    files = nvme_file_bytes(wide.param_numels(), world=2)
    e = estimate(wide, **kw)
    assert e.nvme_bytes == files["params"] + files["optimizer"] + files["grads"]
    assert files["params"] and files["optimizer"] and files["grads"] and files["kept_params"]
    assert e.categories["parameters"] == e.categories["master_weights"] == e.categories["optimizer_states"] == 0
    part = sum(-(-x // 2) for x in wide.param_numels())
    assert files["kept_grads"] == 4 * part  # one sub-group: its gradient buffer
    assert e.cpu_bytes == 2 * part + files["kept_grads"]  # the pinned bf16 partitions + the fp32 gradient buffer
    for n in wide.param_numels():  # every file: a whole, aligned partition of at least 1 MiB
        assert nvme_file_bytes([n], world=2, offload_optimizer="none")["params"] in (0, -(-(n // 2) // 512) * 1024)


def test_finalize_says_what_the_trainer_does_not_decide():
    cfg = config.build_config(2, offload_optimizer="cpu")  # an optimizer block: DeepSpeedCPUAdam
    cfg["zero_optimization"]["round_robin_gradients"] = True
    _, notes = config.finalize(cfg, micro_batch=1, grad_accum=1, world=2, dtype="fp32")
    assert any("--lr / --weight-decay are not used" in n for n in notes)
    assert any(n.startswith("round_robin_gradients:") and "does not model" in n for n in notes)
    _, plain = config.finalize(config.build_config(2), micro_batch=1, grad_accum=1, world=2, dtype="fp32")
    assert not any("--lr" in n or "does not model" in n for n in plain)


def test_expected_collectives_with_padding_and_reuse():
    """Without padding or reuse the per-tensor model is the textbook's; padding and a second use add exactly them."""
    numels = [64] * 6  # Ψ = 384: a multiple of 2N and of N for N = 2, 4
    for stage in range(4):
        assert comm.expected(stage, 384, 4, numels=numels, micro_batches=2) == comm.expected(stage, 384, 4,
                                                                                             micro_batches=2)
    odd = [5, 8]  # N = 3: flat buffer 13 -> 18 (2N = 6); per parameter 5 -> 6, 8 -> 9
    assert comm.expected(2, 13, 3, numels=odd, elem_bytes=1) == {"all_gather": 18, "reduce": 13}
    assert comm.expected(1, 13, 3, numels=odd, elem_bytes=1) == {"all_gather": 18, "reduce": 13}
    assert comm.expected(3, 13, 3, numels=odd, elem_bytes=1) == {"all_gather": 2 * 15, "reduce_scatter": 15}
    assert comm.expected(3, 13, 3, numels=odd, elem_bytes=1, reused=[5])["all_gather"] == 2 * (15 + 6)


def test_nvme_sub_groups_share_one_gradient_buffer():
    from coursekit.memory.deepspeed import nvme_file_bytes

    big = [1 << 20] * 3  # partitions of 2^19 elements on 2 ranks: 2 MiB of fp32 each
    one = nvme_file_bytes(big, world=2)
    split = nvme_file_bytes(big, world=2, sub_group_size=1 << 19)  # one parameter per sub-group
    assert one["optimizer"] == split["optimizer"] == 3 * 3 * (1 << 19) * 4 and one["grads"] == split["grads"]
    assert one["kept_grads"] == 3 * (1 << 19) * 4 and split["kept_grads"] == (1 << 19) * 4  # the largest only
    small = nvme_file_bytes([100, 100], world=2)  # too small to swap: everything stays on the host
    assert small["optimizer"] == small["grads"] == 0 and small["kept_grads"] == 4 * 100


def test_zero3_step_peak_is_the_largest_sub_group_worked_by_hand():
    """DeepSpeed's stage3.step builds one sub-group's fp32 gradient partition (_prepare_fp32_grad_for_sub_group),
    steps it and frees it (_release_sub_group) before the next: the step holds the largest sub-group's."""
    # 5 parameters of 6, 9, 4, 8, 2 elements on N = 2 ranks: partitions ceil(n/2) = 3, 5, 2, 4, 1 (15 per rank).
    # sub_group_size 6, packed in order, a sub-group closed once it reaches 6 (_create_fp16_sub_groups):
    # 3, 3+5 = 8 >= 6 closes [3, 5]; 2, 2+4 = 6 closes [2, 4]; the last parameter closes [1].
    numels = [6, 9, 4, 8, 2]
    parts = layout.zero3_partitions(numels, 2)
    assert parts == [3, 5, 2, 4, 1]
    assert layout.zero3_sub_groups(parts, 6) == [[3, 5], [2, 4], [1]]
    z3 = layout.deepspeed_bytes(numels, stage=3, world=2, rank=1, sub_group_size=6)
    assert z3["fp32_grads"] == 4 * 8  # the largest sub-group, 8 elements: 32 bytes (all at once: 4 x 15 = 60)
    assert z3["master"] == z3["grads"] == 4 * 15 and z3["optimizer"] == 2 * 4 * 15  # the partitions: unchanged
    assert z3["scalars"] == 3 * 4 + 8 + 1  # an Adam step per sub-group (3), the fp64 grad norm, the overflow flag
    # sub_group_size 14: 3+5+2+4 = 14 closes [3, 5, 2, 4], then [1] -> 56 bytes; 15 (>= the whole partition): one
    # sub-group -> 60 bytes, today's default-size case; 1: each parameter its own -> the largest partition, 5 -> 20
    for size, peak in ((14, 4 * 14), (15, 4 * 15), (10**9, 4 * 15), (1, 4 * 5)):
        assert layout.deepspeed_bytes(numels, stage=3, world=2, rank=0, sub_group_size=size)["fp32_grads"] == peak
    # CPU offload: every sub-group keeps its own fp32 gradient buffer on the host all along -> 60 bytes there
    off = layout.deepspeed_bytes(numels, stage=3, world=2, rank=0, sub_group_size=6, offload_optimizer="cpu",
                                 offload_param="cpu")
    assert off["tiers"]["cpu"]["fp32_grads"] == 4 * 15
    # ZeRO-1/2 step one flat partition, no sub-groups: Ψ = 29 padded to 32 (a multiple of 2N), 16 per rank
    for stage in (1, 2):
        assert layout.deepspeed_bytes(numels, stage=stage, world=2, rank=0, sub_group_size=6)["fp32_grads"] == 4 * 16
    with pytest.raises(ValueError, match=r"sub_group_size must be an integer > 0 \(elements\), got 0"):
        layout.zero3_sub_groups(parts, 0)
    for bad in (1.5, True, "20000"):
        with pytest.raises(ValueError, match=re.escape(f"got {bad!r}")):
            layout.zero3_sub_groups(parts, bad)


def test_coursekit_memory_charges_tiny_llamas_largest_sub_group(capsys):
    """tiny-llama on 2 ranks, ZeRO-3, fp32, --sub-group-size 20000 (the live run of test_zero.py). Partitions per rank
    (ceil(n/2)): embedding 8192; per layer q 2048, k 1024, v 1024, o 2048, gate/up/down 5632 each, two norms 32;
    final norm 32; head 8192; 62,624 in all. Packed: 8192+2048+1024+1024+2048+5632 = 19,968 < 20,000, + the first
    layer's up 5632 = 25,600 closes; then down 5632 + 32 + 32 + 2048 + 1024 + 1024 + 2048 + 5632 = 17,472, + 5632 =
    23,104 closes; the rest, 5632 + 32 + 32 + 32 + 8192 = 13,920. Largest 25,600 -> 102,400 bytes, not 250,496."""
    kw = dict(batch=2, seq=32, dtype="fp32", dp=2, zero=3, microbatches=2)
    small, one = estimate("tiny-llama", sub_group_size=20_000, **kw), estimate("tiny-llama", **kw)
    assert small.categories["step_grad_copy"] == 4 * 25_600 and one.categories["step_grad_copy"] == 4 * 62_624
    assert one.phases["optimizer_step"] - small.phases["optimizer_step"] == 4 * (62_624 - 25_600)  # the step's peak
    assert one.phases["end_of_backward"] == small.phases["end_of_backward"]  # nothing else moves
    args = ["--model", "tiny-llama", "--batch", "2", "--seq", "32", "--dtype", "fp32", "--dp", "2", "--zero", "3",
            "--json"]
    for flag in ("20000", "2e4"):
        assert memory_main([*args, "--sub-group-size", flag]) == 0
        assert json.loads(capsys.readouterr().out)["step_grad_copy_bytes"] == 4 * 25_600
    for bad in ("0", "-5", "1.5", "lots"):
        assert memory_main([*args, "--sub-group-size", bad]) == 2
        err = capsys.readouterr().err
        assert err == f"error: --sub-group-size takes a whole number of elements > 0 (20000, 1e9), got {bad!r}\n"
    with pytest.raises(ValueError, match="sub_group_size must be > 0, got 0"):
        estimate("tiny-llama", sub_group_size=0, **kw)
