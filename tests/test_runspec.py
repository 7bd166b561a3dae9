"""The run description (coursekit.spec.runspec.RunSpec): one run, the same for the trainer, the calculator, the
planner and `coursekit layout`.

Each property is checked against another tool's own path: the trainer's option parser and pre-launch validation,
the calculator's older keyword vocabulary (coursekit.memory.vocab), the planner's Layout.
"""
from __future__ import annotations

import re

import pytest

from coursekit import options
from coursekit.memory import estimate
from coursekit.memory.errors import ConfigError
from coursekit.parallel.validate import validate
from coursekit.plan.layout import Layout
from coursekit.spec.runspec import RunSpec

SPECS = [
    RunSpec(strategy="single", seq=32, global_batch=4),
    RunSpec(strategy="ddp", dp_replicate=2, seq=32, global_batch=8, grad_accum=2),
    RunSpec(strategy="zero3", dp_replicate=4, seq=64, micro_batch=1),
    RunSpec(strategy="fsdp2", dp_shard=2, degrees={"tp": 2}, sp=True, seq=64, global_batch=8),
    RunSpec(strategy="hsdp", dp_replicate=2, dp_shard=2, seq=32, global_batch=8, dtype="bf16"),
    RunSpec(strategy="ddp", degrees={"pp": 2}, pp_schedule="1f1b", grad_accum=2, seq=32, global_batch=8),
    RunSpec(strategy="ddp", degrees={"cp": 2, "tp": 2}, cp_impl="ulysses", seq=64, global_batch=4, dtype="bf16",
            recompute="full"),
]


def _world(spec):
    return spec.dims().world_size


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: " ".join(s.trainer_argv()[2:6]))
def test_the_trainer_reads_back_the_same_run_and_builds_the_same_mesh(spec):
    opts = options.parse(spec.trainer_argv())
    assert RunSpec.from_options(opts) == spec
    assert validate(opts, _world(spec)) == spec.dims()  # the trainer's own pre-launch path
    assert (opts.train.micro_batch, opts.train.global_batch) == spec.batch()  # validate fills the batch


@pytest.mark.parametrize("spec", [s for s in SPECS if s.strategy not in ("single",)] + [SPECS[0]],
                         ids=lambda s: s.strategy)
def test_the_calculator_sizes_the_run_as_its_trainer_vocabulary_does(spec):
    d = spec.dims().degrees
    micro, _ = spec.batch()
    old = dict(strategy=spec.strategy, micro_batch=micro, seq=spec.seq, grad_accum=spec.grad_accum,
               dtype=spec.dtype, attention=spec.attention, recompute=spec.recompute, tp=d["tp"], pp=d["pp"],
               cp=d["cp"], sp=spec.sp and d["tp"] > 1, cp_impl=spec.cp_impl,
               dp_replicate=None if spec.dp_replicate is None and d["dp_replicate"] == 1 else d["dp_replicate"],
               dp_shard=None if spec.dp_shard is None and d["dp_shard"] == 1 else d["dp_shard"])
    if d["pp"] > 1:
        old["pp_schedule"] = spec.pp_schedule
    by_vocab = estimate("tiny-llama", **old)
    by_spec = estimate(spec)  # the calculator takes the run description itself
    assert by_spec.to_dict() == by_vocab.to_dict()
    assert by_spec.config.world == spec.dims().world_size


def test_the_planner_layout_is_the_same_run():
    L = Layout(dp_replicate=2, dp_shard=4, tp=2, engine="fsdp2", micro_batch=2, recompute="selective")
    s = L.spec()
    assert s.strategy == "hsdp" and s.dims().degrees == {"pp": 1, "dp_replicate": 2, "dp_shard": 4, "cp": 1, "tp": 2}
    assert Layout(dp_replicate=8, engine="deepspeed", zero=3).spec().strategy == "zero3"
    assert Layout(dp_shard=8, engine="fsdp2").dims().size("fsdp") == 8


@pytest.mark.parametrize("kw,needle", [
    (dict(strategy="fsdp"), "unknown strategy 'fsdp'"),
    (dict(degrees={"xp": 2}), "unknown parallel degree"),
    (dict(degrees={"tp": 0}), "tp must be > 0"),
    (dict(strategy="zero2", zero=3), "strategy deepspeed only"),
    (dict(pp_schedule="zvb"), "unknown pp_schedule"),
    (dict(micro_batch=0), "micro_batch must be > 0"),
])
def test_bad_input_is_refused_naming_the_field(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        RunSpec(**kw)


def test_a_run_that_cannot_be_is_refused_when_asked():
    with pytest.raises(ConfigError, match="runs on 1 process"):
        RunSpec(strategy="single", world=2).dims()
    with pytest.raises(ConfigError, match="not modelled: FSDP1"):
        RunSpec(strategy="fsdp1", dp_shard=2).calculator()
    with pytest.raises(ConfigError, match="global batch 6 is not divisible"):
        RunSpec(strategy="ddp", dp_replicate=4, global_batch=6).batch()


def test_the_calculator_takes_the_run_and_only_its_own_knobs_beside_it():
    spec = RunSpec(strategy="ddp", dp_replicate=2, micro_batch=2, seq=32)
    cpu = estimate(spec, kernels="cpu")
    assert cpu.config.kernels == "cpu" and cpu.config.batch == 2 and cpu.config.dp == 2
    with pytest.raises(ConfigError, match="already sets batch"):
        estimate(spec, batch=3)


def test_the_planners_layout_takes_the_trainers_names():
    from coursekit.plan.layout import parse_layout

    assert parse_layout("strategy=zero3,dp_replicate=8") == parse_layout("engine=deepspeed,zero=3,dp_replicate=8")
    assert parse_layout("strategy=hsdp,dp_replicate=2,dp_shard=4") == parse_layout(
        "engine=fsdp2,dp_replicate=2,dp_shard=4")
    assert parse_layout("pp=2,grad_accum=8,pp_virtual=2") == parse_layout("pp=2,microbatches=8,virtual_stages=2")
    for text, needle in (("strategy=zero3,zero=2", "is zero 3, not 2"), ("strategy=fsdp1", "not modelled"),
                         ("strategy=hsdp,dp_shard=4", "needs dp_replicate > 1"), ("strategy=nope", "unknown"),
                         ("grad_accum=4,microbatches=8", "disagree")):
        with pytest.raises(ValueError, match=needle):
            parse_layout(text)


# -- each field's own check, and the numbers each method derives, worked by hand -----------------------------------

@pytest.mark.parametrize("kw,message", [
    (dict(dtype="fp8"), "unknown dtype 'fp8'; choose one of: fp32, bf16, fp16"),  # DTYPES
    (dict(attention="flash"), "unknown attention 'flash'; choose one of: sdpa, eager"),  # run.ATTENTION
    (dict(recompute="half"), "unknown recompute 'half'; choose one of: none, selective, full, op"),  # run.RECOMPUTE
    (dict(cp_impl="zigzag"), "unknown cp_impl 'zigzag'; choose one of: ring, ulysses"),  # run.CP_IMPLS
    # both unknown names, sorted, then the registry's parallelisms in its order
    (dict(degrees={"xp": 2, "ap": 2}), "unknown parallel degree(s) ap, xp; known: tp, pp, cp, ep"),
    (dict(seq=0), "seq must be > 0, got 0"),
    (dict(grad_accum=0), "grad_accum must be > 0, got 0"),
    (dict(world=0), "world must be > 0, got 0"),
    (dict(pp_virtual=-1), "pp_virtual must be > 0, got -1"),
    # a stage outside 0-3, and a stage given to a strategy that fixes its own
    (dict(strategy="deepspeed", zero=4), "zero 4: a ZeRO stage 0-3 is given with strategy deepspeed only "
                                         "(zero0-zero3 fix their own)"),
    (dict(strategy="zero2", zero=2), "zero 2: a ZeRO stage 0-3 is given with strategy deepspeed only "
                                     "(zero0-zero3 fix their own)"),
])
def test_each_bad_field_is_refused_with_its_name_and_value(kw, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        RunSpec(**kw)


def test_deepspeed_takes_every_zero_stage_0_to_3():
    for stage in (0, 1, 2, 3):  # ZeRO's four stages, all valid with strategy deepspeed
        assert RunSpec(strategy="deepspeed", zero=stage).zero == stage


def test_a_single_process_strategy_on_two_ranks_says_so():
    with pytest.raises(ConfigError, match="^" + re.escape(
            "strategy 'single' runs on 1 process, not 2; use strategy ddp (or another parallel strategy) for more")
            + "$"):
        RunSpec(strategy="single", world=2).dims()


def test_the_mesh_takes_the_given_data_parallel_axis_and_fills_the_other():
    # HSDP (hybrid) on 8 ranks: given dp_shard 2, the replicas fill 8 / 2 = 4; given dp_replicate 2, the shard
    # groups fill 8 / 2 = 4 (with neither given, hybrid would put all 8 on dp_shard)
    assert RunSpec(strategy="hsdp", world=8, dp_shard=2).dims().degrees == {
        "pp": 1, "dp_replicate": 4, "dp_shard": 2, "cp": 1, "tp": 1}
    assert RunSpec(strategy="hsdp", world=8, dp_replicate=2).dims().degrees == {
        "pp": 1, "dp_replicate": 2, "dp_shard": 4, "cp": 1, "tp": 1}
    # without world: the product of the degrees, 2 x 3 x tp 2 = 12 (ep borrows ranks, so it adds none)
    dims = RunSpec(strategy="hsdp", dp_replicate=2, dp_shard=3, degrees={"tp": 2}).dims()
    assert dims.world_size == 12 and dims.dp_flavour == "hybrid"


def test_the_batch_is_micro_batch_times_grad_accum_times_data_parallel_ranks():
    # micro 2 x grad_accum 3 x 2 replicas = 12 sequences per step
    spec = RunSpec(dp_replicate=2, micro_batch=2, grad_accum=3)
    assert spec.batch() == (2, 12)
    assert RunSpec(dp_replicate=2, micro_batch=2, grad_accum=3, global_batch=12).batch() == (2, 12)  # consistent
    with pytest.raises(ConfigError, match="^" + re.escape(
            "global_batch 10 != micro_batch 2 x grad_accum 3 x data-parallel ranks 2") + "$"):
        RunSpec(dp_replicate=2, micro_batch=2, grad_accum=3, global_batch=10).batch()
    # neither given: the default global batch 8 over 2 replicas, one micro-batch each step: 4 sequences per rank
    micro, g = RunSpec(dp_replicate=2).batch()
    assert (micro, g) == (4, 8) and type(micro) is int  # a whole number of sequences, not 4.0
    # global 6 over 2 ranks x 2 micro-batches = 4 slots: 6 does not divide (although 6 % (2 / 2) would be 0)
    with pytest.raises(ConfigError, match="^" + re.escape(
            "global batch 6 is not divisible by data-parallel ranks 2 x grad_accum 2") + "$"):
        RunSpec(dp_replicate=2, grad_accum=2, global_batch=6).batch()
    # tp does not slice the batch: 16 over dp 2 (tp 2 ranks see the same data) x grad_accum 2 = 4 per micro-batch
    assert RunSpec(dp_replicate=2, degrees={"tp": 2}, grad_accum=2, global_batch=16).batch() == (4, 16)


def test_the_trainer_arguments_always_name_the_sequence_and_only_what_differs():
    # every field at its default: model and strategy, and the sequence length, which trainer_argv always passes
    assert RunSpec().trainer_argv() == ["--model", "tiny-llama", "--strategy", "ddp", "--seq", "64"]
    # sequence parallelism splits over the TP group: with tp 1 there is none, so no --sp; neither a pipeline
    # schedule nor a CP attention without pp / cp
    assert RunSpec(sp=True, pp_schedule="1f1b", cp_impl="ulysses").trainer_argv() == [
        "--model", "tiny-llama", "--strategy", "ddp", "--seq", "64"]
    assert RunSpec(sp=True, degrees={"tp": 2}).trainer_argv()[-1] == "--sp"


def test_the_run_read_from_options_keeps_the_world_the_model_and_the_attention():
    opts = options.parse(["--model", "llama3-8b", "--strategy", "ddp", "--attention", "eager"])
    spec = RunSpec.from_options(opts, world=4)
    # 4 ranks given, no degree: ddp fills dp_replicate with all 4 (without the world the product would be 1)
    assert (spec.model, spec.attention, spec.world, spec.dims().degrees["dp_replicate"]) == (
        "llama3-8b", "eager", 4, 4)


def test_the_run_read_from_options_takes_runspecs_defaults_for_groups_the_registry_lacks(monkeypatch):
    """A registry without the pipeline, CP and TP option groups (a course without those modules): the schedule, the
    CP attention and sequence parallelism fall back to RunSpec's own defaults, gpipe, ring and off."""
    from coursekit.spec import registry

    opts = options.parse(["--strategy", "ddp", "--pp", "2", "--pp-schedule", "1f1b", "--cp", "2", "--cp-impl",
                          "ulysses", "--tp", "2", "--sp"])
    kept = [(c, label) for c, label in registry.option_groups()
            if c.__name__ not in ("PipelineOptions", "CPOptions", "TPOptions")]
    monkeypatch.setattr(registry, "option_groups", lambda: kept)
    spec = RunSpec.from_options(opts)
    assert (spec.pp_schedule, spec.cp_impl, spec.sp) == ("gpipe", "ring", False)


BASE = dict(seq=32, dtype="fp32", attention="sdpa", recompute="none", pp=1, cp=1, tp=1, ep=1, sp=False,
            cp_impl="ring", microbatches=1)  # the calculator keywords every run below shares unless it says


@pytest.mark.parametrize("spec,want", [
    # ddp on pp 2 x dp 2 x tp 2 = 8 ranks; global 16 / (dp 2 x grad_accum 4) = micro 2; tp 2 so sp holds; the
    # pipeline's schedule and stages per rank pass through; ddp runs bf16 as autocast over fp32 weights (amp fp32)
    (RunSpec(strategy="ddp", dp_replicate=2, degrees={"tp": 2, "pp": 2}, sp=True, pp_schedule="interleaved-1f1b",
             pp_virtual=3, grad_accum=4, global_batch=16, seq=32, dtype="bf16", attention="eager", recompute="full"),
     dict(BASE, batch=2, dtype="bf16", attention="eager", recompute="full", engine="ddp", dp=2, world=8, tp=2, pp=2,
          sp=True, microbatches=4, pp_schedule="interleaved-1f1b", pp_virtual=3, precision="fp32")),
    # ddp in fp32: no precision override; sp asked with tp 1 is off; pp 1: no schedule keywords at all
    (RunSpec(strategy="ddp", dp_replicate=2, sp=True, micro_batch=3, seq=32, pp_schedule="1f1b"),
     dict(BASE, batch=3, engine="ddp", dp=2, world=2)),
    # tp 2 without sp: sp stays off; cp 2 with ulysses: 2 x 2 ranks, dp 1, global 8 / 1 = micro 8
    (RunSpec(strategy="ddp", degrees={"tp": 2, "cp": 2}, cp_impl="ulysses", seq=32),
     dict(BASE, batch=8, engine="ddp", dp=1, world=4, tp=2, cp=2, cp_impl="ulysses")),
    # deepspeed with its stage given: zero 2; a 16-bit dtype is DeepSpeed's own mixed precision (no amp override)
    (RunSpec(strategy="deepspeed", zero=2, dp_replicate=4, micro_batch=1, seq=32, dtype="bf16"),
     dict(BASE, batch=1, dtype="bf16", engine="deepspeed", dp=4, world=4, zero=2)),
    # zero3 fixes its stage itself (3) with no zero given
    (RunSpec(strategy="zero3", dp_replicate=2, global_batch=4, seq=32),
     dict(BASE, batch=2, engine="deepspeed", dp=2, world=2, zero=3)),
    # fsdp2 over 4 shards, one replica: plain FSDP, no hsdp_shard; ep 2 borrows two of the 4 loss ranks
    (RunSpec(strategy="fsdp2", dp_shard=4, degrees={"ep": 2}, global_batch=8, seq=32),
     dict(BASE, batch=2, engine="fsdp2", dp=4, world=4, ep=2)),
    # fsdp2 with 2 replicas of 2 shards is HSDP in effect: the shard group's size, 2, as hsdp_shard
    (RunSpec(strategy="fsdp2", dp_replicate=2, dp_shard=2, global_batch=8, seq=32),
     dict(BASE, batch=2, engine="fsdp2", dp=4, world=4, hsdp_shard=2)),
    # hsdp on 8 ranks, 4 shard groups given: 2 replicas; hsdp always states its shard group, 4
    (RunSpec(strategy="hsdp", world=8, dp_shard=4, global_batch=8, seq=32),
     dict(BASE, batch=1, engine="fsdp2", dp=8, world=8, hsdp_shard=4)),
])
def test_the_calculator_keywords_of_a_run_worked_by_hand(spec, want):
    assert spec.calculator() == want
