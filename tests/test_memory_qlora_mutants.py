"""QLoRA's byte model (``coursekit.memory.qlora``) by hand: each projection's (in, out), the adapters' count, the NF4
pieces, every refusal word for word (and the configurations just inside each bound), the units' tensors and one
rank's bytes on a two-layer model small enough to add up here. Shapes and configurations are stand-ins carrying
only the fields the module reads, each width its own number so that a swapped field shows. Where
bench/bench_mutation.py found no test (tests/test_memory_engines_mutants.py has the fsdp2 engine's side). Pure Python,
well under a second."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from coursekit.memory import qlora
from coursekit.memory.errors import ConfigError
from coursekit.memory.presets import preset
from coursekit.memory.qlora import TARGETS
from coursekit.memory.shapes import ModelShape


def conf(**kw):
    """What the module reads of a TrainConfig; block and scaler block 1 over 1 rank: every size divides."""
    return SimpleNamespace(**{"tp": 1, "pp": 1, "offload": "none", "offload_params": "none", "fsdp_reshard": True,
                              "lora_targets": TARGETS, "shard_degree": 1, "nf4_block": 1, "nf4_scaler_block": 1,
                              "lora_rank": 1, "dp_rank": None, **kw})


def test_frozen_rest_of_real_presets():
    """Qwen3 (tiny-qwen3: head_dim 16) keeps an RMSNorm over each q and k head, frozen and unquantized, beside the two
    block norms of 64 (peft + torchao's model: self_attn.q_norm.weight, k_norm.weight (16,)); a Qwen2 block has
    q / k / v biases and none on o_proj (HF's Qwen2Attention: o_proj bias=False)."""
    frozen = qlora.unit_dims(preset("tiny-qwen3"), conf())[0][2]
    assert sorted(frozen) == [(16, 1), (16, 1), (64, 1), (64, 1)]
    qwen2 = ModelShape(arch="llama", family="qwen2", layers=1, hidden=4, heads=2, kv_heads=1, ffn=8, vocab=10,
                       qkv_bias=True)  # head_dim 2: q width 4, kv width 2
    assert qlora.unit_dims(qwen2, conf())[0][2] == [(4, 1), (2, 1), (2, 1), (4, 1), (4, 1)]
    with pytest.raises(ConfigError, match="not 4 experts"):
        qlora.check(preset("tiny-qwen3-moe"), conf(nf4_block=32, nf4_scaler_block=8))
