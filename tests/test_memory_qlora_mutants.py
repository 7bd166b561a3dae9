"""QLoRA's byte model (``coursekit.memory.qlora``) by hand: each projection's (in, out), the adapters' count, the NF4
pieces, every refusal word for word (and the configurations just inside each bound), the units' tensors and one
rank's bytes on a two-layer model small enough to add up here. Shapes and configurations are stand-ins carrying
only the fields the module reads, each width its own number so that a swapped field shows. Where
bench/bench_mutation.py found no test (tests/test_memory_engines_mutants.py has the fsdp2 engine's side). Pure Python,
well under a second."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from coursekit.memory import qlora
from coursekit.memory.errors import ConfigError
from coursekit.memory.presets import preset
from coursekit.memory.qlora import TARGETS
from coursekit.memory.shapes import ModelShape


def shape(**kw):
    """hidden 2, q width 3, kv width 5, ffn 7, vocab 13: each projection's in and out tell which field they came
    from."""
    return SimpleNamespace(**{"arch": "llama", "experts": 0, "layers": 2, "hidden": 2, "q_width": 3, "kv_width": 5,
                              "ffn": 7, "vocab": 13, "head_dim": 17, "qkv_bias": False, "o_bias": False,
                              "mlp_bias": False, "qk_norm": False, "tied_embeddings": False, **kw})


def conf(**kw):
    """What the module reads of a TrainConfig; block and scaler block 1 over 1 rank: every size divides."""
    return SimpleNamespace(**{"tp": 1, "pp": 1, "offload": "none", "offload_params": "none", "fsdp_reshard": True,
                              "lora_targets": TARGETS, "shard_degree": 1, "nf4_block": 1, "nf4_scaler_block": 1,
                              "lora_rank": 1, "dp_rank": None, **kw})


def whole(message):
    return "^" + re.escape(message) + "$"


def test_the_targets_and_tables():
    assert TARGETS == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert qlora.NF4_TABLES == 4 + 16 * 4  # one fp32 mean of the scalers + the 16 fp32 NF4 code values


def test_projections_are_llamas_in_and_out():
    """q: hidden -> q width, k / v: hidden -> kv width, o: q width -> hidden, gate / up: hidden -> ffn, down back."""
    p = qlora.projections(shape())
    assert list(p) == list(TARGETS)
    assert p == {"q_proj": (2, 3), "k_proj": (2, 5), "v_proj": (2, 5), "o_proj": (3, 2), "gate_proj": (2, 7),
                 "up_proj": (2, 7), "down_proj": (7, 2)}


def test_lora_params_r_times_in_plus_out_per_target_per_layer():
    s = shape(layers=3)
    # in + out: q 5, k 7, v 7, o 5, gate 9, up 9, down 9 = 51, times r 2, times 3 layers
    assert qlora.lora_params(s, 2) == 3 * 2 * 51
    assert qlora.lora_params(s, 2, ("k_proj", "down_proj")) == 3 * 2 * (7 + 9)
    assert qlora.lora_params(s, 1, ()) == 0


def test_nf4_pieces_whole_bytes():
    """n/2 data bytes (two 4-bit codes a byte), n/block int8 scalers, 4 bytes per scaler_block scalers: whole
    numbers (floor), as the byte counts they are."""
    assert qlora.nf4_pieces(1024, 8, 4) == (512, 128, 4 * 32)
    pieces = qlora.nf4_pieces(1001, 10, 3)
    assert pieces == (500, 100, 4 * 33) and all(type(x) is int for x in pieces)


@pytest.mark.parametrize("s,c,message", [
    (shape(arch="gpt2"), conf(), "qlora is modelled for Llama-style projections (q_proj, k_proj, v_proj, o_proj, "
                                 "gate_proj, up_proj, down_proj), not gpt2"),
    (shape(experts=4), conf(), "qlora is modelled for dense blocks (one gate/up/down MLP), not 4 experts: an MoE "
                               "layer's experts are other tensors (fused per layer, not nn.Linear)"),
    (shape(), conf(tp=2), "qlora is modelled for FSDP2 / HSDP without tp or pp"),
    (shape(), conf(pp=2), "qlora is modelled for FSDP2 / HSDP without tp or pp"),
    (shape(), conf(offload="cpu"), "qlora with CPU offload is not modelled"),
    (shape(), conf(offload_params="cpu"), "qlora with CPU offload is not modelled"),
    (shape(), conf(fsdp_reshard=2), "qlora with reshard to N ranks: torch 2.13's FSDP2 refuses it (a post-forward "
                                    "reshard needs one all-gather output per parameter; an NF4Tensor gathers three: "
                                    "data, scalers, factors)"),
    (shape(), conf(lora_targets=("q_proj", "c_attn")), "lora targets must be among q_proj, k_proj, v_proj, o_proj, "
                                                       "gate_proj, up_proj, down_proj, got q_proj, c_attn"),
    (shape(), conf(lora_targets=()), "lora targets must be among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                     "down_proj, got -"),
    # hidden 3, q / kv width 2, ffn 5: q, k, v, o have 6 elements, gate is the first odd one, 15 (out x in)
    (shape(hidden=3, q_width=2, kv_width=2, ffn=5), conf(),
     "NF4 packs two 4-bit codes a byte: gate_proj (5x3 = 15 elements) must have an even number of elements "
     "(torchao's NF4Tensor refuses an odd one)"),
    # hidden 2, q / kv width 3: q's 6 elements are not blocks of 4
    (shape(hidden=2, q_width=3, kv_width=3, ffn=3), conf(nf4_block=4),
     "NF4 block sizes must divide q_proj (3x2 = 6 elements): need n % block == 0 and (n / block) % scaler_block "
     "== 0 (block 4, scaler_block 1; coursekit.fsdp.qlora's tiny models use 32 / 8)"),
    # q / kv width 4: q, k, v, o have 8 elements (2 blocks of 4), gate is the first of 6
    (shape(hidden=2, q_width=4, kv_width=4, ffn=3), conf(nf4_block=4),
     "NF4 block sizes must divide gate_proj (3x2 = 6 elements): need n % block == 0 and (n / block) % scaler_block "
     "== 0 (block 4, scaler_block 1; coursekit.fsdp.qlora's tiny models use 32 / 8)"),
    # hidden 2, widths 2, ffn 3: q's 4 elements are 2 blocks (one scaler block of 2); gate's 6 are 3 blocks
    (shape(hidden=2, q_width=2, kv_width=2, ffn=3), conf(nf4_block=2, nf4_scaler_block=2),
     "NF4 block sizes must divide gate_proj (3x2 = 6 elements): need n % block == 0 and (n / block) % scaler_block "
     "== 0 (block 2, scaler_block 2; coursekit.fsdp.qlora's tiny models use 32 / 8)"),
    # 16 elements each, block 1: 8 data bytes, 16 scalers, 16 factors; 16 ranks: only the data does not divide
    (shape(hidden=4, q_width=4, kv_width=4, ffn=4), conf(shard_degree=16),
     "FSDP2 shards each NF4 inner tensor of q_proj evenly over 16 ranks: its 8 data bytes, 16 scalers and 16 factors "
     "must all divide by 16"),
    # block 2, scaler block 2: 8 data bytes, 8 scalers, 4 factors; 8 ranks: only the factors do not divide
    (shape(hidden=4, q_width=4, kv_width=4, ffn=4), conf(shard_degree=8, nf4_block=2, nf4_scaler_block=2),
     "FSDP2 shards each NF4 inner tensor of q_proj evenly over 8 ranks: its 8 data bytes, 8 scalers and 4 factors "
     "must all divide by 8"),
    # hidden 4, q width 4, kv width 2: q's 16 elements split over 4 ranks (8, 8, 4); k's 8 do not (4, 4, 2)
    (shape(hidden=4, q_width=4, kv_width=2, ffn=4), conf(shard_degree=4, nf4_block=2, nf4_scaler_block=2),
     "FSDP2 shards each NF4 inner tensor of k_proj evenly over 4 ranks: its 4 data bytes, 4 scalers and 2 factors "
     "must all divide by 4"),
])
def test_check_refuses_with_the_reason(s, c, message):
    with pytest.raises(ConfigError, match=whole(message)):
        qlora.check(s, c)


@pytest.mark.parametrize("s,c", [
    (shape(), conf()),  # every size divides by block 1 over 1 rank
    (shape(hidden=2, q_width=3, kv_width=3, ffn=3), conf(nf4_block=3)),  # 6 elements each: an odd block is fine
    (shape(), conf(fsdp_reshard=False)),  # reshard after forward or not: both are one gather per parameter
    (shape(), conf(lora_targets=("down_proj",))),
    (shape(hidden=4, q_width=4, kv_width=4, ffn=4), conf(shard_degree=4, nf4_block=2, nf4_scaler_block=2)),
    (shape(hidden=4, q_width=4, kv_width=4, ffn=4), conf(shard_degree=8, nf4_block=1, nf4_scaler_block=2)),
    (preset("tiny-llama"), conf(shard_degree=2, nf4_block=32, nf4_scaler_block=8)),  # the course's own run
])
def test_check_accepts_what_fits(s, c):
    assert qlora.check(s, c) is None


def test_unit_dims_block_by_block_then_the_root():
    """Per block: the seven weights' sizes, lora_A (r, in) and lora_B (out, r) of each target, then the frozen rest:
    each biased projection's (out,) bias, Qwen3's q and k head norms (head_dim each), the two RMSNorms (hidden);
    the root: embedding (vocab, hidden), final norm, the untied head."""
    weights = [2 * 3, 2 * 5, 2 * 5, 3 * 2, 2 * 7, 2 * 7, 7 * 2]
    s = shape(vocab=13, qkv_bias=True, mlp_bias=True, qk_norm=True)
    block = (weights, [(11, 2), (5, 11), (11, 7), (2, 11)],  # k_proj's A, B, down_proj's A, B at r = 11
             [(3, 1), (5, 1), (5, 1), (7, 1), (7, 1), (2, 1), (17, 1), (17, 1), (2, 1), (2, 1)])
    root = ([], [], [(13, 2), (2, 1), (13, 2)])
    got = qlora.unit_dims(s, conf(lora_rank=11, lora_targets=("k_proj", "down_proj")))
    assert got == [block, block, root]
    # one layer, tied head, no biases or head norms: the norms alone; the root without the head
    s = shape(layers=1, tied_embeddings=True)
    assert qlora.unit_dims(s, conf(lora_targets=("q_proj",))) == [
        (weights, [(1, 2), (3, 1)], [(2, 1), (2, 1)]), ([], [], [(13, 2), (2, 1)])]
    # o_proj's bias is its own flag (Qwen2: q/k/v biased, o_proj not)
    assert qlora.unit_dims(shape(layers=1, o_bias=True), conf())[0][2] == [(2, 1), (2, 1), (2, 1)]
    assert qlora.unit_dims(shape(layers=1, qkv_bias=True), conf())[0][2] == [(3, 1), (5, 1), (5, 1), (2, 1), (2, 1)]


def test_frozen_rest_of_real_presets():
    """Qwen3 (tiny-qwen3: head_dim 16) keeps an RMSNorm over each q and k head, frozen and unquantized, beside the two
    block norms of 64 (peft + torchao's model: self_attn.q_norm.weight, k_norm.weight (16,)); a Qwen2 block has
    q / k / v biases and none on o_proj (HF's Qwen2Attention: o_proj bias=False)."""
    frozen = qlora.unit_dims(preset("tiny-qwen3"), conf())[0][2]
    assert sorted(frozen) == [(16, 1), (16, 1), (64, 1), (64, 1)]
    qwen2 = ModelShape(arch="llama", family="qwen2", layers=1, hidden=4, heads=2, kv_heads=1, ffn=8, vocab=10,
                       qkv_bias=True)  # head_dim 2: q width 4, kv width 2
    assert qlora.unit_dims(qwen2, conf())[0][2] == [(4, 1), (2, 1), (2, 1), (4, 1), (4, 1)]
    with pytest.raises(ConfigError, match="not 4 experts"):
        qlora.check(preset("tiny-qwen3-moe"), conf(nf4_block=32, nf4_scaler_block=8))


# Two layers of hidden 2, q / kv width 2, ffn 4, vocab 5, untied, no biases; LoRA r 1 on q_proj and down_proj; NF4
# blocks of 2, scaler blocks of 2; 2 shards; store 4 bytes (fp32 master), compute 2 (bf16), state 8, counter 5.
# NF4 pieces: q, k, v, o have 4 elements -> 2 + 2 + 4·(2 // 2) = 8 bytes each; gate, up, down 8 -> 4 + 4 + 4·2 = 16:
# a block's NF4 is 4·8 + 3·16 = 80, a rank holds 80 / 2 + 68 · 7 weights = 516 per block -> 1032.
# Adapters (dim 0, row): q's A (1, 2), B (2, 1), down's A (1, 4), B (2, 1). Padded rows per rank ceil(d0 / 2):
# 1·2 + 1·1 + 1·4 + 1·1 = 8 elements a block -> 4 bytes · 16 = 64; the gathered ceil(d0 / 2)·2 rows:
# 4 + 2 + 8 + 2 = 16.
# Unpadded local rows (torch.chunk): rank 0 keeps 1 of each dim 0 (2 + 1 + 4 + 1 = 8), rank 1 the second row of each
# B only (0 + 1 + 0 + 1 = 2): 16 and 4 over two blocks. Frozen: two norms of 2 a block (1 + 1 padded rows, 2 + 2
# gathered), the root's embedding (5, 2) -> 3 rows · 2 = 6 (12 gathered), final norm 1 (2), head 6 (12): 4·(2·2 + 13)
# = 68. Gathered: a block 80 + 2·(16 + 4) = 120, the root 2·26 = 52; reduced 4·16 = 64 a block, 0 the root.
# Optimizer: 8 per local adapter element + 5 per adapter tensor (2 targets · 2 tensors · 2 layers = 8).
SMALL = shape(layers=2, hidden=2, q_width=2, kv_width=2, ffn=4, vocab=5)


def small_conf(**kw):
    return conf(**{"lora_rank": 1, "lora_targets": ("q_proj", "down_proj"), "nf4_block": 2, "nf4_scaler_block": 2,
                   "shard_degree": 2, **kw})


def test_breakdown_one_rank_by_hand():
    out = qlora.breakdown(SMALL, small_conf(dp_rank=1), store=4, compute=2, state=8, counter=5)
    assert out == {"nf4_base": 1032, "frozen_rest": 68, "adapters": 64, "adapter_grads": 64,
                   "adapter_optimizer": 8 * 4 + 5 * 8, "adapter_local": 4,
                   "trainable_params": 2 * (1 * (2 + 2) + 1 * (4 + 2)),  # layers · r·(in + out) per target
                   "bf16_base_bytes": 2 * (2 * 40) // 2,  # 2 bytes · 40 weight elements a block · 2 blocks / 2
                   "unit_gather_bytes": [120, 120, 52], "unit_reduce_bytes": [64, 64, 0]}
    # the kinds in the docstring's order, then the counts and the units (the JSON's detail keeps this order)
    assert list(out) == ["nf4_base", "frozen_rest", "adapters", "adapter_grads", "adapter_optimizer", "adapter_local",
                         "trainable_params", "bf16_base_bytes", "unit_gather_bytes", "unit_reduce_bytes"]
    # whole bytes (the JSON prints them as integers)
    assert all(type(v) is int for k, v in out.items() if not k.startswith("unit_"))
    assert all(type(v) is int for v in out["unit_gather_bytes"] + out["unit_reduce_bytes"])


def test_breakdown_rank_0_is_the_default_and_keeps_the_first_rows():
    for c in (small_conf(), small_conf(dp_rank=0)):
        out = qlora.breakdown(SMALL, c, store=4, compute=2, state=8, counter=5)
        assert (out["adapter_local"], out["adapter_optimizer"]) == (16, 8 * 16 + 5 * 8)


def test_breakdown_one_shard_holds_everything():
    """One rank: no padding, the whole NF4 base; store, compute and state each scale their own terms."""
    out = qlora.breakdown(SMALL, small_conf(shard_degree=1), store=3, compute=7, state=11, counter=13)
    # adapters 2 + 2 + 4 + 2 = 10 elements a block, frozen 2 + 2 a block and 10 + 2 + 10 at the root
    assert out["nf4_base"] == 2 * (80 + 68 * 7)
    assert (out["frozen_rest"], out["adapters"], out["adapter_grads"]) == (3 * (2 * 4 + 22), 3 * 20, 3 * 20)
    assert (out["adapter_local"], out["adapter_optimizer"]) == (20, 11 * 20 + 13 * 8)
    assert out["unit_gather_bytes"] == [80 + 7 * 14, 80 + 7 * 14, 7 * 22]
    assert out["unit_reduce_bytes"] == [4 * 10, 4 * 10, 0]
    assert out["bf16_base_bytes"] == 2 * (2 * 40)
