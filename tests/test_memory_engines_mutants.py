"""The calculator's engines (``coursekit.memory.engines``: base, ddp, deepspeed, fsdp2) and the Megatron split, on
hand-built stages: every expected byte count is worked out here from the engine's stated rule (the 16Ψ table of
``coursekit.memory.states``, DDP's replicated buckets, DeepSpeed's bucket and ZeRO-3 rules, FSDP2's Ψ/N and units),
never read from the code. Where bench/bench_mutation.py found no test. Pure Python, well under a second."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from coursekit.memory import engines
from coursekit.memory.engines.base import Engine, state_result, unsharded_units
from coursekit.memory.engines.ddp import DDP
from coursekit.memory.engines.megatron import Stage
from coursekit.memory.errors import ConfigError
from coursekit.memory.train_config import TrainConfig

# one stage of 2 layers x 100 parameters, a 50-parameter embedding, a 30-parameter head, 7 tensors: 280 parameters
STAGE = Stage(index=0, layers=2, first=True, last=True, per_layer=100, embed_params=50, head_params=30, tensors=7,
              in_flight=1)
NOT_EXACT = SimpleNamespace(arch="mixtral")  # FSDP2 pads only Llama / GPT-2 layouts: this one takes the Ψ formula


def cfg(**kw):
    return TrainConfig(batch=1, seq=8, **kw)


def whole(message):
    return "^" + re.escape(message) + "$"


def as_tuple(st):
    return (st.parameters, st.gradients, st.master_weights, st.optimizer_states, st.grad_copy, st.step_grad_copy,
            st.step_temporaries, st.cpu, st.nvme)


# -- base ----------------------------------------------------------------------------------------------------------
def test_state_bytes_defaults_are_16psi_adamw_unsharded_without_counters():
    """Catches a changed default of Engine.state_bytes (precision, optimizer, zero, shard, offload, param_tensors):
    1000 parameters, 16Ψ (2 + 2 + 4 + 2·4 bytes), no step counters (param_tensors 0), nothing offloaded; DDP's foreach
    temporaries are one fp32 master-sized copy (4·1000). FSDP2's default shard is 1: its fp32 shard is 4·1000 / 1."""
    assert as_tuple(DDP().state_bytes(1000)) == (2000, 2000, 4000, 8000, 0, 0, 4000, 0, 0)
    f = engines.get("fsdp2").state_bytes(1000)
    assert (f.parameters, f.gradients, f.master_weights, f.optimizer_states) == (4000, 4000, 0, 8000)


def test_states_passes_every_option_of_the_configuration():
    """Catches Engine.states dropping one of the configuration's options (each then falls back to state_bytes'
    default). DDP, 18Ψ SGD with momentum, 280 parameters on 7 tensors: params 2·280, grads 4·280 (18Ψ: fp32 grads),
    master 4·280, one fp32 state 4·280 and no step counter (SGD keeps none); temporaries 4·280 (the master's size)."""
    st, rank = DDP().states(None, cfg(engine="ddp", precision="18psi", optimizer="sgd"), STAGE)
    assert as_tuple(st) == (560, 1120, 1120, 1120, 0, 0, 1120, 0, 0) and rank == 0
    # AdamW keeps torch's 4-byte step per tensor: 8·280 + 4·7 (dropping param_tensors would leave 2240)
    st, _ = DDP().states(None, cfg(engine="ddp", optimizer="adamw", dtype="fp32"), STAGE)
    assert st.optimizer_states == 8 * 280 + 4 * 7 and st.parameters == 4 * 280 and st.master_weights == 0
    # FSDP2 off its exact layout, 4 shards, CPU offload: the whole shard (4·280/4 params + grads, 8·280/4 + 4·7
    # states) moves to the host and the step runs there; parameter offload moves the same
    for opt in (dict(offload="cpu"), dict(offload_params="cpu")):
        st, _ = engines.get("fsdp2").states(NOT_EXACT, cfg(engine="fsdp2", dp=4, **opt), STAGE)
        assert as_tuple(st) == (0, 0, 0, 0, 0, 0, 0, 280 + 280 + 560 + 28, 0)


def test_states_reports_the_asked_data_parallel_rank_else_zero():
    """Catches a wrong reported rank: dp_rank 1 is rank 1, no dp_rank is rank 0 (DDP's ranks are all alike)."""
    assert DDP().states(None, cfg(engine="ddp", dp=2, dp_rank=1), STAGE)[1] == 1
    assert DDP().states(None, cfg(engine="ddp", dp=2), STAGE)[1] == 0


def test_a_replicating_engine_holds_no_units_no_buckets_and_does_not_shard():
    """Catches a non-zero default: the protocol's defaults are DDP's (nothing unsharded, no buffers, ranks alike)."""
    c = cfg(engine="ddp", dp=2)
    assert DDP().units(c, 2, STAGE) == {"start": 0, "end": 0, "largest": 100}  # largest: a 100-parameter layer
    assert Engine().buckets(c, 2, 280, 100) == (0, 0)
    assert DDP().shards_over_dp(c) is False and DDP().ranks_differ(c) is False


def test_the_same_bytes_on_every_rank_note_only_where_a_rank_was_asked():
    """Catches an inverted condition of Engine.notes: the note is for a dp_rank given to an engine whose ranks hold
    the same bytes (DDP), not without dp_rank, and not for DeepSpeed ZeRO-2's exact layout, whose ranks differ."""
    assert DDP().notes(cfg(engine="ddp", dp=2, dp_rank=1)) == [
        "dp_rank 1: every data-parallel rank is reported alike here (ranks differ only in DeepSpeed ZeRO-1/2's "
        "gradient partition, modelled without TP/PP)"]
    assert DDP().notes(cfg(engine="ddp", dp=2)) == []
    assert not any(n.startswith("dp_rank") for n in engines.get("deepspeed").notes(cfg(zero=2, dp=2, dp_rank=1)))


def test_zero_stages_are_refused_with_the_whole_message():
    with pytest.raises(ConfigError, match=whole("zero stages are DeepSpeed's; engine 'ddp' takes zero 0")):
        DDP().state_bytes(10, zero=1)


@pytest.mark.parametrize("stage,keep_all,start,end", [
    # reshard after forward: the head unit in use (30) and the last layer prefetched (100); ends with the embedding
    (STAGE, False, 2 * (30 + 100), 2 * 50),
    # FSDP2 reshard_after_forward=False: every unit stays gathered, 2 layers + embedding + head
    (STAGE, True, 2 * (2 * 100 + 50 + 30), 2 * 50),
    # a first pipeline stage without the head: the last layer in use and the one before it prefetched
    (Stage(0, 2, True, False, 100, 50, 0, 5, 1), False, 2 * (100 + 100), 2 * 50),
    # a stage of no layers (the embedding and the head only): the head, then the embedding
    (Stage(0, 0, True, True, 100, 50, 30, 2, 1), False, 2 * (30 + 50), 2 * 50),
    # a last stage without the embedding ends in its first layer's unit
    (Stage(1, 2, False, True, 100, 0, 30, 5, 1), False, 2 * (30 + 100), 2 * 100),
])
def test_unsharded_units_by_hand(stage, keep_all, start, end):
    """Catches a wrong unit in ZeRO-3 / FSDP2's start or end of backward (a sum turned into a difference, an `or`
    into an `and`, the layer / embedding choice flipped). P = 2 bytes (bf16)."""
    assert unsharded_units(2, stage, keep_all=keep_all) == {"start": start, "end": end,
                                                            "largest": stage.largest_unit}


def test_state_result_rounds_each_category_to_a_whole_byte():
    """Catches a category passed to the wrong field: distinct values land in their own fields, rounded."""
    st = state_result(dict(param=1.4, grad=2.6, master=3.0, state=4.0, gc=5.0), 6.0, 7.0, 8.0, 9.0, "t")
    assert as_tuple(st) == (1, 3, 3, 4, 5, 6, 7, 8, 9) and st.convention == "t"


# -- ddp -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,message", [
    (dict(offload_params="cpu"), "parameter offload needs ZeRO-3 or FSDP2 (parameters must be sharded)"),
    (dict(offload="cpu"), "DDP has no offload; use DeepSpeed ZeRO or FSDP2"),
])
def test_ddp_refuses_offload_with_the_whole_message(kw, message):
    with pytest.raises(ConfigError, match=whole(message)):
        DDP().state_bytes(10, **kw)


@pytest.mark.parametrize("precision,want", [
    # (param, grad, master, states, fp32 grad copy, step temporaries) x 1000 parameters, AdamW, no counters
    ("16psi", (2000, 2000, 4000, 8000, 0, 4000)),  # temporaries: one fp32 master-sized copy
    ("20psi", (2000, 2000, 4000, 8000, 4000, 4000)),  # Megatron's persistent fp32 gradient copy
    ("fp32", (4000, 4000, 0, 8000, 0, 4000)),  # no master: the temporaries are the fp32 weights' size
])
def test_ddp_replicates_the_psi_table(precision, want):
    """Catches a wrong DDP term: the states table of ``coursekit.memory.states`` times Ψ, on every rank, and no
    step-time fp32 gradient partition (that one is DeepSpeed's)."""
    st = DDP().state_bytes(1000, precision=precision)
    assert (st.parameters, st.gradients, st.master_weights, st.optimizer_states, st.grad_copy,
            st.step_temporaries) == want
    assert st.step_grad_copy == 0 and st.cpu == st.nvme == 0


@pytest.mark.parametrize("kw,want", [
    (dict(dp=2), (2 * 1000, 2 * 1000)),  # a second copy of all bf16 gradients, backward and step
    (dict(dp=2, cp=2), (2 * 1000, 2 * 1000)),  # cp ranks reduce gradients too: 4 ranks
    (dict(dp=1), (0, 0)),  # one rank: no reducer
    (dict(dp=2, ddp_bucket_view=True), (0, 0)),  # bucket views: the gradients themselves
])
def test_ddp_buckets_without_bucket_views_copy_the_gradients(kw, want):
    """Catches a wrong DDP bucket rule: with gradient_as_bucket_view=False the reducer's buckets hold a second copy
    of every gradient (G = 2 bytes in 16Ψ, not the master's 4), nothing on a single rank or with bucket views."""
    c = cfg(engine="ddp", **{"ddp_bucket_view": False, **kw})
    assert DDP().buckets(c, 2, 1000, 100) == want


# -- deepspeed (the Ψ formula, where DeepSpeed's exact layout is not used) ----------------------------------------
DS = engines.get("deepspeed")
STEP_NOTE = "; +4Ψ/N fp32 gradient partition at the optimizer step (DeepSpeed)"


def test_deepspeed_fp32_zero1_clones_an_fp32_master_and_copies_the_gradient_partition():
    """Catches the fp32 rule of the Ψ formula moved or lost: with ZeRO ≥ 1 and fp32 weights DeepSpeed still clones
    an fp32 master partition (4 bytes / N) and flattens an fp32 gradient partition at the step (4 / N). 1000
    parameters over 4 ranks, stage 1: params 4·1000, grads 4·1000, master 4·1000/4, AdamW 8·1000/4, copy 4·1000/4."""
    st = DS.state_bytes(1000, precision="fp32", zero=1, shard=4)
    assert as_tuple(st) == (4000, 4000, 1000, 2000, 0, 1000, 0, 0, 0)
    assert st.convention == "fp32: fp32 params (own master) + grads + optimizer states" + STEP_NOTE
    # stage 0 is plain fp32 AdamW: no master, no copy (fp32 grads are stepped as they are)
    st = DS.state_bytes(1000, precision="fp32", zero=0, shard=4)
    assert as_tuple(st) == (4000, 4000, 0, 8000, 0, 0, 0, 0, 0)
    assert st.convention == "fp32: fp32 params (own master) + grads + optimizer states"


def test_deepspeed_20psi_shards_its_fp32_gradient_copy_with_the_optimizer():
    """Catches a wrong divisor of the persistent fp32 gradient copy (20Ψ's +4Ψ): stage 1 over 4 ranks keeps 4·1000/4;
    no step-time copy, the persistent one is that copy."""
    st = DS.state_bytes(1000, precision="20psi", zero=1, shard=4)
    assert as_tuple(st) == (2000, 2000, 1000, 2000, 1000, 0, 0, 0, 0)


def test_deepspeed_offload_moves_master_states_and_gradient_copy_to_the_host():
    """Catches a term left out of (or left on the GPU by) ZeRO-Offload: 20Ψ, stage 2, 4 ranks, 1000 parameters; the
    host holds master 1000 + AdamW 2000 + the fp32 copy 1000 + the fp32 gradient partition 4·1000/4 = 5000; the GPU
    keeps the bf16 parameters only (stage 2 streams its gradients out), no step copy."""
    st = DS.state_bytes(1000, precision="20psi", zero=2, shard=4, offload="cpu")
    assert as_tuple(st) == (2000, 0, 0, 0, 0, 0, 0, 5000, 0)
    # NVMe: master and states go to files, the gradient partition stays in host memory; parameters to the host too
    st = DS.state_bytes(1000, zero=3, shard=4, offload="nvme", offload_params="cpu")
    assert as_tuple(st) == (0, 0, 0, 0, 0, 0, 0, 1000 + 500, 1000 + 2000)
    # both on the host: params 2·1000/4 join master + states (3000) and the gradient partition (1000)
    st = DS.state_bytes(1000, zero=3, shard=4, offload="cpu", offload_params="cpu")
    assert as_tuple(st) == (0, 0, 0, 0, 0, 0, 0, 3000 + 1000 + 500, 0)
    st = DS.state_bytes(1000, zero=3, shard=4, offload_params="nvme")
    assert (st.parameters, st.cpu, st.nvme, st.master_weights) == (0, 0, 500, 1000)


def test_deepspeed_exact_layout_needs_whole_model_16psi_or_fp32():
    """Catches an `and` turned into `or`: the exact layout needs tp 1 and pp 1 and 16psi / fp32."""
    assert DS.exact(cfg(dp=2)) and DS.exact(cfg(dtype="fp32", dp=2))
    assert not DS.exact(cfg(pp=2)) and not DS.exact(cfg(tp=2)) and not DS.exact(cfg(precision="18psi"))


def test_deepspeed_units_only_under_zero3():
    """Catches the ZeRO-3 unit rule applied to another stage (or lost): head 30 + last layer 100 at the start, the
    embedding's 50 at the end, in bf16 (2 bytes); stages 0-2 gather nothing."""
    assert DS.units(cfg(zero=3, dp=2), 2, STAGE) == {"start": 260, "end": 100, "largest": 100}
    assert DS.units(cfg(zero=2, dp=2), 2, STAGE) == {"start": 0, "end": 0, "largest": 100}


@pytest.mark.parametrize("kw,params,want", [
    (dict(zero=3, dp=1), 280, (2 * 100, 2 * 100)),  # ZeRO-3: the whole reduce bucket, kept, even on one rank
    (dict(zero=0, dp=2), 280, (2 * 100, 0)),  # reduce bucket only: stage 0 has no parameter all-gather
    (dict(zero=1, dp=2), 280, (2 * 100, 2 * 100)),  # + the all-gather of the updated partitions
    (dict(zero=2, dp=2, cp=2), 280, (2 * 100, 2 * 100)),  # cp ranks reduce too (4 ranks)
    (dict(zero=2, dp=2, precision="18psi"), 50, (4 * 50, 2 * 50)),  # a bucket no larger than the stage; fp32 grads
    (dict(zero=2, dp=1), 280, (0, 0)),  # one rank: nothing to reduce
])
def test_deepspeed_buckets_by_hand(kw, params, want):
    """Catches a wrong DeepSpeed bucket rule: buckets of bucket_elems = 100 elements (at most the stage's
    parameters), the reduce bucket in the gradients' dtype, the all-gather one in the parameters' (stages 1-2)."""
    assert DS.buckets(cfg(bucket_elems=100, **kw), 2, params, 100) == want


def test_deepspeed_shards_from_stage_1_and_its_ranks_differ_only_in_exact_stages_1_and_2():
    """Catches a wrong stage in shards_over_dp / ranks_differ: ZeRO-1 already shards; ZeRO-1/2's exact layout gives
    each rank its own gradient partition; ZeRO-3 (every parameter split evenly) and the Ψ formula do not."""
    assert DS.shards_over_dp(cfg(zero=1, dp=2)) and not DS.shards_over_dp(cfg(zero=0, dp=2))
    assert DS.ranks_differ(cfg(zero=1, dp=2)) and DS.ranks_differ(cfg(zero=2, dp=2))
    assert not DS.ranks_differ(cfg(zero=3, dp=2)) and not DS.ranks_differ(cfg(zero=1, dp=2, pp=2))


NVME_NOTE = ("NVMe: swap-file bytes; host memory also holds DeepSpeed's pinned swap buffers (buffer_count x buffer "
             "size in the config), not counted here")
PSI_NOTE = ("model states from the Ψ formula: DeepSpeed's exact layout (padding, per-rank gradient partitions, "
            "offload staging) is modelled without TP/PP and for 16psi / fp32 only")
SUB_GROUP_NOTE = ("ZeRO-3's fp32 gradient partition at the step is charged whole here; DeepSpeed builds it one "
                  "sub-group of 1,000,000,000 elements at a time (less, where a rank holds more)")
RANK_NOTE = ("dp_rank 1: every data-parallel rank is reported alike here (ranks differ only in DeepSpeed ZeRO-1/2's "
             "gradient partition, modelled without TP/PP)")


@pytest.mark.parametrize("kw,want", [
    (dict(zero=3, dp=2, offload="nvme"), [NVME_NOTE]),
    (dict(zero=3, dp=2, offload_params="nvme", dp_rank=1), [NVME_NOTE, RANK_NOTE]),  # the base's note follows
    (dict(zero=3, dp=2, precision="18psi"), [PSI_NOTE, SUB_GROUP_NOTE]),
    (dict(zero=3, dp=2, precision="18psi", offload="cpu"), [PSI_NOTE]),  # offload keeps the whole partition
    (dict(zero=2, dp=2, precision="18psi"), [PSI_NOTE]),
    (dict(zero=2, dp=2), []),
])
def test_deepspeed_notes_whole(kw, want):
    """Catches a note lost, shown in the wrong case or with the wrong words: each is what the estimate leaves out."""
    assert DS.notes(cfg(**kw)) == want


# -- fsdp2 ---------------------------------------------------------------------------------------------------------
# A tiny Llama, worked by hand: h 4, 2 heads (d 2, k = a = 2: q, k, v, o all 4 x 4), f 6, V 10, untied, no biases.
# HF's tensors in model.parameters() order, as (dim 0, row size): embed (10, 4); per layer q, k, v, o (4, 4) x 4,
# gate, up (6, 4) x 2, down (4, 6), two norms (4, 1) x 2; final norm (4, 1); head (10, 4). 2 layers: 21 tensors.
from coursekit.memory.engines.fsdp2 import FSDP2, param_dims, unit_sizes  # noqa: E402
from coursekit.memory.shapes import ModelShape  # noqa: E402

TINY = ModelShape(layers=2, hidden=4, heads=2, vocab=10, ffn=6)
# The same over N = 4 shards, ceil(d0 / 4) rows per rank: embed 3 x 4 = 12; a layer's q, k, v, o 1 x 4 = 4 each,
# gate, up 2 x 4 = 8 each, down 1 x 6 = 6, norms 1 each: 40; final norm 1; head 12 -> 12 + 2·40 + 1 + 12 = 105.
# Rank 3 keeps min(ceil(d0/4), d0 - 3·ceil(d0/4)) rows: embed 1 row (4), q/k/v/o 1 (16), gate/up 0, down 1 (6),
# norms 1 (2) -> per layer 24; final norm 1; head 4 -> 4 + 2·24 + 1 + 4 = 57 (rank 2 keeps all its 105).
PADDED, LOCAL3 = 105, 57
# all-gather outputs (ceil(d0/4)·4 rows): a block 4 x (16 + 16) + (8·4) x 2 + 4·6 + 4 + 4 = 160; root: embed 12·4 =
# 48, final norm 4, head 48 -> 100 (4 ranks x 105 = 2·160 + 100)
BLOCK, ROOT = 160, 100


def fsdp2_cfg(**kw):
    return cfg(engine="fsdp2", **{"dp": 4, **kw})


def test_fsdp2_exact_layout_pads_every_tensor_on_dim_0():
    """Catches a wrong padding or local-row rule in FSDP2's exact layout (16Ψ: fp32 shards, 4 bytes): every rank
    allocates the padded 105 elements of parameters and of gradients; AdamW's two states are zeros_like the local
    rows (8·57 on rank 3) plus one fp32 step per tensor (4·21); the foreach temporaries are one local shard."""
    e = FSDP2()
    st, rank = e.states(TINY, fsdp2_cfg(dp_rank=3), None)
    assert rank == 3
    assert as_tuple(st) == (4 * PADDED, 4 * PADDED, 0, 8 * LOCAL3 + 4 * 21, 0, 0, 4 * LOCAL3, 0, 0)
    assert st.convention == ("16Ψ: 16-bit params + grads, fp32 master + optimizer states (FSDP2: sharded fp32 params "
                             "are the master copy); FSDP2's exact layout on shard rank 3 of 4 (dim-0 padding)")
    st, rank = e.states(TINY, fsdp2_cfg(), None)  # no dp_rank: rank 0, which keeps all its padded rows
    assert rank == 0 and st.optimizer_states == 8 * PADDED + 4 * 21
    # 20Ψ's persistent fp32 gradient copy is zeros_like the local rows too; SGD keeps one state and no step
    st, _ = e.states(TINY, fsdp2_cfg(dp_rank=3, precision="20psi", optimizer="sgd"), None)
    assert (st.grad_copy, st.optimizer_states) == (4 * LOCAL3, 4 * LOCAL3)


@pytest.mark.parametrize("opt", [dict(offload="cpu"), dict(offload_params="cpu")])
def test_fsdp2_exact_layout_offloads_the_whole_shard(opt):
    """Catches offload applied only when both targets are set, or a byte left on the GPU: CPUOffloadPolicy moves
    parameters, gradients and states (4·105 + 4·105 + 8·57 + 4·21 on rank 3) and the step runs on the CPU."""
    st, _ = FSDP2().states(TINY, fsdp2_cfg(dp_rank=3, **opt), None)
    assert as_tuple(st) == (0, 0, 0, 0, 0, 0, 0, 4 * PADDED * 2 + 8 * LOCAL3 + 4 * 21, 0)


@pytest.mark.parametrize("reshard,start", [
    (True, ROOT + BLOCK),  # the root (kept from forward) and the last block at the start of backward
    (False, ROOT + 2 * BLOCK),  # every unit stays gathered
    (2, ROOT + BLOCK + BLOCK // 2),  # the last block gathered, the first still holding its 1/2 post-forward slice
])
def test_fsdp2_exact_units_follow_reshard_after_forward(reshard, start):
    """Catches a wrong unit sum in FSDP2's exact units: blocks of 160 elements and a root of 100 (bf16 compute,
    P = 2 bytes); backward ends holding the root; the largest unit is a block, in elements."""
    e, c = FSDP2(), fsdp2_cfg(fsdp_reshard=reshard)
    e.states(TINY, c, None)  # states first, as the calculator asks: it keeps the padded units for this config
    units = e.units(c, 2, STAGE)
    assert units == {"start": 2 * start, "end": 2 * ROOT, "largest": BLOCK}
    assert all(type(v) is int for v in units.values())  # whole bytes, not floats that equal them
    assert e.buckets(c, 2, 280, BLOCK) == ((2 + 4) * BLOCK, 0)  # bf16 all-gather + fp32 reduce-scatter input


def test_fsdp2_units_of_another_configuration_are_not_reused():
    """Catches the padded units kept for one configuration being read for another (or never kept): a config the
    engine has not laid out gets the Ψ formula's units: head 30 + last layer 100 in use, the embedding's 50 last."""
    assert FSDP2().units(fsdp2_cfg(), 2, STAGE)["start"] == 2 * 130  # an engine that laid nothing out yet
    e = FSDP2()
    e.states(TINY, fsdp2_cfg(), None)
    other = fsdp2_cfg()
    assert e.units(other, 2, STAGE) == {"start": 2 * 130, "end": 2 * 50, "largest": 100}
    # fsdp_reshard False keeps every unit: 2 layers + embedding + head
    assert e.units(fsdp2_cfg(fsdp_reshard=False), 2, STAGE)["start"] == 2 * 280


@pytest.mark.parametrize("kw,want", [
    (dict(dp=2), (2 + 4) * 100),  # the largest unit gathered in bf16 and its gradients reduced in fp32
    (dict(dp=2, cp=2), (2 + 4) * 100),  # cp ranks shard too
    (dict(dp=2, dtype="fp32"), (4 + 4) * 100),  # fp32: no cast, both in fp32
    (dict(dp=1), 0),  # one rank: no collectives
])
def test_fsdp2_buckets_by_hand(kw, want):
    """Catches a wrong FSDP2 buffer: the all-gather output and the reduce-scatter input of the largest unit."""
    assert FSDP2().buckets(cfg(engine="fsdp2", **kw), 4 if kw.get("dtype") == "fp32" else 2, 280, 100) == (want, 0)


@pytest.mark.parametrize("reshard,held,group", [(True, ROOT, 4), (False, ROOT + 2 * BLOCK, 0),
                                                (2, ROOT + 2 * (BLOCK // 2), 2)])
def test_fsdp2_detail_between_forward_and_backward(reshard, held, group):
    """Catches a wrong post-forward breakdown: gathered bytes per unit (18Ψ: bf16 compute, 2 bytes — not its fp32
    grads' 4), what stays after forward (the root; plus every block, or each block's 1/2 slice) and the group
    backward all-gathers over (all 4 shards; none when nothing was resharded; the 2 of reshard-to-2)."""
    d = FSDP2().detail(TINY, fsdp2_cfg(precision="18psi", fsdp_reshard=reshard))
    assert d == {"fsdp_units": {"gathered_bytes": [2 * BLOCK, 2 * BLOCK, 2 * ROOT], "reshard_after_forward": reshard,
                                "held_after_forward_bytes": 2 * held, "backward_all_gather_group": group}}
    assert type(d["fsdp_units"]["held_after_forward_bytes"]) is int
    assert FSDP2().detail(TINY, fsdp2_cfg(tp=2)) == {}  # no exact layout under TP: no breakdown


def test_fsdp2_psi_formula_by_hand():
    """Catches a wrong term of FSDP2's Ψ/N formula: 20Ψ, 1000 parameters on 5 tensors over 4 shards; fp32 shards
    of params and grads 4·1000/4, AdamW 8·1000/4 + 4·5 steps, the fp32 grad copy 4·1000/4, temporaries one shard."""
    st = FSDP2().state_bytes(1000, precision="20psi", shard=4, param_tensors=5)
    assert as_tuple(st) == (1000, 1000, 0, 2020, 1000, 0, 1000, 0, 0)
    assert st.convention == ("20Ψ: 16-bit params + grads, persistent fp32 grad copy, fp32 master + optimizer states "
                             "(FSDP2: sharded fp32 params are the master copy)")
    st = FSDP2().state_bytes(1000, precision="20psi", shard=4, param_tensors=5, offload="cpu")
    assert as_tuple(st) == (0, 0, 0, 0, 0, 0, 0, 1000 + 1000 + 2020 + 1000, 0)
    st = FSDP2().state_bytes(1000, precision="fp32", shard=4)
    assert st.convention == "fp32: fp32 params (own master) + grads + optimizer states"  # no master note


def test_fsdp2_refuses_nvme_with_the_whole_message():
    for kw in (dict(offload="nvme"), dict(offload_params="nvme")):
        with pytest.raises(ConfigError, match=whole("FSDP2 offloads to the CPU only (CPUOffloadPolicy); NVMe offload "
                                                    "is DeepSpeed's")):
            FSDP2().state_bytes(10, **kw)


GPT2 = ModelShape(arch="gpt2", layers=2, hidden=4, heads=2, vocab=10, max_positions=8)  # f 16, tied, biases


def test_fsdp2_exact_layout_only_without_tp_pp_ep_for_llama_and_gpt2():
    """Catches an `and` of FSDP2.exact turned into `or`, or GPT-2 dropped from the exact layouts."""
    assert FSDP2().exact(TINY, fsdp2_cfg()) and FSDP2().exact(GPT2, fsdp2_cfg())
    for kw in (dict(tp=2), dict(pp=2), dict(ep=2)):
        assert not FSDP2().exact(TINY, fsdp2_cfg(**kw))
    assert not FSDP2().exact(NOT_EXACT, fsdp2_cfg())
    assert FSDP2().ranks_differ(fsdp2_cfg()) and not FSDP2().ranks_differ(fsdp2_cfg(tp=2))
    assert not FSDP2().ranks_differ(fsdp2_cfg(pp=2))


@pytest.mark.parametrize("shape,shard,wrap,want", [
    (TINY, 4, "block", [BLOCK, BLOCK, ROOT]),
    (TINY.with_(layers=3), 4, "pair", [2 * BLOCK, BLOCK, ROOT]),  # blocks 0-1 together, block 2 alone
    (TINY, 4, "root", [2 * BLOCK + ROOT]),  # one unit: everything
    # GPT-2 over 3 shards (ceil(d0/3)·3 rows): per block ln_1 6 + 6, c_attn (4, 12) 72 + bias 12, c_proj (4, 4) 24
    # + 6, ln_2 6 + 6, c_fc (4, 16) 96 + 18, c_proj (16, 4) 72 + 6 = 330; root wte 12·4, wpe 9·4, ln_f 6 + 6 = 96
    (GPT2, 3, "block", [330, 330, 96]),
    # GPT-2 with rotary positions has no wpe: the root is wte and ln_f, 48 + 12
    (GPT2.with_(positions="rope"), 3, "block", [330, 330, 60]),
    # a tied Llama: no head in the root, embed 48 + final norm 4
    (TINY.with_(tied_embeddings=True), 4, "block", [BLOCK, BLOCK, 52]),
    # one layer: the tensors per layer are all but the first, the final norm(s) and the head, with nothing to round
    (GPT2.with_(layers=1), 3, "block", [330, 96]),
    (TINY.with_(layers=1), 4, "block", [BLOCK, ROOT]),
])
def test_unit_sizes_by_hand(shape, shard, wrap, want):
    """Catches a wrong cut of the tensor list into units (first tensors, tensors per layer, final norm, head) or a
    wrong padding (each tensor's all-gather output is ceil(d0/N)·N rows)."""
    assert unit_sizes(shape, shard=shard, wrap=wrap) == want


def test_param_dims_with_and_without_biases_by_hand():
    """Catches a bias tensor added or lost: a Llama with attention and MLP biases (o_proj's too) and a GPT-2
    without any, one layer each, written out tensor by tensor."""
    llama = ModelShape(layers=1, hidden=4, heads=2, vocab=10, ffn=6, qkv_bias=True, mlp_bias=True)
    assert param_dims(llama) == [(10, 4), (4, 4), (4, 1), (4, 4), (4, 1), (4, 4), (4, 1), (4, 4), (4, 1),
                                 (6, 4), (6, 1), (6, 4), (6, 1), (4, 6), (4, 1), (4, 1), (4, 1), (4, 1), (10, 4)]
    gpt2 = GPT2.with_(layers=1, qkv_bias=False, mlp_bias=False)
    assert param_dims(gpt2) == [(10, 4), (8, 4), (4, 1), (4, 1), (4, 12), (4, 4), (4, 1), (4, 1), (4, 16), (16, 4),
                                (4, 1), (4, 1)]


# QLoRA on a 1-layer Llama (h 4, 2 heads, f 8, V 10), LoRA r 1 on q_proj and down_proj, NF4 blocks of 4 with scaler
# blocks of 2, over 2 shards. NF4 pieces of an n-element weight: n/2 data + n/4 scalers + 4·(n/4/2) factor bytes:
# q, k, v, o (16 elements) 8 + 4 + 8 = 20 each, gate, up, down (32) 16 + 8 + 16 = 40 each -> 200 per block; a rank
# holds 200 / 2 + 68 (the fp32 mean and the 16-entry code book) x 7 weights = 576. Adapters (dim 0, row): q's lora_A
# (1, 4), lora_B (4, 1), down's (1, 8), (4, 1): padded ceil(d0/2) rows 4 + 2 + 8 + 2 = 16 elements, rank 1 keeps
# 0 + 2 + 0 + 2 = 4 of them. Frozen rest in fp32 (store 4): the block's two norms 2 + 2, the root's embed (10, 4) ->
# 20, final norm 2, head 20 -> 4·(4 + 42) = 184. Gathered (bf16, 2 bytes; ceil(d0/2)·2 rows): the block's NF4 200 +
# 2·(adapters 8 + 4 + 16 + 4 + norms 8) = 280, the root 2·(40 + 4 + 40) = 168; reduced in fp32: 4·32 = 128 and 0.
QSHAPE = ModelShape(layers=1, hidden=4, heads=2, vocab=10, ffn=8)


def qlora_cfg(**kw):
    return cfg(engine="fsdp2", qlora=True, lora_rank=1, lora_targets=("q_proj", "down_proj"), nf4_block=4,
               nf4_scaler_block=2, **{"dp": 2, **kw})


def test_fsdp2_qlora_states_by_kind_by_hand():
    """Catches a wrong QLoRA term on shard rank 1: parameters = NF4 576 + frozen 184 + adapters 4·16; gradients
    the adapters' 64; AdamW 8 bytes x 4 local adapter elements + a 4-byte step x 4 adapter tensors; temporaries one
    local adapter shard (4·4); 20Ψ adds its fp32 gradient copy of the adapters (4 bytes per adapter element)."""
    st, rank = FSDP2().states(QSHAPE, qlora_cfg(dp_rank=1), None)
    assert rank == 1 and as_tuple(st) == (576 + 184 + 64, 64, 0, 8 * 4 + 4 * 4, 0, 0, 4 * 4, 0, 0)
    assert st.convention == ("QLoRA: NF4 base (block 4, scaler block 2) + LoRA r=1 on 2 projections, FSDP2 shard "
                             "rank 1 of 2")
    st, rank = FSDP2().states(QSHAPE, qlora_cfg(), None)  # rank 0 keeps all 16 adapter rows' elements
    assert rank == 0 and st.convention.endswith("FSDP2 shard rank 0 of 2") and st.optimizer_states == 8 * 16 + 16
    st, _ = FSDP2().states(QSHAPE, qlora_cfg(precision="20psi"), None)
    assert st.grad_copy == 4 * 16


def test_fsdp2_qlora_units_buckets_and_detail_by_hand():
    """Catches the QLoRA units or buffers read from the wrong place: backward starts with the root (168) and the
    block (280) gathered and ends with the root; the largest unit is already in bytes; the buffers are the largest
    gather output plus the largest reduce input (280 + 128), on more than one rank (cp ranks count)."""
    e, c = FSDP2(), qlora_cfg()
    e.states(QSHAPE, c, None)
    assert e.units(c, 2, STAGE) == {"start": 168 + 280, "end": 168, "largest": 280}
    assert e.buckets(c, 2, 280, 280) == (280 + 128, 0)
    e, c = FSDP2(), qlora_cfg(dp=1, cp=2)
    e.states(QSHAPE, c, None)
    assert e.buckets(c, 2, 280, 280) == (280 + 128, 0)
    e, c = FSDP2(), qlora_cfg(dp=1)
    e.states(QSHAPE, c, None)
    assert e.buckets(c, 2, 280, 280) == (0, 0)
    d = FSDP2().detail(QSHAPE, qlora_cfg(dp_rank=1))
    assert d == {"qlora": {"nf4_base": 576, "frozen_rest": 184, "adapters": 64, "adapter_grads": 64,
                           "adapter_optimizer": 8 * 4 + 4 * 4, "adapter_local": 4,
                           "trainable_params": 1 * (4 + 4) + 1 * (8 + 4),  # r·(in + out) per adapted projection
                           "bf16_base_bytes": 2 * (4 * 16 + 3 * 32) // 2,
                           "unit_gather_bytes": [280, 168], "unit_reduce_bytes": [128, 0]},
                 "fsdp_units": {"gathered_bytes": [280, 168], "reshard_after_forward": True,
                                "held_after_forward_bytes": 168, "backward_all_gather_group": 2}}
    assert FSDP2().notes(qlora_cfg()) == [
        "qlora: saved activations are the base model's; LoRA's own (each adapter's input and x·Aᵀ) and the NF4 "
        "dequantization temporaries of each matmul are not modelled"]
    assert FSDP2().notes(fsdp2_cfg()) == []
