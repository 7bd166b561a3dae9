"""``--recompute op``: torchtitan's per-op selective activation checkpoint, in the trainer and the calculator.

The policy (``coursekit.parallel.recompute``) keeps every block's input and the outputs of its save list — every
second mm among them — and recomputes the rest. The calculator (``coursekit.memory.op_recompute``) predicts what
it keeps; both count whole storages, so they agree to the byte. The trainer equals one process step by step.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from parity import COMMON, assert_equal_to_single, baseline, train
from test_memory_activations import build, llama, measure

from coursekit.memory import activation_bytes, preset
from coursekit.memory.errors import ConfigError
from coursekit.parallel.recompute import enable_op_recompute, policy, save_ops


def _op_model(shape, attention="sdpa", dtype="fp32"):
    m = build(shape, attention, dtype)
    enable_op_recompute(m)
    return m


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-mixtral"])
def test_op_saved_bytes_equal_the_calculator_to_the_byte(name):
    shape = replace(preset(name), layers=2)
    got = measure(_op_model(shape), 2, 32, shape.vocab, breakdown=True)
    est = activation_bytes(shape, 2, 32, dtype="fp32", kernels="cpu", recompute="op")
    assert est.total_bytes == got["total_bytes"], (est.per_layer, got["by_module"])
    assert est.layer_bytes == got["by_layer"]["layers.1"]
    # and it keeps less than no recompute, more than full
    assert (activation_bytes(shape, 2, 32, dtype="fp32", kernels="cpu", recompute="full").total_bytes
            < est.total_bytes < activation_bytes(shape, 2, 32, dtype="fp32", kernels="cpu").total_bytes)


@pytest.mark.parametrize("shape,attention,dtype,b,s", [
    (llama(64, 4, 2, 176), "eager", "bf16", 2, 24),  # eager attention: its two bmm are kept
    (llama(64, 4, 1, 176, head_dim=32, qkv_bias=True), "sdpa", "fp32", 1, 33),  # q, k, v are addmm: kept, uncounted
    (llama(64, 4, 4, 176, activation="relu", mlp_bias=True), "sdpa", "fp32", 2, 17),
    (llama(64, 4, 2, 176, drop=0.1), "sdpa", "bf16", 2, 24),  # CPU SDPA with dropout: the math path's fp32 bmm
], ids=["eager-bf16", "qkv-bias", "mlp-bias-relu", "math-path"])
def test_op_kernels_and_biases_equal_the_calculator(shape, attention, dtype, b, s):
    got = measure(_op_model(shape, attention, dtype), b, s, shape.vocab)["total_bytes"]
    assert activation_bytes(shape, b, s, dtype=dtype, attention=attention, kernels="cpu",
                            recompute="op").total_bytes == got


def test_every_second_mm_is_recomputed():
    """q, v, gate and down are kept; k, o and up recomputed (saving every mm would keep all seven)."""
    shape = replace(preset("tiny-llama"), layers=2)
    mods = measure(_op_model(shape), 2, 32, shape.vocab, breakdown=True)["by_module"]
    kept = {k.rsplit(".", 1)[-1] for k in mods if k.startswith("model.layers.1.") and mods[k]}
    assert kept == {"q_proj", "v_proj", "gate_proj", "down_proj"}
    assert set(activation_bytes(shape, 2, 32, recompute="op", kernels="cpu").per_layer) == {
        "layer_input(checkpoint)", "q_proj.out(mm)", "v_proj.out(mm)", "mlp.gate_proj.out(mm)",
        "mlp.down_proj.out(mm)"}


def test_the_policy_counts_forward_and_recompute_apart():
    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

    mm, x, w = torch.ops.aten.mm.default, torch.zeros(2, 4), torch.zeros(4, 3)
    decide = policy(save_ops(), {(4, 8)})
    fwd = [decide(SelectiveCheckpointContext(is_recompute=False), mm, x, w) for _ in range(4)]
    rec = [decide(SelectiveCheckpointContext(is_recompute=True), mm, x, w) for _ in range(2)]
    save, redo = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert fwd == [save, redo, save, redo] and rec == [save, redo]
    # the router's shape is recomputed and not counted; a non-listed op is recomputed; bmm always kept
    ctx = SelectiveCheckpointContext(is_recompute=False)
    assert decide(ctx, mm, x, torch.zeros(4, 8)) == redo
    assert decide(ctx, mm, x, w) == save  # the 5th counted mm
    assert decide(ctx, torch.ops.aten.mul.Tensor, x, x) == redo
    assert decide(ctx, torch.ops.aten.bmm.default, x, x) == save


def test_op_is_refused_where_not_modelled():
    for kw in (dict(cp=2), dict(tp=2, model="tiny-mixtral"), dict(ep=2, model="tiny-mixtral")):
        with pytest.raises(ConfigError, match="without cp or ep"):
            activation_bytes(preset(kw.pop("model", "tiny-llama")), 2, 32, recompute="op", **kw)
    with pytest.raises(ConfigError, match="Llama-style"):
        activation_bytes(preset("gpt2"), 2, 32, recompute="op")


def test_flops_and_planner_accept_op():
    from coursekit.flops import flops_per_step
    from coursekit.plan.layout import parse_layout

    f = {rc: flops_per_step("llama3-8b", 2, 8192, recompute=rc)["recompute"] for rc in ("selective", "op", "full")}
    assert 0 < f["op"] < f["full"]
    # k, o, up per layer (Llama 3 8B: 4096·1024 + 4096² + 4096·14336), 2 FLOPs each per token
    assert f["op"] == 2 * 32 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336) * 2 * 8192
    assert parse_layout("dp_shard=8,recompute=op")["recompute"] == "op"


def test_memory_cli_op_and_bad_value_in_one_line():
    def run(*a):
        return subprocess.run([sys.executable, "-m", "coursekit.cli", "memory", "--model", "tiny-llama", "--batch",
                               "2", "--seq", "32", "--recompute", *a], capture_output=True, text=True, timeout=120)
    ok = run("op")
    assert ok.returncode == 0 and "recompute=op" in ok.stdout
    bad = run("ops")
    assert bad.returncode == 2 and "invalid choice: 'ops'" in bad.stderr.strip().splitlines()[-1]


def _saved_as_predicted(res, extra, nproc):
    from coursekit.profiling.stepcount import predicted_saved

    want = predicted_saved(["--strategy", "ddp", *COMMON, *extra], nproc)
    assert [r["final"]["peak_saved_bytes"] for r in res.results] == want * nproc


def test_fsdp2_with_op_recompute_equals_single_and_its_saved_bytes(no_orphans):
    """FSDP2 on 2 ranks under --recompute op: equal to one process (no recompute) step by step, and each rank's
    counted peak of saved bytes (SAC's own storage included) equals the calculator's."""
    res = train("fsdp2", 2, "--recompute", "op", "--count-step")
    assert_equal_to_single(res, baseline())
    _saved_as_predicted(res, ["--recompute", "op"], 2)
    from coursekit.profiling.stepcount import predicted_saved

    assert res.results[0]["final"]["peak_saved_bytes"] < predicted_saved(["--strategy", "ddp", *COMMON], 2)[0]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,nproc,extra", [("single", 1, ()), ("ddp", 2, ()), ("ddp", 2, ("--tp", "2")),
                                                  ("single", 1, ("--model", "tiny-mixtral"))],
                         ids=["single", "ddp2", "tp2", "mixtral"])  # (DDP's MoE aux loss is per rank: not one process)
def test_op_recompute_equals_single(strategy, nproc, extra, no_orphans):
    res = train(strategy, nproc, "--recompute", "op", "--count-step", *extra)
    assert_equal_to_single(res, baseline(*extra[:2]) if "--model" in extra else baseline())
    _saved_as_predicted(res, ["--recompute", "op", *extra], nproc)


def test_op_under_tp_with_sp_keeps_the_local_mms_and_reduce_scatters(no_orphans):
    """TP 2 with SP: each rank keeps its block's sequence-shard input, its local q, v, gate and down mm outputs (the
    widths split by tp, all n tokens) and the two reduce-scatter outputs the list names (n/tp tokens); its counted
    peak equals the calculator's, the run equals one process. By hand for tiny-llama (n = 8 x 32 = 256 tokens,
    fp32): 256 x (32 + 16 + 88 + 64) x 4 + 2 x 128 x 64 x 4 = 270,336 B per layer above full recompute's input."""
    from coursekit.profiling.stepcount import predicted_saved

    res = train("ddp", 2, "--tp", "2", "--sp", "--recompute", "op", "--count-step")
    assert_equal_to_single(res, baseline())
    _saved_as_predicted(res, ["--tp", "2", "--sp", "--recompute", "op"], 2)
    op, full = (predicted_saved(["--strategy", "ddp", *COMMON, "--tp", "2", "--sp", "--recompute", rc], 2)[0]
                for rc in ("op", "full"))
    assert op - full == 2 * 270336  # 2 layers


def test_planner_prices_op_between_none_and_full():
    """The step-time model's op recompute (k, o, up GEMMs + the element-wise forward) costs less than full, more
    than none; op's peak lies between full's and none's."""
    from coursekit.plan.search import evaluate

    c = {rc: evaluate("llama3-8b", {"dp_shard": 8, "engine": "fsdp2", "micro_batch": 2, "recompute": rc}, gpus=8, seq=8192,
                      global_batch=16) for rc in ("none", "op", "full")}
    t = {rc: x.prediction.step_time_s for rc, x in c.items()}
    assert t["none"] < t["op"] < t["full"]
    assert c["full"].peak_bytes < c["op"].peak_bytes < c["none"].peak_bytes


# -- per-layer full recompute (Megatron's block method) ------------------------------------------------------------
def test_recompute_layers_keeps_the_other_blocks_whole_and_equals_the_calculator(no_orphans):
    """--recompute full --recompute-layers 1 on tiny-llama's 2 blocks: block 0 keeps only its input, block 1 all
    its activations. The counted peak of saved bytes equals the calculator's for that mix, which lies strictly
    between full and no recompute (a trainer that recomputed both blocks, or none, would not match), and the losses
    are one process's without recompute (recompute changes nothing but memory)."""
    from coursekit.profiling.stepcount import predicted_saved

    res = train("single", 1, "--recompute", "full", "--recompute-layers", "1", "--count-step")
    assert_equal_to_single(res, baseline())
    _saved_as_predicted(res, ["--recompute", "full", "--recompute-layers", "1"], 1)
    full, part, none = (predicted_saved(["--strategy", "single", *COMMON, *x], 1)[0] for x in (
        ["--recompute", "full"], ["--recompute", "full", "--recompute-layers", "1"], []))
    assert full < part < none
    # the calculator's mix, by hand: one recomputed layer (its input) + one whole layer, which also keeps the RoPE
    # tables its rotary saves (full recompute keeps none); embedding and head as under full recompute
    kw = dict(dtype="fp32", kernels="cpu", position_ids="per-sequence")
    f = activation_bytes(preset("tiny-llama"), 8, 32, recompute="full", **kw)
    n = activation_bytes(preset("tiny-llama"), 8, 32, **kw)
    assert part - full == n.layer_bytes - f.layer_bytes + sum(n.shared.values()) - sum(f.shared.values())


def test_recompute_layers_needs_full_recompute_everywhere():
    from coursekit.memory import TrainConfig
    from coursekit.plan import Layout
    from coursekit.spec.runspec import RunSpec

    for make in (lambda: TrainConfig(batch=1, seq=32, recompute="op", recompute_layers=1),
                 lambda: RunSpec(model="tiny-llama", recompute="none", recompute_layers=2),
                 lambda: Layout(recompute="selective", recompute_layers=1)):
        with pytest.raises(ValueError, match="recompute_layers"):
            make()
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--model", "tiny-llama",
                          "--recompute-layers", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--recompute-layers" in out.stderr


@pytest.mark.slow  # default tier: test_recompute_layers_keeps_the_other_blocks_whole_and_equals_the_calculator
def test_recompute_layers_counts_per_pipeline_stage(tmp_path, no_orphans):
    """Under pp 2 (4 blocks, 2 per stage, 1F1B) --recompute-layers 1 recomputes each stage's first block: every
    rank's counted peak equals the calculator's per-stage figure, and the run equals one process."""
    from parity import llama_file
    from test_pp import assert_saved_as_predicted

    model = llama_file(tmp_path, num_hidden_layers=4)
    args = ["--model", model, "--pp", "2", "--grad-accum", "4", "--pp-schedule", "1f1b", "--recompute", "full",
            "--recompute-layers", "1"]
    res = train("ddp", 2, *args, "--count-step")
    assert_equal_to_single(res, baseline("--model", model))
    assert_saved_as_predicted(res, args)
