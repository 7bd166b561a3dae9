"""Expert parallelism in the trainer: every MoE layer keeps this rank's slice of its experts (``dispatch.py``).

EP borrows its ranks from the ``loss`` group (data × context parallel), as torchtitan and Megatron-Core do: with
``--nproc 4 --ep 2`` ranks 0, 1 share the experts of each layer (rank 0 experts 0 ... E/2 - 1, rank 1 the rest) and
so do ranks 2, 3, while all four still see different data. The attention, the router, the embeddings and the norms
stay data-parallel (averaged by DDP, sharded by FSDP2); the expert slices are ``coursekit.parallel.split``
parameters: their gradient (every EP rank's tokens, through the all-to-all) is scaled by 1/ep and averaged over
``ep_rest`` (ranks 0, 2 and ranks 1, 3: the same slice), which makes it the mean over all loss ranks.
"""
from __future__ import annotations

from coursekit.ep import EPOptions
from coursekit.memory.calculator import resolve_model
from coursekit.parallel import model_parts
from coursekit.spec.families import plan_for


class ExpertParallel:
    name = "ep"

    @classmethod
    def check(cls, opts, dims) -> None:
        shape, ep, model = resolve_model(opts.train.model), dims.ep, opts.train.model
        if not shape.is_moe:
            raise ValueError(f"--ep {ep} needs a mixture-of-experts model; {model} ({shape.family}) is dense (try "
                             "tiny-qwen3-moe or tiny-mixtral)")
        plan_for(shape.family, "--ep", model)
        if shape.experts % ep:
            raise ValueError(f"--ep {ep} does not divide the {shape.experts} experts of {model}")
        if opts.train.compile:
            raise ValueError("--ep with --compile is not supported yet (the dispatch's uneven all-to-all splits are "
                             "data-dependent: a graph break per layer); expert parallelism composes with data, "
                             "FSDP2/HSDP, tensor, pipeline and context parallelism, recompute and DCP checkpoints")

    def __init__(self, ctx):
        self.ctx = ctx

    def apply(self, model, strategy):
        from coursekit.ep.dispatch import ExpertShard  # torch: not at import time, so `check` stays light
        from coursekit.models import blocks
        from coursekit.parallel.split import Split, mark

        ctx, o = self.ctx, self.ctx.opts.of(EPOptions)
        family = plan_for(resolve_model(ctx.opts.train.model).family, "--ep", ctx.opts.train.model)
        group = ctx.mesh["ep"].get_group()
        split = Split(group=group, replicas=ctx.mesh["ep_rest"])
        rank = ctx.dims.coord(ctx.info.rank, "ep")
        parent, _, leaf = family.experts.rpartition(".")
        for lm in model_parts(model):
            for block in blocks(lm):
                if not hasattr(block, parent.partition(".")[0]):
                    continue  # a pipeline stage keeps placeholders for the other stages' layers
                moe = block.get_submodule(parent)
                shard = ExpertShard(getattr(moe, leaf), group=group, rank=rank, size=ctx.dims.ep,
                                    capacity_factor=o.capacity_factor)
                shard.grad_scale = 1 / ctx.dims.ep  # the all-to-all summed ep ranks' losses: make it their mean
                mark(shard, split)
                setattr(moe, leaf, shard)
        return model
