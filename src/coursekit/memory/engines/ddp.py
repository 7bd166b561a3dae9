"""DDP (``torch.nn.parallel.DistributedDataParallel``): every rank holds everything; gradients are all-reduced.

Parameters, gradients, master weights and optimizer states are replicated on every data-parallel rank. The
optimizer is torch's (Adam/AdamW keep a 4-byte fp32 ``step`` per parameter tensor); the foreach implementation
allocates about one parameter-sized temporary during the step.

DDP's reducer all-reduces gradients in buckets. With ``gradient_as_bucket_view=True`` (what coursekit's trainer sets,
``coursekit.ddp.strategy``) each ``.grad`` is a view into its bucket: gradients cost G·Ψ once and the buckets add
nothing (checked against a live run, tests/test_memory_engines.py). With torch's default (``False``;
``TrainConfig.ddp_bucket_view=False``) the buckets are a second copy of all gradients, counted as communication
buckets.

``precision="fp32"`` with ``dtype="bf16"`` is torch autocast, as the trainer runs ``--dtype bf16``: fp32 weights,
gradients and AdamW states (16Ψ, no separate master copy), bf16 compute.
"""
from __future__ import annotations

from coursekit.memory.engines.base import Engine, state_result
from coursekit.memory.errors import ConfigError
from coursekit.memory.states import OPTIMIZERS, PRECISION_TEXT, PRECISIONS


class DDP(Engine):
    name = "ddp"
    autocast = True

    def check(self, *, zero: int, offload: str, offload_params: str) -> None:
        super().check(zero=zero, offload=offload, offload_params=offload_params)
        if offload_params != "none":
            raise ConfigError("parameter offload needs ZeRO-3 or FSDP2 (parameters must be sharded)")
        if offload != "none":
            raise ConfigError("DDP has no offload; use DeepSpeed ZeRO or FSDP2")

    def formula(self, params, *, precision, optimizer, zero, shard, offload, offload_params, param_tensors):
        P, G, M, GC, S = PRECISIONS[precision]
        K = S * OPTIMIZERS[optimizer]
        shards = dict(param=P * params / 1.0, grad=G * params / 1.0, master=M * params / 1.0,
                      state=K * params / 1.0 + self.counters(optimizer, param_tensors), gc=GC * params / 1.0)
        temps = (M or P) * params  # torch foreach AdamW temporaries
        return state_result(shards, 0.0, temps, 0.0, 0.0, PRECISION_TEXT[precision])

    def buckets(self, c, P, params, largest_unit):
        if c.dp * c.cp == 1 or c.ddp_bucket_view:  # bucket views: the buckets are the gradients, counted once
            return 0, 0
        G = PRECISIONS[c.precision][1]
        return G * params, G * params  # reducer bucket buffers cover all gradients (gradient_as_bucket_view=False)
