"""Run a Hugging Face causal LM with context-parallel attention: the model file stays untouched.

    use_cp_attention(model, "ring", group)                 # every attention layer now runs coursekit.cp.ring
    batch = shard_batch(input_ids, cp, rank, layout=layout_for("ring"))
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                labels=batch["shift_labels"], shift_labels=batch["shift_labels"], num_items_in_batch=n_labelled)
    # out.loss = this rank's share of the global mean; all-reduce (sum) losses and gradients over the CP group

transformers looks attention up by name (``AttentionInterface``): we register one that calls our attention with the
layer's q, k, v — already rotated by RoPE at the *global* positions we pass in ``position_ids`` — and returns
(b, s/C, heads, d) as HF's own kernels do. The causal mask is built inside our attention (a mask over the local
s/C rows would be wrong), so the matching mask function returns None: no mask tensor is built at all.
"""
from __future__ import annotations

from coursekit.cp import attention


def use_cp_attention(model, impl: str, group=None):
    """Switch every attention layer of ``model`` to ``impl`` ('ulysses' or 'ring') over ``group``; returns model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    fn = attention(impl)
    name = f"coursekit_cp_{impl}"

    def forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
        if dropout:
            raise ValueError("coursekit.cp attention has no attention dropout; set attention_dropout=0")
        out = fn(query, key, value, group=group, causal=True, scale=scaling)
        return out.transpose(1, 2), None  # (b, s/C, heads, d), no attention weights

    # registered per call, closing over this group (one CP group per process in a training job)
    AttentionInterface.register(name, forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, lambda *args, **kwargs: None)
    model.set_attn_implementation(name)
    return model
