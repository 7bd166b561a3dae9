"""Single process and DistributedDataParallel (Module 1 baseline).

DDP all-reduces gradients in buckets while backward runs; with gradient accumulation the first micro-batches run
under ``no_sync()`` so only the last one communicates.
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from coursekit.strategies.base import Strategy


class Single(Strategy):
    name = "single"

    def __init__(self, args, info):
        if info.world_size != 1:
            raise ValueError(f"strategy 'single' runs on 1 process, but the world size is {info.world_size}; "
                             "use --strategy ddp (or another parallel strategy) for more")
        super().__init__(args, info)


class DDP(Strategy):
    name = "ddp"

    def wrap(self, model):
        ids = [self.device.index] if self.device.type == "cuda" else None
        bucket_mb = getattr(self.args, "bucket_mb", None) or 25
        # gradient_as_bucket_view: .grad tensors are views into DDP's flat buckets, so gradients cost Ψ bytes once
        # (not once in .grad and again in the buckets) and the measured bytes equal the 16Ψ model exactly.
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)

    def sync_context(self, micro: int, n_micro: int):
        return self.model.no_sync() if micro < n_micro - 1 else super().sync_context(micro, n_micro)
