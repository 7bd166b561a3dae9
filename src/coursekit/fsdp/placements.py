"""DTensor made visible: per parameter, its placements, global and local shapes, mesh and the bytes this rank holds.

    print(table(model))          # on every rank after fully_shard / parallelize_module

    name                           placements            global shape   local shape   mesh           bytes
    model.layers.0.self_attn.q_proj.weight  (Shard(dim=0),)  (64, 64)  (32, 64)  fsdp(2)       8,192
"""
from __future__ import annotations

import torch

from coursekit.measure.states import tensor_bytes


def describe(model: torch.nn.Module) -> list[dict]:
    """One row per parameter: what it is globally and what this rank keeps of it."""
    from torch.distributed.tensor import DTensor

    rows = []
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            local = p.to_local()
            mesh = p.device_mesh
            axes = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
            rows.append({"name": name, "placements": tuple(repr(x) for x in p.placements),
                         "global_shape": tuple(p.shape), "local_shape": tuple(local.shape),
                         "mesh": " x ".join(f"{a}({s})" for a, s in zip(axes, mesh.shape)),
                         "bytes": tensor_bytes([local]), "dtype": str(p.dtype).removeprefix("torch.")})
        else:
            rows.append({"name": name, "placements": ("plain tensor",), "global_shape": tuple(p.shape),
                         "local_shape": tuple(p.shape), "mesh": "-", "bytes": tensor_bytes([p]),
                         "dtype": str(p.dtype).removeprefix("torch.")})
    return rows


def table(model: torch.nn.Module) -> str:
    rows = describe(model)
    w = max(len(r["name"]) for r in rows)
    head = f"{'parameter':<{w}}  {'placements':<34} {'global':>14} {'local':>14} {'mesh':<22} {'bytes':>10}"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['name']:<{w}}  {', '.join(r['placements']):<34} {str(r['global_shape']):>14} "
                   f"{str(r['local_shape']):>14} {r['mesh']:<22} {r['bytes']:>10,}")
    out.append(f"{'total held by this rank':<{w}}  {'':<34} {'':>14} {'':>14} {'':<22} "
               f"{sum(r['bytes'] for r in rows):>10,}")
    return "\n".join(out)
