"""Exact per-rank training memory of a decoder-only transformer, in pure Python (no torch import).

    from coursekit.memory import estimate
    e = estimate("llama3-8b", batch=1, seq=8192, dp=8, zero=3, gpu="H100-80GB")
    e.peak_bytes, e.activations_bytes, e.to_dict(), print(e.table())

Modules: ``shapes`` (ModelShape, HF config.json, parameter terms), ``presets``, ``activations`` (saved tensors, term by
term), ``states`` (precision conventions, optimizers, the Ψ formula of model states), ``engines`` (one module per
data-parallel engine behind one protocol: ``ddp``, ``deepspeed``, ``fsdp2``; and ``megatron``, the TP / SP / PP / CP
split), ``deepspeed`` (DeepSpeed's exact per-rank layout, used by ``engines.deepspeed``), ``qlora`` (a frozen NF4
base + LoRA adapters under FSDP2, by kind), ``train_config`` (TrainConfig), ``calculator`` (estimate: adds up what
the engine and the split say), ``solvers``, ``gpus``, ``cli``.
"""
from coursekit.memory.activations import ActivationReport, activation_bytes
from coursekit.memory.calculator import Estimate, estimate, resolve_model
from coursekit.memory.train_config import TrainConfig
from coursekit.memory.errors import ConfigError
from coursekit.memory.gpus import GPUS, gpu
from coursekit.memory.presets import PRESETS, preset, to_hf_config_dict
from coursekit.memory.shapes import ModelShape, from_hf_config
from coursekit.memory.solvers import max_micro_batch, max_seq_len, min_gpus
from coursekit.memory.engines import model_state_bytes

__all__ = ["ActivationReport", "ConfigError", "Estimate", "GPUS", "ModelShape", "PRESETS", "TrainConfig",
           "activation_bytes", "estimate", "from_hf_config", "gpu", "max_micro_batch", "max_seq_len", "min_gpus",
           "model_state_bytes", "preset", "resolve_model", "to_hf_config_dict"]
