"""FSDP2 strategies: ``fsdp2`` (shard over the ``fsdp`` group) and ``hsdp`` (replicate × shard on a 2-D mesh).

    coursekit train --strategy fsdp2 --nproc 4 --reshard-after-forward false
    coursekit train --strategy hsdp --dp-replicate 2 --dp-shard 2 --dtype bf16

``fully_shard`` turns every parameter into a DTensor sharded on dim 0 over the mesh (Shard(0): each rank keeps
rows ceil(n/N)·r ... of it, the last rank padded). Each wrapped unit (a block, a pair of blocks, the root) is one
all-gather before its forward (and again before its backward when it resharded) and one reduce-scatter of its
gradients after its backward. HSDP adds an all-reduce of the reduce-scattered shards across replicas. Order: the
blocks first, then the root (which takes whatever is left: embeddings, final norm, head).

``--compile`` compiles each block before it is wrapped; ``--compile-model`` compiles the whole wrapped model (dynamo
breaks the graph at FSDP2's hooks, which it is told not to trace: 5 graphs for tiny-llama, equal to eager).

``--dtype bf16`` is FSDP2's MixedPrecisionPolicy (bf16 compute copies, fp32 gradient reduction, fp32 sharded
master weights), not autocast. FSDP1 (``FullyShardedDataParallel``) maps onto these arguments as: ShardingStrategy.
FULL_SHARD → reshard_after_forward=True, SHARD_GRAD_OP → False, HYBRID_SHARD → a 2-D mesh (``hsdp``),
``transformer_auto_wrap_policy`` → ``--wrap block``, ``CPUOffload(offload_params=True)`` → ``--offload cpu``.
"""
from __future__ import annotations

import contextlib

import torch

from coursekit.fsdp import FSDPOptions, rules
from coursekit.fsdp.rules import reshard_value
from coursekit.parallel import split
from coursekit.parallel.api import Strategy
from coursekit.parallel.compose import model_parts


class FSDP2(rules.FSDP2, Strategy):
    """Its checks before launch: ``rules.FSDP2`` (torch-free)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.fo = self.opts.of(FSDPOptions)
        self.mp_dtype, self.autocast_dtype = self.autocast_dtype, None  # bf16 through the policy, not autocast

    def dp_mesh(self):
        return self.ctx.mesh["fsdp"]

    def wrap(self, model):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        from coursekit.models import blocks

        kw = dict(mesh=self.dp_mesh(), reshard_after_forward=reshard_value(self.fo.reshard_after_forward))
        if self.mp_dtype is not None:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=self.mp_dtype, reduce_dtype=torch.float32)
        kw["offload_policy"] = (CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if self.fo.offload == "cpu"
                                else OffloadPolicy())
        # a parallelism's hand-split modules (expert slices) first, each sharded (and its gradient averaged) over
        # the ranks holding the same slice (coursekit.parallel.split)
        for m in split.split_modules(model):
            fully_shard(m, **dict(kw, mesh=m._coursekit_split.replicas))
        # the blocks of every LM this rank holds (pipeline stages too); pipeline placeholders hold no parameters
        units = [b for lm in model_parts(model) for b in blocks(lm) if any(True for _ in b.parameters())]
        if self.fo.wrap == "pair":
            units = [units[i:i + 2] for i in range(0, len(units), 2)]
        if self.fo.wrap != "root":
            for u in units:
                fully_shard(u, **kw)
        self.units = [u if isinstance(u, torch.nn.Module) else u[0] for u in units] if self.fo.wrap != "root" else []
        # the root's forward ends where its backward starts: resharding it would only gather it again at once
        fully_shard(model, **dict(kw, reshard_after_forward=False))
        if self.fo.prefetch and self.units:
            n = self.fo.prefetch
            for i, u in enumerate(self.units):
                u.set_modules_to_forward_prefetch(self.units[i + 1:i + 1 + n])
                u.set_modules_to_backward_prefetch(self.units[max(0, i - n):i][::-1])
            if self.device.type == "cpu":
                # No streams on the host: with FSDP2's default async_op=False a prefetched all-gather blocks the
                # training thread however early it is issued. async_op=True hands it to gloo's thread and waits for
                # it only when the unit is needed, so it runs while the current unit computes (on CUDA the
                # all-gather stream does that, and FSDP2's default stays).
                model._set_unshard_async_op(True)
        if self.fo.compile_model:  # in place: the state dict keeps its names (no ``_orig_mod.`` prefix) for DCP
            model.compile()
        return model

    def train_step(self, micro_batches: list, measure: bool = False):
        """The plain step; the measured one (the last) also counts its collectives (``coursekit.comm.counter``)."""
        if not measure:
            return super().train_step(micro_batches)
        from coursekit.comm.counter import CollectiveCounter

        with CollectiveCounter() as cc:
            loss = super().train_step(micro_batches, measure=True)
        self.collectives = cc.step_plan()
        self.last_state_bytes["collectives"] = self.collectives  # held bytes were taken inside the step
        return loss

    def state_bytes(self) -> dict:
        out = super().state_bytes()
        out["collectives"] = getattr(self, "collectives", None)
        out["units"] = [unit_shapes(u) for u in self.units] + [unit_shapes(self.model, root=True)]
        return out

    def sync_context(self, micro: int, n_micro: int):
        if micro == n_micro - 1:
            return contextlib.nullcontext()
        self.model.set_requires_gradient_sync(False)  # gradients accumulate; one reduce-scatter, at the last
        return _restore_sync(self.model)


class HSDP(rules.HSDP, FSDP2):
    """Its checks before launch: ``rules.HSDP`` (no CP)."""

    def dp_mesh(self):
        return self.ctx.mesh.root["dp_replicate", "dp_shard"]


def unit_shapes(module, root: bool = False) -> list[list[int]]:
    """Global shapes of the parameters one ``fully_shard`` unit gathers (the root: those no block owns)."""
    from torch.distributed.fsdp import FSDPModule

    state = module._get_fsdp_state() if isinstance(module, FSDPModule) else None
    group = state._fsdp_param_group if state is not None else None
    return [list(fp._orig_size) for fp in group.fsdp_params] if group is not None else []


@contextlib.contextmanager
def _restore_sync(model):
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
