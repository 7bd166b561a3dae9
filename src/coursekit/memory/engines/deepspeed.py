"""DeepSpeed ZeRO stages 0-3, ZeRO-Offload and ZeRO-Infinity, on one data-parallel rank.

Stage 1 shards the fp32 master weights and optimizer states over the N data-parallel ranks (dp · cp), stage 2 also
the gradients, stage 3 also the parameters. At the optimizer step DeepSpeed turns each rank's gradient partition
into an fp32 copy (+4Ψ/N that the paper's 16Ψ formula omits; none when gradients already are fp32), and in fp32
runs its ZeRO optimizers still clone an fp32 master partition. FusedAdam: no step temporaries, no per-tensor state.
ZeRO-3 builds that fp32 copy one sub-group (``sub_group_size`` elements) at a time and frees it before the next: its
step holds the largest sub-group's (exact layout; the Ψ formula charges the whole partition and says so).

Where the calculator knows the model's tensors and the whole model is on every rank (no TP/PP; 16psi or fp32), the
bytes are DeepSpeed's exact layout (``coursekit.memory.deepspeed``: padding, the per-rank gradient partition,
offload staging buffers, NVMe swap files); otherwise the Ψ formula below.

Offload: ZeRO-Offload (``offload="cpu"``) keeps the fp32 master weights, optimizer states and the fp32 gradient
partition on the CPU (stage ≥ 2 streams gradients there during backward); ``nvme`` moves master weights and states
to NVMe, the gradient partition stays in CPU memory (ZeRO-Infinity: stage 3 only). ``offload_params`` (stage 3)
moves the parameter partitions.

Communication: stages 0-2 reduce gradients through a reduce bucket of ``bucket_elems`` elements and stages 1-2
all-gather the updated parameter partitions through one of the same size; ZeRO-3 allocates its whole reduce bucket
up front and keeps it, and gathers one unsharded unit at a time.
"""
from __future__ import annotations

from coursekit.memory import deepspeed as layout
from coursekit.memory.engines.base import Engine, state_result, unsharded_units
from coursekit.memory.states import OPTIMIZERS, PRECISION_TEXT, PRECISIONS


class DeepSpeed(Engine):
    name = "deepspeed"
    zero_stages = (0, 1, 2, 3)
    step_counters = False  # DeepSpeed steps flat partitions

    def check(self, *, zero: int, offload: str, offload_params: str) -> None:
        super().check(zero=zero, offload=offload, offload_params=offload_params)
        layout.check_offload(zero=zero, offload=offload, offload_params=offload_params)

    def exact(self, c) -> bool:
        """DeepSpeed's exact layout needs the tensors each rank flattens: known without TP/PP, for 16Ψ and fp32."""
        return c.tp == 1 and c.pp == 1 and c.precision in ("16psi", "fp32")

    def states(self, shape, c, stage):
        if not self.exact(c):
            return super().states(shape, c, stage)
        return layout.state_bytes(shape.param_numels(), precision=c.precision, dtype=c.dtype, optimizer=c.optimizer,
                                  zero=c.zero, shard=c.shard_degree, rank=c.dp_rank, offload=c.offload,
                                  offload_params=c.offload_params, micro_batches=c.microbatches,
                                  sub_group_size=c.sub_group_size)

    def formula(self, params, *, precision, optimizer, zero, shard, offload, offload_params, param_tensors):
        P, G, M, GC, S = PRECISIONS[precision]
        if zero >= 1 and precision == "fp32":
            # DeepSpeed's ZeRO optimizers clone an fp32 master partition even when the weights are fp32 already
            # (single_partition_of_fp32_groups / fp32_partitioned_groups_flat) — measured, tests/test_zero.py
            M = 4
        K = S * OPTIMIZERS[optimizer]
        N = shard
        part = {"param": N if zero >= 3 else 1, "grad": N if zero >= 2 else 1, "opt": N if zero >= 1 else 1}
        shards = dict(param=P * params / part["param"], grad=G * params / part["grad"],
                      master=M * params / part["opt"], state=K * params / part["opt"], gc=GC * params / part["opt"])
        # the fp32 copy of the gradient partition at the step (unless grads are fp32 already); in fp32 runs too:
        # flatten(averaged_gradients) copies even fp32 gradients — measured
        fp32_run = precision == "fp32" and zero >= 1
        step_copy = 4 * params / part["opt"] if M and (G != 4 or fp32_run) and not GC else 0.0
        cpu = nvme = 0.0
        if offload != "none":
            moved = shards["master"] + shards["state"] + shards["gc"]
            grad_part = 4 * params / part["opt"]  # the fp32 gradient partition the CPU optimizer reads
            if zero >= 2:
                shards["grad"] = 0.0  # streamed to the CPU during backward (GPU keeps only the reduce bucket)
            shards["master"] = shards["state"] = shards["gc"] = 0.0
            step_copy = 0.0
            if offload == "cpu":
                cpu += moved + grad_part
            else:
                nvme += moved
                cpu += grad_part
        if offload_params != "none":
            moved, shards["param"] = shards["param"], 0.0
            if offload_params == "cpu":
                cpu += moved
            else:
                nvme += moved
        text = PRECISION_TEXT[precision]
        if step_copy:
            text += "; +4Ψ/N fp32 gradient partition at the optimizer step (DeepSpeed)"
        return state_result(shards, step_copy, 0.0, cpu, nvme, text)

    def units(self, c, P, stage):
        return unsharded_units(P, stage) if c.zero == 3 else super().units(c, P, stage)

    def buckets(self, c, P, params, largest_unit):
        if c.zero == 3:  # ZeRO-3 allocates its whole reduce bucket up front and keeps it
            return P * c.bucket_elems, P * c.bucket_elems  # (in the parameters' dtype, whatever Ψ, even on one rank)
        if c.dp * c.cp == 1:
            return 0, 0
        bucket = min(c.bucket_elems, params)
        step = P * bucket if c.zero in (1, 2) else 0  # all-gather of updated parameter partitions
        return PRECISIONS[c.precision][1] * bucket, step

    def shards_over_dp(self, c) -> bool:
        return c.zero > 0

    def ranks_differ(self, c) -> bool:
        return self.exact(c) and c.zero in (1, 2)

    def notes(self, c) -> list[str]:
        out = []
        if "nvme" in (c.offload, c.offload_params):
            out.append("NVMe: swap-file bytes; host memory also holds DeepSpeed's pinned swap buffers (buffer_count x "
                       "buffer size in the config), not counted here")
        out += super().notes(c)
        if not self.exact(c):
            out.append("model states from the Ψ formula: DeepSpeed's exact layout (padding, per-rank gradient "
                       "partitions, offload staging) is modelled without TP/PP and for 16psi / fp32 only")
            if c.zero == 3 and c.offload == "none":
                out.append(f"ZeRO-3's fp32 gradient partition at the step is charged whole here; DeepSpeed builds it "
                           f"one sub-group of {c.sub_group_size:,} elements at a time (less, where a rank holds more)")
        return out
