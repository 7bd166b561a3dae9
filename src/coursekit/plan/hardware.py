"""What the planner needs to know about a machine: compute peaks, memory bandwidth, links. Pure Python.

Two kinds of figure, kept apart:

* **Data-sheet figures**: dense tensor-core peaks, HBM capacity and bandwidth, the NVLink / Infinity Fabric
  bandwidth per GPU (one direction), from the one GPU table (``coursekit.spec.gpus``, which cites them); the
  network bandwidth per GPU (below).
* **Stated achievable fractions** (model assumptions, one place, the same for every case the planner is checked on):
  ``gemm_fraction`` of the dense peak a large GEMM sustains, ``attn_fraction`` for a flash-attention kernel
  (forward + backward), ``link_fraction`` of a link's one-way bandwidth that a ring collective's bus bandwidth
  reaches, ``HBM_FRACTION`` of HBM bandwidth for memory-bound kernels.

Overrides: ``load_overrides(path)`` reads YAML or JSON with any field of ``Hardware`` / ``Network`` and, under
``collectives``, the rows ``coursekit.comm.bench`` measured (per link: ``intra`` for inside a node, ``inter`` across
nodes), from which per-collective latency and bus bandwidth are fitted (``fit_alpha_beta``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from coursekit.comm.volume import busbw_factor
from coursekit.spec.gpus import gpu as spec_gpu

GB = 1e9
HBM_FRACTION = 0.85  # memory-bound kernels (norms, activations, optimizer) reach ~85 % of HBM peak (STREAM-like)


# Lee et al. 2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning"
# (arXiv 2507.03114), abstract: overlapping computation and communication slowed the computation by 18.9 % on
# average (40.0 % at most) against the same compute with no communication beside it, over GPT and Llama training on
# 4 A100, H100, MI250 and MI210 GPUs. One figure for every GPU of the table (a stated assumption: it is their mean).
OVERLAP_SLOWDOWN = 0.189


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator and its node. Bandwidths in bytes/s, FLOP/s, seconds."""
    name: str
    memory_bytes: int
    peak_flops: dict
    """Dense peak per dtype: bf16, fp16, fp32, tf32."""
    hbm_bw: float
    """Memory bandwidth (data sheet)."""
    link_bw: float
    """Intra-node GPU-to-GPU bandwidth per GPU, one direction (NVLink / Infinity Fabric / PCIe)."""
    link_fraction: float = 0.80
    """Ring bus bandwidth / one-way link bandwidth (nccl-tests all_reduce on DGX A100: ~230-240 of 300 GB/s)."""
    link_latency_s: float = 8e-6
    """Fixed cost of an all-to-all or a send inside a node (launch + handshake); plus ``hop_latency_s`` per ring
    step. All-reduce, all-gather and reduce-scatter follow NCCL's tuning model (``coursekit.comm.nccl``)."""
    hop_latency_s: float = 0.7e-6
    gemm_fraction: float = 0.70
    """Fraction of the dense peak a large GEMM sustains in training (clocks under power limits, epilogues)."""
    gemm_half_dim: int = 96
    """Small-GEMM curve: each of M, N, K contributes d / (d + gemm_half_dim) (tile fill and wave quantisation)."""
    attn_fraction: float = 0.45
    """Fraction of the dense peak a fused (flash) attention kernel sustains, forward and backward together."""
    kernel_floor_s: float = 4e-6
    """Shortest time any kernel takes (launch + tail); on a CPU, the per-op dispatch overhead."""
    overlap: float = 1.0
    """How much of an overlap window is usable (1: separate copy engines / SMs; 0: comm competes for the cores)."""
    overlap_slowdown: float = OVERLAP_SLOWDOWN
    """How much slower compute runs while a collective runs beside it: the collective's kernels hold SMs (an
    all-gather launched 24 CTAs on an H100's 132 SMs) and HBM bandwidth. Each hidden second of communication
    stretches the step by ``overlap_slowdown / (1 + overlap_slowdown)`` s while the compute window outlasts it, and
    by what of the slowed compute outlasts the collectives once they fill it (``steptime._stretch``;
    ``interference_s``)."""
    optimizer_ops_per_tensor: int = 0
    """Optimizer kernels per parameter tensor beyond the memory-bound term (0: fused / multi-tensor kernels on GPUs;
    torch's single-tensor AdamW loop on a CPU runs about 10 per tensor)."""
    zero3_hook_s: float = 100e-6
    """DeepSpeed ZeRO-3's host work per parameter tensor per micro-batch: the Python hooks that fetch each module's
    parameters before its forward and its backward, release them after, and partition its gradient. Charged beyond
    what ``overlap`` of the device compute hides (on a CPU, all of it). Measured on a CPU host by
    ``coursekit.plan.calibrate.zero3_hook_cost`` (there ~170 plain-op costs per tensor: on a CPU the host also does
    the copies and allocations a GPU's streams do). The GPU default (100 us) is a stated assumption, not measured
    and not a published figure."""
    dtensor_op_s: float = 30e-6
    """Host cost of an op on a DTensor beyond the plain op, in a TP layer's forward and backward (sharding
    propagation, unwrap / rewrap); ``dtensor_opt_op_s`` the same in an optimizer step. Hidden behind ``overlap`` x
    the device compute. Measured on a CPU host by ``coursekit.plan.calibrate.dtensor_op_cost`` (there ~7-20 and ~4-5
    plain-op costs); the GPU defaults are stated assumptions, not measured and not published figures."""
    dtensor_opt_op_s: float = 10e-6
    loss_sync: bool = False
    """The trainer all-reduces the loss every step (coursekit's trainer does; a latency-bound call)."""
    nccl_arch: str = "hopper"
    """The GPU generation NCCL's tuning tables key on (volta, ampere, hopper, blackwell)."""
    nccl_link: str = "nvlink"
    """NCCL's intra-node link class for its per-step latencies: nvlink or pci."""
    collectives: dict = field(default_factory=dict)
    """Measured per-op (latency_s, busbw B/s) inside a node, from coursekit.comm.bench rows; overrides the above."""
    source: str = ""

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ValueError(f"{self.name} has no {dtype} peak; known: {', '.join(self.peak_flops)}")
        return self.peak_flops[dtype]

    @property
    def intra_busbw(self) -> float:
        return self.link_bw * self.link_fraction


@dataclass(frozen=True, kw_only=True)
class Network:
    """The inter-node network, per GPU (rail-optimised: one NIC per GPU)."""
    name: str
    bw_per_gpu: float
    """Bytes/s one GPU's NIC carries one way."""
    fraction: float = 0.90
    """Achieved bus bandwidth / NIC line rate for large messages (IB ~0.9, RoCE ~0.85)."""
    latency_s: float = 12e-6
    """Per tree level of an inter-node all-to-all, and of a send across nodes (NIC + switch + NCCL proxy); the
    NCCL-tuned collectives take NCCL's own network step latency (``coursekit.comm.nccl``)."""
    collectives: dict = field(default_factory=dict)
    source: str = ""

    @property
    def busbw(self) -> float:
        return self.bw_per_gpu * self.fraction


def _gpu(name, *, src: str, **kw):
    """The planner's Hardware for a GPU of the table: its data-sheet figures, and the stated fractions ``kw``."""
    g = spec_gpu(name)
    return Hardware(name=g.name, memory_bytes=g.memory_bytes, peak_flops=g.peaks, hbm_bw=g.hbm_bw, link_bw=g.link_bw,
                    source=src, **kw)


_NV = "NVIDIA {} Tensor Core GPU data sheet (nvidia.com), dense (non-sparse) peaks"
# the GPUs the planner's stated fractions are given for (each GEMM / attention fraction is a model assumption,
# the same for every case checked; the data-sheet figures are the table's)
HARDWARE: dict[str, Hardware] = {h.name: h for h in (
    _gpu("A100-40GB", src=_NV.format("A100"), gemm_fraction=0.72, attn_fraction=0.50, nccl_arch="ampere"),
    _gpu("A100-80GB", src=_NV.format("A100"), gemm_fraction=0.72, attn_fraction=0.50, nccl_arch="ampere"),
    _gpu("H100-80GB", src=_NV.format("H100"), gemm_fraction=0.62, attn_fraction=0.40),
    _gpu("H100-PCIe", src=_NV.format("H100"), gemm_fraction=0.62, attn_fraction=0.40, link_fraction=0.70,
         nccl_link="pci"),
    _gpu("H200", src=_NV.format("H200"), gemm_fraction=0.64, attn_fraction=0.40),
    _gpu("H100-96GB-500W", gemm_fraction=0.62, attn_fraction=0.40,
         src="Grand Teton H100 as torchtitan's benchmarks describe it (pytorch/torchtitan benchmarks/"
             "llama3_h100_202412_torchtitan.md): 96 GB HBM2e, 2.4 TB/s, 500 W; peak at the lower of the two bounds "
             "it gives (H100 NVL data sheet), H100's fractions"),
    # a ring uses fewer of MI300X's Infinity Fabric links than a full mesh offers, hence the lower link_fraction;
    # RCCL keeps NCCL's tuning model: priced with its Hopper-generation tables (a stated assumption)
    _gpu("MI300X", link_fraction=0.70, gemm_fraction=0.50, attn_fraction=0.30,
         src="AMD Instinct MI300X data sheet (amd.com), dense peaks"),
)}

_G = "line rate per GPU, one NIC per GPU (rail-optimised)"
NETWORKS: dict[str, Network] = {n.name: n for n in (
    Network(name="ib-400", bw_per_gpu=50 * GB, source=f"InfiniBand NDR 400 Gb/s, {_G}"),
    Network(name="ib-200", bw_per_gpu=25 * GB, source=f"InfiniBand HDR 200 Gb/s, {_G} (DGX A100: 8 x HDR)"),
    Network(name="ib-100", bw_per_gpu=12.5 * GB, source=f"InfiniBand EDR 100 Gb/s, {_G}"),
    Network(name="roce-400", bw_per_gpu=50 * GB, fraction=0.85, latency_s=15e-6, source=f"RoCE 400 Gb/s, {_G}"),
    Network(name="roce-200", bw_per_gpu=25 * GB, fraction=0.85, latency_s=15e-6, source=f"RoCE 200 Gb/s, {_G}"),
    Network(name="roce-100", bw_per_gpu=12.5 * GB, fraction=0.85, latency_s=15e-6, source=f"RoCE 100 Gb/s, {_G}"),
    Network(name="efa-3200", bw_per_gpu=50 * GB, fraction=0.80, latency_s=20e-6,
            source="AWS p5 EFA v2, 3,200 Gb/s per 8-GPU node"),
    Network(name="opa-4x100", bw_per_gpu=6.25 * GB, fraction=0.85, latency_s=15e-6,
            source="4 x 100 Gb/s Omni-Path per 8-GPU node (Jean Zay A100 partition, BLOOM paper §3.4)"),
    Network(name="eth-100", bw_per_gpu=12.5 * GB / 8, fraction=0.80, latency_s=30e-6,
            source="one 100 Gb/s Ethernet port per 8-GPU node"),
)}


def hardware(name) -> Hardware:
    """The GPU preset called ``name`` (the table's names and spellings, ``coursekit.spec.gpus``), or a ValueError
    naming the known ones."""
    if isinstance(name, Hardware):
        return name
    g = spec_gpu(name)  # ambiguous ("H100": SXM or PCIe?) and unknown names are refused there, with the candidates
    if g.name not in HARDWARE:
        raise ValueError(f"GPU {g.name} has no planner preset (no stated GEMM / attention fractions); known: "
                         f"{', '.join(HARDWARE)} (or describe one with --hardware FILE)")
    return HARDWARE[g.name]


def network(name) -> Network:
    if isinstance(name, Network):
        return name
    for k, v in NETWORKS.items():
        if k.lower() == str(name).lower():
            return v
    raise ValueError(f"unknown network {name!r}; known: {', '.join(NETWORKS)} (or set it with --hardware FILE)")


# -- measured collectives ----------------------------------------------------------------------------------------------
def fit_alpha_beta(rows, op: str) -> tuple[float, float]:
    """Least-squares fit of ``time = alpha + wire_bytes / busbw`` to coursekit.comm.bench rows of ``op``.

    Returns (alpha_s, busbw B/s). busbw is per-rank wire bytes per second (nccl-tests' convention), so the fit is
    valid at the group size benchmarked and carries to other sizes through ``busbw_factor``.
    """
    pts = [(r["size"] * busbw_factor(op, r["world_size"]), r["time_us"] * 1e-6) for r in rows if r["op"] == op]
    if len(pts) < 2:
        raise ValueError(f"need at least two benchmark rows of {op}, got {len(pts)}")
    n = len(pts)
    mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
    if slope <= 0:
        raise ValueError(f"benchmark rows of {op} do not grow with size; cannot fit a bandwidth")
    alpha = max(0.0, my - slope * mx)
    return alpha, 1.0 / slope


def collectives_from_rows(rows) -> dict:
    """{op: (alpha_s, busbw)} for every op with at least two rows (ring_all_reduce is skipped)."""
    rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
    ops = sorted({r["op"] for r in rows} - {"ring_all_reduce"})
    return {op: fit_alpha_beta(rows, op) for op in ops if sum(r["op"] == op for r in rows) >= 2}


def _rows_from(spec, base: Path):
    if isinstance(spec, (str, Path)):
        return json.loads((base / spec).read_text())
    return spec


def load_overrides(path, hw: Hardware, net: Network) -> tuple[Hardware, Network]:
    """Apply a YAML/JSON file to the chosen presets. Top-level keys: ``gpu`` (Hardware fields; figures in the
    units above, e.g. ``hbm_bw: 3.35e12``), ``network`` (Network fields), ``collectives`` ({intra|inter: bench rows or
    a path to a JSON file of them})."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"hardware file {path} not found")
    text = p.read_text()
    if p.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with keys gpu, network, collectives")
    unknown = set(data) - {"gpu", "network", "collectives"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; use gpu, network, collectives")
    hw = _apply(hw, data.get("gpu") or {}, path)
    net = _apply(net, data.get("network") or {}, path)
    coll = data.get("collectives") or {}
    if "intra" in coll:
        hw = replace(hw, collectives=collectives_from_rows(_rows_from(coll["intra"], p.parent)))
    if "inter" in coll:
        net = replace(net, collectives=collectives_from_rows(_rows_from(coll["inter"], p.parent)))
    return hw, net


def _number(v, current, key, path):
    """YAML 1.1 reads ``1.0e12`` (no exponent sign) as a string: take numbers for numeric fields."""
    if isinstance(current, (int, float)) and not isinstance(current, bool) and isinstance(v, str):
        try:
            return type(current)(float(v))
        except ValueError:
            raise ValueError(f"{path}: {key} must be a number, got {v!r}") from None
    if isinstance(current, dict) and isinstance(v, dict):
        return {k: float(x) if isinstance(x, str) else x for k, x in v.items()}
    return v


def _apply(obj, changes: dict, path):
    names = {f.name for f in fields(obj)}
    bad = set(changes) - names
    if bad:
        raise ValueError(f"{path}: unknown {type(obj).__name__} fields {sorted(bad)}; "
                         f"known: {', '.join(sorted(names))}")
    changes = {k: _number(v, getattr(obj, k), k, path) for k, v in changes.items()}
    if "peak_flops" in changes:
        changes = dict(changes, peak_flops={**obj.peak_flops, **changes["peak_flops"]})
    return replace(obj, **changes)
