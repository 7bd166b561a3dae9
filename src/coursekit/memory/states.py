"""Model-state bytes per rank: parameters, gradients, master weights, optimizer states, and where they live.

Precision conventions (bytes per parameter, unsharded; AdamW keeps two states):

=========  ======  =====  ======  ======  =====  ============================================================
name       param   grad   master  states  total  what
=========  ======  =====  ======  ======  =====  ============================================================
16psi      2       2      4       8       16Ψ    ZeRO paper's mixed-precision Adam (K = 12): bf16 weights and
                                                 gradients, fp32 master weights and m, v
18psi      2       4      4       8       18Ψ    bf16 weights, fp32 gradient accumulation (Megatron main_grad)
20psi      2       2+4    4       8       20Ψ    16Ψ plus a persistent fp32 gradient copy (Megatron fp16 table)
fp32       4       4      0       8       16Ψ    pure fp32 AdamW: the weights are their own master copy
=========  ======  =====  ======  ======  =====  ============================================================

Engines (data-parallel implementation), with N the sharding degree (dp · cp: context-parallel ranks hold the same
weights and shard them too, as torchtitan and DeepSpeed-Ulysses do; HSDP shards over its shard group only):

- ``deepspeed`` ZeRO stage 0–3: stage 1 shards master + states, 2 also gradients, 3 also parameters. At the optimizer
  step DeepSpeed turns each rank's gradient partition into an fp32 copy (``single_grad_partition``): +4Ψ/N that
  the paper's 16Ψ formula omits (none when gradients already are fp32). FusedAdam: no step temporaries.
- ``fsdp2``: sharded parameters are kept in the master dtype (fp32 when mixed) and are the master copy, sharded
  gradients in that dtype too; compute uses unsharded bf16 units (see calculator). torch's foreach AdamW
  allocates about one sharded-parameter-sized temporary during the step.
- ``ddp``: everything replicated; DDP's reducer keeps bucket buffers the size of all gradients
  (``gradient_as_bucket_view=False``, the default), counted as communication buckets.

Offload (``offload`` for optimizer state, ``offload_params`` for ZeRO-3 / FSDP2 parameters): DeepSpeed's
ZeRO-Offload keeps fp32 master weights, optimizer states and the fp32 gradient partition on the CPU (stage ≥ 2
streams gradients there during backward); ``nvme`` moves master weights and states to NVMe, the gradient partition
stays in CPU memory (ZeRO-Infinity: stage 3 only). FSDP2's CPUOffloadPolicy moves sharded parameters, gradients and optimizer states to the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from coursekit.memory.errors import ConfigError, choice

PRECISIONS = {  # name -> (param, grad, master, persistent fp32 grad copy, state dtype bytes)
    "16psi": (2, 2, 4, 0, 4),
    "18psi": (2, 4, 4, 0, 4),
    "20psi": (2, 2, 4, 4, 4),
    "fp32": (4, 4, 0, 0, 4),
}
PRECISION_TEXT = {
    "16psi": "16Ψ: 16-bit params + grads, fp32 master + optimizer states",
    "18psi": "18Ψ: 16-bit params, fp32 grads, fp32 master + optimizer states",
    "20psi": "20Ψ: 16-bit params + grads, persistent fp32 grad copy, fp32 master + optimizer states",
    "fp32": "fp32: fp32 params (own master) + grads + optimizer states",
}
OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 1, "sgd-nomomentum": 0, "lion": 1}  # states per parameter
STEP_COUNTER_OPTIMIZERS = ("adamw", "adam")  # torch keeps state["step"] as a 0-d fp32 tensor per parameter
ENGINES = ("deepspeed", "fsdp2", "ddp")
OFFLOAD = ("none", "cpu", "nvme")


@dataclass(frozen=True)
class StateBytes:
    """Per-rank bytes by category and by device. ``step_grad_copy`` exists only during the optimizer step."""
    parameters: int
    gradients: int
    master_weights: int
    optimizer_states: int
    grad_copy: int  # persistent fp32 gradient copy (20Ψ)
    step_grad_copy: int  # DeepSpeed's fp32 gradient partition at the step (on GPU unless offloaded)
    step_temporaries: int  # torch foreach optimizer temporaries during the step
    cpu: int
    nvme: int
    convention: str
    offload_buffers: int = 0  # DeepSpeed ZeRO-Offload (stages 1-2): the accelerator's one-parameter gradient buffer

    @property
    def resident(self) -> int:
        """GPU bytes held between steps (the ZeRO paper's model-state memory)."""
        return self.parameters + self.gradients + self.master_weights + self.optimizer_states + self.grad_copy


def model_state_bytes(params: float, *, precision: str = "16psi", optimizer: str = "adamw", engine: str = "deepspeed",
                      zero: int = 0, shard: int = 1, offload: str = "none",
                      offload_params: str = "none", param_tensors: int = 0) -> StateBytes:
    """Model-state bytes on one rank holding ``params`` parameters (after TP/PP split), sharded over ``shard`` ranks.

    ``zero`` is DeepSpeed's stage (engine ``deepspeed``); ``fsdp2`` shards everything, ``ddp`` nothing.
    ``param_tensors``: parameter tensors on this rank. torch's Adam/AdamW keep a 4-byte fp32 ``step`` counter per
    tensor (engines ``ddp`` and ``fsdp2``, whose optimizers see every tensor; DeepSpeed steps flat partitions).
    """
    check_options(precision=precision, optimizer=optimizer, engine=engine, zero=zero, offload=offload,
                  offload_params=offload_params)
    P, G, M, GC, S = PRECISIONS[precision]
    if engine == "deepspeed" and zero >= 1 and precision == "fp32":
        # DeepSpeed's ZeRO optimizers clone an fp32 master partition even when the weights are fp32 already
        # (single_partition_of_fp32_groups / fp32_partitioned_groups_flat) — measured, tests/test_zero.py
        M = 4
    K = S * OPTIMIZERS[optimizer]
    N = shard
    counters = 4 * param_tensors if optimizer in STEP_COUNTER_OPTIMIZERS and engine != "deepspeed" else 0
    if engine == "fsdp2":  # sharded params are the master copy; grads in their dtype
        store = M or P
        shards = dict(param=store * params / N, grad=store * params / N, master=0.0,
                      state=K * params / N + counters, gc=GC * params / N)
        step_copy, temps = 0.0, store * params / N
        cpu = nvme = 0.0
        if offload != "none" or offload_params != "none":  # CPUOffloadPolicy moves the whole sharded state
            cpu = sum(shards.values())
            shards = dict.fromkeys(shards, 0.0)
            temps = 0.0  # the step runs on the CPU
        return _result(shards, step_copy, temps, cpu, nvme, f"{PRECISION_TEXT[precision]} (FSDP2: sharded fp32 "
                       f"params are the master copy)" if M else PRECISION_TEXT[precision])
    part = {"param": 1.0, "grad": 1.0, "opt": 1.0}
    if engine == "deepspeed":
        part = {"param": N if zero >= 3 else 1, "grad": N if zero >= 2 else 1, "opt": N if zero >= 1 else 1}
    shards = dict(param=P * params / part["param"], grad=G * params / part["grad"],
                  master=M * params / part["opt"], state=K * params / part["opt"] + counters,
                  gc=GC * params / part["opt"])
    # DeepSpeed materialises an fp32 copy of the gradient partition at the step (unless grads are fp32 already)
    # (in fp32 runs too: flatten(averaged_gradients) copies even fp32 gradients — measured)
    fp32_run = engine == "deepspeed" and precision == "fp32" and zero >= 1
    step_copy = 4 * params / part["opt"] if engine == "deepspeed" and M and (G != 4 or fp32_run) and not GC else 0.0
    temps = (M or P) * params if engine == "ddp" else 0.0  # torch foreach AdamW temporaries; FusedAdam has none
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
        moved = shards["param"]
        shards["param"] = 0.0
        if offload_params == "cpu":
            cpu += moved
        else:
            nvme += moved
    text = PRECISION_TEXT[precision]
    if step_copy:
        text += "; +4Ψ/N fp32 gradient partition at the optimizer step (DeepSpeed)"
    return _result(shards, step_copy, temps, cpu, nvme, text)


def check_options(*, precision: str, optimizer: str, engine: str, zero: int, offload: str,
                  offload_params: str) -> None:
    """Raise ConfigError for a combination no engine supports (shared by the formula and DeepSpeed's layout)."""
    choice("precision", precision, PRECISIONS)
    choice("optimizer", optimizer, OPTIMIZERS)
    choice("engine", engine, ENGINES)
    choice("offload", offload, OFFLOAD)
    choice("offload_params", offload_params, OFFLOAD)
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero stage must be 0, 1, 2 or 3, got {zero!r}")
    if engine != "deepspeed" and zero:
        raise ConfigError(f"zero stages are DeepSpeed's; engine {engine!r} takes zero 0")
    if offload_params != "none" and not (engine == "fsdp2" or zero == 3):
        raise ConfigError("parameter offload needs ZeRO-3 or FSDP2 (parameters must be sharded)")
    if engine == "fsdp2" and "nvme" in (offload, offload_params):
        raise ConfigError("FSDP2 offloads to the CPU only (CPUOffloadPolicy); NVMe offload is DeepSpeed's")
    if engine == "ddp" and (offload != "none"):
        raise ConfigError("DDP has no offload; use DeepSpeed ZeRO or FSDP2")
    if engine == "deepspeed" and offload != "none" and zero == 0:
        raise ConfigError("DeepSpeed offloads optimizer state with ZeRO stage 1, 2 or 3, not 0")
    if engine == "deepspeed" and "nvme" in (offload, offload_params) and zero != 3:
        raise ConfigError("NVMe offload (ZeRO-Infinity) needs ZeRO stage 3")


def _result(shards, step_copy, temps, cpu, nvme, text) -> StateBytes:
    r = round
    return StateBytes(r(shards["param"]), r(shards["grad"]), r(shards["master"]), r(shards["state"]), r(shards["gc"]),
                      r(step_copy), r(temps), r(cpu), r(nvme), text)
