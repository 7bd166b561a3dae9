"""Which link a process group uses, and what its collectives cost there. Pure Python.

A group lies on NVLink when its ranks fit in a node under the mesh order pp x dp_replicate x dp_shard x cp x tp
(tp innermost), else on the network with busbw = min(NVLink busbw, k x NIC) for k members per node. All-reduce,
all-gather and reduce-scatter cost what NCCL's own tuning model says for that bus bandwidth, group size and node
count (``coursekit.comm.nccl``: ring or tree, LL / LL128 / Simple, the fastest; a ring's latency grows with the
ranks); all-to-all and point-to-point sends are alpha-beta (a fixed cost + per step inside the node + per tree level
across nodes). Measured collectives (``Hardware.collectives`` / ``Network.collectives``) replace the model per op.
"""
from __future__ import annotations

import math

from coursekit.comm import nccl
from coursekit.comm.volume import busbw_factor
from coursekit.spec.dims import AXES


class Links:
    """Which link a process group uses, from its place in the mesh (ParallelDims order) and the node size."""

    ORDER = AXES  # the mesh's axes, outermost first (coursekit.spec.dims, from the registry's mesh places)

    def __init__(self, layout: Layout, cluster: Cluster):
        self.deg = {a: getattr(layout, a, 1) for a in AXES}  # an axis the planner does not search has degree 1
        self.ep = layout.ep
        self.c = cluster
        self._memo: dict = {}

    def placement(self, axes: tuple) -> tuple[int, int, int]:
        """(group size, members per node, nodes spanned) of a group made of contiguous mesh ``axes``."""
        if axes not in self._memo:
            self._memo[axes] = self._placement(axes)
        return self._memo[axes]

    def _placement(self, axes: tuple) -> tuple[int, int, int]:
        if axes in (("ep",), ("ep_rest",)):  # EP: the innermost ep of the dp x cp ranks (ParallelDims), just outside
            host = self.deg["dp_replicate"] * self.deg["dp_shard"] * self.deg["cp"]  # tp; ep_rest: those with one slice
            n, stride = (self.ep, self.deg["tp"]) if axes == ("ep",) else (host // self.ep, self.deg["tp"] * self.ep)
        else:
            inner = self.ORDER[self.ORDER.index(axes[-1]) + 1:]
            stride = math.prod(self.deg[a] for a in inner)
            n = math.prod(self.deg[a] for a in axes)
        g = self.c.gpus_per_node
        k = 1 if stride >= g else max(1, min(n, g // stride))
        return n, k, -(-n // k)  # a group of 12 with 8 per node spans 2 nodes

    def kind(self, axes: tuple) -> str:
        n, k, nodes = self.placement(axes)
        return "nvlink" if nodes == 1 else "network"

    def time(self, op: str, payload: float, axes: tuple, calls: float = 1) -> float:
        """Seconds for ``calls`` collectives of ``payload`` bytes (nccl-tests size convention) over the group."""
        n, k, nodes = self.placement(axes)
        if n == 1 or calls == 0:
            return 0.0
        hw, net = self.c.hw, self.c.net
        measured = (hw if nodes == 1 else net).collectives.get(op)
        if measured is None and op in nccl.TUNED:
            return calls * self.nccl(op, payload, axes).time_s
        bw = self.busbw(k, nodes)
        wire = payload * busbw_factor(op, n)
        if measured is not None:
            alpha, bw = measured
        elif nodes == 1:
            alpha = hw.link_latency_s + hw.hop_latency_s * nccl.ring_steps(op, n)
        else:
            lv = 2 if op == "all_reduce" else 1
            alpha = hw.link_latency_s + hw.hop_latency_s * nccl.ring_steps(op, k) + lv * net.latency_s * math.ceil(
                math.log2(nodes))
        return calls * (alpha + wire / bw)

    def nccl(self, op: str, payload: float, axes: tuple) -> nccl.Choice:
        """NCCL's pick (algorithm, protocol, time) for one ``op`` of ``payload`` bytes over the group of ``axes``."""
        n, k, nodes = self.placement(axes)
        hw = self.c.hw
        return nccl.choose(op, payload, n, nodes, self.busbw(k, nodes), link=hw.nccl_link, arch=hw.nccl_arch)

    def busbw(self, k: int, nodes: int) -> float:
        """A ring's bus bandwidth: NVLink's inside a node, else min(NVLink, k members per node x the NIC's)."""
        hw = self.c.hw
        return hw.intra_busbw if nodes == 1 else min(hw.intra_busbw, k * self.c.net.busbw)

    def p2p(self, nbytes: float, axis: str, calls: float = 1) -> float:
        """Point-to-point sends to a neighbour along ``axis`` (pipeline stages, CP ring)."""
        if self.deg[axis] == 1 or calls == 0:
            return 0.0
        hw, net = self.c.hw, self.c.net
        if self.kind((axis,)) == "nvlink":
            alpha, bw = (hw.collectives.get("send") or (hw.link_latency_s, hw.intra_busbw))
        else:
            alpha, bw = (net.collectives.get("send") or (net.latency_s, net.busbw))
        return calls * (alpha + nbytes / bw)
