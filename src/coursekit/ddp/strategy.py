"""``single`` (one process) and ``ddp`` (PyTorch DistributedDataParallel) — Module 1's data parallelism.

DDP replicates the model on every rank of its sub-mesh (``loss``: the data-parallel ranks, and the context-parallel
ones, which hold the same weights and see different tokens) and averages gradients with bucketed all-reduces that
start during backward. Gradient accumulation skips the all-reduce on all but the last micro-batch (``no_sync``).

A tensor-parallel model holds DTensor parameters, which DDP's flat buckets cannot take ("mixed torch.Tensor and
DTensor"), and a pipeline stage runs several backwards per step in an order DDP's bucket rebuild does not expect
(its reducer asserts); there the same replication is done by torch's composable ``replicate`` (built on FSDP2's
machinery, no sharding), which understands the 2-D mesh and which the pipeline schedule drives itself.
"""
from __future__ import annotations

import contextlib
import warnings

from torch.nn.parallel import DistributedDataParallel

from coursekit.ddp import DDPOptions
from coursekit.parallel import split
from coursekit.parallel.api import Strategy, no_gradient_sync


class Single(Strategy):
    name = "single"

    def __init__(self, ctx):
        if ctx.info.world_size != 1:
            raise ValueError(f"strategy 'single' runs on 1 process, but the world size is {ctx.info.world_size}; "
                             "use --strategy ddp (or another parallel strategy) for more")
        super().__init__(ctx)


class DDP(Strategy):
    name = "ddp"

    @classmethod
    def wraps_stages(cls, dims) -> bool:
        return dims.size("loss") > 1 or dims.tp > 1  # one replica and no DTensors: nothing to average (wrap)

    def wrap(self, model):
        from torch.distributed.tensor import DTensor

        mesh = self.ctx.mesh["loss"]
        tensor_parallel = any(isinstance(p, DTensor) for p in model.parameters())
        if self.pipeline is not None and mesh.size() == 1 and not tensor_parallel:
            self.composable = False  # one replica: nothing to average; zero-bubble schedules need bare stages
            return model
        if self.pipeline is not None or tensor_parallel:
            from torch.distributed._composable.replicate_with_fsdp import replicate

            self.composable = True
            # replicate's root warns when the model returns a view (under TP the logits are one): an
            # in-place op on it would skip the pre-backward hook. The loss (parallel.loss) reads it out of place.
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(Replicate", category=UserWarning)
            for m in split.split_modules(model):  # expert slices: averaged over the ranks holding the same slice only
                replicate(m, mesh=m._coursekit_split.replicas)
            return replicate(model, mesh=mesh)
        self.composable = False
        hand = split.split_params(model)  # expert slices: not the same on every rank, so not in DDP's buckets
        if hand:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(hand))
            split.reduce_in_hooks(model)
        ids = [self.device.index] if self.device.type == "cuda" else None
        bucket_mb = self.opts.of(DDPOptions).bucket_mb or 25
        # gradient_as_bucket_view: .grad tensors are views into DDP's flat buckets, so gradients cost Ψ bytes once
        # (not once in .grad and again in the buckets) and the measured bytes equal the 16Ψ model exactly.
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True,
                                       process_group=mesh.get_group())

    def sync_context(self, micro: int, n_micro: int):
        if micro == n_micro - 1:
            return contextlib.nullcontext()
        if self.composable:  # FSDP2-style: skip the gradient all-reduce until the last micro-batch
            return no_gradient_sync(self.model)
        return self.model.no_sync()
