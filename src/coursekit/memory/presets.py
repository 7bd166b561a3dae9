"""Shapes of real models and of the course's tiny models, defined once, in pure Python.

``coursekit.models`` builds the real ``transformers`` model from ``to_hf_config_dict(preset(name))``, so the calculator
and the model it is checked against cannot drift apart. Sources: the models' published ``config.json`` files
(meta-llama/Meta-Llama-3-8B, -70B, Llama-3.1-405B, Llama-3.2-1B/3B, Llama-2-7b/13b/70b-hf; openai-community/gpt2,
gpt2-medium, gpt2-large, gpt2-xl) and, for GPT-3 175B, Table 2.1 of Brown et al. 2020 (96 layers, d_model 12288,
96 heads of 128, context 2048) with GPT-2's vocabulary and modules.

The tiny course models (2 layers, hidden 64, vocab 256, 512 positions) run in milliseconds on a CPU:

- ``tiny-llama``: 4 heads, 2 KV heads (so grouped-query attention is exercised), ``intermediate_size`` 176 —
  Llama's 8/3·h rounded up to a multiple of 16 (8/3·64 = 170.7 -> 176), as Meta's ``ffn_dim_multiplier`` rule does
  (with multiple_of 16); untied head, like Llama 3 8B.
- ``tiny-gpt2``: 4 heads, ``n_inner`` 4·64 = 256, tied head, like GPT-2.

Both have dropout 0 so that every parallel strategy reproduces the single-process loss exactly.
"""
from __future__ import annotations

from coursekit.memory.errors import ConfigError
from coursekit.memory.shapes import ModelShape

_LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}


def _llama(name, L, h, a, k, f, V, P, *, theta=10000.0, tied=False, eps=1e-5, scaling=None, head_dim=None):
    return ModelShape(arch="llama", name=name, layers=L, hidden=h, heads=a, kv_heads=k, ffn=f, vocab=V,
                      max_positions=P, rope_theta=theta, tied_embeddings=tied, norm_eps=eps, rope_scaling=scaling,
                      head_dim=head_dim)


def _gpt2(name, L, h, a, V=50257, P=1024, *, dropout=0.1):
    return ModelShape(arch="gpt2", name=name, layers=L, hidden=h, heads=a, vocab=V, max_positions=P,
                      attn_dropout=dropout, resid_dropout=dropout, embd_dropout=dropout)


PRESETS: dict[str, ModelShape] = {s.name: s for s in (
    _llama("tiny-llama", 2, 64, 4, 2, 176, 256, 512),
    _gpt2("tiny-gpt2", 2, 64, 4, V=256, P=512, dropout=0.0),
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, eps=1e-5),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, eps=1e-5),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, eps=1e-5),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, theta=500000.0),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, theta=500000.0),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 131072, theta=500000.0, scaling=_LLAMA3_ROPE_SCALING),
    _llama("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, theta=500000.0, tied=True, head_dim=64,
           scaling={**_LLAMA3_ROPE_SCALING, "factor": 32.0}),
    _llama("llama3.2-3b", 28, 3072, 24, 8, 8192, 128256, 131072, theta=500000.0, tied=True, head_dim=128,
           scaling={**_LLAMA3_ROPE_SCALING, "factor": 32.0}),
    _gpt2("gpt2", 12, 768, 12),
    _gpt2("gpt2-medium", 24, 1024, 16),
    _gpt2("gpt2-large", 36, 1280, 20),
    _gpt2("gpt2-xl", 48, 1600, 25),
    _gpt2("gpt3-175b", 96, 12288, 96, P=2048),
)}


def preset(name: str) -> ModelShape:
    """The preset called ``name`` (a ConfigError lists the known names)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


def to_hf_config_dict(shape: ModelShape) -> dict:
    """Keyword arguments for ``LlamaConfig`` / ``GPT2Config`` (plus ``"model_type"``) that build this shape.

    Raises ConfigError for shapes the two HF families cannot express (e.g. a llama with LayerNorm).
    """
    if shape.arch == "llama":
        if (shape.norm, shape.mlp, shape.positions) != ("rmsnorm", "swiglu", "rope"):
            raise ConfigError("a llama-style HF model has RMSNorm, a SwiGLU MLP and RoPE")
        _check_family(shape)
        d = {
            "model_type": shape.family, "vocab_size": shape.vocab, "hidden_size": shape.hidden,
            "intermediate_size": shape.ffn, "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
            "hidden_act": shape.activation, "max_position_embeddings": shape.max_positions,
            "rms_norm_eps": shape.norm_eps, "tie_word_embeddings": shape.tied_embeddings,
            # the published config.json keys: transformers 4 reads them, transformers 5 converts them to rope_parameters
            "rope_theta": shape.rope_theta, "attention_bias": shape.qkv_bias, "mlp_bias": shape.mlp_bias,
            "attention_dropout": shape.attn_dropout,
        }
        if shape.rope_scaling:
            d["rope_scaling"] = dict(shape.rope_scaling)
        for k, v in _family_keys(shape).items():
            if v is _DROP:
                d.pop(k, None)
            else:
                d[k] = v
        if shape.vocab < 3:  # LlamaConfig's default bos/eos ids (1, 2) would lie outside the vocabulary
            d.update(bos_token_id=None, eos_token_id=None)
        return d
    if (shape.norm, shape.mlp, shape.positions) != ("layernorm", "gelu", "learned") or not shape.qkv_bias \
            or not shape.mlp_bias or shape.kv_heads != shape.heads or shape.head_dim * shape.heads != shape.hidden:
        raise ConfigError("a gpt2-style HF model has LayerNorm, a GELU MLP with biases, learned positions, "
                          "q/k/v biases, multi-head attention and head_dim = hidden / heads")
    eos = min(50256, shape.vocab - 1)  # GPT-2's token 50256, or the last id of a smaller vocabulary
    return {
        "model_type": "gpt2", "vocab_size": shape.vocab, "n_positions": shape.max_positions, "n_embd": shape.hidden,
        "n_layer": shape.layers, "n_head": shape.heads, "n_inner": shape.ffn,
        "activation_function": shape.activation, "layer_norm_epsilon": shape.norm_eps,
        "tie_word_embeddings": shape.tied_embeddings, "resid_pdrop": shape.resid_dropout,
        "embd_pdrop": shape.embd_dropout, "attn_pdrop": shape.attn_dropout, "bos_token_id": eos,
        "eos_token_id": eos,
    }


def _check_family(shape: ModelShape) -> None:
    """Refuse a llama-style shape its HF family cannot build (the module layout is fixed per family)."""
    f, why = shape.family, None
    if f in ("llama", "mistral") and (shape.qk_norm or shape.o_bias != shape.qkv_bias):
        why = "no q/k norm, and a bias on o_proj exactly when q/k/v have one"
    elif f == "qwen2" and (shape.qk_norm or shape.head_dim * shape.heads != shape.hidden or shape.mlp_bias):
        why = "no q/k norm, head_dim = hidden / heads, no MLP bias"
    elif f in ("qwen3", "qwen3_moe") and (not shape.qk_norm or shape.o_bias != shape.qkv_bias or shape.mlp_bias):
        why = "an RMSNorm on each query and key head, one attention_bias for q/k/v/o, no MLP bias"
    elif f == "mixtral" and (shape.qk_norm or shape.qkv_bias or shape.o_bias or shape.mlp_bias):
        why = "no biases and no q/k norm"
    if why:
        raise ConfigError(f"a {f} HF model has {why}")


_DROP = object()


def _family_keys(shape: ModelShape) -> dict:
    """The config.json keys a family adds to (or drops from) Llama's."""
    f = shape.family
    if f == "qwen2":
        return {"attention_bias": _DROP, "mlp_bias": _DROP, "head_dim": _DROP}  # fixed biases; head_dim derived
    if f == "mixtral":
        return {"num_local_experts": shape.experts, "num_experts_per_tok": shape.top_k,
                "router_aux_loss_coef": shape.aux_loss_coef, "router_jitter_noise": 0.0, "attention_bias": _DROP,
                "mlp_bias": _DROP, "intermediate_size": shape.moe_ffn}
    if f == "qwen3_moe":
        return {"num_experts": shape.experts, "num_experts_per_tok": shape.top_k, "moe_intermediate_size":
                shape.moe_ffn, "norm_topk_prob": shape.norm_topk, "router_aux_loss_coef": shape.aux_loss_coef,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "mlp_bias": _DROP}
    if f == "qwen3":
        return {"mlp_bias": _DROP}
    return {}


def _qwen3(name, L, h, a, k, f, V, P, *, tied=False, theta=1000000.0, experts=0, top_k=None, expert_ffn=None,
           d=128):
    return ModelShape(arch="llama", family="qwen3_moe" if experts else "qwen3", name=name, layers=L, hidden=h,
                      heads=a, kv_heads=k, ffn=f, vocab=V, max_positions=P, rope_theta=theta, tied_embeddings=tied,
                      norm_eps=1e-6, head_dim=d, experts=experts, top_k=top_k, expert_ffn=expert_ffn,
                      norm_topk=bool(experts) or None)


def _mixtral(name, L, h, a, k, f, V, P, *, experts=8, top_k=2, theta=1000000.0):
    return ModelShape(arch="llama", family="mixtral", name=name, layers=L, hidden=h, heads=a, kv_heads=k, ffn=f,
                      vocab=V, max_positions=P, rope_theta=theta, norm_eps=1e-5, experts=experts, top_k=top_k)


# The families people train now (sources: the published config.json of Qwen/Qwen3-8B, Qwen3-32B, Qwen3-30B-A3B,
# Qwen3-235B-A22B, Qwen/Qwen2.5-7B, mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1), and tiny ones for the labs
# (2 layers, hidden 64, vocab 256: GQA, q/k norm, 4 experts of width 32 run top-2 (Qwen3-MoE) or 8 experts top-2
# (Mixtral-style, wider experts)).
PRESETS.update({s.name: s for s in (
    _qwen3("tiny-qwen3", 2, 64, 4, 2, 176, 256, 512, d=16),
    _qwen3("tiny-qwen3-moe", 2, 64, 4, 2, 176, 256, 512, d=16, experts=4, top_k=2, expert_ffn=32),
    _mixtral("tiny-mixtral", 2, 64, 4, 2, 48, 256, 512, experts=8, top_k=2),
    _qwen3("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, 40960),
    _qwen3("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 40960),
    _qwen3("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 40960, experts=128, top_k=8, expert_ffn=768),
    _qwen3("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 40960, experts=128, top_k=8, expert_ffn=1536),
    ModelShape(arch="llama", family="qwen2", name="qwen2.5-7b", layers=28, hidden=3584, heads=28, kv_heads=4,
               ffn=18944, vocab=152064, max_positions=131072, rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True),
    _mixtral("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768),
    _mixtral("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 65536),
)})
