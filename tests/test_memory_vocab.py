"""One vocabulary with the trainer: ``coursekit memory`` and ``estimate`` take the trainer's names (--micro-batch,
--grad-accum, --strategy, --dp-replicate/--dp-shard) and the calculator's older ones, which say the same thing."""
from __future__ import annotations

import json

import pytest

from coursekit.memory import ConfigError, TrainConfig, estimate, max_micro_batch, min_gpus
from coursekit.memory.cli import main
from coursekit.memory.vocab import layout

BASE = ["--model", "llama3-8b", "--seq", "2048", "--gpu", "H100-80GB", "--json"]


def cli_json(args, capsys) -> dict:
    assert main(BASE + args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("trainer,calculator", [
    ("--micro-batch 2 --grad-accum 4 --strategy zero2 --dp-replicate 4", "--batch 2 --microbatches 4 --zero 2 --dp 4"),
    ("--micro-batch 1 --strategy zero3 --dp-replicate 8", "--batch 1 --engine deepspeed --zero 3 --dp 8"),
    ("--micro-batch 1 --strategy deepspeed --zero 1 --dp-replicate 2", "--batch 1 --zero 1 --dp 2"),
    # the trainer's ddp runs bf16 as autocast (fp32 weights): precision fp32 (test_memory_engines checks it live)
    ("--micro-batch 1 --strategy ddp --dp-replicate 4", "--batch 1 --engine ddp --dp 4 --precision fp32"),
    ("--micro-batch 1 --strategy ddp --precision 16psi", "--batch 1 --engine ddp"),
    ("--micro-batch 1 --strategy single --dtype fp32", "--batch 1 --engine ddp --dtype fp32"),
    ("--micro-batch 1 --strategy fsdp2 --dp-shard 8", "--batch 1 --engine fsdp2 --dp 8"),
    ("--micro-batch 1 --strategy fsdp2 --world 16 --tp 2", "--batch 1 --engine fsdp2 --dp 8 --tp 2"),  # fill
    ("--micro-batch 1 --strategy hsdp --dp-replicate 2 --dp-shard 4", "--batch 1 --engine fsdp2 --dp 8 --hsdp-shard 4"),
    ("--micro-batch 1 --strategy hsdp --world 8 --hsdp-shard 4", "--batch 1 --engine fsdp2 --dp 8 --hsdp-shard 4"),
    ("--micro-batch 1 --strategy zero1 --world 16 --tp 2 --pp 2 --grad-accum 8",
     "--batch 1 --zero 1 --dp 4 --tp 2 --pp 2 --microbatches 8"),
])
def test_both_spellings_give_the_same_estimate(trainer, calculator, capsys):
    new, old = cli_json(trainer.split(), capsys), cli_json(calculator.split(), capsys)
    assert new == old
    c = old["config"]
    assert new["peak_bytes"] > 0 and c["world"] == c["dp"] * c["tp"] * c["pp"] * c["cp"]


@pytest.mark.parametrize("args,message", [
    ("--strategy ddp --dp-shard 2", "dp_shard 2 needs a sharding data-parallel strategy"),
    ("--strategy zero3 --world 6 --tp 4", "world size 6 is not divisible by tp 4"),
    ("--strategy fsdp2 --world 8 --dp-shard 3", "dp_shard 3 does not divide the 8 data-parallel ranks"),
    ("--strategy zero3 --zero 2", "strategy 'zero3' is ZeRO stage 3, not 2"),
    ("--strategy ddp --engine fsdp2", "strategy 'ddp' runs engine 'ddp', not 'fsdp2'"),
    ("--strategy ddp --zero 2", "zero stages are DeepSpeed's"),
    ("--strategy single --dp-replicate 2", "strategy 'single' runs on 1 process"),
    ("--strategy hsdp --dp-shard 4 --hsdp-shard 2", "dp_shard (4) and its alias hsdp_shard (2) disagree"),
    ("--strategy fsdp2 --dp 8 --dp-replicate 3", "dp_replicate (3) does not divide dp (8)"),
    ("--strategy hsdp --dp 8 --dp-replicate 2 --dp-shard 2", "dp (8) != dp_replicate (2) x dp_shard (2)"),
])
def test_layout_errors_are_the_trainers(args, message, capsys):
    assert main(BASE + ["--micro-batch", "1"] + args.split()) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err


def test_python_api_takes_the_trainer_names():
    kw = dict(seq=4096, gpu="H100-80GB")
    new = estimate("llama3-8b", micro_batch=2, grad_accum=2, strategy="zero3", dp_replicate=8, **kw)
    old = estimate("llama3-8b", batch=2, microbatches=2, zero=3, dp=8, **kw)
    assert new.to_dict() == old.to_dict()
    assert max_micro_batch("llama3-8b", strategy="zero3", dp_replicate=8, **kw) == max_micro_batch(
        "llama3-8b", zero=3, dp=8, **kw)
    with pytest.raises(ConfigError, match="micro_batch \\(2\\) and its alias batch \\(3\\) disagree"):
        estimate("llama3-8b", micro_batch=2, batch=3, seq=1024)
    with pytest.raises(ConfigError, match="unknown strategy 'fsdp'"):
        estimate("llama3-8b", micro_batch=1, seq=1024, strategy="fsdp")


def test_min_gpus_for_hsdp_sizes_the_shard_group():
    """HSDP memory depends on the shard group only: the fewest GPUs are one group (the old spelling failed here,
    building dp=1 below its shard group)."""
    e = min_gpus("llama3-8b", "H100-80GB", micro_batch=1, seq=2048, strategy="hsdp", dp_shard=8)
    assert (e.config.dp, e.config.hsdp_shard, e.config.world) == (8, 8, 8)
    assert e.to_dict() == min_gpus("llama3-8b", "H100-80GB", batch=1, seq=2048, engine="fsdp2",
                                   hsdp_shard=8).to_dict()


@pytest.mark.parametrize("kw,degrees,group", [
    (dict(strategy="hsdp", dp_replicate=2, dp_shard=4, tp=2), dict(dp_replicate=2, dp_shard=4, tp=2), "fsdp"),
    (dict(strategy="fsdp2", world=16, cp=2), dict(dp_shard=8, cp=2), "fsdp"),
    (dict(strategy="zero3", world=16, pp=2), dict(dp_replicate=8, pp=2), "loss"),
    (dict(strategy="ddp", dp_replicate=4, cp=2), dict(dp_replicate=4, cp=2), "loss"),
])
def test_config_layout_is_the_trainers_mesh(kw, degrees, group):
    """A TrainConfig built from the trainer's names gives back the same ParallelDims, and the calculator shards model
    states over that mesh's group: FSDP2 over dp_shard x cp, ZeRO (and DDP's replicas) over the loss group."""
    from coursekit.memory import vocab

    c = vocab.config(dict(batch=1, seq=1024, **kw))
    dims = layout(c)
    assert dims.degrees == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, **degrees}
    assert c.shard_degree == dims.size(group) and c.world == dims.world_size


def test_help_names_the_trainers_flags_first(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--micro-batch BATCH, --batch BATCH" in out and "--grad-accum MICROBATCHES, --microbatches" in out
    assert "--strategy" in out and "--dp-replicate" in out and "--dp-shard" in out
