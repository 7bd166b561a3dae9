"""Preset shapes against the real transformers models, counted on the meta device (no weights allocated)."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from coursekit.memory import PRESETS, ConfigError, ModelShape, from_hf_config, preset, to_hf_config_dict


def meta_numels(hf_kwargs: dict) -> tuple[int, ...]:
    d = dict(hf_kwargs)
    cls = {"llama": transformers.LlamaConfig, "gpt2": transformers.GPT2Config}[d.pop("model_type")]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cls(**d))
    return tuple(p.numel() for p in model.parameters())  # tied weights are one Parameter: counted once


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


def test_config_json_round_trip(tmp_path):
    for name in ("llama3-8b", "gpt2", "llama3.2-1b"):
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
