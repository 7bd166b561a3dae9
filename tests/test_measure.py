"""The measurement path: held state bytes (plain, shared, DTensor shards) and peak memory on this backend."""
import textwrap

import torch

from coursekit.launch import launch_code
from coursekit.measure import PeakMemory, state_bytes, tensor_bytes


def test_tensor_bytes_counts_each_storage_once():
    a = torch.zeros(1000)
    assert tensor_bytes([a, a[:10], a.view(10, 100)]) == 4000  # views pin the whole storage, once
    assert tensor_bytes([a, torch.zeros(10, dtype=torch.bfloat16), None]) == 4020


def test_state_bytes_of_a_tied_model_after_a_step():
    m = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10, bias=False))
    m[1].weight = m[0].weight  # tied: one storage
    opt = torch.optim.AdamW(m.parameters(), foreach=False)
    m(torch.tensor([1, 2])).sum().backward()
    opt.step()
    got = state_bytes(m, opt)
    assert got["params_bytes"] == 80 * 4 and got["grads_bytes"] == 80 * 4
    assert got["optimizer_bytes"] == 2 * 80 * 4 + 4  # exp_avg, exp_avg_sq and one fp32 step counter


def test_peak_memory_on_cpu_is_exact_for_known_allocations():
    keep = torch.empty(3_000_000, dtype=torch.uint8)  # live before the block: not counted
    with PeakMemory("cpu") as pm:
        a = torch.empty(10_000_000, dtype=torch.uint8)
        del a
        b = torch.empty(4_000_000, dtype=torch.uint8)
        c = torch.empty(5_000_000, dtype=torch.uint8)
    assert pm.peak_bytes == 10_000_000
    with PeakMemory("cpu") as pm2:
        d = torch.empty(6_000_000, dtype=torch.uint8)
        e = torch.empty(7_000_000, dtype=torch.uint8)
    assert pm2.peak_bytes == 13_000_000
    del keep, b, c, d, e


def test_dtensor_local_shards_are_what_a_rank_holds(no_orphans):
    code = textwrap.dedent("""
        import torch
        from torch.distributed.fsdp import fully_shard
        from coursekit import dist as ckdist
        from coursekit.launch import report
        from coursekit.measure import state_bytes
        from coursekit.models import build_model
        with ckdist.session(seed=0) as info:
            model = build_model("tiny-llama", seed=0)
            full = state_bytes(model)["params_bytes"]
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            report({"full": full, "local": state_bytes(model)["params_bytes"]})
    """)
    res = launch_code(code, nproc=2, timeout=180, stream=False)
    full = res.results[0]["full"]
    locals_ = [r["local"] for r in res.results]
    assert all(r["full"] == full for r in res.results)
    # dim-0 shards: each rank holds about half; FSDP2 pads uneven dim-0 splits, so the sum is >= the full model
    assert all(0.45 * full < x < 0.6 * full for x in locals_)
    assert full <= sum(locals_) < 1.05 * full
