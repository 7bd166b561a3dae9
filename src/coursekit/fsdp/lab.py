"""What Lab 3 runs: a driver for a learner's hand-written wrapping, DTensor placements over torch's fake process
group, and QLoRA's held bytes in one process.

    launch_function(wrap, "coursekit.fsdp.lab:wrap_and_step", nproc=3)   # every rank: units, placements, bytes
    placements(world=4, rank=3, replicate=2)    # describe() rows of HSDP 2 x 2, as rank 3 sees them (no launch)
    placements_many([(3, 2, 1), (4, 3, 2)])     # several at once, one process each
    qlora_held("tiny-llama")                    # NF4 base, rest, adapters, their grads and AdamW states, 1 process
    layout_plans("llama3-8b", 2, 8); layout_memory("llama3-8b", 2, 8)   # FULL_SHARD / SHARD_GRAD_OP / HSDP (pure)

``placements`` runs ``python -m coursekit.fsdp.lab`` in a fresh process: a fake process group
(``init_process_group("fake")``) moves no data, but every DTensor has the shapes it has on rank r of N, and it can
be created only once per process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from coursekit.launch import stamped_env


def _batch(vocab: int, batch: int = 4, seq: int = 32, seed: int = 0):
    import torch

    return torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))


def units_of(model) -> list[dict]:
    """Every ``fully_shard`` unit of ``model``: its module name ("" is the root) and the parameters it gathers."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, FSDPModule):
            group = mod._get_fsdp_state()._fsdp_param_group
            params = group.fsdp_params if group is not None else []
            out.append({"module": name, "params": len(params), "shapes": [list(fp._orig_size) for fp in params]})
    return out


def wrap_and_step(fn, model: str = "tiny-llama", seed: int = 0) -> None:
    """Driver (``launch_function``): build ``model``, let ``fn(model)`` shard it, train one AdamW step and report
    ``{"rank", "world", "units", "placements", "held", "loss"}`` — held bytes as the trainer counts them."""
    from coursekit import dist as ckdist
    from coursekit.fsdp.placements import describe
    from coursekit.launch import report
    from coursekit.measure import state_bytes
    from coursekit.models import build_model
    from coursekit.parallel.api import adamw
    from coursekit.parallel.loss import cross_entropy

    with ckdist.session(seed=seed) as info:
        m = build_model(model, seed=seed)
        out = fn(m)
        m = out if out is not None else m
        opt = adamw(m.parameters(), lr=1e-3)
        x = _batch(m.config.vocab_size, seed=seed)
        loss = cross_entropy(m(input_ids=x[:, :-1]).logits, x[:, 1:])
        loss.backward()
        opt.step()
        report({"rank": info.rank, "world": info.world_size, "units": units_of(m), "placements": describe(m),
                "held": state_bytes(m, opt), "loss": loss.item()})


def _placements_here(world: int, rank: int, replicate: int, model: str) -> list[dict]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from coursekit.fsdp.placements import describe
    from coursekit.models import blocks, build_model

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        if replicate > 1:
            mesh = init_device_mesh("cpu", (replicate, world // replicate), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        m = build_model(model, seed=0)
        for b in blocks(m):
            fully_shard(b, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return [dict(r, placements=list(r["placements"]), global_shape=list(r["global_shape"]),
                     local_shape=list(r["local_shape"])) for r in describe(m)]
    finally:
        dist.destroy_process_group()


def placements(*, world: int, rank: int, replicate: int = 1, model: str = "tiny-llama", timeout: float = 300) -> list:
    """``describe()`` rows of ``model`` sharded by FSDP2 (HSDP when ``replicate`` > 1) as rank ``rank`` of ``world``
    holds it, computed in a fresh process over the fake process group."""
    return placements_many([(world, rank, replicate)], model=model, timeout=timeout)[0]


def placements_many(configs, *, model: str = "tiny-llama", timeout: float = 300) -> list:
    """``placements`` for several (world, rank, replicate) at once: one process each, all running together."""
    procs = []
    for world, rank, replicate in configs:
        if world % replicate:
            raise ValueError(f"replicate={replicate} must divide world={world}")
        cmd = [sys.executable, "-m", "coursekit.fsdp.lab", "placements", "--world", str(world), "--rank", str(rank),
               "--replicate", str(replicate), "--model", model]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=stamped_env({**os.environ, "OMP_NUM_THREADS": "1"})))
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"placements on the fake process group failed:\n{stderr[-3000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def qlora_held(model: str = "tiny-llama", *, r: int = 8, block: int = 32, scaler_block: int = 8) -> dict:
    """One process (no sharding): bytes of the NF4 base (4-bit data, scalers, factors, table, mean), the frozen
    unquantized rest, the LoRA adapters, their gradients and AdamW states after one step; the trainable count."""
    import warnings

    from coursekit.fsdp.qlora import qlora_model
    from coursekit.measure.states import optimizer_state_bytes, param_kind_bytes
    from coursekit.parallel.api import adamw
    from coursekit.parallel.loss import cross_entropy

    with warnings.catch_warnings():  # peft asks transformers a deprecated question (a FutureWarning on stderr)
        warnings.simplefilter("ignore", FutureWarning)
        m = qlora_model(model, r=r, block=block, scaler_block=scaler_block)
        m.train()
        trainable = [p for p in m.parameters() if p.requires_grad]
        opt = adamw(trainable, lr=1e-3)
        x = _batch(m.config.vocab_size)
        cross_entropy(m(input_ids=x[:, :-1]).logits, x[:, 1:]).backward()
        opt.step()
    kinds = param_kind_bytes(m, grads=True)
    return kinds | {"adapter_optimizer": optimizer_state_bytes(opt), "trainable_params": sum(p.numel() for p in trainable)}


def saved_chunks(step_dir, suffix: str) -> dict:
    """What a DCP checkpoint recorded for the model tensor whose key ends with ``suffix``: its key, global size and
    the chunks (row offsets and sizes) the saving ranks wrote, from the checkpoint's ``.metadata`` alone."""
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    key = next(k for k in sorted(md) if k.endswith(suffix) and not k.startswith("optim"))
    return {"key": key, "size": list(md[key].size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in md[key].chunks]}


LAYOUTS = ("FULL_SHARD", "SHARD_GRAD_OP", "HSDP")


def layout_plans(model: str, nodes: int, gpus: int, param_bytes: int = 2) -> dict:
    """Each layout's collectives of one step on ``nodes`` x ``gpus`` ranks, as the trainer's record lists them
    (``coursekit.fsdp.predict``, equal to the counted ones: tests/test_fsdp.py); bf16 gathers, fp32 reduce."""
    from coursekit.fsdp.predict import step_collectives
    from coursekit.memory.calculator import resolve_model

    s, n = resolve_model(model), nodes * gpus
    plans = dict(zip(LAYOUTS, (step_collectives(s, shard=n, param_bytes=param_bytes),
                               step_collectives(s, shard=n, reshard=False, param_bytes=param_bytes),
                               step_collectives(s, shard=gpus, replicate=nodes, param_bytes=param_bytes))))
    return {k: [{"op": c.op, "bytes": c.bytes, "count": c.count, "group_size": c.group_size} for c in v]
            for k, v in plans.items()}


def layout_memory(model: str, nodes: int, gpus: int, **kw) -> dict:
    """Per-rank peak bytes of each layout: ``coursekit memory --strategy fsdp2 [--no-reshard]`` and ``--strategy
    hsdp`` (default: micro-batch 1, seq 4096, bf16 compute on fp32 shards, full recompute)."""
    from coursekit.memory import estimate

    n, kw = nodes * gpus, {"micro_batch": 1, "seq": 4096, "dtype": "bf16", "precision": "fp32", "recompute": "full",
                           **kw}
    return dict(zip(LAYOUTS, (estimate(model, strategy="fsdp2", dp_shard=n, **kw).peak_bytes,
                              estimate(model, strategy="fsdp2", dp_shard=n, fsdp_reshard=False, **kw).peak_bytes,
                              estimate(model, strategy="hsdp", dp_shard=gpus, dp_replicate=nodes, **kw).peak_bytes)))


def shape_dict(model: str) -> dict:
    """A Llama model's shape as plain data (what Lab 3's qlora_bytes takes)."""
    from coursekit.memory.calculator import resolve_model

    s = resolve_model(model)
    keys = ("layers", "hidden", "ffn", "vocab", "heads", "kv_heads", "head_dim", "tied_embeddings")
    return {k: getattr(s, k) for k in keys}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 prog="python -m coursekit.fsdp.lab", description=__doc__.split("\n")[0].replace("``", ""))
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("placements", help="describe() rows on the fake process group, as one JSON line", allow_abbrev=False)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--replicate", type=int, default=1)
    p.add_argument("--model", default="tiny-llama")
    a = ap.parse_args(argv)
    print(json.dumps(_placements_here(a.world, a.rank, a.replicate, a.model)))
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # results reported: skip the interpreter's slow teardown
