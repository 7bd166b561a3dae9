"""TrainConfig's checks (``coursekit.memory.train_config``), each refusal with its whole message, and what it
fills in (dp from world, microbatches from pp, fsdp_reshard as torch reads it, lora targets from a string). Where
bench/bench_mutation.py found no test. Pure Python, well under a second."""
from __future__ import annotations

import re

import pytest

from coursekit.memory.errors import ConfigError
from coursekit.memory.train_config import TrainConfig


def make(**kw):
    return TrainConfig(**{"batch": 1, "seq": 8, **kw})


def whole(message):
    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize("kw,message", [
    (dict(batch=0), "batch must be > 0, got 0"),
    (dict(seq=0), "seq must be > 0, got 0"),
    (dict(precision="fp32", dtype="bf16"), "precision fp32 keeps fp32 weights; use dtype fp32 (or a 16/18/20psi "
     "precision); fp32 weights with bf16 compute (torch autocast) are modelled for engine fsdp2 or ddp"),
    (dict(recompute="full", recompute_layers=0), "recompute_layers must be > 0, got 0"),
    (dict(recompute="selective", recompute_layers=2),
     "recompute_layers needs recompute full, got recompute 'selective'"),
    (dict(dropout=1.0), "dropout must be in [0, 1), got 1.0"),
    (dict(dropout=-0.1), "dropout must be in [0, 1), got -0.1"),
    (dict(dropout="0.1"), "dropout must be in [0, 1), got '0.1'"),
    (dict(tp=0), "tp must be > 0, got 0"), (dict(pp=0), "pp must be > 0, got 0"),
    (dict(cp=0), "cp must be > 0, got 0"), (dict(ep=0), "ep must be > 0, got 0"),
    (dict(pp=2, pp_virtual=0), "pp_virtual must be > 0, got 0"),
    (dict(pp=2, pp_virtual=2), "pp_schedule gpipe keeps one stage per rank (pp_virtual 1, not 2); interleaved-1f1b "
     "or looped-bfs keep several"),
    (dict(pp=2, pp_schedule="1f1b", pp_virtual=3), "pp_schedule 1f1b keeps one stage per rank (pp_virtual 1, not "
     "3); interleaved-1f1b or looped-bfs keep several"),
    (dict(pp=2, pp_schedule="interleaved-1f1b", pp_virtual=1), "pp_schedule interleaved-1f1b keeps several stages "
     "per rank: pp_virtual >= 2 (with one, use 1f1b or gpipe)"),
    (dict(pp=2, pp_schedule="zbv", pp_virtual=3), "pp_schedule zbv keeps exactly two stages per rank in a V "
     "(pp_virtual 2, not 3)"),
    (dict(zero=4), "zero stage must be 0, 1, 2 or 3, got 4"),
    (dict(zero=True), "zero stage must be 0, 1, 2 or 3, got True"),
    (dict(world=0), "world must be > 0, got 0"),
    (dict(world=6, tp=4), "world (6) is not divisible by tp·pp·cp = 4·1·1 = 4"),
    (dict(world=8, dp=3, tp=2), "dp·tp·pp·cp = 3·2 != world (8)"),
    (dict(world=8, dp=0, tp=2), "dp must be > 0, got 0"),
    (dict(dp=0), "dp must be > 0, got 0"),
    (dict(hsdp_shard=0, engine="fsdp2"), "hsdp_shard must be > 0, got 0"),
    (dict(hsdp_shard=2, dp=4), "hsdp_shard is an FSDP2 (HSDP) option; set engine fsdp2"),
    (dict(hsdp_shard=3, dp=4, engine="fsdp2"), "dp (4) is not divisible by the HSDP shard group (3)"),
    (dict(zero=1, engine="fsdp2"), "zero stages are DeepSpeed's; engine 'fsdp2' needs zero 0"),
    (dict(microbatches=0), "microbatches must be > 0, got 0"),
    (dict(seq=9, cp=2), "seq (9) is not divisible by cp (2)"),
    (dict(ep=3, dp=2, engine="fsdp2"), "ep (3) does not divide the dp·cp = 2 ranks it borrows"),
    (dict(ep=2, dp=2), "ep is modelled with engines ddp and fsdp2 (as the trainer runs it), not deepspeed"),
    (dict(sp=True, tp=2, seq=9), "sequence parallelism needs seq/cp (9) divisible by tp (2)"),
    (dict(sp=True, tp=4, cp=2, seq=6), "sequence parallelism needs seq/cp (3) divisible by tp (4)"),
    (dict(dp_rank=-1, dp=2), "dp_rank must be >= 0, got -1"),
    (dict(dp_rank=2, dp=2), "dp_rank (2) must be below the sharding degree (2)"),
    (dict(dp_rank=2, dp=4, engine="fsdp2", hsdp_shard=2), "dp_rank (2) must be below the sharding degree (2)"),
    (dict(runtime_bytes=-1), "runtime_bytes must be >= 0, got -1"),
    (dict(bucket_elems=0), "bucket_elems must be > 0, got 0"),
    (dict(sub_group_size=0), "sub_group_size must be > 0, got 0"),
    (dict(fsdp_reshard=0, engine="fsdp2"), "fsdp_reshard must be > 0, got 0"),
    (dict(fsdp_reshard=2, dp=4), "fsdp_reshard N (reshard to a smaller group) is FSDP2's; set engine fsdp2"),
    (dict(fsdp_reshard=3, dp=4, engine="fsdp2"), "fsdp_reshard 3 must divide the 4 sharding ranks"),
    (dict(qlora=True, engine="fsdp2", lora_rank=0), "lora_rank must be > 0, got 0"),
    (dict(qlora=True, engine="fsdp2", nf4_block=0), "nf4_block must be > 0, got 0"),
    (dict(qlora=True, engine="fsdp2", nf4_scaler_block=0), "nf4_scaler_block must be > 0, got 0"),
    (dict(lora_rank=16), "lora_rank, lora_targets and the nf4 block sizes are QLoRA's: set qlora"),
    (dict(nf4_scaler_block=128), "lora_rank, lora_targets and the nf4 block sizes are QLoRA's: set qlora"),
    (dict(lora_targets="q_proj"), "lora_rank, lora_targets and the nf4 block sizes are QLoRA's: set qlora"),
    (dict(qlora=True), "qlora is modelled for engine fsdp2 (FSDP2 shards NF4 data and scalers); set engine fsdp2 "
     "(strategy fsdp2 or hsdp)"),
])
def test_each_refusal_with_its_whole_message(kw, message):
    """Catches a check lost, loosened, or its message reworded (or emptied)."""
    with pytest.raises(ConfigError, match=whole(message)):
        make(**kw)


@pytest.mark.parametrize("field,value", [
    ("dtype", "fp8"), ("precision", "8psi"), ("optimizer", "adafactor"), ("attention", "flash"), ("impl", "te"),
    ("kernels", "tpu"), ("recompute", "half"), ("sp_style", "nemo"), ("engine", "horovod"),
    ("pp_schedule", "chimera"), ("pp_runtime", "deepspeed"), ("cp_impl", "star"), ("position_ids", "none"),
    ("offload", "disk"), ("offload_params", "disk"),
])
def test_each_choice_names_its_field(field, value):
    """Catches a choice not checked, or checked under another name (the message names the field and the value)."""
    with pytest.raises(ConfigError, match="^" + re.escape(f"unknown {field} {value!r}; choose one of: ")):
        make(**{field: value})


def test_what_the_configuration_fills_in():
    """Catches a wrong default or derived field: the precision from the dtype (fp32 -> fp32, 16-bit -> 16psi); dp
    from world / (tp·pp·cp), world from dp; microbatches = pp unless given; the sharding degree (the HSDP group or
    dp, times cp); fsdp_reshard N read as torch reads it (N = shard degree: True, 1: False); lora targets from a
    comma list; the limits themselves accepted."""
    assert make(dtype="fp32").precision == "fp32" and make(dtype="fp16").precision == "16psi"
    assert make().precision == "16psi"
    c = make(world=8, tp=2)
    assert (c.dp, c.world) == (4, 8)
    assert make(dp=3, tp=2, cp=2, seq=8).world == 12 and make().dp == 1 and make().world == 1
    assert make(world=8, dp=4, tp=2).dp == 4
    assert make(pp=2).microbatches == 2 and make(pp=2, microbatches=3).microbatches == 3 and make().microbatches == 1
    assert make(engine="fsdp2", dp=4, hsdp_shard=2, cp=2).shard_degree == 4 and make(dp=4, cp=2).shard_degree == 8
    assert make(engine="fsdp2", dp=4, hsdp_shard=2, dp_rank=1).dp_rank == 1
    assert [make(engine="fsdp2", dp=4, fsdp_reshard=n).fsdp_reshard for n in (4, 1, 2)] == [True, False, 2]
    assert make(engine="fsdp2", qlora=True, lora_targets="q_proj, v_proj").lora_targets == ("q_proj", "v_proj")
    assert make(engine="fsdp2", qlora=True, lora_targets=["k_proj"]).lora_targets == ("k_proj",)
    assert make(recompute="full", recompute_layers=2.0).recompute_layers == 2
    assert make(pp=2, pp_schedule="gpipe", pp_virtual=1).pp_virtual == 1
    assert make(pp=2, pp_schedule="interleaved-1f1b", pp_virtual=3).pp_virtual == 3
    assert make(pp=2, pp_schedule="zbv", pp_virtual=2).pp_virtual == 2
    assert make(runtime_bytes=0).runtime_bytes == 0 and make(dp=2, dp_rank=0).dp_rank == 0
    assert make(dropout=0).dropout == 0 and make(dropout=0.5).dropout == 0.5
    assert make(sp=True, tp=2, seq=8).sp and make(sp=True, seq=9).sp  # sp with tp 1: nothing to divide
    assert make(ep=2, dp=2, engine="ddp").ep == 2 and make(precision="fp32", dtype="bf16", engine="ddp")
    d = make().to_dict()
    assert d["batch"] == 1 and d["engine"] == "deepspeed" and d["bucket_elems"] == 500_000_000
    assert d["sub_group_size"] == 1_000_000_000 and d["runtime_bytes"] == 1 << 30 and len(d) == 43  # its 43 fields


def test_whole_number_fields_are_stored_as_ints():
    """Catches a checked value stored under another name (the field then keeps the float it was given): every
    whole-number field given as a float is kept as the int positive_int returns."""
    ints = dict(batch=2.0, seq=8.0, tp=2.0, pp=2.0, cp=2.0, ep=2.0, dp=4.0, microbatches=3.0, dp_rank=1.0,
                runtime_bytes=5.0, bucket_elems=7.0, sub_group_size=9.0, hsdp_shard=2.0)
    c = make(engine="fsdp2", **ints)
    for k in ints:
        assert type(getattr(c, k)) is int and getattr(c, k) == ints[k], k
    c = make(world=8.0)
    assert type(c.world) is int and c.world == 8
    c = make(pp=2, pp_schedule="interleaved-1f1b", pp_virtual=3.0, recompute="full", recompute_layers=2.0)
    assert type(c.pp_virtual) is int and type(c.recompute_layers) is int
    c = make(engine="fsdp2", qlora=True, lora_rank=4.0, nf4_block=32.0, nf4_scaler_block=8.0, dp=4,
             fsdp_reshard=2.0)
    assert all(type(getattr(c, k)) is int for k in ("lora_rank", "nf4_block", "nf4_scaler_block", "fsdp_reshard"))


def test_autocast_is_refused_before_an_unknown_engine_is():
    """Catches a default of True for an engine the registry does not know: fp32 weights with bf16 compute are
    refused first, naming the engines that model autocast."""
    with pytest.raises(ConfigError, match=whole("precision fp32 keeps fp32 weights; use dtype fp32 (or a 16/18/20psi "
                                                "precision); fp32 weights with bf16 compute (torch autocast) are "
                                                "modelled for engine fsdp2 or ddp")):
        make(precision="fp32", dtype="bf16", engine="horovod")
