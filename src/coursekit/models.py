"""Transformers models built from configs: tiny course models and shape presets of real ones. No hub downloads.

The shapes live once, in pure Python (``coursekit.memory.presets``), so the calculator and the real model agree by
construction; this file only turns a shape into a ``transformers`` model (random init, or on the meta device to
count parameters of a 405B model in a second).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from coursekit.memory.presets import PRESETS, preset, to_hf_config_dict

ATTENTION = ("sdpa", "eager")


def model_names() -> list[str]:
    return sorted(PRESETS)


def hf_config(model: str | dict, *, attention: str = "sdpa", dropout: float | None = None, **overrides):
    """A transformers config for a preset name, a path to an HF ``config.json``, or a config dict."""
    from transformers import AutoConfig, GPT2Config, LlamaConfig

    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTION)}")
    if isinstance(model, dict):
        d = dict(model)
    elif str(model).endswith(".json"):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"no such model config: {model}")
        d = json.loads(path.read_text())
    else:
        d = to_hf_config_dict(preset(str(model)))  # raises with the list of known names
    d.update(overrides)
    kind = d.pop("model_type", None)
    if dropout is not None:
        keys = ("attention_dropout",) if kind != "gpt2" else ("resid_pdrop", "embd_pdrop", "attn_pdrop")
        d.update({k: float(dropout) for k in keys})
    cls = {"llama": LlamaConfig, "gpt2": GPT2Config}.get(kind)
    cfg = cls(**d) if cls else AutoConfig.for_model(kind, **d)
    cfg._attn_implementation = attention
    cfg.use_cache = False
    return cfg


def build_model(model: str | dict, *, attention: str = "sdpa", dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", seed: int | None = None, dropout: float | None = None,
                **overrides) -> torch.nn.Module:
    """A causal LM with random init (same seed → same weights on every rank), in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM

    cfg = hf_config(model, attention=attention, dropout=dropout, **overrides)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attention)
    return m


def model_class(model: str | dict, *, attention: str = "sdpa") -> type:
    """The transformers class ``build_model(model)`` builds, its modules imported (transformers loads a model's
    modules lazily, on the first build: a process can import them ahead, e.g. before ``gc.freeze``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config(model, attention=attention))]


def count_parameters(model: str | dict | torch.nn.Module) -> int:
    """Exact parameter count (tied weights once); names and paths are built on the meta device."""
    if not isinstance(model, torch.nn.Module):
        model = build_model(model, device="meta")
    return sum(p.numel() for p in model.parameters())


def param_numels(model: str | dict) -> list[int]:
    """Parameter sizes of a course model in ``model.parameters()`` order (DeepSpeed's flattening order)."""
    return [p.numel() for p in build_model(model, device="meta").parameters()]


def blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer blocks of a causal LM (Llama-style ``model.layers``, GPT-2's ``transformer.h``)."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    for name in ("layers", "h"):
        if isinstance(getattr(base, name, None), torch.nn.ModuleList):
            return getattr(base, name)
    raise ValueError(f"cannot find the transformer blocks of {type(model).__name__}")
