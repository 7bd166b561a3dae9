"""FSDP2 (``torch.distributed.fsdp.fully_shard``; HSDP with a 2-D mesh): every rank holds 1/N of everything.

N is the sharding degree: dp · cp, or the HSDP shard group · cp (``TrainConfig.shard_degree``). Sharded parameters
are kept in the master dtype (fp32 when mixed) and are the optimizer's master copy; sharded gradients are in that
dtype too. Compute uses unsharded units in the compute dtype: one per transformer block plus the embedding and the
head (torchtitan's wrapping), freed after forward unless ``reshard_after_forward=False`` (``fsdp_reshard``).
Backward reduce-scatters one unit's unsharded gradients, cast to the fp32 reduce dtype when mixed. torch's foreach
AdamW allocates about one sharded-parameter-sized temporary during the step. ``CPUOffloadPolicy`` moves the sharded
parameters, gradients and optimizer states to the CPU, and the step runs there.
"""
from __future__ import annotations

from coursekit.memory.engines.base import Engine, state_result, unsharded_units
from coursekit.memory.errors import ConfigError
from coursekit.memory.states import OPTIMIZERS, PRECISION_TEXT, PRECISIONS


class FSDP2(Engine):
    name = "fsdp2"
    hybrid_shard = True
    autocast = True  # precision fp32 + dtype bf16: fp32 shards and units, bf16 compute (no MixedPrecisionPolicy)

    def check(self, *, zero: int, offload: str, offload_params: str) -> None:
        super().check(zero=zero, offload=offload, offload_params=offload_params)
        if "nvme" in (offload, offload_params):
            raise ConfigError("FSDP2 offloads to the CPU only (CPUOffloadPolicy); NVMe offload is DeepSpeed's")

    def formula(self, params, *, precision, optimizer, zero, shard, offload, offload_params, param_tensors):
        P, G, M, GC, S = PRECISIONS[precision]
        K = S * OPTIMIZERS[optimizer]
        N = shard
        store = M or P
        shards = dict(param=store * params / N, grad=store * params / N, master=0.0,
                      state=K * params / N + self.counters(optimizer, param_tensors), gc=GC * params / N)
        temps = store * params / N
        cpu = 0.0
        if offload != "none" or offload_params != "none":  # CPUOffloadPolicy moves the whole sharded state
            cpu = sum(shards.values())
            shards = dict.fromkeys(shards, 0.0)
            temps = 0.0  # the step runs on the CPU
        text = f"{PRECISION_TEXT[precision]} (FSDP2: sharded fp32 params are the master copy)" if M else \
            PRECISION_TEXT[precision]
        return state_result(shards, 0.0, temps, cpu, 0.0, text)

    def units(self, c, P, stage):
        return unsharded_units(P, stage, keep_all=not c.fsdp_reshard)

    def buckets(self, c, P, params, largest_unit):
        reduce = 4 if PRECISIONS[c.precision][2] else P  # unsharded grads of one unit, cast to the fp32 reduce dtype
        return (P + reduce) * largest_unit if c.dp * c.cp > 1 else 0, 0

    def shards_over_dp(self, c) -> bool:
        return True
