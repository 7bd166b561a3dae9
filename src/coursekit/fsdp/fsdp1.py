"""FSDP1 (``FullyShardedDataParallel``), as existing code bases use it, on the same flags as FSDP2. GPU only: torch
2.13 refuses FSDP1 without an accelerator ("FSDP needs a non-CPU accelerator device"), so on CPU the strategy is
refused before launch and its tests skip (tests/test_fsdp_variants.py).

    coursekit train --strategy fsdp1 --nproc 2                              # ShardingStrategy.FULL_SHARD
    coursekit train --strategy fsdp1 --nproc 2 --reshard-after-forward false   # SHARD_GRAD_OP
    coursekit train --strategy fsdp1 --dp-replicate 2 --dp-shard 2          # HYBRID_SHARD on a 2-D mesh

How each FSDP1 argument maps onto FSDP2 (``fully_shard``), which the course teaches:

    FSDP1 (FullyShardedDataParallel)                   FSDP2 (fully_shard)              coursekit flag
    sharding_strategy=FULL_SHARD                        reshard_after_forward=True       --reshard-after-forward true
    sharding_strategy=SHARD_GRAD_OP                     reshard_after_forward=False      --reshard-after-forward false
    sharding_strategy=HYBRID_SHARD (+ device_mesh)      2-D mesh (replicate, shard)      --strategy hsdp
    auto_wrap_policy=transformer_auto_wrap_policy       fully_shard(block) per block     --wrap block
    (no auto_wrap_policy: one FlatParameter)            fully_shard(model) only          --wrap root
    mixed_precision=MixedPrecision(bf16, fp32 reduce)   mp_policy=MixedPrecisionPolicy   --dtype bf16
    cpu_offload=CPUOffload(offload_params=True)         offload_policy=CPUOffloadPolicy  --offload cpu
    backward_prefetch=BACKWARD_PRE, forward_prefetch    set_modules_to_{forward,backward}_prefetch  --prefetch N
    model.no_sync()                                     set_requires_gradient_sync(False)   (--grad-accum)
    use_orig_params=True                                parameters are DTensors already

The difference a learner sees: FSDP1 flattens each unit's parameters into one ``FlatParameter`` and shards that
(padding the flat buffer to a multiple of N), FSDP2 shards every parameter on dim 0 (per-parameter DTensors).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from coursekit.fsdp import FSDPOptions, rules
from coursekit.fsdp.rules import reshard_value
from coursekit.parallel.api import Strategy
from coursekit.parallel.compose import model_parts


class FSDP1(rules.FSDP1, Strategy):
    """What it supports and its checks before launch (GPU only, FSDP1's flags): ``rules.FSDP1``."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.fo = self.opts.of(FSDPOptions)
        self.mp_dtype, self.autocast_dtype = self.autocast_dtype, None  # bf16 through MixedPrecision

    def sharding_strategy(self):
        from torch.distributed.fsdp import ShardingStrategy

        if self.ctx.dims.degrees["dp_replicate"] > 1:
            return ShardingStrategy.HYBRID_SHARD
        full = reshard_value(self.fo.reshard_after_forward)
        return ShardingStrategy.FULL_SHARD if full else ShardingStrategy.SHARD_GRAD_OP

    def wrap(self, model):
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        from coursekit.models import blocks

        strategy = self.sharding_strategy()
        mesh = (self.ctx.mesh.root["dp_replicate", "dp_shard"] if strategy.name == "HYBRID_SHARD"
                else self.ctx.mesh["fsdp"])
        policy = None
        if self.fo.wrap == "block":
            policy = functools.partial(transformer_auto_wrap_policy,
                                       transformer_layer_cls={type(b) for lm in model_parts(model) for b in blocks(lm)})
        mp = (MixedPrecision(param_dtype=self.mp_dtype, reduce_dtype=torch.float32, buffer_dtype=self.mp_dtype)
              if self.mp_dtype is not None else None)
        return FSDP(model, auto_wrap_policy=policy, sharding_strategy=strategy, device_mesh=mesh,
                    mixed_precision=mp, cpu_offload=CPUOffload(offload_params=self.fo.offload == "cpu"),
                    backward_prefetch=BackwardPrefetch.BACKWARD_PRE if self.fo.prefetch else None,
                    forward_prefetch=bool(self.fo.prefetch), use_orig_params=True,
                    device_id=self.device if self.device.type == "cuda" else None)

    def sync_context(self, micro: int, n_micro: int):
        return contextlib.nullcontext() if micro == n_micro - 1 else self.model.no_sync()

    def param_sq_sum(self) -> float:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(self.model, writeback=False):
            return float(sum(p.detach().double().pow(2).sum().cpu() for p in self.model.parameters()))
