"""Context parallelism in the trainer: every attention layer runs ``coursekit.cp`` over the ``cp`` sub-mesh.

The data path gives each CP rank its part of every sequence (``data_cut``: ``coursekit.data.micro_batches`` with
the layout the implementation expects: zig-zag for ring, contiguous for Ulysses) together with its labels and global
position ids, so RoPE rotates each token at its true position. Parameters are replicated over CP ranks; their
gradients are averaged with the data-parallel ones (the strategy reduces over ``loss`` = dp × cp, or FSDP shards
over ``fsdp`` = dp_shard × cp).
"""
from __future__ import annotations

from coursekit.cp.options import CPOptions
from coursekit.parallel import model_parts
from coursekit.spec.families import plan_for


class ContextParallel:
    name = "cp"

    @classmethod
    def check(cls, opts, dims) -> None:
        from coursekit.memory.calculator import resolve_model
        from coursekit.parallel import LayoutError, check_model

        shape = resolve_model(opts.train.model)
        impl = opts.of(CPOptions).cp_impl
        plan_for(shape.family, "--cp", opts.train.model)
        try:
            check_model(dims, num_layers=shape.layers, num_heads=shape.heads, num_kv_heads=shape.kv_heads,
                        seq=opts.train.seq, cp_impl=impl)
        except LayoutError as e:
            raise ValueError(str(e)) from None
        if shape.attn_dropout:
            raise ValueError("--cp attention has no dropout; the model's attention_dropout must be 0")
        if opts.train.attention != "sdpa":
            raise ValueError("--cp replaces the attention kernel; --attention eager does not apply")

    @staticmethod
    def data_cut(opts, dims, rank: int):
        """This rank's part of every sequence (``coursekit.data.micro_batches``' ``cut``), in the layout the attention
        implementation expects."""
        from coursekit.cp.shard import cutter, layout_for

        return cutter(dims.cp, dims.coord(rank, "cp"), layout_for(opts.of(CPOptions).cp_impl))

    def __init__(self, ctx):
        self.ctx = ctx

    def apply(self, model, strategy):
        from coursekit.cp.hf import use_cp_attention

        for lm in model_parts(model):
            use_cp_attention(lm, self.ctx.opts.of(CPOptions).cp_impl, group=self.ctx.mesh["cp"].get_group())
        return model
