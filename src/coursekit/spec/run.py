"""The choices a run description offers, one tuple each, read by every tool that names them: the trainer's options
(``coursekit.options`` and the parallelisms' option groups), ``coursekit memory`` (``coursekit.memory``),
``coursekit plan`` and ``coursekit layout``. ``tests/test_layers.py`` compares the four CLIs' choices and defaults.
"""
from __future__ import annotations

from coursekit.spec.registry import STRATEGIES as _STRATEGIES
from coursekit.spec.schedules import SCHEDULES as _SCHEDULES

STRATEGIES = tuple(_STRATEGIES)
"""Data-parallel strategies (``--strategy``), the registry's names."""
PP_SCHEDULES = tuple(_SCHEDULES)
"""Pipeline schedules (``--pp-schedule``)."""
CP_IMPLS = ("ring", "ulysses")
SP_STYLES = ("torch", "megatron")  # sequence parallelism: torch's plan, or Megatron-LM's (the linears keep the shard)
"""Context-parallel attention (``--cp-impl``): ring attention or DeepSpeed-Ulysses' all-to-all."""
ATTENTION = ("sdpa", "eager")
"""Attention implementation as transformers names it (``--attention``)."""
RECOMPUTE = ("none", "selective", "full", "op")
"""Activation recomputation (``--recompute``): the calculator and the planner model all four; the trainer runs
``TRAINER_RECOMPUTE``. ``op`` is torchtitan's per-op selective checkpoint (its default "selective" AC: each block
keeps its input and the outputs of a save list of ops, every second matmul among them); ``selective`` is
Megatron's (the attention core recomputed)."""
TRAINER_RECOMPUTE = ("none", "full", "op")

ADAMW = {"betas": (0.9, 0.95), "eps": 1e-8}
"""The course's AdamW hyper-parameters, everywhere: the trainer's optimizer factory (``coursekit.parallel.api.adamw``),
DeepSpeed's config (``coursekit.zero.ds_config``), the measured optimizer step (``coursekit.measure.phases``)."""
