"""Solvers answer the inverse questions consistently with estimate(); invalid configurations fail clearly."""
from __future__ import annotations

import pytest

from coursekit.memory import ConfigError, estimate, gpu, max_micro_batch, max_seq_len, min_gpus


@pytest.mark.parametrize("model,cfg", [
    ("llama3-8b", dict(seq=4096, dp=8, zero=3)),
    ("llama3-8b", dict(seq=8192, dp=8, zero=3, recompute="full")),
    ("gpt2-xl", dict(seq=1024, zero=0)),
    ("llama3-70b", dict(seq=4096, tp=8, pp=2, dp=4, zero=1, sp=True, impl="fused")),
])
def test_max_micro_batch_fits_and_one_more_does_not(model, cfg):
    cap = gpu("H100-80GB").memory_bytes
    b = max_micro_batch(model, "H100-80GB", **cfg)
    assert b >= 1
    assert estimate(model, batch=b, **cfg).peak_bytes <= cap
    assert estimate(model, batch=b + 1, **cfg).peak_bytes > cap


def test_max_micro_batch_zero_when_nothing_fits():
    assert max_micro_batch("llama3-70b", "L4", seq=4096) == 0


@pytest.mark.parametrize("cfg", [dict(batch=1, dp=8, zero=3, recompute="full"), dict(batch=2, cp=4, dp=2, zero=2)])
def test_max_seq_len(cfg):
    cap = gpu("H100-80GB").memory_bytes
    s = max_seq_len("llama3-8b", "H100-80GB", **cfg)
    step = cfg.get("cp", 1)
    assert s % step == 0 and s > 0
    assert estimate("llama3-8b", seq=s, **cfg).peak_bytes <= cap
    assert estimate("llama3-8b", seq=s + step, **cfg).peak_bytes > cap


def test_max_seq_len_capped_by_learned_positions():
    assert max_seq_len("gpt2", "H100-80GB", batch=1) == 1024


@pytest.mark.parametrize("model,cfg", [
    ("llama3-70b", dict(batch=1, seq=4096, zero=3, recompute="full")),
    ("llama3-405b", dict(batch=1, seq=8192, zero=3, recompute="full", tp=8)),
    ("llama3-8b", dict(batch=2, seq=4096, engine="fsdp2")),
])
def test_min_gpus(model, cfg):
    cap = gpu("H100-80GB").memory_bytes
    e = min_gpus(model, "H100-80GB", **cfg)
    assert e.peak_bytes <= cap
    assert e.config.world == e.config.dp * e.config.tp * e.config.pp * e.config.cp
    if e.config.dp > 1:
        assert estimate(model, dp=e.config.dp - 1, **cfg).peak_bytes > cap


def test_min_gpus_without_sharding_is_an_error():
    with pytest.raises(ConfigError, match="do not shard"):
        min_gpus("llama3-70b", "H100-80GB", batch=1, seq=4096, zero=0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch=1, seq=1024, tp=3), "tp \\(3\\) must divide heads"),
    (dict(batch=1, seq=1024, world=10, tp=4), "world \\(10\\) is not divisible by tp·pp·cp"),
    (dict(batch=1, seq=1024, world=16, tp=2, pp=2, cp=2, dp=3), "!= world"),
    (dict(batch=0, seq=1024), "batch must be > 0"),
    (dict(batch=-2, seq=1024), "batch must be > 0"),
    (dict(batch=1, seq=0), "seq must be > 0"),
    (dict(batch=1.5, seq=1024), "batch must be an integer"),
    (dict(batch=1, seq=1024, dtype="fp8"), "unknown dtype 'fp8'"),
    (dict(batch=1, seq=1024, dp=0), "dp must be > 0"),
    (dict(batch=1, seq=1000, cp=16), "not divisible by cp"),
    (dict(batch=1, seq=1024, zero=4), "zero stage must be"),
    (dict(batch=1, seq=1024, offload_params="cpu", zero=2), "ZeRO-3 or FSDP2"),
    (dict(batch=1, seq=1024, offload="nvme", zero=2), "needs ZeRO stage 3"),
    (dict(batch=1, seq=1024, offload="cpu", zero=0), "stage 1, 2 or 3"),
    (dict(batch=1, seq=1024, cp=2, attention="eager"), "context parallelism"),
    (dict(batch=1, seq=1024, engine="fsdp2", dp=6, hsdp_shard=4), "HSDP shard group"),
    (dict(batch=1, seq=1024, pp=64), "exceeds the number of layers"),
    (dict(batch=1, seq=1024, gpu="TPU-v9"), "unknown GPU"),
])
def test_invalid_configs(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        estimate("llama3-8b", **kwargs)


def test_invalid_shapes():
    from coursekit.memory import ModelShape
    with pytest.raises(ConfigError, match="multiple of kv_heads"):
        ModelShape(layers=2, hidden=64, heads=4, kv_heads=3, ffn=128, vocab=10)
    with pytest.raises(ConfigError, match="hidden must be > 0"):
        ModelShape(layers=2, hidden=-64, heads=4, ffn=128, vocab=10)
    with pytest.raises(ConfigError, match="learned positions"):
        estimate("gpt2", batch=1, seq=2048)
    assert issubclass(ConfigError, ValueError)
