"""``coursekit.plan.layout``: a layout's checks and their messages, its short name, ``--layout`` parsing and the
round trip to the run description (``RunSpec``), as the module's docstrings state them. Pure Python; written
against the mutation survivors of bench/bench_mutation.py plan.layout."""
from __future__ import annotations

import pytest

from coursekit.plan.layout import Layout, parse_layout
from coursekit.spec.runspec import RunSpec


# -- the checks, word for word ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    (dict(tp=0), "layout tp must be a positive integer, got 0"),
    (dict(tp=True), "layout tp must be a positive integer, got True"),  # a bool is not a count
    (dict(micro_batch="2"), "layout micro_batch must be a positive integer, got '2'"),
    (dict(recompute="half"), "layout recompute must be one of none, selective, full, op, got 'half'"),
    (dict(engine="fsdp1"), "layout engine must be one of ddp, deepspeed, fsdp2, got 'fsdp1'"),
    (dict(zero=5, engine="deepspeed"), "layout zero must be 0-3, got 5"),
    (dict(zero=1), "zero=1 is a DeepSpeed stage: set engine=deepspeed"),
    (dict(dp_shard=2), "dp_shard 2 needs engine=fsdp2 (FSDP2 / HSDP); DDP and ZeRO use dp_replicate"),
    (dict(dp_replicate=3, cp=2, ep=4), "layout ep 4 does not divide the dp x cp = 6 ranks it borrows"),
    (dict(dp_replicate=2, ep=2, engine="deepspeed", zero=1),
     "layout ep > 1 runs with DDP, FSDP2 or HSDP (as the trainer does), not DeepSpeed"),
    (dict(virtual_stages=2), "virtual_stages > 1 is the interleaved 1F1B schedule: needs pp > 1 and pp_schedule=1f1b"),
    (dict(pp=2, virtual_stages=2, pp_schedule="gpipe"),
     "virtual_stages > 1 is the interleaved 1F1B schedule: needs pp > 1 and pp_schedule=1f1b"),
    (dict(recompute="full", recompute_layers=0),
     "layout recompute_layers must be a count >= 1 with recompute=full, got 0 with recompute=full"),
    (dict(recompute="full", recompute_layers=True),
     "layout recompute_layers must be a count >= 1 with recompute=full, got True with recompute=full"),
    (dict(recompute="none", recompute_layers=2),
     "layout recompute_layers must be a count >= 1 with recompute=full, got 2 with recompute=none"),
    (dict(sp_style="nemo"), "layout sp_style must be torch or megatron (or empty), got 'nemo'"),
    (dict(grad_reduce_dtype="fp8"), "layout grad_reduce_dtype must be one of fp32, bf16, got 'fp8'"),
])
def test_each_check_refuses_with_its_message(kw, message):
    """Catches each condition weakened (`or` -> `and`, > 1 -> > 2, 'deepspeed' misspelt) and each message emptied,
    re-cased or its list joined otherwise (the lists: spec.run.RECOMPUTE, the registry's engines, GRAD_DTYPES)."""
    with pytest.raises(ValueError) as e:
        Layout(**kw)
    assert str(e.value) == message


def test_the_edges_each_check_accepts():
    """dp_shard 1 with DDP, ep 1 with DeepSpeed, virtual_stages 1 without pp are no-ops; DeepSpeed's ZeRO-0 is a
    stage."""
    Layout(dp_shard=1, engine="ddp")
    Layout(dp_replicate=2, engine="deepspeed", zero=0)
    Layout(virtual_stages=1, pp_schedule="gpipe")
    Layout(pp=2, virtual_stages=2, recompute="full", recompute_layers=1)


# -- short(): the one-line name the planner prints --------------------------------------------------------------------
def test_the_short_name_lists_what_differs_from_the_defaults():
    """strategy (hsdp with its replicas x shards) and dp, the degrees above 1 in the registry's order (tp, pp, cp,
    ep), v for virtual stages, the CP kernel, mb, rc-<policy>[N], no-sp (tp > 1 only), overlap:..., grad-<dtype>,
    joined by spaces. Catches each condition inverted or shifted by one, each piece dropped or misspelt."""
    assert Layout().short() == "ddp dp1 mb1"
    full = Layout(dp_replicate=2, dp_shard=2, engine="fsdp2", tp=2, pp=2, cp=2, ep=2, virtual_stages=2, micro_batch=2,
                  recompute="full", recompute_layers=1, sp=False, grad_reduce_dtype="bf16", cp_impl="ulysses")
    assert full.short() == "hsdp(2x2) dp4 tp2 pp2 cp2 ep2 v2 ulysses mb2 rc-full1 no-sp grad-bf16"
    assert Layout(dp_shard=4, engine="fsdp2", recompute="selective", sp=False).short() == "fsdp2 dp4 mb1 rc-selective"
    assert Layout(tp=2, dp_replicate=2, overlap="tp").short() == "ddp dp2 tp2 mb1 overlap:tp"
    assert Layout(tp=3, pp=3, cp=3, dp_replicate=3, virtual_stages=3).short() == "ddp dp3 tp3 pp3 cp3 v3 ring mb1"


# -- parse_layout: --layout k=v,... -----------------------------------------------------------------------------------
def test_parse_layout_types_values_and_fills_the_engine():
    """Integers typed, zero may be 0 (the rest >= 1), sp read as a flag (1 / true / yes / on, any case), other values
    kept as text; a value may hold '=' (only the first splits); zero > 0 implies DeepSpeed and dp_shard > 1 FSDP2,
    unless an engine is given. Catches: the bounds shifted, the flag words misspelt or upper-cased, the value lost,
    the engine filled when it should not be (or, and) or left out."""
    assert parse_layout("zero=0") == {"zero": 0}
    assert parse_layout("tp=1") == {"tp": 1}
    assert parse_layout("overlap=a=b") == {"overlap": "a=b"}
    assert parse_layout("recompute=full") == {"recompute": "full"}
    for word in ("1", "TRUE", "true", "Yes", "on", "ON"):
        assert parse_layout(f"sp={word}") == {"sp": True}, word
    assert parse_layout("sp=no") == {"sp": False}
    assert parse_layout("tp=2") == {"tp": 2}
    assert parse_layout("zero=1,engine=ddp") == {"zero": 1, "engine": "ddp"}  # given: kept (Layout refuses it)
    assert parse_layout("zero=2") == {"zero": 2, "engine": "deepspeed"}
    assert parse_layout("dp_shard=2") == {"dp_shard": 2, "engine": "fsdp2"}
    assert parse_layout("dp_shard=2,engine=ddp") == {"dp_shard": 2, "engine": "ddp"}
    assert parse_layout("dp_replicate=2") == {"dp_replicate": 2}


def test_parse_layout_takes_the_trainers_names_and_strategies():
    """grad_accum / pp_virtual are microbatches / virtual_stages (equal values given twice are one); strategy=NAME
    is the engine and ZeRO stage of its registry entry. Catches the alias test inverted (`and` -> `or`, not in,
    ==), its value lost, 'strategy' left out of the known keys or not handled."""
    assert parse_layout("grad_accum=4") == {"microbatches": 4}
    assert parse_layout("grad_accum=4,microbatches=4,pp_virtual=2") == {"microbatches": 4, "virtual_stages": 2}
    assert parse_layout("strategy=zero3") == {"engine": "deepspeed", "zero": 3}
    assert parse_layout("strategy=fsdp2,dp_shard=4") == {"engine": "fsdp2", "dp_shard": 4}
    assert parse_layout("strategy=ddp") == {"engine": "ddp"}
    assert parse_layout("strategy=deepspeed,zero=2") == {"engine": "deepspeed", "zero": 2}
    assert parse_layout("strategy=hsdp,dp_replicate=2,dp_shard=2") == {"engine": "fsdp2", "dp_replicate": 2,
                                                                       "dp_shard": 2}


@pytest.mark.parametrize("text, message", [
    ("tp", "--layout item 'tp' is not key=value"),
    ("tp=two", "--layout tp must be an integer, got 'two'"),
    ("tp=0", "--layout tp must be >= 1, got 0"),
    ("zero=-1", "--layout zero must be >= 0, got -1"),
    ("grad_accum=4,microbatches=8", "--layout grad_accum=4 and microbatches=8 disagree; give one"),
    ("strategy=nope", "--layout strategy 'nope' is unknown; choose one of single, ddp, zero0, zero1, zero2, zero3, "
                      "deepspeed, fsdp2, hsdp, fsdp1"),
    ("strategy=fsdp1", "--layout strategy 'fsdp1' is not modelled: FSDP1 flattens each unit's parameters into one "
                       "padded FlatParameter, a layout the calculator does not model; use --strategy fsdp2 "
                       "(per-parameter sharding)"),
    ("strategy=deepspeed", "--layout strategy 'deepspeed' takes its ZeRO stage from its config: give zero=K"),
    ("strategy=zero3,zero=2", "--layout strategy=zero3 is zero 3, not 2; give one of them"),
    ("strategy=zero1,engine=fsdp2", "--layout strategy=zero1 is engine deepspeed, not fsdp2; give one of them"),
    ("strategy=hsdp,dp_shard=4",
     "--layout strategy=hsdp needs dp_replicate > 1 and dp_shard > 1 (replicas of shard groups)"),
    ("strategy=hsdp,dp_replicate=2", "--layout strategy=hsdp needs dp_replicate > 1 and dp_shard > 1 (replicas of "
                                     "shard groups)"),
])
def test_parse_layout_refusals_word_for_word(text, message):
    """Catches each message emptied or changed, the registry's names joined otherwise."""
    with pytest.raises(ValueError) as e:
        parse_layout(text)
    assert str(e.value) == message


def test_an_unknown_key_lists_the_known_ones_sorted():
    with pytest.raises(ValueError) as e:
        parse_layout("tensor=2")
    assert str(e.value).startswith("unknown --layout key 'tensor'; known: cp, cp_impl, dp_replicate, dp_shard, "
                                   "engine, ep, grad_accum, grad_reduce_dtype, micro_batch, microbatches, overlap, pp, ")


# -- the run description both ways -----------------------------------------------------------------------------------
def test_a_layout_is_the_run_description_of_its_strategy_degrees_and_schedule():
    """spec(): the strategy the (engine, zero, replicas x shards) name, the degrees above 1, interleaved 1F1B with
    pp_virtual for virtual stages, grad_accum for microbatches, sp only with tp > 1, the sp_style only when given,
    extra fields passed through. Catches each field dropped, None'd or swapped."""
    s = Layout(dp_replicate=2, dp_shard=2, engine="fsdp2", tp=2, pp=2, virtual_stages=2, microbatches=4,
               micro_batch=2, recompute="full", recompute_layers=1, sp_style="megatron").spec(seq=128)
    assert (s.strategy, s.dp_replicate, s.dp_shard, s.degrees) == ("hsdp", 2, 2, {"tp": 2, "pp": 2})
    assert (s.micro_batch, s.recompute, s.recompute_layers, s.cp_impl) == (2, "full", 1, "ring")
    assert (s.sp, s.sp_style, s.pp_schedule, s.pp_virtual, s.grad_accum, s.seq) == (True, "megatron",
                                                                                   "interleaved-1f1b", 2, 4, 128)
    z = Layout(dp_replicate=4, engine="deepspeed", zero=2, pp=2, pp_schedule="gpipe", cp=2,
               cp_impl="ulysses").spec()
    assert (z.strategy, z.dp_replicate, z.dp_shard, z.degrees) == ("zero2", 4, 1, {"pp": 2, "cp": 2})
    assert (z.pp_schedule, z.pp_virtual, z.grad_accum, z.cp_impl, z.sp, z.sp_style) == ("gpipe", None, 1, "ulysses",
                                                                                       False, None)
    assert Layout(sp=True).spec().sp is False  # tp 1: nothing to split
    assert Layout(dp_shard=8, engine="fsdp2").dims().size("fsdp") == 8


def test_a_run_description_is_the_layout_its_strategy_and_mesh_name():
    """from_spec(): engine and ZeRO stage from the strategy's registry entry (zero for 'deepspeed' from the spec), the
    degrees the mesh fills, ep, the micro-batch, recompute, sp, the CP kernel, the schedule (1f1b when pp is 1).
    Catches each field dropped, None'd or taken from elsewhere, and the refusals' messages."""
    L = Layout.from_spec(RunSpec(strategy="hsdp", dp_replicate=2, dp_shard=2, degrees={"tp": 2, "pp": 2, "cp": 2},
                                 micro_batch=3, recompute="selective", sp=True, cp_impl="ulysses",
                                 pp_schedule="1f1b"))
    assert L == Layout(dp_replicate=2, dp_shard=2, engine="fsdp2", tp=2, pp=2, cp=2, micro_batch=3,
                       recompute="selective", sp=True, cp_impl="ulysses", pp_schedule="1f1b")
    z = Layout.from_spec(RunSpec(strategy="zero3", dp_replicate=4, micro_batch=2, pp_schedule="gpipe"))
    assert z == Layout(dp_replicate=4, engine="deepspeed", zero=3, micro_batch=2, sp=False)  # pp 1: 1f1b
    d = Layout.from_spec(RunSpec(strategy="deepspeed", zero=1, dp_replicate=2, micro_batch=1))
    assert (d.engine, d.zero, d.dp_replicate) == ("deepspeed", 1, 2)
    e = Layout.from_spec(RunSpec(strategy="fsdp2", dp_shard=4, degrees={"ep": 2}, micro_batch=1))
    assert (e.engine, e.dp_shard, e.ep) == ("fsdp2", 4, 2)
    g = Layout.from_spec(RunSpec(strategy="ddp", dp_replicate=2, degrees={"pp": 2}, micro_batch=1,
                                 pp_schedule="gpipe"))
    assert (g.pp, g.pp_schedule, g.zero) == (2, "gpipe", 0)
    with pytest.raises(ValueError) as err:
        Layout.from_spec(RunSpec(strategy="fsdp1", dp_shard=2))
    assert str(err.value).startswith("no planner layout for strategy 'fsdp1': FSDP1 flattens")
    with pytest.raises(ValueError) as err:
        Layout.from_spec(RunSpec(strategy="deepspeed", dp_replicate=2))
    assert str(err.value) == ("strategy 'deepspeed' takes its ZeRO stage from its DeepSpeed config: give zero")


def test_to_dict_is_every_field():
    """The 19 fields of the dataclass (6 degrees, micro_batch, recompute, recompute_layers, zero, engine, pp_schedule,
    microbatches, virtual_stages, cp_impl, sp, sp_style, overlap, grad_reduce_dtype), what --json prints."""
    d = Layout(tp=2, dp_replicate=2).to_dict()
    assert d["tp"] == 2 and d["dp_replicate"] == 2 and d["engine"] == "ddp" and len(d) == 19
