"""Model shapes (``coursekit.memory.shapes``) worked out by hand: the defaults of each family, every refusal word for
word, the parameter terms of small llama / qwen3 / gpt2 / mixtral / qwen3_moe shapes and what follows from them
(totals, tensors in ``parameters()`` order, a TP / EP rank's share), and HF config.json reading with each key's
default. The meta-device comparisons with transformers are tests/test_memory_presets.py; these are pure Python,
well under a second."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from coursekit.memory import shapes
from coursekit.memory.errors import ConfigError
from coursekit.memory.shapes import ModelShape, ParamTerm, from_hf_config


@pytest.fixture(autouse=True)
def _uncached():
    """The derived counts are cached per shape: a value computed before (another test, mutmut's first run) would
    not be computed again."""
    for f in (shapes._num_params, shapes._local_tensors, shapes._expert_layer, shapes._param_numels,
              shapes._local_params):
        f.cache_clear()


# h 12, 4 heads of 5 (head_dim given: not 12 / 4), 1 K/V head, FFN 20, vocab 50, 3 layers: q and o 12·20 = 240,
# k and v 12·5 = 60 each, gate / up / down 12·20 = 240, RMSNorm 12
LL = ModelShape(layers=3, hidden=12, heads=4, kv_heads=1, head_dim=5, ffn=20, vocab=50)
# GPT-2: h 12, 4 heads (d 3), FFN 4·12 = 48, 16 positions, tied; LayerNorm 2·12
G2 = ModelShape(arch="gpt2", layers=2, hidden=12, heads=4, vocab=50, max_positions=16)
QW3 = ModelShape(layers=2, hidden=12, heads=4, kv_heads=1, head_dim=5, ffn=20, vocab=50, family="qwen3",
                 qkv_bias=True, mlp_bias=True)
MIX = ModelShape(layers=2, hidden=12, heads=4, kv_heads=1, head_dim=5, ffn=20, vocab=50, family="mixtral",
                 experts=4, top_k=2)
QMOE = ModelShape(layers=2, hidden=12, heads=4, kv_heads=1, head_dim=5, ffn=20, vocab=50, family="qwen3_moe",
                  experts=4, top_k=3, expert_ffn=7)


def shape(**kw):
    return ModelShape(**{"layers": 2, "hidden": 12, "heads": 4, "vocab": 50, "ffn": 20, **kw})


# ---- defaults --------------------------------------------------------------------------------------------------
def test_llama_defaults():
    s = shape()
    assert (s.arch, s.family, s.kv_heads, s.head_dim, s.norm, s.mlp, s.positions, s.activation) == (
        "llama", "llama", 4, 3, "rmsnorm", "swiglu", "rope", "silu")
    assert (s.tied_embeddings, s.qkv_bias, s.mlp_bias, s.o_bias, s.qk_norm) == (False,) * 5
    assert (s.experts, s.top_k, s.is_moe, s.moe_ffn, s.norm_topk) == (0, 0, False, 20, None)
    assert (s.max_positions, s.norm_eps, s.rope_theta, s.aux_loss_coef, s.name) == (2048, 1e-5, 10000.0, 0.001,
                                                                                    "custom")
    assert (s.q_width, s.kv_width) == (12, 12)
    assert shape(kv_heads=2, head_dim=5).kv_width == 10 and shape(kv_heads=2, head_dim=5).q_width == 20


def test_gpt2_defaults():
    s = ModelShape(arch="gpt2", layers=2, hidden=12, heads=4, vocab=50)
    assert (s.family, s.ffn, s.head_dim, s.norm, s.mlp, s.positions, s.activation) == (
        "gpt2", 48, 3, "layernorm", "gelu", "learned", "gelu_new")
    assert (s.tied_embeddings, s.qkv_bias, s.mlp_bias, s.o_bias, s.qk_norm) == (True, True, True, True, False)


def test_given_values_win_over_the_defaults():
    s = shape(kv_heads=2, head_dim=7, tied_embeddings=1, norm="layernorm", mlp="gelu", positions="learned",
              activation="relu", qkv_bias=1, mlp_bias=1, o_bias=0, qk_norm=1, max_positions=64)
    assert (s.kv_heads, s.head_dim, s.norm, s.mlp, s.positions, s.activation, s.max_positions) == (
        2, 7, "layernorm", "gelu", "learned", "relu", 64)
    for field in ("tied_embeddings", "qkv_bias", "mlp_bias", "o_bias", "qk_norm"):  # stored as bools
        assert getattr(s, field) is not None and type(getattr(s, field)) is bool
    assert (s.tied_embeddings, s.qkv_bias, s.mlp_bias, s.o_bias, s.qk_norm) == (True, True, True, False, True)
    g = ModelShape(arch="gpt2", layers=2, hidden=12, heads=4, vocab=50, ffn=30, tied_embeddings=0, qkv_bias=0,
                   mlp_bias=0, norm="rmsnorm")
    assert (g.ffn, g.tied_embeddings, g.qkv_bias, g.mlp_bias, g.o_bias, g.norm) == (30, False, False, False, False,
                                                                                    "rmsnorm")
    assert shape(layers=2.0).layers == 2 and type(shape(layers=2.0).layers) is int  # positive_int's int


def test_family_defaults():
    assert shape(qkv_bias=True).o_bias is True  # llama's attention_bias covers o_proj
    q2 = shape(family="qwen2", qkv_bias=True)
    assert (q2.arch, q2.qkv_bias, q2.o_bias, q2.qk_norm) == ("llama", True, False, False)
    assert shape(family="qwen3").qk_norm is True
    assert shape(family="qwen3", qk_norm=False).qk_norm is False
    assert shape(family="mistral").qk_norm is False
    assert QMOE.qk_norm is True and MIX.qk_norm is False


def test_moe_fields():
    assert (MIX.experts, MIX.top_k, MIX.moe_ffn, MIX.norm_topk, MIX.is_moe) == (4, 2, 20, True, True)
    assert (QMOE.experts, QMOE.top_k, QMOE.moe_ffn, QMOE.norm_topk) == (4, 3, 7, False)
    assert shape(family="mixtral", experts=4).top_k == 2  # num_experts_per_tok's default
    assert shape(family="mixtral", experts=4, norm_topk=False).norm_topk is True  # mixtral always renormalises
    assert shape(family="qwen3_moe", experts=4, norm_topk=1).norm_topk is True
    assert shape(family="qwen3_moe", experts=4, top_k=4).top_k == 4  # all experts: allowed
    assert shape(family="qwen3_moe", experts=4, aux_loss_coef=0).aux_loss_coef == 0
    assert shape(family="qwen3_moe", experts=4.0).experts == 4 and type(shape(family="qwen3_moe",
                                                                              experts=4.0).experts) is int
    whole = shape(family="qwen3_moe", experts=4, expert_ffn=7.0)  # stored as the int it is, as every size
    assert type(whole.expert_ffn) is int and type(whole.moe_ffn) is int and type(whole.num_params()) is int
    assert shape(experts=0).is_moe is False


def test_with_and_to_dict():
    assert LL.with_(layers=5).layers == 5 and LL.with_(layers=5).hidden == 12 and LL.layers == 3
    d = LL.to_dict()
    assert d["layers"] == 3 and d["head_dim"] == 5 and d["family"] == "llama" and len(d) == 31
    assert ModelShape(**d) == LL


# ---- refusals ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,message", [
    (dict(arch="bert"), "unknown arch 'bert'; choose one of: llama, gpt2"),
    (dict(family="t5"), "unknown family 't5'; choose one of: llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, gpt2"),
    (dict(family="gpt2"), "family gpt2 is a gpt2-style model, not llama"),
    (dict(arch="gpt2", family="qwen3"), "family qwen3 is a llama-style model, not gpt2"),
    (dict(layers=0), "layers must be > 0, got 0"),
    (dict(hidden=-12), "hidden must be > 0, got -12"),
    (dict(heads=0), "heads must be > 0, got 0"),
    (dict(vocab=0), "vocab must be > 0, got 0"),
    (dict(max_positions=0), "max_positions must be > 0, got 0"),
    (dict(kv_heads=0), "kv_heads must be > 0, got 0"),
    (dict(ffn=None), "ffn (intermediate_size) is required for a llama-style model"),
    (dict(ffn=0), "ffn must be > 0, got 0"),
    (dict(heads=5), "hidden (12) is not divisible by heads (5); give head_dim"),
    (dict(head_dim=-1), "head_dim must be > 0, got -1"),
    (dict(head_dim=0), "head_dim must be > 0, got 0"),  # not taken as "derive it from hidden / heads"
    (dict(heads=5, head_dim=0), "head_dim must be > 0, got 0"),
    (dict(kv_heads=3), "heads (4) must be a multiple of kv_heads (3)"),
    (dict(norm="batchnorm"), "unknown norm 'batchnorm'; choose one of: rmsnorm, layernorm"),
    (dict(mlp="relu"), "unknown mlp 'relu'; choose one of: swiglu, gelu"),
    (dict(positions="alibi"), "unknown positions 'alibi'; choose one of: rope, learned"),
    (dict(attn_dropout=1.0), "attn_dropout must be in [0, 1), got 1.0"),
    (dict(resid_dropout=-0.1), "resid_dropout must be in [0, 1), got -0.1"),
    (dict(embd_dropout="0.1"), "embd_dropout must be in [0, 1), got '0.1'"),
    (dict(family="qwen2"), "qwen2 has a bias on q, k and v and none on o_proj"),
    (dict(family="qwen2", qkv_bias=True, o_bias=True), "qwen2 has a bias on q, k and v and none on o_proj"),
    (dict(experts=4), "experts=4 needs a mixture-of-experts family (mixtral, qwen3_moe), not llama"),
    (dict(family="qwen3", experts=2), "experts=2 needs a mixture-of-experts family (mixtral, qwen3_moe), not qwen3"),
    (dict(family="mixtral"), "experts must be > 0, got 0"),
    (dict(family="mixtral", experts=4, top_k=0), "top_k must be > 0, got 0"),
    (dict(family="qwen3_moe", experts=4, top_k=5), "top_k 5 is more than the 4 experts"),
    (dict(family="qwen3_moe", experts=4, expert_ffn=0), "expert_ffn must be > 0, got 0"),
    (dict(family="qwen3_moe", experts=4, aux_loss_coef=-0.5), "aux_loss_coef must be a finite number >= 0, got -0.5"),
    (dict(family="qwen3_moe", experts=4, aux_loss_coef=math.inf),
     "aux_loss_coef must be a finite number >= 0, got inf"),
    (dict(family="qwen3_moe", experts=4, aux_loss_coef="0.1"),
     "aux_loss_coef must be a finite number >= 0, got '0.1'"),
])
def test_refusals_word_for_word(kw, message):
    with pytest.raises(ConfigError) as e:
        shape(**kw)
    assert str(e.value) == message


def test_the_edges_that_are_allowed():
    assert shape(attn_dropout=0.0, resid_dropout=0.999, embd_dropout=0).attn_dropout == 0.0
    assert shape(heads=5, head_dim=3).head_dim == 3  # head_dim given: hidden need not divide
    assert shape(kv_heads=1).kv_heads == 1 and shape(kv_heads=4).kv_heads == 4
    assert shape(family="qwen2", qkv_bias=True, o_bias=False).o_bias is False
    assert shape(family="mixtral", experts=1, top_k=1).top_k == 1
    assert shape(family="qwen3_moe", experts=4, expert_ffn=1).moe_ffn == 1


# ---- parameter terms ---------------------------------------------------------------------------------------------
def T(name, count, per_layer, tp, stage, tensors=1, expert=False):
    return ParamTerm(name, count, per_layer, tp, stage, tensors, expert)


def test_llama_terms():
    assert LL.param_terms() == [
        T("embedding", 600, False, "shard", "first"),  # V·h
        T("attn_norm", 12, True, "replicate", "layer"),
        T("q_proj", 240, True, "shard", "layer"),
        T("kv_proj", 120, True, "kv", "layer", 2),  # 2·h·k·d = 2·12·5
        T("o_proj", 240, True, "shard", "layer"),
        T("mlp_norm", 12, True, "replicate", "layer"),
        T("mlp_in_proj", 480, True, "shard", "layer", 2),  # gate and up: 2·h·f
        T("mlp_out_proj", 240, True, "shard", "layer"),
        T("final_norm", 12, False, "replicate", "last"),
        T("lm_head", 600, False, "shard", "last")]
    # per layer 12 + 240 + 120 + 240 + 12 + 480 + 240 = 1,344; in all 600 + 3·1,344 + 12 + 600 = 5,244
    assert LL.param_table() == {"embedding": 600, "attn_norm": 36, "q_proj": 720, "kv_proj": 360, "o_proj": 720,
                                "mlp_norm": 36, "mlp_in_proj": 1440, "mlp_out_proj": 720, "final_norm": 12,
                                "lm_head": 600}
    assert LL.num_params() == 5244 and LL.params_per_layer() == 1344
    assert LL.num_active_params() == 5244 and LL.expert_params() == 0 and LL.expert_params_per_layer() == 0
    assert LL.num_param_tensors() == 1 + 3 * 9 + 2 and LL.local_tensors() == (9, 1, 2)


def test_qwen3_terms_with_every_bias_and_the_qk_norm():
    assert QW3.param_terms() == [
        T("embedding", 600, False, "shard", "first"),
        T("attn_norm", 12, True, "replicate", "layer"),
        T("q_proj", 240, True, "shard", "layer"),
        T("kv_proj", 120, True, "kv", "layer", 2),
        T("qkv_bias", 20, True, "shard", "layer"),  # q's bias a·d
        T("kv_bias", 10, True, "kv", "layer", 2),  # 2·k·d
        T("o_proj", 240, True, "shard", "layer"),
        T("o_bias", 12, True, "replicate", "layer"),
        T("qk_norm", 10, True, "replicate", "layer", 2),  # 2·d
        T("mlp_norm", 12, True, "replicate", "layer"),
        T("mlp_in_proj", 480, True, "shard", "layer", 2),
        T("mlp_in_bias", 40, True, "shard", "layer", 2),  # 2·f
        T("mlp_out_proj", 240, True, "shard", "layer"),
        T("mlp_out_bias", 12, True, "replicate", "layer"),
        T("final_norm", 12, False, "replicate", "last"),
        T("lm_head", 600, False, "shard", "last")]
    # q (+b), k (+b), v (+b), o (+b), q_norm, k_norm, gate (+b), up (+b), down (+b), two norms
    layer = (240, 20, 60, 5, 60, 5, 240, 12, 5, 5, 240, 20, 240, 20, 240, 12, 12, 12)
    assert QW3.param_numels() == (600,) + layer * 2 + (12, 600)
    assert QW3.local_tensors() == (18, 1, 2) and QW3.num_param_tensors() == 1 + 2 * 18 + 2


def test_gpt2_terms():
    assert G2.param_terms() == [
        T("embedding", 600, False, "shard", "first"),
        T("position_embedding", 192, False, "replicate", "first"),  # 16 positions · 12
        T("attn_norm", 24, True, "replicate", "layer", 2),  # LayerNorm: weight and bias
        T("q_proj", 144, True, "shard", "layer"),
        T("kv_proj", 288, True, "kv", "layer", 0),  # inside c_attn: no tensor of its own
        T("qkv_bias", 12, True, "shard", "layer"),
        T("kv_bias", 24, True, "kv", "layer", 0),
        T("o_proj", 144, True, "shard", "layer"),
        T("o_bias", 12, True, "replicate", "layer"),
        T("mlp_norm", 24, True, "replicate", "layer", 2),
        T("mlp_in_proj", 576, True, "shard", "layer"),  # c_fc 12·48
        T("mlp_in_bias", 48, True, "shard", "layer"),
        T("mlp_out_proj", 576, True, "shard", "layer"),
        T("mlp_out_bias", 12, True, "replicate", "layer"),
        T("final_norm", 24, False, "replicate", "last", 2)]  # tied: no lm_head
    # 12h² + 13h = 1,884 per layer; 600 + 192 + 2·1,884 + 24 = 4,584
    assert G2.params_per_layer() == 1884 and G2.num_params() == 4584
    # wte, wpe; ln_1 (w, b), c_attn (12·36, 36), c_proj (144, 12), ln_2, c_fc (576, 48), c_proj (576, 12); ln_f
    layer = (12, 12, 432, 36, 144, 12, 12, 12, 576, 48, 576, 12)
    assert G2.param_numels() == (600, 192) + layer * 2 + (12, 12)
    assert G2.local_tensors() == (12, 2, 2) and G2.num_param_tensors() == 28
    # the same with a SwiGLU MLP: c_fc twice; untied: the head is last
    assert G2.with_(mlp="swiglu").param_numels()[2:14 + 4] == (12, 12, 432, 36, 144, 12, 12, 12, 576, 48, 576, 48,
                                                              576, 12, 12, 12)
    assert G2.with_(tied_embeddings=False).param_numels()[-3:] == (12, 12, 600)


def test_a_llama_with_a_gelu_mlp_and_learned_positions():
    s = shape(mlp="gelu", positions="learned", max_positions=8, norm="layernorm", tied_embeddings=True)
    # h 12, 4 heads of 3, FFN 20: q, k, v, o 144 each; fc, proj 240; LayerNorm 24
    assert s.param_numels() == (600, 96) + (144, 144, 144, 144, 240, 240, 12, 12, 12, 12) * 2 + (12, 12)
    assert [t.name for t in s.param_terms()][:2] == ["embedding", "position_embedding"]
    assert s.param_table()["mlp_in_proj"] == 2 * 240 and s.param_terms()[-1] == T("final_norm", 24, False,
                                                                                  "replicate", "last", 2)


def test_mixtral_terms_and_active_params():
    assert MIX.param_terms()[5:9] == [
        T("mlp_norm", 12, True, "replicate", "layer"),
        T("router", 48, True, "replicate", "layer"),  # E·h
        T("experts_in_proj", 1920, True, "replicate", "layer", expert=True),  # E·2f·h = 4·40·12
        T("experts_out_proj", 960, True, "replicate", "layer", expert=True)]  # E·f·h
    assert [t.name for t in MIX.param_terms()] == ["embedding", "attn_norm", "q_proj", "kv_proj", "o_proj",
                                                   "mlp_norm", "router", "experts_in_proj", "experts_out_proj",
                                                   "final_norm", "lm_head"]
    # per layer 12 + 240 + 120 + 240 + 12 + 48 + 1920 + 960 = 3,552; in all 600 + 2·3,552 + 612 = 8,316
    assert MIX.num_params() == 8316
    assert MIX.expert_params_per_layer() == 2880 and MIX.expert_params() == 5760
    active = MIX.num_active_params()  # experts: 2 of 4 -> 5,760 · 2 / 4 = 2,880
    assert active == 8316 - 5760 + 2880 and type(active) is int
    # mixtral builds the router (block.gate) before the experts
    assert MIX.param_numels() == (600,) + (240, 60, 60, 240, 48, 1920, 960, 12, 12) * 2 + (12, 600)


def test_qwen3_moe_terms_and_active_params():
    # expert_ffn 7: experts_in 4·14·12 = 672, experts_out 4·7·12 = 336; the experts before the router; q/k norms
    assert QMOE.param_numels() == (600,) + (240, 60, 60, 240, 5, 5, 672, 336, 48, 12, 12) * 2 + (12, 600)
    # experts 2·1,008 = 2,016, active 3 of 4: (1,344 · 3 // 4) + (672 · 3 // 4) = 1,008 + 504
    assert QMOE.expert_params() == 2016
    assert QMOE.num_active_params() == QMOE.num_params() - 2016 + 1008 + 504
    assert QMOE.num_params() == 600 + 2 * (12 + 240 + 120 + 240 + 10 + 12 + 48 + 672 + 336) + 612


def test_a_tp_rank_holds_its_share():
    # tp 2: shard terms halved (q 120, o 120, gate/up 240, down 120, vocab 300); one K/V head over 2 ranks:
    # replicated (120 each); norms whole
    assert LL.local_params(2) == (12 + 120 + 120 + 120 + 12 + 240 + 120, 300, 12 + 300, 0)
    # tp 7: rounded up (240 / 7 -> 35, 480 / 7 -> 69, 600 / 7 -> 86)
    assert LL.local_params(7) == (12 + 35 + 120 + 35 + 12 + 69 + 35, 86, 12 + 86, 0)
    assert LL.local_params() == (1344, 600, 612, 0)
    # gpt2, tp 2: K/V 2 of 4 heads (288 / 4 · 2 = 144, bias 24 / 4 · 2 = 12), q 72 (+6), o 72, c_fc 288 (+24),
    # c_proj 288; o's and c_proj's biases whole; the tied embedding 300 (first stage, and reported as tied)
    assert G2.local_params(2) == (24 + 72 + 144 + 6 + 12 + 72 + 12 + 24 + 288 + 24 + 288 + 12, 300 + 192, 24, 300)
    # 8 heads, 4 K/V heads of 3: K/V 2·12·12 = 288, 72 per head; tp 2 keeps 2 heads, tp 8 one (replicated)
    gqa = shape(heads=8, kv_heads=4, head_dim=3, tied_embeddings=True)
    # q and o 12·24 = 288, K/V 288, gate+up 480, down 240, two norms 24: tp 2 -> 144, 144, 144, 240, 120
    assert gqa.local_params(2)[0] == 24 + 144 + 144 + 144 + 240 + 120
    assert gqa.local_params(8)[0] == 24 + 36 + 36 + 72 + 60 + 30  # tp 8: one K/V head of 4 (72), replicated
    assert gqa.local_params(1)[3] == 600 and gqa.local_params(4)[3] == 150


def test_an_ep_rank_holds_its_experts():
    # mixtral, tp 2, ep 2: experts 1920 / 2 and 960 / 2; the router whole
    assert MIX.local_params(2, 2) == (12 + 120 + 120 + 120 + 12 + 48 + 960 + 480, 300, 312, 0)
    assert MIX.local_params(1, 4)[0] == 12 + 240 + 120 + 240 + 12 + 48 + 480 + 240
    assert MIX.local_params(1)[0] == 3552


def test_a_ranks_share_is_whole_parameters():
    # counts, not fractions: 1920 // 2, 288 // 4 · (4 // 2), ... are ints (a float count would print as 960.0)
    gqa = shape(heads=8, kv_heads=4, head_dim=3)
    for got in (MIX.local_params(2, 2), MIX.local_params(1, 4), gqa.local_params(2), gqa.local_params(8),
                G2.local_params(2)):
        assert all(type(v) is int for v in got), got


# ---- HF config.json ------------------------------------------------------------------------------------------------
LLAMA_CFG = {"model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 3, "hidden_size": 12,
             "intermediate_size": 20, "vocab_size": 50}


def fields(s, *names):
    return tuple(getattr(s, n) for n in names)


def test_a_minimal_llama_config_takes_transformers_defaults():
    s = from_hf_config(dict(LLAMA_CFG))
    assert s == ModelShape(layers=3, hidden=12, heads=4, kv_heads=4, ffn=20, vocab=50, max_positions=2048,
                           tied_embeddings=False, activation="silu", qkv_bias=False, mlp_bias=False, norm_eps=1e-6,
                           rope_theta=10000.0, attn_dropout=0.0, name="llama", family="llama")
    assert s.rope_scaling is None and type(s.rope_theta) is float
    assert from_hf_config(dict(LLAMA_CFG, num_key_value_heads=None)).kv_heads == 4
    assert from_hf_config(dict(LLAMA_CFG, attention_dropout=None)).attn_dropout == 0.0
    assert from_hf_config(dict(LLAMA_CFG), name="mine").name == "mine"


def test_a_full_llama_config():
    cfg = dict(LLAMA_CFG, num_key_value_heads=2, head_dim=5, max_position_embeddings=64, tie_word_embeddings=True,
               hidden_act="gelu", attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5, rope_theta=500000,
               attention_dropout=0.25, model_type="mistral")
    s = from_hf_config(cfg)
    assert fields(s, "family", "name", "kv_heads", "head_dim", "max_positions", "tied_embeddings", "activation",
                  "qkv_bias", "o_bias", "mlp_bias", "norm_eps", "rope_theta", "attn_dropout") == (
        "mistral", "mistral", 2, 5, 64, True, "gelu", True, True, True, 1e-5, 500000.0, 0.25)


def test_family_rules_of_the_llama_reader():
    q2 = from_hf_config(dict(LLAMA_CFG, model_type="qwen2", head_dim=7, attention_bias=False))
    assert fields(q2, "head_dim", "qkv_bias", "o_bias") == (3, True, False)  # Qwen2 derives head_dim; q/k/v bias
    assert from_hf_config(dict(LLAMA_CFG, model_type="qwen3")).head_dim == 128  # Qwen3Config's default
    q3 = from_hf_config(dict(LLAMA_CFG, model_type="qwen3", head_dim=6))
    assert fields(q3, "head_dim", "qk_norm", "qkv_bias") == (6, True, False)
    mx = from_hf_config(dict(LLAMA_CFG, model_type="mixtral", attention_bias=True))
    assert fields(mx, "qkv_bias", "experts", "top_k", "aux_loss_coef", "norm_topk") == (False, 8, 2, 0.001, True)
    mx = from_hf_config(dict(LLAMA_CFG, model_type="mixtral", num_local_experts=4, num_experts_per_tok=1,
                             router_aux_loss_coef=0.02, router_jitter_noise=0.0))
    assert fields(mx, "experts", "top_k", "aux_loss_coef") == (4, 1, 0.02)
    qm = from_hf_config(dict(LLAMA_CFG, model_type="qwen3_moe", num_attention_heads=4))
    # Qwen3MoeConfig has no head_dim default (unlike Qwen3Config): the attention takes hidden / heads = 3
    assert fields(qm, "experts", "top_k", "expert_ffn", "norm_topk", "aux_loss_coef", "head_dim") == (
        128, 8, 768, False, 0.001, 3)
    qm = from_hf_config(dict(LLAMA_CFG, model_type="qwen3_moe", num_experts=16, num_experts_per_tok=4,
                             moe_intermediate_size=9, norm_topk_prob=True, router_aux_loss_coef=0.5,
                             decoder_sparse_step=1, mlp_only_layers=[]))
    assert fields(qm, "experts", "top_k", "expert_ffn", "norm_topk", "aux_loss_coef") == (16, 4, 9, True, 0.5)


def test_moe_configs_refused():
    with pytest.raises(ConfigError) as e:
        from_hf_config(dict(LLAMA_CFG, model_type="mixtral", router_jitter_noise=0.1))
    assert str(e.value) == "router_jitter_noise > 0 makes the router random; the course's models use 0"
    dense = ("qwen3_moe with dense layers among the sparse ones (mlp_only_layers, decoder_sparse_step > 1) is not "
             "modelled; every layer must be sparse")
    for extra in (dict(mlp_only_layers=[1]), dict(decoder_sparse_step=2)):
        with pytest.raises(ConfigError) as e:
            from_hf_config(dict(LLAMA_CFG, model_type="qwen3_moe", **extra))
        assert str(e.value) == dense


def test_rope_parameters_in_either_layout():
    top = from_hf_config(dict(LLAMA_CFG, rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}))
    assert (top.rope_theta, top.rope_scaling) == (5e5, {"type": "linear", "factor": 2.0})
    # transformers 5: rope_parameters holds the theta and the scaling (and wins over the top level)
    five = from_hf_config(dict(LLAMA_CFG, rope_theta=1.0, rope_scaling={"type": "linear"},
                               rope_parameters={"rope_theta": 1e6, "rope_type": "llama3", "factor": 8.0}))
    assert (five.rope_theta, five.rope_scaling) == (1e6, {"rope_type": "llama3", "factor": 8.0})
    only_theta = from_hf_config(dict(LLAMA_CFG, rope_parameters={"rope_theta": 2e5},
                                     rope_scaling={"type": "dynamic", "factor": 4.0}))
    assert (only_theta.rope_theta, only_theta.rope_scaling) == (2e5, {"type": "dynamic", "factor": 4.0})
    for default in ({"rope_parameters": {"rope_type": "default", "rope_theta": 3e5}},
                    {"rope_scaling": {"type": "default"}}, {"rope_scaling": {"rope_type": "default", "type": "x"}}):
        assert from_hf_config(dict(LLAMA_CFG, **default)).rope_scaling is None
    assert from_hf_config(dict(LLAMA_CFG, rope_parameters={"rope_type": "default", "rope_theta": 3e5})).rope_theta \
        == 3e5
    assert from_hf_config(dict(LLAMA_CFG, rope_scaling={"rope_type": "yarn", "type": "default"})).rope_scaling == {
        "rope_type": "yarn", "type": "default"}  # rope_type is read first


GPT2_CFG = {"model_type": "gpt2", "n_embd": 12, "n_layer": 2, "n_head": 4, "vocab_size": 50}


def test_a_minimal_gpt2_config_takes_transformers_defaults():
    s = from_hf_config(dict(GPT2_CFG))
    assert s == ModelShape(arch="gpt2", layers=2, hidden=12, heads=4, vocab=50, ffn=48, max_positions=1024,
                           tied_embeddings=True, activation="gelu_new", norm_eps=1e-5, attn_dropout=0.1,
                           resid_dropout=0.1, embd_dropout=0.1, name="gpt2")
    alt = from_hf_config({"model_type": "gpt2", "hidden_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "vocab_size": 50, "n_inner": None})
    assert alt == s


def test_a_full_gpt2_config():
    s = from_hf_config(dict(GPT2_CFG, n_embd=16, hidden_size=99, n_layer=3, num_hidden_layers=99, n_head=2,
                            num_attention_heads=99, n_inner=40, n_positions=32, tie_word_embeddings=False,
                            activation_function="relu", layer_norm_epsilon=1e-6, attn_pdrop=0.2, resid_pdrop=0.3,
                            embd_pdrop=0.4), name="g")
    assert fields(s, "hidden", "layers", "heads", "ffn", "max_positions", "tied_embeddings", "activation",
                  "norm_eps", "attn_dropout", "resid_dropout", "embd_dropout", "name") == (
        16, 3, 2, 40, 32, False, "relu", 1e-6, 0.2, 0.3, 0.4, "g")


@pytest.mark.parametrize("cfg,message", [
    ({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "vocab_size": 50}, "gpt2 config lacks required key 'n_embd'"),
    ({"model_type": "gpt2", "n_embd": 12, "n_layer": 2, "n_head": 4}, "gpt2 config lacks required key 'vocab_size'"),
    ({k: v for k, v in LLAMA_CFG.items() if k != "intermediate_size"},
     "llama config lacks required key 'intermediate_size'"),
    (dict({k: v for k, v in LLAMA_CFG.items() if k != "hidden_size"}, model_type="qwen3"),
     "qwen3 config lacks required key 'hidden_size'"),
    ({"model_type": "t5"}, "unsupported model_type 't5'; supported: llama, mistral, qwen2, qwen3, mixtral, "
                           "qwen3_moe, gpt2"),
    ({}, "unsupported model_type None; supported: llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, gpt2"),
    ({"model_type": ["llama"]}, "model_type must be a string, got list ['llama']"),  # was a TypeError (unhashable)
])
def test_config_refusals(cfg, message):
    with pytest.raises(ConfigError) as e:
        from_hf_config(cfg)
    assert str(e.value) == message


def test_config_files(tmp_path, monkeypatch):
    folder = tmp_path / "my-model"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(LLAMA_CFG))
    assert from_hf_config(path).name == "my-model"  # the folder names it
    assert from_hf_config(str(path)).name == "my-model"
    assert from_hf_config(path, name="x").name == "x"
    monkeypatch.chdir(folder)
    assert from_hf_config(Path("config.json")).name == "config"  # no folder name: the file's stem
    assert from_hf_config("config.json").layers == 3
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as e:
        from_hf_config(missing)
    assert str(e.value) == f"no such config file: {missing}"
    with pytest.raises(ConfigError) as e:
        from_hf_config(tmp_path)  # a folder is not a file
    assert str(e.value) == f"no such config file: {tmp_path}"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError) as e:
        from_hf_config(bad)
    assert str(e.value).startswith(f"{bad} is not valid JSON: Expecting property name")
    bad.write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(ConfigError) as e:
        from_hf_config(bad)
    assert str(e.value).startswith(f"{bad} is not valid JSON: ") and "codec" in str(e.value)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError) as e:
        from_hf_config(bad)
    assert str(e.value) == (f"{bad} holds a JSON list, not an object (an HF config.json is one object of its "
                            "fields)")
    with pytest.raises(ConfigError) as e:
        from_hf_config(42)
    assert str(e.value) == "expected a path or a dict, got int"
