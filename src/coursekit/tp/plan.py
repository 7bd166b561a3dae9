"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with DTensor: the plan is a dictionary, as in torchtitan.

Per transformer block, on the ``tp`` sub-mesh:

    q_proj, k_proj, v_proj, gate_proj, up_proj   ColwiseParallel   weight rows split: each rank its heads / FFN slice
    o_proj, down_proj                            RowwiseParallel   weight columns split: partial sums, all-reduced

So each block does one all-reduce after attention and one after the MLP in forward (Megatron's "g"), and one each
in backward at the block's input (its "f"); between them everything stays local. Embeddings, norms and the head
stay replicated (their gradients are equal on every TP rank because the all-reduces make their inputs equal).
Module 4 deepens this: sequence parallelism for the norms, loss-parallel head, replicated KV heads for GQA.
"""
from __future__ import annotations


class TensorParallel:
    name = "tp"

    @classmethod
    def check(cls, opts, dims) -> None:
        from coursekit.memory.calculator import resolve_model

        shape = resolve_model(opts.train.model)
        if shape.arch != "llama":
            raise ValueError(f"--tp splits Llama-style projections; {opts.train.model} is {shape.arch}")
        if shape.kv_heads % dims.tp:
            raise ValueError(f"--tp {dims.tp} needs key/value heads divisible by it ({shape.kv_heads} here); "
                             "replicated KV heads are Module 4's")

    def __init__(self, ctx):
        self.ctx = ctx

    def plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        col, row = ColwiseParallel, RowwiseParallel
        return {"self_attn.q_proj": col(), "self_attn.k_proj": col(), "self_attn.v_proj": col(),
                "self_attn.o_proj": row(), "mlp.gate_proj": col(), "mlp.up_proj": col(), "mlp.down_proj": row()}

    def apply(self, model, strategy):
        from torch.distributed.tensor.parallel import parallelize_module

        from coursekit.models import blocks

        mesh = self.ctx.mesh["tp"]
        lm = model.lm if hasattr(model, "lm") else model  # a pipeline stage wraps the HF model
        for block in blocks(lm):
            if hasattr(block, "self_attn"):  # a pipeline stage keeps placeholders for other stages' blocks
                parallelize_module(block, mesh, self.plan())
        return model
