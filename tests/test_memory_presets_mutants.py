"""The preset helpers and the HF config keywords (``coursekit.memory.presets``) by hand: each family helper's defaults
(the published config.json values its docstring names), ``to_hf_config_dict`` key by key for every family on small
shapes whose every field is its own value, and every refusal word for word. Where bench/bench_mutation.py found no
test (tests/test_memory_presets.py checks the presets against transformers' models). Pure Python, well under a
second."""
from __future__ import annotations

import re

import pytest

from coursekit.memory import presets
from coursekit.memory.errors import ConfigError
from coursekit.memory.presets import PRESETS, preset, to_hf_config_dict
from coursekit.memory.shapes import ModelShape


def whole(message):
    return "^" + re.escape(message) + "$"


def fields(s, *names):
    return tuple(getattr(s, n) for n in names)


SIZES = ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions")


# --- the helpers' defaults -----------------------------------------------------------------------------------------

def test_llama_helper_defaults_and_overrides():
    """Llama 2's config.json values by default: rope_theta 1e4, untied, rms_norm_eps 1e-5, no rope scaling,
    head_dim hidden / heads."""
    s = presets._llama("x", 2, 8, 2, 1, 16, 32, 64)
    assert fields(s, *SIZES) == ("x", 2, 8, 2, 1, 16, 32, 64) and (s.arch, s.family) == ("llama", "llama")
    assert (s.rope_theta, s.tied_embeddings, s.norm_eps, s.rope_scaling, s.head_dim) == (10000.0, False, 1e-5, None, 4)
    s = presets._llama("x", 2, 8, 2, 1, 16, 32, 64, theta=5.0, tied=True, eps=1e-6, scaling={"factor": 2.0},
                       head_dim=3)
    assert (s.rope_theta, s.tied_embeddings, s.norm_eps, s.rope_scaling, s.head_dim) == (5.0, True, 1e-6,
                                                                                         {"factor": 2.0}, 3)


def test_gpt2_helper_defaults_and_overrides():
    """GPT-2's config.json: vocab 50257, n_positions 1024, every dropout 0.1."""
    s = presets._gpt2("g", 2, 8, 2)
    assert fields(s, "name", "layers", "hidden", "heads", "vocab", "max_positions") == ("g", 2, 8, 2, 50257, 1024)
    assert (s.arch, s.attn_dropout, s.resid_dropout, s.embd_dropout) == ("gpt2", 0.1, 0.1, 0.1)
    s = presets._gpt2("g", 2, 8, 2, V=10, P=20, dropout=0.25)
    assert (s.vocab, s.max_positions, s.attn_dropout, s.resid_dropout, s.embd_dropout) == (10, 20, 0.25, 0.25, 0.25)


def test_qwen3_helper_defaults_and_moe():
    """Qwen3's config.json: rope_theta 1e6, rms_norm_eps 1e-6, head_dim 128, untied; with experts, qwen3_moe whose
    router weights are renormalised (norm_topk_prob true)."""
    s = presets._qwen3("q", 2, 8, 2, 1, 16, 32, 64)
    assert fields(s, *SIZES) == ("q", 2, 8, 2, 1, 16, 32, 64)
    assert (s.arch, s.family, s.rope_theta, s.norm_eps, s.head_dim, s.tied_embeddings, s.experts, s.qk_norm) == (
        "llama", "qwen3", 1000000.0, 1e-6, 128, False, 0, True)
    assert (s.top_k, s.expert_ffn, s.norm_topk) == (0, None, None)  # dense: no router
    s = presets._qwen3("q", 2, 8, 2, 1, 16, 32, 64, tied=True, theta=7.0, experts=4, top_k=3, expert_ffn=6, d=5)
    assert (s.family, s.tied_embeddings, s.rope_theta, s.experts, s.top_k, s.expert_ffn, s.head_dim, s.norm_topk) == (
        "qwen3_moe", True, 7.0, 4, 3, 6, 5, True)


def test_mixtral_helper_defaults():
    """Mixtral-8x7B's config.json: 8 experts, 2 a token, rope_theta 1e6, rms_norm_eps 1e-5."""
    s = presets._mixtral("m", 2, 8, 2, 1, 16, 32, 64)
    assert fields(s, *SIZES) == ("m", 2, 8, 2, 1, 16, 32, 64)
    assert (s.arch, s.family, s.experts, s.top_k, s.rope_theta, s.norm_eps) == ("llama", "mixtral", 8, 2, 1000000.0,
                                                                               1e-5)
    s = presets._mixtral("m", 2, 8, 2, 1, 16, 32, 64, experts=4, top_k=1, theta=3.0)
    assert (s.experts, s.top_k, s.rope_theta) == (4, 1, 3.0)


def test_preset_by_name_or_the_known_names():
    assert preset("gpt2") is PRESETS["gpt2"] and preset("tiny-llama").hidden == 64
    with pytest.raises(ConfigError, match=whole(f"unknown model preset 'gpt3'; known: {', '.join(sorted(PRESETS))}")):
        preset("gpt3")


# --- to_hf_config_dict ---------------------------------------------------------------------------------------------

def llama(**kw):
    return ModelShape(**{"layers": 2, "hidden": 8, "heads": 2, "kv_heads": 1, "ffn": 16, "vocab": 32,
                         "max_positions": 64, "rope_theta": 5.0, "norm_eps": 1e-6, "attn_dropout": 0.25, **kw})


LLAMA = {"model_type": "llama", "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "hidden_act": "silu",
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 5.0,
         "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.25}


def test_llama_keys():
    assert to_hf_config_dict(llama()) == LLAMA
    s = llama(qkv_bias=True, mlp_bias=True, tied_embeddings=True, head_dim=3, family="mistral")
    assert to_hf_config_dict(s) == {**LLAMA, "model_type": "mistral", "attention_bias": True, "mlp_bias": True,
                                    "tie_word_embeddings": True, "head_dim": 3}


def test_llama_rope_scaling_is_a_copy():
    scaling = {"rope_type": "linear", "factor": 2.0}
    d = to_hf_config_dict(llama(rope_scaling=scaling))
    assert d == {**LLAMA, "rope_scaling": scaling} and d["rope_scaling"] is not scaling


def test_a_vocabulary_below_3_has_no_bos_eos():
    """LlamaConfig's default bos / eos ids 1 and 2 must lie in the vocabulary: below 3 tokens they are None."""
    assert to_hf_config_dict(llama(vocab=2)) == {**LLAMA, "vocab_size": 2, "bos_token_id": None, "eos_token_id": None}
    assert to_hf_config_dict(llama(vocab=3)) == {**LLAMA, "vocab_size": 3}


def test_family_keys():
    qwen2 = llama(family="qwen2", qkv_bias=True)
    want = {k: v for k, v in LLAMA.items() if k not in ("attention_bias", "mlp_bias", "head_dim")}
    assert to_hf_config_dict(qwen2) == {**want, "model_type": "qwen2"}
    qwen3 = llama(family="qwen3", head_dim=5)
    want = {k: v for k, v in LLAMA.items() if k != "mlp_bias"}
    assert to_hf_config_dict(qwen3) == {**want, "model_type": "qwen3", "head_dim": 5}
    mixtral = llama(family="mixtral", experts=4, top_k=2, expert_ffn=12, aux_loss_coef=0.5)
    want = {k: v for k, v in LLAMA.items() if k not in ("attention_bias", "mlp_bias")}
    assert to_hf_config_dict(mixtral) == {**want, "model_type": "mixtral", "num_local_experts": 4,
                                          "num_experts_per_tok": 2, "router_aux_loss_coef": 0.5,
                                          "router_jitter_noise": 0.0, "intermediate_size": 12}
    moe = llama(family="qwen3_moe", experts=4, top_k=3, expert_ffn=6, norm_topk=True, aux_loss_coef=0.25)
    want = {k: v for k, v in LLAMA.items() if k != "mlp_bias"}
    assert to_hf_config_dict(moe) == {**want, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 3,
                                      "moe_intermediate_size": 6, "norm_topk_prob": True,
                                      "router_aux_loss_coef": 0.25, "decoder_sparse_step": 1, "mlp_only_layers": []}
    assert presets._family_keys(llama()) == {} and presets._family_keys(llama(family="mistral")) == {}


LLAMA_LAYOUT = "a llama-style HF model has RMSNorm, a SwiGLU MLP and RoPE"


@pytest.mark.parametrize("shape,message", [
    (llama(norm="layernorm"), LLAMA_LAYOUT),
    (llama(mlp="gelu"), LLAMA_LAYOUT),
    (llama(positions="learned"), LLAMA_LAYOUT),
    (llama(qk_norm=True), "a llama HF model has no q/k norm, and a bias on o_proj exactly when q/k/v have one"),
    (llama(family="mistral", o_bias=True), "a mistral HF model has no q/k norm, and a bias on o_proj exactly when "
                                           "q/k/v have one"),
    (llama(qkv_bias=True, o_bias=False), "a llama HF model has no q/k norm, and a bias on o_proj exactly when q/k/v "
                                         "have one"),
    (llama(family="qwen2", qkv_bias=True, qk_norm=True), "a qwen2 HF model has no q/k norm, head_dim = hidden / "
                                                         "heads, no MLP bias"),
    (llama(family="qwen2", qkv_bias=True, head_dim=3), "a qwen2 HF model has no q/k norm, head_dim = hidden / heads, "
                                                       "no MLP bias"),
    (llama(family="qwen2", qkv_bias=True, mlp_bias=True), "a qwen2 HF model has no q/k norm, head_dim = hidden / "
                                                          "heads, no MLP bias"),
    (llama(family="qwen3", qk_norm=False), "a qwen3 HF model has an RMSNorm on each query and key head, one "
                                           "attention_bias for q/k/v/o, no MLP bias"),
    (llama(family="qwen3", qkv_bias=True, o_bias=False), "a qwen3 HF model has an RMSNorm on each query and key "
                                                         "head, one attention_bias for q/k/v/o, no MLP bias"),
    (llama(family="qwen3", mlp_bias=True), "a qwen3 HF model has an RMSNorm on each query and key head, one "
                                           "attention_bias for q/k/v/o, no MLP bias"),
    (llama(family="qwen3_moe", experts=2, mlp_bias=True), "a qwen3_moe HF model has an RMSNorm on each query and "
                                                          "key head, one attention_bias for q/k/v/o, no MLP bias"),
    (llama(family="mixtral", experts=2, qk_norm=True), "a mixtral HF model has no biases and no q/k norm"),
    (llama(family="mixtral", experts=2, qkv_bias=True), "a mixtral HF model has no biases and no q/k norm"),
    (llama(family="mixtral", experts=2, o_bias=True), "a mixtral HF model has no biases and no q/k norm"),
    (llama(family="mixtral", experts=2, mlp_bias=True), "a mixtral HF model has no biases and no q/k norm"),
])
def test_llama_style_refusals(shape, message):
    with pytest.raises(ConfigError, match=whole(message)):
        to_hf_config_dict(shape)


@pytest.mark.parametrize("shape", [
    llama(qkv_bias=True),  # o_proj biased with q/k/v (attention_bias): a llama
    llama(family="qwen2", qkv_bias=True),
    llama(family="qwen3", qkv_bias=True),  # qwen3's attention_bias covers o_proj too
    llama(family="qwen3_moe", experts=2),
    llama(family="mixtral", experts=2),
])
def test_llama_style_shapes_each_family_builds(shape):
    assert to_hf_config_dict(shape)["model_type"] == shape.family


def gpt2(**kw):
    return ModelShape(**{"arch": "gpt2", "layers": 2, "hidden": 8, "heads": 2, "vocab": 10, "max_positions": 16,
                         "norm_eps": 1e-6, "attn_dropout": 0.1, "resid_dropout": 0.2, "embd_dropout": 0.3, **kw})


GPT2 = {"model_type": "gpt2", "vocab_size": 10, "n_positions": 16, "n_embd": 8, "n_layer": 2, "n_head": 2,
        "n_inner": 32, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True,
        "resid_pdrop": 0.2, "embd_pdrop": 0.3, "attn_pdrop": 0.1, "bos_token_id": 9, "eos_token_id": 9}


def test_gpt2_keys_and_its_end_token():
    """n_inner 4·8 by default; bos = eos = GPT-2's token 50256, or the last id of a smaller vocabulary."""
    assert to_hf_config_dict(gpt2()) == GPT2
    assert to_hf_config_dict(gpt2(ffn=12, tied_embeddings=False, vocab=50257)) == {
        **GPT2, "n_inner": 12, "tie_word_embeddings": False, "vocab_size": 50257, "bos_token_id": 50256,
        "eos_token_id": 50256}
    assert to_hf_config_dict(gpt2(vocab=50258))["eos_token_id"] == 50256
    assert to_hf_config_dict(gpt2(vocab=50256))["eos_token_id"] == 50255


GPT2_LAYOUT = ("a gpt2-style HF model has LayerNorm, a GELU MLP with biases, learned positions, q/k/v biases, "
               "multi-head attention and head_dim = hidden / heads")


@pytest.mark.parametrize("shape", [gpt2(norm="rmsnorm"), gpt2(mlp="swiglu"), gpt2(positions="rope"),
                                   gpt2(qkv_bias=False), gpt2(mlp_bias=False), gpt2(kv_heads=1), gpt2(head_dim=3)])
def test_gpt2_refusals(shape):
    with pytest.raises(ConfigError, match=whole(GPT2_LAYOUT)):
        to_hf_config_dict(shape)
