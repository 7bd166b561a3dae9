"""How long NCCL takes for one collective, by NCCL's own cost model (Module 1; pure Python, no torch).

At init NCCL builds a table of latency and bandwidth for every (collective, algorithm, protocol) and, for each
call, takes the one with the smallest ``latency + bytes / bandwidth`` (``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime`` in src/graph/tuning.cc; the constants below are NVIDIA/nccl master 5067397, 2026-06-11).
This module is that model for the two algorithms every NCCL job has and the three protocols:

* **ring** (all-reduce, all-gather, reduce-scatter): ``steps`` = 2(n-1) for all-reduce, n-1 for the others, of
  which ``inter`` cross a node boundary (the same count over nodes); latency = base + (steps - inter) x intra-node
  step + inter x network step; bandwidth = bus bandwidth x n / steps (so bytes / bandwidth = wire bytes / busbw,
  nccl-tests' convention, ``coursekit.comm.volume.busbw_factor``). On several nodes a large all-reduce's latency is
  x1.4 (NCCL's "plateau effect of ring", Ampere and later).
* **tree** (all-reduce only): latency = base + 2 ((n/nodes - 1) x intra step + log2(nodes) x network step);
  bandwidth = 0.92 x bus bandwidth x 0.5, times NCCL's size correction for medium messages.
* **protocols**: Simple (the full bus bandwidth, the slowest steps), LL128 (0.92 of it; Hopper and later, and
  Ampere on NVLink, enable it by default), LL (half of it, capped; the fastest steps).

Why it matters at scale: a ring's latency grows with the ranks, not with log(ranks). An all-gather of a 300 MB
layer over 1,536 GPUs (192 nodes) pays 1,535 steps: ~3.5 ms of latency next to ~1.7 ms of transfer at 180 GB/s,
so a ZeRO-3 / FSDP job that gathers per layer is latency-bound where an alpha-beta model with tree latency
predicts it bandwidth-bound and hidden.

The bus bandwidth given is the link's ring figure (``coursekit.plan.hardware``: NVLink inside a node, the NICs
across). Not modelled: NVLS (NVSwitch multicast), CollNet / SHARP, PAT (one GPU per node), NCCL's per-channel
bandwidth caps (with its usual 16+ channels they lie above the links here), the net plugin's own latency (0 for
IB verbs), NCCL_ALGO / NCCL_PROTO (pass ``algorithms`` / ``protocols``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from coursekit.comm.volume import busbw_factor

TUNED = ("all_reduce", "all_gather", "reduce_scatter")
"""The collectives this model prices (NCCL tunes broadcast/reduce too; all-to-all and send are point-to-point)."""
ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")
LINKS = ("nvlink", "pci")

# microseconds (tuning.cc's ncclTunerConstantsDefaults: baseLatencies, hwLatencies)
BASE_LAT_US = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}, "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}}
HW_LAT_US = {
    "nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}, "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
    "pci": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}, "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
    "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}, "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}},
}
NET_OVERHEAD_US = 1.0  # getNetOverhead on an Intel x86 host (AMD: 2.0); x3 for Simple; floors an intra step
# LL's bandwidth cap, GB/s (llMaxBws): one node by GPU generation; across nodes by host CPU (Intel) and node count
LL_MAX_BW_ONE_NODE = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
LL_MAX_BW_NODES = {2: 39.0, 3: 20.4}  # 2 nodes; 3 or more
RING_PLATEAU = 1.4  # multi-node ring/Simple all-reduce latency factor on compute capability >= 8.0 (1.9 before)
NCHANNELS = 16  # only for the plateau's threshold (bytes per channel per rank >= 64)
# treeCorrectionFactor: tree bandwidth factor per protocol by log2(bytes / 64), 64 B to 256 MB
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}


@dataclass(frozen=True)
class Choice:
    """NCCL's pick for one call: its time, algorithm and protocol, and the latency / bandwidth it used."""
    time_s: float
    algorithm: str
    protocol: str
    latency_s: float
    bandwidth: float
    """Algorithm bandwidth, bytes/s (payload bytes / this = the transfer time)."""


def ring_steps(op: str, n: int) -> int:
    """Steps of a ring over n ranks: 2(n-1) for all-reduce (reduce-scatter, then all-gather), n-1 otherwise."""
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def _latency_us(op, algo, proto, n, nodes, link) -> float:
    intra = HW_LAT_US[link][algo][proto]
    ppn = n / nodes
    inter = HW_LAT_US["net"]["tree" if ppn == 1 else algo][proto]  # one GPU per node: every step is exposed
    lat = BASE_LAT_US[algo][proto]
    if algo == "tree":
        return lat + 2 * ((ppn - 1) * intra + (nodes.bit_length() - 1) * inter)
    if nodes > 1:
        intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
    inter_steps = 0 if nodes == 1 else ring_steps(op, nodes)
    return lat + (ring_steps(op, n) - inter_steps) * intra + inter_steps * inter


def _bus_bw(algo, proto, busbw_gbs, nodes, arch) -> float:
    """NCCL's bus bandwidth of one (algorithm, protocol), GB/s, from the link's ring figure."""
    ll_max = LL_MAX_BW_ONE_NODE[arch] if nodes == 1 else LL_MAX_BW_NODES[min(nodes, 3)]
    b = busbw_gbs
    if algo == "ring":
        return {"LL": min(ll_max, b * 0.5), "LL128": b * 0.92, "Simple": b}[proto]
    b *= 0.92
    return {"LL": min(b / 3.8, ll_max), "LL128": b * (7 / 9 if nodes == 1 else 120 / 128), "Simple": b}[proto]


def candidates(op: str, nbytes: float, n: int, nodes: int, busbw: float, *, link: str = "nvlink",
               arch: str = "hopper", algorithms=ALGORITHMS, protocols=None) -> list[Choice]:
    """Every (algorithm, protocol) NCCL would weigh for ``op`` of ``nbytes`` (nccl-tests' size: the buffer of one
    rank for all-reduce, the whole gathered / reduced buffer for all-gather / reduce-scatter) over ``n`` ranks on
    ``nodes`` nodes, with ring bus bandwidth ``busbw`` (bytes/s); fastest first."""
    if op not in TUNED:
        raise ValueError(f"NCCL's tuning model prices {', '.join(TUNED)}, not {op!r}")
    if link not in LINKS or arch not in ARCHS:
        raise ValueError(f"link must be one of {LINKS} and arch one of {ARCHS}, got {link!r}, {arch!r}")
    if n < 2 or nodes < 1 or nodes > n:  # an uneven spread (12 ranks on 8 + 4) is priced as NCCL does: n / nodes
        raise ValueError(f"need n >= 2 ranks on 1 to n nodes, got n {n}, nodes {nodes}")
    if protocols is None:  # LL128 by default on Hopper and later; on Ampere / Volta only over NVLink
        protocols = PROTOCOLS if (arch in ("hopper", "blackwell") or link == "nvlink") else ("LL", "Simple")
    out = []
    for algo in algorithms:
        if algo == "tree" and op != "all_reduce":
            continue
        for proto in protocols:
            lat = _latency_us(op, algo, proto, n, nodes, link)
            bw = _bus_bw(algo, proto, busbw / 1e9, nodes, arch)
            if algo == "ring":
                bw *= n / ring_steps(op, n)
                if proto == "Simple" and nodes > 1 and op == "all_reduce" and nbytes / (NCHANNELS * n) >= 64:
                    lat *= RING_PLATEAU
            else:
                bw *= 0.5
                log = int(math.log2(max(1, int(nbytes) >> 6))) if nbytes >= 64 else 0
                if log < len(TREE_CORRECTION[proto]):
                    bw *= TREE_CORRECTION[proto][log]
            bw_bytes = bw * 1e9
            out.append(Choice(lat * 1e-6 + nbytes / bw_bytes, algo, proto, lat * 1e-6, bw_bytes))
    return sorted(out, key=lambda c: c.time_s)


@lru_cache(maxsize=1 << 16)
def choose(op: str, nbytes: float, n: int, nodes: int, busbw: float, **kw) -> Choice:
    """NCCL's pick (the fastest candidate) for one call; see ``candidates``. Cached: a layout search asks the same
    calls many times."""
    return candidates(op, nbytes, n, nodes, busbw, **kw)[0]


def curve(op: str, n: int, nodes: int, busbw: float, sizes=None, **kw) -> list[dict]:
    """nccl-tests' table for the model: per size, time, algbw and busbw (GB/s) and NCCL's pick."""
    rows = []
    for s in sizes or [2 ** k for k in range(10, 34, 2)]:
        c = choose(op, s, n, nodes, busbw, **kw)
        algbw = s / c.time_s / 1e9
        rows.append({"op": op, "size": s, "ranks": n, "nodes": nodes, "time_us": c.time_s * 1e6, "algbw": algbw,
                     "busbw": algbw * busbw_factor(op, n), "algorithm": c.algorithm, "protocol": c.protocol})
    return rows
