"""Apply a run's parallelisms to a model in one fixed, documented order (torchtitan's ``parallelize_llama``):

    1. PP split   (coursekit.pp)   keep this rank's stage of blocks
    2. TP         (coursekit.tp)   DTensor plan on the tp sub-mesh
    3. CP         (coursekit.cp)   attention over sequence shards (Module 4)
    4. activation checkpointing    --recompute full: every block (--recompute-layers N: the stage's first N)
                                   recomputes its forward in backward; op:
                                   torchtitan's per-op policy (coursekit.parallel.recompute)
    5. compile                     --compile: torch.compile each block (in place, so wrappers keep their hooks)
    6. data parallel               the strategy's wrap (DDP, ZeRO, FSDP2 ...) in ``strategy.setup``

Why this order: the pipeline split decides which blocks exist here; TP must see plain ``nn.Linear`` modules to
replace their weights by DTensors; checkpointing and compile wrap the already-parallel blocks; data parallelism
comes last because it shards or replicates whatever parameters the earlier steps left (DTensors included).
Each parallelism knows only its own sub-mesh (``ctx.mesh["tp"]``, ...).
"""
from __future__ import annotations

from coursekit.parallel import model_parts
from coursekit.parallel.recompute import enable_op_recompute
from coursekit.spec import registry

__all__ = ["model_parts", "parallelize"]


def parallelize(model, strategy, ctx):
    from coursekit.models import blocks  # torch and transformers: not at import time of the registry

    dims, t = ctx.dims, ctx.opts.train
    for name in registry.ORDER:
        if dims.degree(name) > 1:
            model = registry.parallelism(name)(ctx).apply(model, strategy)
    for lm in model_parts(model):
        if t.recompute == "full":
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if t.recompute_layers is not None:  # Megatron's block method: the stage's first N blocks only
                held = [b for b in blocks(lm) if hasattr(b, "gradient_checkpointing")]  # not other stages' skips
                for block in held[t.recompute_layers:]:
                    block.gradient_checkpointing = False
        elif t.recompute == "op":
            enable_op_recompute(lm)
        if t.compile:
            for block in blocks(lm):
                block.compile()
    return model
