"""RunSpec's two newest fields, recompute_layers (Megatron's block method: the first N blocks of each stage under
full recompute) and sp_style (torch's plan or Megatron's sequence-parallel linears), through each tool's path:
their checks with whole messages, the trainer's arguments written by hand and read back by the trainer's own
parser, the calculator's keywords. Where bench/bench_mutation.py found no test. Pure Python."""
from __future__ import annotations

import re

import pytest

from coursekit import options
from coursekit.memory.errors import ConfigError
from coursekit.spec.runspec import RunSpec

BASE = ["--model", "tiny-llama", "--strategy", "ddp"]


@pytest.mark.parametrize("kw,message", [
    (dict(sp_style="nemo"), "unknown sp_style 'nemo'; choose one of: torch, megatron"),
    (dict(recompute="full", recompute_layers=0), "recompute_layers must be > 0, got 0"),
    (dict(recompute="selective", recompute_layers=2), "recompute_layers 2 needs recompute full (it picks which "
                                                      "blocks full recompute covers), got recompute 'selective'"),
])
def test_the_new_fields_are_refused_with_their_whole_message(kw, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        RunSpec(**kw)


def test_both_sp_styles_and_recompute_layers_under_full_recompute_are_accepted():
    assert [RunSpec(sp_style=s).sp_style for s in ("torch", "megatron")] == ["torch", "megatron"]
    assert RunSpec(recompute="full", recompute_layers=3).recompute_layers == 3


def test_the_trainer_reads_recompute_layers_and_megatrons_sp_back():
    spec = RunSpec(recompute="full", recompute_layers=2, degrees={"tp": 2}, sp=True, sp_style="megatron")
    argv = BASE + ["--tp", "2", "--seq", "64", "--recompute", "full", "--recompute-layers", "2", "--sp",
                   "--sp-style", "megatron"]
    assert spec.trainer_argv() == argv
    assert RunSpec.from_options(options.parse(argv)) == spec
    # torch's plan is the trainer's default: --sp alone; read back as unsaid (None), which the trainer runs as torch
    torch_sp = RunSpec(degrees={"tp": 2}, sp=True, sp_style="torch")
    assert torch_sp.trainer_argv() == BASE + ["--tp", "2", "--seq", "64", "--sp"]
    assert RunSpec.from_options(options.parse(torch_sp.trainer_argv())).sp_style is None


def test_the_calculator_gets_the_new_fields_only_where_they_apply():
    kw = RunSpec(recompute="full", recompute_layers=2, degrees={"tp": 2}, sp=True, sp_style="megatron").calculator()
    assert (kw["recompute_layers"], kw["sp"], kw["sp_style"]) == (2, True, "megatron")
    # tp 1: no sequence parallelism at all, so no style; unsaid style: the calculator's own choice (no keyword)
    one = RunSpec(sp=True, sp_style="megatron").calculator()
    assert one["sp"] is False and "sp_style" not in one and "recompute_layers" not in one
    assert "sp_style" not in RunSpec(degrees={"tp": 2}, sp=True).calculator()
