"""The run description (coursekit.spec.runspec.RunSpec): one run, the same for the trainer, the calculator, the
planner and `coursekit layout`.

Each property is checked against another tool's own path: the trainer's option parser and pre-launch validation,
the calculator's older keyword vocabulary (coursekit.memory.vocab), the planner's Layout.
"""
from __future__ import annotations

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
