"""The measurement path: held state bytes (plain, shared, DTensor shards) and peak memory on this backend."""
import math
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
            shapes = {}
            for name in ("tiny-llama", "odd"):
                model = (build_model("tiny-llama", seed=0) if name == "tiny-llama" else
                         build_model(dict(model_type="llama", vocab_size=255, hidden_size=64, intermediate_size=175,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2), seed=0))
                shapes[name] = {"full": state_bytes(model)["params_bytes"],
                                "shapes": [list(p.shape) for p in model.parameters()]}
                for layer in model.model.layers:
                    fully_shard(layer)
                fully_shard(model)
                shapes[name]["local"] = state_bytes(model)["params_bytes"]
            report(shapes)
        from coursekit.launch import finish
        finish(0)
    """)
    res = launch_code(code, nproc=2, timeout=180, stream=False)
    for name in ("tiny-llama", "odd"):
        full, shapes = res.results[0][name]["full"], res.results[0][name]["shapes"]
        assert full == 4 * sum(math.prod(s) for s in shapes)  # fp32, no tied or shared tensors
        # FSDP2 shards dim 0 into ceil(d0 / 2) rows per rank and pads the last rank's shard to that size: every
        # rank holds the same padded bytes (tiny-llama's dims are even: exactly half; the odd model's are not)
        padded = 4 * sum(-(-s[0] // 2) * math.prod(s[1:]) for s in shapes)
        assert [r[name]["local"] for r in res.results] == [padded, padded], name
        assert (padded * 2 == full) == (name == "tiny-llama")
