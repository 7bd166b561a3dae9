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

The data-parallel engines (``ddp``, ``deepspeed`` ZeRO 0-3, ``fsdp2``) each decide what they shard, over N ranks
(dp · cp: context-parallel ranks hold the same weights and shard them too, as torchtitan and DeepSpeed-Ulysses do;
HSDP shards over its shard group only), what they offload and what they allocate at the step: one module each in
``coursekit.memory.engines``. This module holds what they share: the precision conventions and the optimizers (``model_state_bytes``, the Ψ
formula of any engine, is the engines' registry's).
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


def check_choices(*, precision: str, optimizer: str, zero: int, offload: str, offload_params: str) -> None:
    """Raise ConfigError for a precision, optimizer, ZeRO stage or offload target that no engine knows (each engine's
    own limits: ``coursekit.memory.engines``' ``check_options``)."""
    choice("precision", precision, PRECISIONS)
    choice("optimizer", optimizer, OPTIMIZERS)
    choice("offload", offload, OFFLOAD)
    choice("offload_params", offload_params, OFFLOAD)
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero stage must be 0, 1, 2 or 3, got {zero!r}")


def local_rows(d0: int, n: int, rank: int) -> int:
    """Rows of a dim-0 size ``d0`` that shard rank ``rank`` of ``n`` keeps unpadded (torch.chunk's split, as FSDP2
    shards)."""
    per = -(-d0 // n)
    return max(0, min(per, d0 - rank * per))


