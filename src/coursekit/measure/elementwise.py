"""Element-wise traffic of one transformer layer as the eager modeling code runs it, counted op by op.

Every aten op of one layer's forward and backward, except the GEMMs and the attention kernel, reads its tensor
inputs and writes its outputs once from memory: on a GPU each is its own kernel (the hidden tensors of a training
micro-batch are far larger than the L2 cache), so the sum of their bytes is the layer's element-wise HBM traffic.
A ``TorchDispatchMode`` sees each op with its real tensors (views and in-place aliases move nothing and are not
counted); the model is the course's own (``coursekit.models.build_model``, transformers' modeling code), in bf16.
One layer's share is the model with two layers minus the model with one (embedding, head and loss cancel).

The planner (``coursekit.plan.steptime``, pure Python) prices eager element-wise work with coefficients read from
these counts (``ELEMENTWISE``); tests/test_elementwise.py measures shapes the coefficients were not read from.
Op bytes do not depend on the device: the same ops run on CPU and CUDA in eager mode (the attention kernel aside,
which is left out here on both).
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from coursekit.models import build_model

# aten ops priced elsewhere by the planner: the GEMMs (a roofline each) and the attention kernel
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_grouped_mm"})
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


class ElementwiseBytes(TorchDispatchMode):
    """Bytes read + written by the element-wise ops run under it (``total``; ``by_op`` per aten op name)."""

    def __init__(self):
        super().__init__()
        self.total = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        if name in GEMM_OPS or any(k in name for k in ATTENTION_OPS):
            return out
        ins = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr() for t in ins}
        fresh = [o for o in outs if o.untyped_storage().data_ptr() not in storages]
        if outs and not fresh and not func._schema.is_mutable:  # a view moves nothing (an in-place op does)
            return out
        n = sum(t.numel() * t.element_size() for t in ins if t.dim() > 0 and not t.is_meta)
        n += sum(o.numel() * o.element_size() for o in outs)
        self.total += n
        self.by_op[name] = self.by_op.get(name, 0) + n
        return out


def _model_bytes(config: dict, layers: int, seq: int, batch: int, dtype) -> int:
    model = build_model({**config, "num_hidden_layers" if config.get("model_type") != "gpt2" else "n_layer": layers},
                        dtype=dtype, seed=0)
    model.train()
    ids = torch.randint(0, config.get("vocab_size", 256), (batch, seq))
    with ElementwiseBytes() as c:
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
    return c.total


def layer_elementwise_bytes(config: dict, *, seq: int = 128, batch: int = 2, dtype=torch.bfloat16) -> float:
    """Element-wise bytes per token of one layer, forward + backward (a HF config dict with ``model_type``, as
    ``coursekit.memory.presets.to_hf_config_dict`` writes), in ``dtype``."""
    torch.manual_seed(0)
    return (_model_bytes(config, 2, seq, batch, dtype) - _model_bytes(config, 1, seq, batch, dtype)) / (seq * batch)
