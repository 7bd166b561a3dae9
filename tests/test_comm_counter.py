"""CollectiveCounter in a live 2-process job: every route to a collective is seen; DDP's and FSDP2's counted
collectives equal the volume model exactly.

One launch runs every check (a launch costs ~6 s); this file is also the worker script (``python test_comm_counter.py``
under torchrun). Each rank reports what it counted; the tests compare on every rank.
"""
import math
from pathlib import Path

import pytest

from coursekit.comm import volume

NPROC = 2


# dims that 2 ranks cannot split evenly (vocab 255, MLP 175): FSDP2 pads those parameters' dim 0
ODD_LLAMA = {"model_type": "llama", "vocab_size": 255, "hidden_size": 64, "intermediate_size": 175,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def _tiny_llama(model="tiny-llama"):
    """The course's tiny Llama (2 layers, hidden 64, vocab 256), or another config, same init on every rank."""
    from coursekit.models import build_model

    return build_model(model, seed=0)


def _paths(info, dev):
    """One call through every route a library takes to a collective; returns the records, in order."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import distributed_c10d

    from coursekit.comm.counter import CollectiveCounter

    n = info.world_size
    captured = dist.all_gather_into_tensor  # as DeepSpeed does: a reference taken before the counter starts
    solo = [dist.new_group([r]) for r in range(n)][info.rank]  # created outside: new_group talks to the store
    x = torch.ones(10, device=dev)  # 40 bytes
    with CollectiveCounter() as cc:
        dist.all_reduce(x)
        captured(torch.empty(10 * n, device=dev), x)
        distributed_c10d.reduce_scatter_tensor(torch.empty(10, device=dev), torch.ones(10 * n, device=dev))
        dist.all_gather([torch.empty(10, device=dev) for _ in range(n)], x)
        dist.broadcast(x, src=0)
        dist.all_to_all_single(torch.empty(4 * n, device=dev), torch.ones(4 * n, device=dev))
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))
        dist.all_reduce(torch.ones(3, dtype=torch.bfloat16, device=dev))
        dist.all_reduce(x, group=solo)
        dist.barrier()
        dist.all_gather_object([None] * n, {"rank": info.rank})
    return [r.to_dict() for r in cc.records]


def _ddp_steps(info, dev):
    """Four steps of torch's DDP with small buckets (as the trainer's ddp strategy wraps it); the last accumulates
    2 micro-batches under ``no_sync``."""
    import contextlib

    import torch
    from torch.nn.parallel import DistributedDataParallel

    from coursekit.comm.counter import CollectiveCounter

    model = _tiny_llama().to(dev)
    ids_ = [torch.device(dev).index] if torch.device(dev).type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids_, bucket_cap_mb=0.1,  # 0.1 MiB: several buckets
                                  gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(100 + info.rank)
    steps = []
    for n_micro in (1, 1, 1, 2):
        with CollectiveCounter() as cc:
            for i in range(n_micro):
                ids = torch.randint(0, 256, (2, 16), generator=gen).to(dev)
                with ddp.no_sync() if i < n_micro - 1 else contextlib.nullcontext():
                    (ddp(input_ids=ids, labels=ids).loss / n_micro).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        # the buckets this step used, as DDP's reducer holds them (rebuilt at the start of the second step)
        buckets = [b.buffer().numel() * b.buffer().element_size()
                   for b in ddp.reducer._get_zeros_like_grad_buckets()]
        steps.append({"micro": n_micro, "records": [r.to_dict() for r in cc.records], "bucket_bytes": buckets})
    return {"steps": steps,
            "num_params": sum(p.numel() for p in ddp.parameters() if p.requires_grad),
            "buffer_bytes": sum(b.numel() * b.element_size() for b in ddp.module.buffers())}


def _fsdp2(info, dev, model_name="tiny-llama"):
    """One step of FSDP2 (each decoder layer a unit, then the root); the parameter shapes of each unit."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from coursekit.comm.counter import CollectiveCounter

    model = _tiny_llama(model_name).to(dev)
    layers = [[list(p.shape) for p in layer.parameters()] for layer in model.model.layers]
    in_layers = {id(p) for layer in model.model.layers for p in layer.parameters()}
    root = [list(p.shape) for p in model.parameters() if id(p) not in in_layers]
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(info.rank))
    with CollectiveCounter() as cc:
        model(input_ids=ids.to(dev), labels=ids.to(dev)).loss.backward()
    return {"layers": layers, "root": root, "records": [r.to_dict() for r in cc.records]}


def _tensor_parallel(info, dev):
    """A Megatron MLP (column- then row-parallel) with DTensor: functional collectives, forward and backward."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from coursekit.comm.counter import CollectiveCounter

    torch.manual_seed(0)
    hidden, tokens = 16, 12
    mlp = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.ReLU(),
                              torch.nn.Linear(4 * hidden, hidden)).to(dev)
    mesh = init_device_mesh(torch.device(dev).type, (info.world_size,))
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(tokens, hidden, device=dev, requires_grad=True)
    with CollectiveCounter() as fwd:
        y = mlp(x)
    with CollectiveCounter() as bwd:
        y.sum().backward()
    return {"hidden": hidden, "tokens": tokens, "fwd": [r.to_dict() for r in fwd.records],
            "bwd": [r.to_dict() for r in bwd.records]}


def _ring(info, dev):
    """The teaching ring all-reduce is made of sends and receives whose bytes are the ring's wire bytes."""
    import torch

    from coursekit.comm.counter import CollectiveCounter
    from coursekit.comm.ring import ring_all_reduce

    t = torch.ones(1000 * info.world_size, device=dev)
    with CollectiveCounter() as cc:
        ring_all_reduce(t)
    return {"payload": t.numel() * 4, "summary": cc.summary(), "ok": bool((t == info.world_size).all())}


def _bench_calls(info, dev):
    """What each benchmark call (coursekit.comm.bench) issues: the counted records next to the size it reports."""
    import torch

    from coursekit.comm.bench import OPS, _make
    from coursekit.comm.counter import CollectiveCounter

    out = {}
    for op in OPS:
        _, nbytes, call = _make(op, 4096, info.world_size, torch.float32, torch.device(dev))
        with CollectiveCounter() as cc:
            call()
        out[op] = {"size": nbytes, "records": [r.to_dict() for r in cc.records]}
    return out


def _worker() -> None:
    from coursekit import dist as ckdist
    from coursekit.launch import report

    with ckdist.session(seed=0) as info:
        dev = info.device
        report({"rank": info.rank, "world": info.world_size, "paths": _paths(info, dev),
                "ddp": _ddp_steps(info, dev), "fsdp2": _fsdp2(info, dev),
                "fsdp2_odd": _fsdp2(info, dev, ODD_LLAMA), "tp": _tensor_parallel(info, dev),
                "ring": _ring(info, dev), "bench": _bench_calls(info, dev)})


@pytest.fixture(scope="module")
def results():
    """One launch for the whole file. Like ``no_orphans`` it fails if a process of this launch survives; it looks
    for this script's path only, so jobs of concurrent test runs do not count."""
    import psutil

    from coursekit.launch import launch

    script = str(Path(__file__).resolve())
    res = launch(script, nproc=NPROC, timeout=240, stream=False)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if script in (p.info["cmdline"] or [])]
    assert not left, f"processes of this launch left behind: {left}"
    return res.results


def test_every_route_to_a_collective_is_counted(results):
    n = NPROC
    for res in results:
        got = [(r["op"], r["bytes"], r["dtype"], r["group_size"]) for r in res["paths"]]
        assert got[:10] == [
            ("all_reduce", 40, "float32", n),           # dist.all_reduce
            ("all_gather", 40 * n, "float32", n),       # reference captured before counting (DeepSpeed's way)
            ("reduce_scatter", 40 * n, "float32", n),   # distributed_c10d module function; payload = full input
            ("all_gather", 40 * n, "float32", n),       # list all_gather; payload = gathered output
            ("broadcast", 40, "float32", n),
            ("all_to_all", 16 * n, "float32", n),       # payload = one rank's send buffer
            ("all_reduce", 40, "float32", n),           # functional collective (DTensor's route)
            ("all_reduce", 6, "bfloat16", n),
            ("all_reduce", 40, "float32", 1),           # a one-rank sub-group
            ("barrier", 0, "", n),
        ], res["paths"]
        # all_gather_object = an all-gather of the pickled sizes, then one of the padded pickles: both counted
        assert [r["op"] for r in res["paths"][10:]] == ["all_gather", "all_gather"]
        assert res["paths"][0]["impl"] == "c10d::allreduce_" and res["paths"][6]["impl"].endswith("::all_reduce")


def _plan(records, keep=lambda r: True):
    return volume.merge(volume.Collective(r["op"], r["bytes"], 1, r["group_size"]) for r in records if keep(r))


def test_ddp_all_reduce_bytes_equal_the_volume_model_exactly(results):
    for res in results:
        d = res["ddp"]
        psi, n = d["num_params"], res["world"]
        assert psi > 100_000 and d["buffer_bytes"] > 0  # the tiny Llama: gradients and a rotary buffer
        for i, s in enumerate(d["steps"]):
            model = volume.ddp(psi, n, grad_bytes=4, bucket_bytes=s["bucket_bytes"], buffer_bytes=d["buffer_bytes"])
            recs = s["records"]
            if i == 1:
                # the rebuild step: rank 0 also broadcasts the new bucket layout (integer indices and sizes), once
                layout = [r for r in recs if r["dtype"].startswith("int")]
                assert layout and all(r["op"] == "broadcast" for r in layout)
                recs = [r for r in recs if r not in layout]
            # exactly the model: one all-reduce per bucket, Ψ·4 bytes in all, plus one buffer broadcast per step
            # (also with 2 micro-batches: the no_sync micro-batch communicates nothing) — and nothing else
            assert _plan(recs) == model, (i, s)
            ar = [r for r in recs if r["op"] == "all_reduce"]
            assert sum(r["bytes"] for r in ar) == psi * 4 == volume.payload_bytes(volume.ddp(psi, n))
            # one all-reduce per bucket, of that bucket's bytes: the counter agrees with DDP's own reducer
            assert sorted(r["bytes"] for r in ar) == sorted(s["bucket_bytes"])
            if i == 0:  # the first step: every gradient in one bucket
                assert len(ar) == 1
            wire = sum(volume.wire_bytes("all_reduce", r["bytes"], n) for r in ar)
            assert wire == pytest.approx(2 * (n - 1) / n * psi * 4, rel=1e-12)
        assert len(d["steps"][2]["bucket_bytes"]) > 1  # after the rebuild: 0.1 MiB buckets


def _padded(shapes, n):
    """Elements of a unit as FSDP2 lays it out for n ranks: each parameter's dim 0 rounded up to a multiple of n."""
    return sum(-(-s[0] // n) * n * math.prod(s[1:]) for s in shapes)


@pytest.mark.parametrize("key", ["fsdp2", "fsdp2_odd"])
def test_fsdp2_collectives_equal_the_volume_model(results, key):
    for res in results:
        f, n = res[key], res["world"]
        layers, root = [_padded(u, n) for u in f["layers"]], _padded(f["root"], n)
        unpadded = [sum(math.prod(s) for s in u) for u in f["layers"]]
        # tiny-Llama's dims divide by 2 (no padding); the odd model's vocab and MLP rows do not
        assert (layers == unpadded) == (key == "fsdp2")
        # every layer all-gathers for forward and again for backward, then reduce-scatters its gradients; FSDP2
        # keeps the root's parameters from forward to backward, so the root gathers once
        model = volume.merge(volume.fsdp(layers, n) + volume.fsdp(root, n, reshard_after_forward=False))
        assert _plan(f["records"]) == model
        assert {r["impl"] for r in f["records"]} == {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"}


def test_tensor_parallel_functional_collectives_are_counted(results):
    for res in results:
        tp = res["tp"]
        act = tp["tokens"] * tp["hidden"] * 4
        # Megatron's g (row-parallel output) all-reduces in forward, f (column-parallel input grad) in backward
        assert [(r["op"], r["bytes"], r["group_size"]) for r in tp["fwd"]] == [("all_reduce", act, NPROC)]
        assert [(r["op"], r["bytes"], r["group_size"]) for r in tp["bwd"]] == [("all_reduce", act, NPROC)]
        # a full block (attention + MLP) has twice this: volume.tensor_parallel's 4 all-reduces per layer
        assert volume.tensor_parallel(1, tp["tokens"], tp["hidden"], NPROC, act_bytes=4) == \
            [volume.Collective("all_reduce", act, 4, NPROC)]


def test_ring_all_reduce_sends_exactly_the_ring_wire_bytes(results):
    for res in results:
        ring, n = res["ring"], res["world"]
        assert ring["ok"]
        wire = volume.wire_bytes("all_reduce", ring["payload"], n)  # 2(n-1)/n · S
        assert ring["summary"]["send"]["bytes"] == wire == ring["summary"]["recv"]["bytes"]
        assert ring["summary"]["send"]["calls"] == 2 * (n - 1)
        assert set(ring["summary"]) == {"send", "recv"}  # built from point-to-point only


def test_benchmark_issues_the_collective_and_size_it_reports(results):
    for res in results:
        for op, b in res["bench"].items():
            recs = b["records"]
            if op == "ring_all_reduce":  # sends and receives: 2(n-1) chunks of S/n each way = S · 2(n-1)/n sent
                sent = sum(r["bytes"] for r in recs if r["op"] == "send")
                assert {r["op"] for r in recs} == {"send", "recv"} and sent == b["size"] * 2 * (NPROC - 1) / NPROC
            else:
                assert [(r["op"], r["bytes"], r["group_size"]) for r in recs] == [(op, b["size"], NPROC)], op


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(_worker())  # no interpreter teardown of a distributed worker (see coursekit.launch.finish)
