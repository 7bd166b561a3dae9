"""The two vocabularies (``coursekit.memory.vocab``): every refusal word for word, the configurations just inside each
bound, what the run description carries (its model, its ZeRO stage, the micro-batches' default) and the mesh a
TrainConfig gives back. Where bench/bench_mutation.py found no test (tests/test_memory_vocab.py has the command
line's side). Pure Python, well under a second."""
from __future__ import annotations

import re

import pytest

from coursekit.memory import engines, vocab
from coursekit.memory.errors import ConfigError
from coursekit.spec import registry
from coursekit.spec.runspec import RunSpec


def whole(message):
    return "^" + re.escape(message) + "$"


def run(**kw):
    """spec_of on the trainer's path (always=True) for a micro-batch of 1 at seq 8 plus ``kw``."""
    return vocab.spec_of({"micro_batch": 1, "seq": 8, **kw}, model="llama3-8b", always=True)


def test_spec_of_carries_the_model_given_or_tiny_llama():
    spec, knobs = run(strategy="ddp")
    assert spec.model == "llama3-8b" and knobs == {}
    spec, _ = vocab.spec_of({"strategy": "ddp", "micro_batch": 1, "seq": 8})
    assert spec.model == "tiny-llama"


def test_spec_of_without_a_micro_batch_is_a_config_error():
    """The calculator sizes one given micro-batch: none is refused as a ConfigError (what the command line reports
    as ``error: ...``), not a KeyError."""
    with pytest.raises(ConfigError, match=whole("batch must be an integer, got None")):
        vocab.spec_of({"strategy": "ddp", "seq": 8})


def test_grad_accum_defaults_to_pp():
    """The calculator's default micro-batches are pp (1F1B fills the pipeline), the trainer's 1."""
    assert run(strategy="zero1", world=8, pp=4)[0].grad_accum == 4
    assert run(strategy="zero1", world=8)[0].grad_accum == 1
    assert run(strategy="zero1", world=8, pp=4, grad_accum=3)[0].grad_accum == 3
    assert run(strategy="zero1", world=8, pp=2, microbatches=6)[0].grad_accum == 6  # the older name


@pytest.mark.parametrize("kw,message", [
    (dict(strategy="ddp", tp=0), "tp must be > 0, got 0"),
    (dict(strategy="ddp", cp=-1), "cp must be > 0, got -1"),
    (dict(strategy="ddp", seq=0), "seq must be > 0, got 0"),
    (dict(strategy="ddp", micro_batch=0), "batch must be > 0, got 0"),
    (dict(strategy="ddp", dp=0), "dp must be > 0, got 0"),
    (dict(engine="bogus"), "unknown engine 'bogus'; choose one of: " + ", ".join(engines.REGISTRY)),
    (dict(engine="ddp", zero=1), "zero stages are DeepSpeed's; engine 'ddp' needs zero 0"),
    (dict(engine="fsdp2", zero=3), "zero stages are DeepSpeed's; engine 'fsdp2' needs zero 0"),
    (dict(engine="deepspeed", zero=5), "zero stage must be 0, 1, 2, 3, got 5"),
    (dict(strategy="fsdp1"), f"strategy 'fsdp1' is not modelled: {registry.STRATEGIES['fsdp1'].unmodelled}"),
    (dict(strategy="fsdp2", zero=1), "zero stages are DeepSpeed's; engine 'fsdp2' (strategy 'fsdp2') needs zero 0"),
    (dict(strategy="ddp", hsdp_shard=2), "hsdp_shard 2 is the shard group of HSDP: give strategy hsdp or fsdp2 "
                                         "(engine fsdp2); this one replicates (use dp_replicate)"),
    (dict(strategy="zero3", hsdp_shard=2), "hsdp_shard 2 is the shard group of HSDP: give strategy hsdp or fsdp2 "
                                           "(engine fsdp2); this one replicates (use dp_replicate)"),
    (dict(strategy="fsdp2", dp=8, dp_shard=3), "dp_shard (3) does not divide dp (8)"),
    (dict(strategy="fsdp2", dp=8, hsdp_shard=3), "dp (8) is not divisible by the HSDP shard group (3)"),
    (dict(strategy="hsdp", dp=8, dp_replicate=2, dp_shard=2), "dp (8) != dp_replicate (2) x dp_shard (2)"),
    (dict(strategy="fsdp2", dp=8, dp_replicate=3), "dp_replicate (3) does not divide dp (8)"),
])
def test_refusals_word_for_word(kw, message):
    with pytest.raises(ConfigError, match=whole(message)):
        run(**kw)


@pytest.mark.parametrize("kw,strategy,zero,rep,shard", [
    (dict(engine="ddp", zero=0), "ddp", None, None, None),  # zero 0 is no ZeRO: any engine takes it
    (dict(engine="fsdp2", zero=0), "fsdp2", None, None, None),
    (dict(engine="deepspeed"), "zero0", None, None, None),  # no stage given: ZeRO-0
    (dict(engine="deepspeed", zero=1), "zero1", None, None, None),
    (dict(strategy="ddp", zero=0), "ddp", None, None, None),
    (dict(strategy="fsdp2", zero=0), "fsdp2", None, None, None),  # the run carries no stage for fsdp2
    (dict(strategy="zero2", zero=2), "zero2", None, None, None),  # zeroK fixes its own stage: the run carries none
    (dict(strategy="deepspeed", zero=1), "deepspeed", 1, None, None),  # deepspeed's stage is the run's
    (dict(strategy="hsdp", dp=8, dp_replicate=2, dp_shard=4), "hsdp", None, 2, 4),
    (dict(strategy="fsdp2", dp=8, hsdp_shard=2), "fsdp2", None, 4, 2),
    (dict(strategy="fsdp2", dp=8, dp_shard=8), "fsdp2", None, 1, 8),
    (dict(strategy="fsdp2", dp=8, dp_replicate=1), "fsdp2", None, 1, 8),
    (dict(strategy="fsdp2", dp=8), "fsdp2", None, 1, 8),
    (dict(strategy="zero3", dp=8), "zero3", None, 8, 1),
])
def test_accepted_and_what_the_run_carries(kw, strategy, zero, rep, shard):
    spec, _ = run(**kw)
    assert (spec.strategy, spec.zero, spec.dp_replicate, spec.dp_shard) == (strategy, zero, rep, shard)


def test_engine_ddp_keeps_16psi_unless_fp32_or_given():
    assert run(engine="ddp")[1] == {"precision": "16psi"}
    assert run(engine="ddp", dtype="fp32")[1] == {}
    assert run(engine="ddp", precision="18psi")[1] == {"precision": "18psi"}


def test_config_of_refuses_knobs_the_run_sets():
    spec = RunSpec(model="m", strategy="ddp", micro_batch=1, seq=8)
    with pytest.raises(ConfigError, match=whole("the run description already sets tp; give them in the RunSpec")):
        vocab.config_of(spec, {"tp": 2})
    with pytest.raises(ConfigError, match=whole("the run description already sets batch, tp; give them in the "
                                                "RunSpec")):
        vocab.config_of(spec, {"tp": 2, "batch": 3, "optimizer": "adamw"})
    c = vocab.config_of(spec, {"precision": "fp32", "tp": None, "optimizer": "sgd"})  # an override; None: not given
    assert (c.precision, c.optimizer, c.tp) == ("fp32", "sgd", 1)


def test_divide():
    assert vocab._divide(8, 1, "x") == 8 and vocab._divide(8, 8, "x") == 1 and vocab._divide(8, 2, "x") == 4
    for part in (0, -2, 2.0, 3):  # -2 and 2.0 would divide 8 by Python's % but are no group sizes
        with pytest.raises(ConfigError, match=whole(f"x ({part}) does not divide dp (8)")):
            vocab._divide(8, part, "x")


@pytest.mark.parametrize("kw,flavour,rep,shard", [
    (dict(strategy="ddp", dp_replicate=4), "replicate", 4, 1),
    (dict(strategy="zero3", dp_replicate=4), "replicate", 4, 1),
    (dict(strategy="fsdp2", dp_shard=4), "shard", 1, 4),
    (dict(strategy="hsdp", dp_replicate=2, dp_shard=4), "hybrid", 2, 4),
])
def test_layout_flavour_is_the_strategys(kw, flavour, rep, shard):
    dims = vocab.layout(vocab.config({"batch": 1, "seq": 8, **kw}))
    assert (dims.dp_flavour, dims.dp_replicate, dims.dp_shard) == (flavour, rep, shard)
