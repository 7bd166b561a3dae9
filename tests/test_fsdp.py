"""FSDP2 and HSDP on the parallel core: equal to the single-process run on every rank (fp32)."""
import pytest

from parity import assert_equal_to_single, baseline, train


@pytest.mark.parametrize("nproc,extra", [
    (2, ()),
    (3, ("--global-batch", "6")),  # uneven shards: 3 does not divide the weights' first dims (padded last rank)
    (2, ("--reshard-after-forward", "false", "--grad-accum", "2", "--prefetch", "1")),
])
def test_fsdp2_equals_single(nproc, extra, no_orphans):
    base = baseline("--global-batch", "6") if "--global-batch" in extra else baseline()
    res = train("fsdp2", nproc, *extra)
    assert_equal_to_single(res, base)
    held = [r["final"]["params_bytes"] for r in res.results]
    n = res.results[0]["final"]["num_params"]
    assert sum(held) >= 4 * n and max(held) <= 4 * n / nproc + 4 * 64 * nproc  # sharded: ~1/N each, padding only


def test_hsdp_2x2_equals_single(no_orphans):
    res = train("hsdp", 4, "--dp-replicate", "2", "--dp-shard", "2")
    assert_equal_to_single(res, baseline())
    held = [r["final"]["params_bytes"] for r in res.results]
    assert held[0] == held[2] and held[1] == held[3]  # replicas hold the same shard


def test_fsdp2_x_tp2_equals_single(no_orphans):
    assert_equal_to_single(train("fsdp2", 4, "--tp", "2"), baseline())


def test_dtensor_placements_are_visible(no_orphans):
    from coursekit.launch import launch_code

    code = '''
from coursekit.dist import session
from coursekit.launch import report
from coursekit.models import build_model
from coursekit.fsdp.placements import describe
from torch.distributed.fsdp import fully_shard
with session(seed=0) as info:
    m = build_model("tiny-llama", seed=0)
    for b in m.model.layers:
        fully_shard(b)
    fully_shard(m)
    report(describe(m))
'''
    res = launch_code(code, nproc=2, timeout=300, stream=False)
    for rank, rows in enumerate(res.results):
        q = next(r for r in rows if r["name"].endswith("layers.0.self_attn.q_proj.weight"))
        assert q["placements"] == ["Shard(dim=0)"] and q["global_shape"] == [64, 64] and q["local_shape"] == [32, 64]
        assert q["bytes"] == 32 * 64 * 4
        k = next(r for r in rows if r["name"].endswith("layers.0.self_attn.k_proj.weight"))  # 2 KV heads x 16
        assert k["global_shape"] == [32, 64] and k["local_shape"] == [16, 64]
