"""coursekit.memory.activations where bench/bench_mutation.py found no test: the per-layer recompute's stage sums
(Megatron's block method, worked by hand on a made-up report), each refusal's whole message, and whole-number
bytes on the Ulysses path. Pure Python (no torch)."""
from __future__ import annotations

import re

import pytest

from coursekit.memory import ModelShape, activation_bytes
from coursekit.memory.activations import ActivationReport
from coursekit.memory.errors import ConfigError


def _shape(fam, h, a, k, f, **kw):
    return ModelShape(arch="llama", family=fam, layers=2, hidden=h, heads=a, kv_heads=k, ffn=f, vocab=256,
                      max_positions=512, **kw)


def test_recomputing_the_first_n_layers_of_a_stage_worked_by_hand():
    """A report of 10 bytes per recomputed layer (its checkpointed input), 100 per plain one, RoPE tables of 5
    bytes (6 when a plain layer's rotary saves its own), embedding 3, head 7; the first 2 layers of a stage are
    recomputed (Megatron's --recompute-method block)."""
    r = ActivationReport(per_layer={"x": 10}, embed={"e": 3}, shared={"rope": 5}, head={"h": 7}, layers=4,
                         attention_kernel="flash", recompute_layers=2, plain_layer_bytes=100,
                         plain_shared={"rope_saved": 6})
    assert [r.layers_bytes(n) for n in (1, 2, 3, 4)] == [10, 20, 120, 220]  # 2·10 + (n − 2)·100 beyond 2
    assert [r.shared_bytes(n) for n in (1, 2, 3, 4)] == [5, 5, 6, 6]  # a plain layer on the stage: its tables
    assert r.stage_bytes(4, first=True, last=False) == 220 + 6 + 3
    assert r.stage_bytes(2, first=False, last=True) == 20 + 5 + 7
    assert r.total_bytes == 220 + 3 + 6 + 7
    whole = ActivationReport(per_layer={"x": 10}, embed={"e": 3}, shared={"rope": 5}, head={"h": 7}, layers=4,
                             attention_kernel="flash", plain_layer_bytes=100, plain_shared={"rope_saved": 6})
    assert (whole.layers_bytes(4), whole.shared_bytes(4), whole.total_bytes) == (40, 5, 40 + 3 + 5 + 7)


@pytest.mark.parametrize("shape,seq,kw,message", [
    (_shape("mixtral", 64, 4, 2, 128, experts=4, top_k=2), 30, dict(tp=4),
     "tp (4) splits a mixture-of-experts block's tokens: seq/cp (30) must be divisible by it"),
    (_shape("qwen3", 64, 4, 2, 128, head_dim=16), 32, dict(cp=2, attention="eager"),
     "context parallelism needs a flash-style attention kernel (sdpa on CUDA, or fused)"),
    (_shape("llama", 64, 4, 4, 128), 32, dict(cp=2, cp_impl="ulysses", recompute="selective"),
     "selective recompute with cp_impl ulysses is not modelled (the checkpoint boundary against the all-to-alls "
     "decides what stays)"),
    (_shape("qwen3", 64, 4, 2, 128, head_dim=16), 32, dict(impl="fused", attention="eager"),
     "impl 'fused' means flash attention; use attention 'sdpa' (or impl 'hf' for eager)"),
    # 6 query heads and 6 K/V heads on one TP rank: cp 4 divides neither (the counts are whole numbers: "6")
    (_shape("llama", 96, 6, 6, 128), 32, dict(cp=4, cp_impl="ulysses"),
     "Ulysses splits heads: cp (4) must divide the query heads per TP rank (6), and divide or be a multiple of "
     "their K/V heads (6)"),
])
def test_each_refusal_says_it_whole(shape, seq, kw, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        activation_bytes(shape, 2, seq, **kw)


def test_ulysses_bytes_are_whole_numbers():
    # 4 query heads and 4 K/V heads over cp 2: 2 of each per rank; every term an int (a float would print 2.0)
    r = activation_bytes(_shape("llama", 64, 4, 4, 128), 2, 64, cp=2, cp_impl="ulysses", kernels="cuda")
    assert r.per_layer["attn.logsumexp_fp32"] == 4 * 2 * 2 * 64  # fp32, b 2 x 2 heads x S 64 rows
    assert all(type(v) is int for v in r.per_layer.values()), {k: v for k, v in r.per_layer.items()
                                                                if type(v) is not int}
