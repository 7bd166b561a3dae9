"""The shape of a decoder-only transformer, read from an HF ``config.json`` or given explicitly, and its parameters
as a table of named terms.

Two module layouts (``arch``) are modelled exactly as ``transformers`` builds them:

- ``llama`` (LlamaForCausalLM; also Mistral-style configs): RMSNorm, RoPE, SwiGLU MLP (gate, up, down), separate
  q/k/v/o projections with optional bias, grouped-query attention (``kv_heads < heads``), optional ``head_dim``.
  Its families (``family``, the HF ``model_type``): llama, mistral; qwen2 (bias on q/k/v, none on o); qwen3 (an
  RMSNorm on each query and key head, ``qk_norm``); and the mixtures of experts mixtral and qwen3_moe, whose MLP is
  a top-k softmax router (``E × h``) and ``E`` fused SwiGLU experts (transformers 5's 3-D ``experts.gate_up_proj``
  ``E × 2f × h`` and ``experts.down_proj`` ``E × h × f``, ``f`` = ``expert_ffn``); a token runs ``top_k`` of them;
- ``gpt2`` (GPT2LMHeadModel; also GPT-3 shapes): LayerNorm, learned position embedding, fused ``c_attn`` (q, k, v in one
  ``h × 3h`` Conv1D with bias), GELU MLP with bias, tied embeddings by default.

Naming: ``h`` hidden, ``a`` heads, ``k`` key/value heads, ``d`` head dim, ``f`` FFN width, ``V`` vocab, ``L`` layers.
"""
from __future__ import annotations

import json
from functools import lru_cache
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from coursekit.memory.errors import ConfigError, choice, positive_int

ARCHS = ("llama", "gpt2")
NORMS = ("rmsnorm", "layernorm")
MLPS = ("swiglu", "gelu")  # swiglu: act(gate(x)) * up(x) -> down ; gelu: fc -> act -> proj
POSITIONS = ("rope", "learned")
_DEFAULTS = {  # arch -> (norm, mlp, positions, activation, tied)
    "llama": ("rmsnorm", "swiglu", "rope", "silu", False),
    "gpt2": ("layernorm", "gelu", "learned", "gelu_new", True),
}
LLAMA_MODEL_TYPES = ("llama", "mistral")  # same modules; mistral's sliding window does not change training memory
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "mixtral": "llama",
            "qwen3_moe": "llama", "gpt2": "gpt2"}  # HF model_type -> module layout (arch)
MOE_FAMILIES = ("mixtral", "qwen3_moe")


@dataclass(frozen=True)
class ParamTerm:
    """One named group of parameters. ``count`` is per instance; ``per_layer`` terms repeat ``L`` times.

    ``tp``: ``"shard"`` if tensor parallelism splits it (column/row-parallel weights, column-parallel biases,
    vocab-parallel embedding and head; padded up when not divisible), ``"kv"`` for K/V projections (split by KV head;
    with more TP ranks than KV heads each rank keeps one head, replicated), ``"replicate"`` if every TP rank holds it
    whole (norms, row-parallel biases, position embedding). ``stage``: ``"layer"``, or ``"first"`` / ``"last"``
    pipeline stage for the rest.
    """
    name: str
    count: int
    per_layer: bool
    tp: str
    stage: str
    tensors: int = 1  # how many parameter tensors the HF module holds for this term (optimizers keep per-tensor state)
    expert: bool = False  # one slice per expert: a token uses top_k / experts of it; expert parallelism splits it


@dataclass(frozen=True)
class ModelShape:
    """Decoder-only transformer shape. Unset fields take the family's defaults (see module docstring)."""
    layers: int
    hidden: int
    heads: int
    vocab: int
    arch: str = "llama"
    kv_heads: int | None = None  # None: = heads (multi-head attention)
    ffn: int | None = None  # None: 4·hidden (gpt2); required for llama
    head_dim: int | None = None  # None: hidden // heads
    max_positions: int = 2048
    tied_embeddings: bool | None = None
    norm: str | None = None
    mlp: str | None = None
    positions: str | None = None
    activation: str | None = None  # HF hidden_act / activation_function
    qkv_bias: bool | None = None  # llama: attention_bias (also on o_proj); gpt2: always True
    mlp_bias: bool | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, compare=False, hash=False)
    attn_dropout: float = 0.0  # HF attention_dropout / attn_pdrop
    resid_dropout: float = 0.0  # HF resid_pdrop (gpt2 only; llama has none)
    embd_dropout: float = 0.0  # HF embd_pdrop (gpt2 only)
    name: str = "custom"
    family: str | None = None  # HF model_type (FAMILIES); None: the arch's own (llama, gpt2)
    o_bias: bool | None = None  # llama-style: a bias on o_proj; None: = qkv_bias (qwen2: False)
    qk_norm: bool | None = None  # an RMSNorm over each query and key head (qwen3); None: the family's
    experts: int = 0  # mixture of experts (mixtral, qwen3_moe): experts per MoE layer; 0 = dense
    top_k: int | None = None  # experts each token runs (num_experts_per_tok); None: 2
    expert_ffn: int | None = None  # each expert's intermediate size (qwen3_moe: moe_intermediate_size); None: ffn
    norm_topk: bool | None = None  # renormalise the top-k router weights to sum 1 (mixtral: always)
    aux_loss_coef: float = 0.001  # router_aux_loss_coef: weight of the load-balancing loss

    def __post_init__(self):
        s = object.__setattr__
        choice("arch", self.arch, ARCHS)
        s(self, "family", choice("family", self.family or self.arch, tuple(FAMILIES)))
        if FAMILIES[self.family] != self.arch:
            raise ConfigError(f"family {self.family} is a {FAMILIES[self.family]}-style model, not {self.arch}")
        self._post_init_moe()
        for n in ("layers", "hidden", "heads", "vocab", "max_positions"):
            s(self, n, positive_int(n, getattr(self, n)))
        norm, mlp, pos, act, tied = _DEFAULTS[self.arch]
        s(self, "kv_heads", positive_int("kv_heads", self.kv_heads if self.kv_heads is not None else self.heads))
        if self.ffn is None and self.arch == "llama":
            raise ConfigError("ffn (intermediate_size) is required for a llama-style model")
        s(self, "ffn", positive_int("ffn", self.ffn if self.ffn is not None else 4 * self.hidden))
        if self.head_dim is None and self.hidden % self.heads:
            raise ConfigError(f"hidden ({self.hidden}) is not divisible by heads ({self.heads}); give head_dim")
        s(self, "head_dim", positive_int("head_dim", self.head_dim if self.head_dim is not None
                                         else self.hidden // self.heads))
        if self.heads % self.kv_heads:
            raise ConfigError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        s(self, "tied_embeddings", tied if self.tied_embeddings is None else bool(self.tied_embeddings))
        s(self, "norm", choice("norm", self.norm or norm, NORMS))
        s(self, "mlp", choice("mlp", self.mlp or mlp, MLPS))
        s(self, "positions", choice("positions", self.positions or pos, POSITIONS))
        s(self, "activation", self.activation or act)
        s(self, "qkv_bias", self.arch == "gpt2" if self.qkv_bias is None else bool(self.qkv_bias))
        s(self, "mlp_bias", self.arch == "gpt2" if self.mlp_bias is None else bool(self.mlp_bias))
        for n in ("attn_dropout", "resid_dropout", "embd_dropout"):
            v = getattr(self, n)
            if not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ConfigError(f"{n} must be in [0, 1), got {v!r}")
        s(self, "o_bias", (self.qkv_bias and self.family != "qwen2") if self.o_bias is None else bool(self.o_bias))
        s(self, "qk_norm", self.family in ("qwen3", "qwen3_moe") if self.qk_norm is None else bool(self.qk_norm))
        if self.family == "qwen2" and (not self.qkv_bias or self.o_bias):
            raise ConfigError("qwen2 has a bias on q, k and v and none on o_proj")

    def _post_init_moe(self):
        s = object.__setattr__
        moe = self.family in MOE_FAMILIES
        if not moe:
            if self.experts:
                raise ConfigError(f"experts={self.experts} needs a mixture-of-experts family "
                                  f"({', '.join(MOE_FAMILIES)}), not {self.family}")
            s(self, "top_k", 0)
            return
        s(self, "experts", positive_int("experts", self.experts))
        s(self, "top_k", positive_int("top_k", self.top_k if self.top_k is not None else 2))
        if self.top_k > self.experts:
            raise ConfigError(f"top_k {self.top_k} is more than the {self.experts} experts")
        if self.expert_ffn is not None:
            s(self, "expert_ffn", positive_int("expert_ffn", self.expert_ffn))
        s(self, "norm_topk", True if self.family == "mixtral" else bool(self.norm_topk))
        if not (isinstance(self.aux_loss_coef, (int, float)) and 0 <= self.aux_loss_coef < float("inf")):
            raise ConfigError(f"aux_loss_coef must be a finite number >= 0, got {self.aux_loss_coef!r}")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_ffn(self) -> int:
        """Each expert's intermediate size."""
        return self.expert_ffn or self.ffn

    # ---- derived sizes -------------------------------------------------------------------------------------------
    @property
    def q_width(self) -> int:  # a·d: width of q and of the attention output
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:  # k·d: width of k and of v
        return self.kv_heads * self.head_dim

    def with_(self, **changes) -> "ModelShape":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    # ---- parameters ----------------------------------------------------------------------------------------------
    def param_terms(self) -> list[ParamTerm]:
        """Every parameter of the HF model as a named term (tied weights once)."""
        h, f, V = self.hidden, self.ffn, self.vocab
        qw, kw = self.q_width, self.kv_width
        norm = 2 * h if self.norm == "layernorm" else h  # LayerNorm: weight + bias; RMSNorm: weight
        qkv_bias, mlp_bias = int(self.qkv_bias), int(self.mlp_bias)
        o_bias = int(self.o_bias)  # llama's attention_bias covers o_proj (not qwen2's); gpt2's c_proj always has one
        n_in = 2 if self.mlp == "swiglu" else 1
        nt = 2 if self.norm == "layernorm" else 1  # tensors per norm
        fused = self.arch == "gpt2"  # GPT-2's c_attn holds q, k and v (and their biases) in one tensor each
        t = [ParamTerm("embedding", V * h, False, "shard", "first")]
        if self.positions == "learned":
            t.append(ParamTerm("position_embedding", self.max_positions * h, False, "replicate", "first"))
        t += [
            ParamTerm("attn_norm", norm, True, "replicate", "layer", nt),
            ParamTerm("q_proj", h * qw, True, "shard", "layer"),
            ParamTerm("kv_proj", 2 * h * kw, True, "kv", "layer", 0 if fused else 2),
            ParamTerm("qkv_bias", qw * qkv_bias, True, "shard", "layer"),
            ParamTerm("kv_bias", 2 * kw * qkv_bias, True, "kv", "layer", 0 if fused else 2),
            ParamTerm("o_proj", qw * h, True, "shard", "layer"),
            ParamTerm("o_bias", h * o_bias, True, "replicate", "layer"),
            ParamTerm("qk_norm", 2 * self.head_dim * int(self.qk_norm), True, "replicate", "layer", 2),
            ParamTerm("mlp_norm", norm, True, "replicate", "layer", nt),
        ]
        if self.is_moe:  # the router and the E experts' fused SwiGLU weights (kept whole by TP: replicated)
            E, fe = self.experts, self.moe_ffn
            t += [ParamTerm("router", E * h, True, "replicate", "layer"),
                  ParamTerm("experts_in_proj", E * 2 * fe * h, True, "replicate", "layer", expert=True),
                  ParamTerm("experts_out_proj", E * fe * h, True, "replicate", "layer", expert=True)]
        else:
            t += [ParamTerm("mlp_in_proj", n_in * h * f, True, "shard", "layer", n_in),
                  ParamTerm("mlp_in_bias", n_in * f * mlp_bias, True, "shard", "layer", n_in),
                  ParamTerm("mlp_out_proj", f * h, True, "shard", "layer"),
                  ParamTerm("mlp_out_bias", h * mlp_bias, True, "replicate", "layer")]
        t.append(ParamTerm("final_norm", norm, False, "replicate", "last", nt))
        if not self.tied_embeddings:
            t.append(ParamTerm("lm_head", V * h, False, "shard", "last"))
        return [x for x in t if x.count]

    def param_table(self) -> dict[str, int]:
        """Named terms -> total parameters (per-layer terms multiplied by L), in model order."""
        return {x.name: x.count * (self.layers if x.per_layer else 1) for x in self.param_terms()}

    def num_params(self) -> int:
        return _num_params(self)

    def num_active_params(self) -> int:
        """Parameters a token runs through: every dense one, and ``top_k / experts`` of the experts' (a dense model:
        all). The FLOPs convention of an MoE model (6·N_active per token, ``coursekit.flops``)."""
        total = 0
        for x in self.param_terms():
            n = x.count * (self.layers if x.per_layer else 1)
            total += n * self.top_k // self.experts if x.expert else n
        return total

    def expert_params(self) -> int:
        """Parameters of all experts of all layers (0 for a dense model)."""
        return self.layers * self.expert_params_per_layer()

    def expert_params_per_layer(self) -> int:
        """Parameters of one layer's experts (0 for a dense model)."""
        return _expert_layer(self)

    def num_param_tensors(self) -> int:
        """How many parameter tensors the HF model has (``len(list(model.parameters()))``, tied weights once)."""
        return sum(x.tensors * (self.layers if x.per_layer else 1) for x in self.param_terms())

    def param_numels(self) -> tuple[int, ...]:
        """Sizes of the HF model's parameter tensors in ``model.parameters()`` order (tied weights once).

        This is the order DeepSpeed flattens them in, so ZeRO-1/2 partition boundaries (and which parameters
        straddle them) follow from it; ``coursekit.memory.deepspeed`` uses it for DeepSpeed's exact layout.
        """
        return _param_numels(self)

    def _param_numels(self) -> tuple[int, ...]:
        h, f, V = self.hidden, self.ffn, self.vocab
        qw, kw = self.q_width, self.kv_width
        norm = [h, h] if self.norm == "layernorm" else [h]
        qb, mb = self.qkv_bias, self.mlp_bias

        def linear(n_in, n_out, bias):
            return [n_in * n_out] + ([n_out] if bias else [])

        first = [V * h] + ([self.max_positions * h] if self.positions == "learned" else [])
        if self.arch == "gpt2":  # wte, wpe; ln_1, c_attn, c_proj, ln_2, c_fc, c_proj; ln_f
            layer = (norm + linear(h, qw + 2 * kw, qb) + linear(qw, h, qb) + norm
                     + linear(h, f, mb) * (2 if self.mlp == "swiglu" else 1) + linear(f, h, mb))
        else:  # embed_tokens; q, k, v, o (q_norm, k_norm), the MLP, input_layernorm, post_attention_layernorm; norm
            attn = (linear(h, qw, qb) + linear(h, kw, qb) + linear(h, kw, qb) + linear(qw, h, self.o_bias)
                    + [self.head_dim, self.head_dim] * self.qk_norm)
            E, fe = self.experts, self.moe_ffn
            if self.family == "mixtral":  # block.gate (the router) is built before block.experts
                mlp = [E * h, E * 2 * fe * h, E * h * fe]
            elif self.is_moe:  # qwen3_moe: experts first, then the router
                mlp = [E * 2 * fe * h, E * h * fe, E * h]
            else:
                mlp = linear(h, f, mb) * (2 if self.mlp == "swiglu" else 1) + linear(f, h, mb)
            layer = attn + mlp + norm + norm
        last = norm + ([] if self.tied_embeddings else [V * h])
        return tuple(first + layer * self.layers + last)

    def local_tensors(self) -> tuple[int, int, int]:
        """Parameter tensors per layer, on the first stage only, on the last stage only."""
        return _local_tensors(self)

    def _local_tensors(self) -> tuple[int, int, int]:
        out = {"layer": 0, "first": 0, "last": 0}
        for x in self.param_terms():
            out[x.stage] += x.tensors
        return out["layer"], out["first"], out["last"]

    def params_per_layer(self) -> int:
        return sum(x.count for x in self.param_terms() if x.per_layer)

    def local_params(self, tp: int = 1, ep: int = 1) -> tuple[int, int, int, int]:
        """Parameters one TP (and EP) rank holds: (per layer, first-stage extras, last-stage extras, tied
        embedding). Expert parallelism keeps experts/ep of every expert term."""
        return _local_params(self, tp, ep)

    def _local_params(self, tp: int, ep: int = 1) -> tuple[int, int, int, int]:
        out = {"layer": 0, "first": 0, "last": 0}
        tied = 0
        for x in self.param_terms():
            if x.expert:
                n = x.count // ep
            elif x.tp == "shard":
                n = -(-x.count // tp)
            elif x.tp == "kv":
                n = x.count // self.kv_heads * max(1, self.kv_heads // tp)
            else:
                n = x.count
            out[x.stage] += n
            if x.name == "embedding" and self.tied_embeddings:
                tied = n
        return out["layer"], out["first"], out["last"], tied


@lru_cache(maxsize=1024)  # shapes are immutable; the solvers and grids ask the same shape thousands of times
def _num_params(shape: ModelShape) -> int:
    return sum(shape.param_table().values())


@lru_cache(maxsize=1024)
def _local_tensors(shape: ModelShape) -> tuple[int, int, int]:
    return shape._local_tensors()


@lru_cache(maxsize=1024)
def _expert_layer(shape: ModelShape) -> int:
    return sum(x.count for x in shape.param_terms() if x.expert)


@lru_cache(maxsize=1024)
def _param_numels(shape: ModelShape) -> tuple[int, ...]:
    return shape._param_numels()


@lru_cache(maxsize=4096)
def _local_params(shape: ModelShape, tp: int, ep: int = 1) -> tuple[int, int, int, int]:
    return shape._local_params(tp, ep)


# ---- HF config.json ------------------------------------------------------------------------------------------------
def from_hf_config(config: str | Path | dict, *, name: str | None = None) -> ModelShape:
    """A ModelShape from an HF ``config.json`` (path or dict): ``model_type`` llama / mistral or gpt2."""
    if isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"no such config file: {path}")
        try:
            cfg = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise ConfigError(f"{path} holds a JSON {type(cfg).__name__}, not an object (an HF config.json is one "
                              "object of its fields)")
        name = name or path.parent.name or path.stem
    elif isinstance(config, dict):
        cfg = config
    else:
        raise ConfigError(f"expected a path or a dict, got {type(config).__name__}")
    mt = cfg.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise ConfigError(f"model_type must be a string, got {type(mt).__name__} {mt!r}")
    try:
        if mt in FAMILIES and FAMILIES[mt] == "llama":
            return _from_llama(cfg, name or mt)
        if mt == "gpt2":
            return _from_gpt2(cfg, name or mt)
    except KeyError as e:
        raise ConfigError(f"{mt} config lacks required key {e.args[0]!r}") from None
    raise ConfigError(f"unsupported model_type {mt!r}; supported: {', '.join(FAMILIES)}")


def _rope(cfg: dict) -> tuple[float, dict | None]:
    rp = cfg.get("rope_parameters") or {}  # transformers >= 5 layout
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = {k: v for k, v in rp.items() if k != "rope_theta"} or cfg.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling


def _moe_fields(cfg: dict, mt: str) -> dict:
    """The mixture-of-experts fields of a mixtral / qwen3_moe config (every layer sparse, as in the published
    models; a config with dense layers among them is refused rather than mis-counted)."""
    if mt == "mixtral":
        if cfg.get("router_jitter_noise"):
            raise ConfigError("router_jitter_noise > 0 makes the router random; the course's models use 0")
        return dict(experts=cfg.get("num_local_experts", 8), top_k=cfg.get("num_experts_per_tok", 2),
                    aux_loss_coef=cfg.get("router_aux_loss_coef", 0.001))
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise ConfigError("qwen3_moe with dense layers among the sparse ones (mlp_only_layers, decoder_sparse_step "
                          "> 1) is not modelled; every layer must be sparse")
    return dict(experts=cfg.get("num_experts", 128), top_k=cfg.get("num_experts_per_tok", 8),
                expert_ffn=cfg.get("moe_intermediate_size", 768), norm_topk=cfg.get("norm_topk_prob", False),
                aux_loss_coef=cfg.get("router_aux_loss_coef", 0.001))


def _from_llama(cfg: dict, name: str) -> ModelShape:
    theta, scaling = _rope(cfg)
    heads = cfg["num_attention_heads"]
    mt = cfg["model_type"]
    extra = _moe_fields(cfg, mt) if mt in MOE_FAMILIES else {}
    if mt == "qwen2":
        extra.update(qkv_bias=True, o_bias=False)
    head_dim = cfg.get("head_dim") if mt != "qwen2" else None  # Qwen2 derives it: hidden / heads
    if mt == "qwen3" and head_dim is None:
        head_dim = 128  # Qwen3Config's default
    return ModelShape(
        arch="llama", family=mt, name=name, **extra, layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads, ffn=cfg["intermediate_size"], vocab=cfg["vocab_size"],
        head_dim=head_dim, max_positions=cfg.get("max_position_embeddings", 2048),
        tied_embeddings=cfg.get("tie_word_embeddings", False), activation=cfg.get("hidden_act", "silu"),
        **({} if mt == "qwen2" else {"qkv_bias": mt != "mixtral" and cfg.get("attention_bias", False)}),
        mlp_bias=cfg.get("mlp_bias", False),
        norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
        attn_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
    )


def _from_gpt2(cfg: dict, name: str) -> ModelShape:
    h = cfg.get("n_embd", cfg.get("hidden_size"))
    if h is None:
        raise KeyError("n_embd")
    return ModelShape(
        arch="gpt2", name=name, layers=cfg.get("n_layer", cfg.get("num_hidden_layers")),
        hidden=h, heads=cfg.get("n_head", cfg.get("num_attention_heads")), ffn=cfg.get("n_inner") or 4 * h,
        vocab=cfg["vocab_size"], max_positions=cfg.get("n_positions", 1024),
        tied_embeddings=cfg.get("tie_word_embeddings", True), activation=cfg.get("activation_function", "gelu_new"),
        norm_eps=cfg.get("layer_norm_epsilon", 1e-5), attn_dropout=float(cfg.get("attn_pdrop", 0.1)),
        resid_dropout=float(cfg.get("resid_pdrop", 0.1)), embd_dropout=float(cfg.get("embd_pdrop", 0.1)),
    )
