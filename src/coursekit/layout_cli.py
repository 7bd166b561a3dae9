"""``coursekit layout``: which global rank holds which mesh coordinate, and which groups it talks in.

    coursekit layout --nproc 16 --tp 8 --pp 2 --gpus-per-node 8
    coursekit layout --nproc 8 --tp 2 --pp 2 --cp 2 --strategy fsdp2 --json

Pure Python (``coursekit.parallel.ParallelDims``, no torch, no processes): the same rank ↔ coordinate map the
trainer builds its ``DeviceMesh`` from (axes pp × dp_replicate × dp_shard × cp × tp, tp fastest). With
``--gpus-per-node`` each rank's node is shown, and every axis is marked *intra-node* when all of its groups stay
inside one node (NVLink) or *crosses nodes* when some group spans the network.
"""
from __future__ import annotations

import argparse
import json
import sys

from coursekit.spec import registry
from coursekit.spec.run import STRATEGIES


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit layout", description=__doc__.splitlines()[0].replace("``", ""))
    p.add_argument("--nproc", type=int, required=True, help="world size (GPUs / processes)")
    for k, e in registry.PARALLELISMS.items():  # one degree flag per registered parallelism
        p.add_argument(f"--{k}", type=int, default=1, help=f"{e.help or k} degree (default 1)")
    p.add_argument("--dp-replicate", type=int, default=None, help="data-parallel replicas (default: fill)")
    p.add_argument("--dp-shard", type=int, default=None, help="data-parallel sharding ranks (fsdp2, hsdp)")
    p.add_argument("--strategy", default="ddp", choices=STRATEGIES, help="data-parallel strategy: decides which dp axis fills")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node: show nodes and which axes "
                   "cross them")
    p.add_argument("--json", action="store_true", help="every rank's coordinate and groups as JSON")
    return p


def dims_of(a):
    from coursekit.spec.runspec import RunSpec

    degrees = {k: getattr(a, k) for k in registry.PARALLELISMS if getattr(a, k) != 1}
    return RunSpec(strategy=a.strategy, world=a.nproc, dp_replicate=a.dp_replicate, dp_shard=a.dp_shard,
                   degrees=degrees).dims()


def placement(dims, gpus_per_node: int) -> dict:
    """Per axis with more than one rank: 'intra-node' if every group lies inside one node, else 'crosses nodes'."""
    out = {}
    for a in dims.enabled:
        inside = all(len({r // gpus_per_node for r in g}) == 1 for g in dims.groups(a))
        out[a] = "intra-node" if inside else "crosses nodes"
    return out


def layout(dims, gpus_per_node: int | None = None) -> dict:
    axes = dims.enabled or ["dp_replicate"]
    ranks = [{"rank": r, **({"node": r // gpus_per_node} if gpus_per_node else {}), "coords": {**dims.coords(r), **{n: dims.coord(r, n) for n in axes if n not in dims.degrees}},
              "groups": {a: dims.group(r, a) for a in axes}} for r in range(dims.world_size)]
    return {"layout": dims.to_dict(), "ranks": ranks,
            **({"placement": placement(dims, gpus_per_node)} if gpus_per_node else {})}


def main(argv=None) -> int:
    from coursekit.parallel import LayoutError

    a = parser().parse_args(argv)
    if a.gpus_per_node is not None and (a.gpus_per_node < 1 or a.nproc % a.gpus_per_node):
        raise ValueError(f"--gpus-per-node {a.gpus_per_node} does not divide --nproc {a.nproc}")
    try:
        dims = dims_of(a)
    except LayoutError as e:
        raise ValueError(str(e)) from None
    if a.json:
        print(json.dumps(layout(dims, a.gpus_per_node)))
        return 0
    print(dims.describe(gpus_per_node=a.gpus_per_node))
    if a.gpus_per_node:
        print()
        for axis, where in placement(dims, a.gpus_per_node).items():
            print(f"{axis:>12}: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
