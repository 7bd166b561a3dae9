"""Preset shapes against the real transformers models, counted on the meta device (no weights allocated)."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from coursekit.memory import PRESETS, ConfigError, ModelShape, from_hf_config, preset, to_hf_config_dict


def meta_model(hf_kwargs: dict):
    d = dict(hf_kwargs)
    cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def meta_numels(hf_kwargs: dict) -> tuple[int, ...]:
    return tuple(p.numel() for p in meta_model(hf_kwargs).parameters())  # tied weights: one Parameter, once


def meta_active_count(hf_kwargs: dict) -> int:
    """transformers' own count with only top-k of every layer's experts: an expert tensor (``mlp.experts.*``, one
    slice per expert on dim 0) counts k / E of itself, as a token multiplies only k experts' slices."""
    model = meta_model(hf_kwargs)
    cfg = model.config
    E = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    total = 0
    for name, p in model.named_parameters():
        if ".mlp.experts." in name:
            assert p.shape[0] == E, name
            total += p.numel() // E * cfg.num_experts_per_tok
        else:
            total += p.numel()
    return total


def meta_param_count(hf_kwargs: dict) -> int:
    return sum(meta_numels(hf_kwargs))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_param_count_equals_meta_model(name):
    shape = preset(name)
    assert shape.num_params() == meta_param_count(to_hf_config_dict(shape))


@pytest.mark.parametrize("shape", [
    ModelShape(arch="llama", layers=3, hidden=96, heads=6, kv_heads=2, ffn=200, vocab=300, head_dim=24,
               qkv_bias=True, mlp_bias=True, tied_embeddings=True),
    ModelShape(arch="gpt2", layers=3, hidden=96, heads=4, vocab=300, ffn=320, tied_embeddings=False),
], ids=["llama-odd", "gpt2-untied"])
def test_explicit_shapes_equal_meta_model(shape):
    assert shape.num_params() == meta_param_count(to_hf_config_dict(shape))
    assert shape.param_numels() == meta_numels(to_hf_config_dict(shape))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_tensor_list_equals_meta_model_in_order(name):
    """``param_numels`` (DeepSpeed's flattening order, hence ZeRO-1/2 partition boundaries) is the real model's
    ``parameters()`` list. Deep models are cut to 2 layers: the list repeats per layer."""
    shape = preset(name)
    shape = shape.with_(layers=min(shape.layers, 2))
    numels = shape.param_numels()
    assert numels == meta_numels(to_hf_config_dict(shape))
    assert len(numels) == shape.num_param_tensors() and sum(numels) == shape.num_params()


@pytest.mark.parametrize("name", [n for n in sorted(PRESETS) if preset(n).is_moe])
def test_active_params_equal_meta_model(name):
    shape = preset(name)
    assert shape.num_active_params() == meta_active_count(to_hf_config_dict(shape))
    assert shape.num_active_params() < shape.num_params()


# the model cards' rounded totals (billions): Qwen3 (Qwen/Qwen3-*: "Number of Parameters"), Mixtral (Mistral AI's
# announcements: 46.7B total / 12.9B active; 141B / 39B)
PUBLISHED = {"qwen3-8b": (8.2, 8.2), "qwen3-32b": (32.8, 32.8), "qwen3-30b-a3b": (30.5, 3.3),
             "qwen3-235b-a22b": (235, 22), "mixtral-8x7b": (46.7, 12.9), "mixtral-8x22b": (141, 39),
             "qwen2.5-7b": (7.61, 7.61)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_match_published_totals(name):
    total, active = PUBLISHED[name]
    shape = preset(name)
    assert shape.num_params() / 1e9 == pytest.approx(total, rel=0.01)
    assert shape.num_active_params() / 1e9 == pytest.approx(active, rel=0.03)


def test_config_json_round_trip(tmp_path):
    for name in ("llama3-8b", "gpt2", "llama3.2-1b", "qwen3-8b", "qwen3-30b-a3b", "mixtral-8x7b", "qwen2.5-7b",
                 "tiny-qwen3-moe"):
        shape = preset(name)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(to_hf_config_dict(shape)))
        back = from_hf_config(path)
        assert back.with_(name=shape.name) == shape


def test_hf_style_config_json(tmp_path):
    """A config.json as published on the Hub (transformers 4 layout: rope_theta at top level)."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
           "max_position_embeddings": 8192, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    shape = from_hf_config(path)
    assert shape.num_params() == preset("llama3-8b").num_params()
    assert shape.rope_theta == 500000.0


def test_unknown_preset_lists_names():
    with pytest.raises(ConfigError, match="llama3-8b"):
        preset("llama-9000")
    with pytest.raises(ConfigError, match="model_type"):
        from_hf_config({"model_type": "t5"})


def test_family_config_json_from_the_hub_layout():
    """A Qwen3-MoE config.json in the published layout (intermediate_size beside moe_intermediate_size)."""
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
           "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48,
           "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 151936,
           "max_position_embeddings": 40960, "rope_theta": 1000000.0, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "tie_word_embeddings": False, "rms_norm_eps": 1e-6}
    shape = from_hf_config(cfg)
    assert shape.num_params() == preset("qwen3-30b-a3b").num_params()
    assert (shape.experts, shape.top_k, shape.moe_ffn, shape.qk_norm) == (128, 8, 768, True)
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        from_hf_config(dict(cfg, mlp_only_layers=[0]))


@pytest.mark.parametrize("bad, match", [
    (dict(family="qwen3_moe", experts=4, top_k=5), "top_k 5 is more than the 4 experts"),
    (dict(family="llama", experts=4), "needs a mixture-of-experts family"),
    (dict(family="qwen3_moe", experts=0), "experts must be > 0"),
    (dict(family="gpt2"), "gpt2-style model, not llama"),
])
def test_bad_moe_shapes_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        ModelShape(arch="llama", layers=2, hidden=64, heads=4, vocab=256, ffn=128, **bad)
