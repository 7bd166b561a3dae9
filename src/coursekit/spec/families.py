"""How each model family is cut by the parallelisms, by submodule name (torchtitan's per-model ``parallelize`` plan):
the parallelisms read this instead of probing attribute names. Pure Python; the names are transformers'.

A family without an entry is refused by TP, CP, PP and EP before launch, naming the family. Adding a family is one
entry here plus its shapes in ``coursekit.memory.shapes`` (and its config keys in ``coursekit.memory.presets``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class FamilyPlan:
    body: str
    """The decoder stack of the causal LM (called with ``input_ids`` or ``inputs_embeds``); the pipeline cuts it."""
    blocks: str
    """The block list inside ``body``: a pipeline stage keeps a contiguous run of them."""
    embed: str
    """The token embedding inside ``body`` (the first stage's)."""
    final_norm: str
    """The final norm inside ``body`` (the last stage's, with the head)."""
    head: str
    """The output projection of the causal LM (the last stage's)."""
    attention: str
    """The attention module of a block (TP prepares its input; CP swaps its kernel)."""
    mlp: str
    """The MLP module of a block (TP prepares its input)."""
    colwise: tuple[str, ...]
    """Projections split by output features (ColwiseParallel): each TP rank its heads or FFN slice."""
    kv: tuple[str, ...]
    """Key/value projections: column-split, or kept whole when there are fewer K/V heads than TP ranks."""
    rowwise: tuple[str, ...]
    """Projections split by input features (RowwiseParallel): partial sums, then all-reduced (or reduce-scattered)."""
    norms: tuple[str, ...]
    """The block's norms, sequence-sharded under sequence parallelism."""
    experts: str | None = None
    """A mixture of experts: the fused experts module of a block (transformers 5's ``mlp.experts``, called with the
    router's top-k ids and weights); expert parallelism replaces it by this rank's slice. None: a dense MLP."""
    router: str | None = None
    """The router of a block (logits over the experts, then top-k)."""
    head_shared: tuple[str, ...] = ()
    """Modules every attention head uses (Qwen3's q/k RMSNorm over ``head_dim``): whole on every TP rank, but each
    rank's gradient covers only its own heads, so TP sums them over its ranks."""


LLAMA = FamilyPlan(body="model", blocks="layers", embed="embed_tokens", final_norm="norm", head="lm_head",
                   attention="self_attn", mlp="mlp", colwise=("self_attn.q_proj", "mlp.gate_proj", "mlp.up_proj"),
                   kv=("self_attn.k_proj", "self_attn.v_proj"), rowwise=("self_attn.o_proj", "mlp.down_proj"),
                   norms=("input_layernorm", "post_attention_layernorm"))

# Mixtral and Qwen3-MoE: Llama's attention (Qwen3's q/k norms live inside it), a sparse MLP block ``mlp`` holding
# the router ``mlp.gate`` and the fused experts ``mlp.experts``. TP splits the attention only (the experts are EP's).
MOE = FamilyPlan(body="model", blocks="layers", embed="embed_tokens", final_norm="norm", head="lm_head",
                 attention="self_attn", mlp="mlp", colwise=("self_attn.q_proj",),
                 kv=("self_attn.k_proj", "self_attn.v_proj"), rowwise=("self_attn.o_proj",),
                 norms=("input_layernorm", "post_attention_layernorm"), experts="mlp.experts", router="mlp.gate")

# Qwen3 and Qwen3-MoE: the Llama / MoE layout plus the q/k norms inside the attention, shared by all heads
QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
QWEN3, QWEN3_MOE = replace(LLAMA, head_shared=QK_NORMS), replace(MOE, head_shared=QK_NORMS)

# coursekit.memory.shapes' family (the HF model_type) -> plan: Llama 2/3, Mistral, Qwen2 (biases) share the Llama layout
PLANS = {"llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "qwen3": QWEN3, "mixtral": MOE, "qwen3_moe": QWEN3_MOE}


def plan_for(family: str, what: str, model: str) -> FamilyPlan:
    """The plan of ``family``; a ValueError naming the family and the parallelism (``what``) otherwise."""
    if family not in PLANS:
        raise ValueError(f"{what} has no plan for {model} ({family}); families with one: {', '.join(PLANS)}")
    return PLANS[family]
