"""Accelerators, one table: memory, dense peak FLOP/s per dtype, HBM and GPU-to-GPU bandwidth, board power, and the
names CUDA reports. The calculator's fit check (``coursekit.memory``), the planner's hardware (``coursekit.plan``)
and MFU's peak (``coursekit.profiling.mfu``) read it; none restates a figure.

``memory_bytes`` is the marketed capacity read as GiB (HBM stacks are built in binary units); the CUDA driver shows a
little less to PyTorch (ECC and driver reservations: an "80GB" H100 reports about 79.1 GiB), which is one more reason
the calculator adds a runtime constant. Peak FLOP/s are *dense* (no 2:4 sparsity) tensor-core figures for bf16, and
the plain fp32 (non-tensor-core) figure; ``tf32`` where the data sheet gives one. ``link_bw`` is one GPU's
NVLink / Infinity Fabric / PCIe bandwidth in one direction; the network between nodes is the cluster's, not the
GPU's (``coursekit.plan.hardware.NETWORKS``). Sources: the vendors' data sheets (NVIDIA "<GPU> Tensor Core GPU"
data sheets, SXM parts unless named; AMD Instinct MI300X data sheet); ``power_w`` is the board's maximum (TDP).
"""
from __future__ import annotations

from dataclasses import dataclass

from coursekit.spec.errors import ConfigError

GiB = 1 << 30
GB = 1e9


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    bf16_flops: float  # dense tensor-core peak
    fp32_flops: float  # plain fp32 (CUDA cores / vector units)
    tf32_flops: float | None = None
    hbm_bw: float | None = None  # bytes/s
    link_bw: float | None = None  # bytes/s per GPU, one direction
    power_w: int | None = None
    cuda_names: tuple[str, ...] = ()  # substrings of torch.cuda.get_device_name() that mean this part
    fp8_flops: float | None = None  # dense FP8 tensor-core peak (data sheet); None: no FP8 tensor cores

    def peak_flops(self, dtype: str = "bf16") -> float:
        if dtype in ("bf16", "fp16"):
            return self.bf16_flops
        if dtype == "tf32":
            if self.tf32_flops is None:
                raise ConfigError(f"{self.name} has no TF32 tensor cores")
            return self.tf32_flops
        if dtype == "fp32":
            return self.fp32_flops
        raise ConfigError(f"unknown dtype {dtype!r}; choose one of: bf16, fp16, tf32, fp32")

    @property
    def peaks(self) -> dict[str, float]:
        """Dense peak per dtype: bf16, fp16, fp32 and (where the part has them) tf32 and fp8."""
        out = {"bf16": self.bf16_flops, "fp16": self.bf16_flops, "fp32": self.fp32_flops}
        out |= {"tf32": self.tf32_flops} if self.tf32_flops else {}
        return out | ({"fp8": self.fp8_flops} if self.fp8_flops else {})


GPUS: dict[str, GPU] = {g.name: g for g in (
    # A100 SXM4: HBM2 1,555 GB/s (40GB) / HBM2e 2,039 GB/s (80GB); NVLink 3: 600 GB/s per GPU both ways
    GPU("A100-40GB", 40 * GiB, 312e12, 19.5e12, 156e12, 1555 * GB, 300 * GB, 400, ("A100-SXM4-40GB", "A100-PCIE-40GB")),
    GPU("A100-80GB", 80 * GiB, 312e12, 19.5e12, 156e12, 2039 * GB, 300 * GB, 400, ("A100",)),
    # H100 SXM5: HBM3 3.35 TB/s; NVLink 4: 900 GB/s per GPU both ways. H100 PCIe: HBM2e 2.0 TB/s; 8-GPU PCIe servers
    # talk over PCIe Gen5 x16 (128 GB/s both ways; the NVLink bridge joins pairs only)
    # FP8 dense peaks: the data sheets' "with sparsity" figures halved (H100 SXM 3,958 -> 1,979; PCIe 3,026 -> 1,513)
    GPU("H100-80GB", 80 * GiB, 989.4e12, 66.9e12, 494.7e12, 3350 * GB, 450 * GB, 700, ("H100",), fp8_flops=1978.9e12),
    GPU("H100-PCIe", 80 * GiB, 756.5e12, 51.2e12, 378e12, 2000 * GB, 64 * GB, 350, ("H100 PCIe",),
        fp8_flops=1513e12),
    # Meta's Grand Teton H100 (torchtitan's published runs): 96 GB HBM2e at 2.4 TB/s, NVLink 4, a 500 W power limit;
    # its source bounds the peak "between SXM and NVL": priced at the lower bound, the H100 NVL data sheet's dense
    # figures (BF16 1,671 / FP8 3,341 / TF32 835 TFLOP/s with sparsity, halved; FP32 60 TFLOP/s)
    GPU("H100-96GB-500W", 96 * GiB, 835.5e12, 60e12, 417.5e12, 2400 * GB, 450 * GB, 500, (), fp8_flops=1670.5e12),
    # H200 SXM: H100's compute, HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s
    GPU("H200", 141 * GiB, 989.4e12, 66.9e12, 494.7e12, 4800 * GB, 450 * GB, 700, ("H200",), fp8_flops=1978.9e12),
    GPU("L4", 24 * GiB, 121e12, 30.3e12, 60e12, 300 * GB, 32 * GB, 72, ("L4",)),
    GPU("A10", 24 * GiB, 125e12, 31.2e12, 62.5e12, 600 * GB, 32 * GB, 150, ("A10",)),
    # AWS g5's A10G has no NVIDIA data sheet; these are AWS's / commonly quoted figures (A10 silicon, lower clocks)
    GPU("A10G", 24 * GiB, 70e12, 31.2e12, 35e12, 600 * GB, 32 * GB, None, ("A10G",)),
    GPU("RTX-4090", 24 * GiB, 165.2e12, 82.6e12, 82.6e12, 1008 * GB, 32 * GB, 450, ("RTX 4090",)),  # bf16, fp32 acc.
    # MI300X: HBM3 5.3 TB/s, 192 GB; 7 Infinity Fabric links of 128 GB/s (both ways) to the 7 peers: 448 GB/s one way
    GPU("MI300X", 192 * GiB, 1307.4e12, 163.4e12, 653.7e12, 5300 * GB, 448 * GB, 750, ("MI300X",),
        fp8_flops=2614.9e12),
)}
# Other spellings of one GPU only: a family name with several memory sizes or form factors ("H100": 80GB SXM or
# PCIe; "A100": 40GB or 80GB) is refused with the candidates, never resolved silently.
ALIASES = {"h100-sxm": "H100-80GB", "h100-sxm-80gb": "H100-80GB", "rtx4090": "RTX-4090", "4090": "RTX-4090",
           "h200-141gb": "H200", "mi300x-192gb": "MI300X", "h100-pcie-80gb": "H100-PCIe"}
_BY_LOWER = {k.lower(): v for k, v in GPUS.items()}


def gpu(name) -> GPU:
    """The GPU called ``name`` (case-insensitive; a ConfigError names the candidates of an ambiguous or partial
    name, or lists the known names)."""
    if isinstance(name, GPU):
        return name
    key = str(name).lower()
    key = ALIASES.get(key, key).lower()
    if key not in _BY_LOWER:
        starts = [n for n in GPUS if n.lower().startswith(key)] if key else []
        if len(starts) > 1:
            raise ConfigError(f"ambiguous GPU {name!r}: {' or '.join(starts)}; give the full name")
        if starts:
            raise ConfigError(f"unknown GPU {name!r}; did you mean {starts[0]}?")
        raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return _BY_LOWER[key]


def from_device_name(device_name: str) -> GPU | None:
    """The GPU a CUDA device name means (``torch.cuda.get_device_name()``: "NVIDIA H100 80GB HBM3"), the longest
    matching name first (so "H100 PCIe" is not read as an SXM "H100"); None when the table has no such part."""
    low = device_name.lower()
    hits = [(len(part), g) for g in GPUS.values() for part in g.cuda_names if part.lower() in low]
    return max(hits, key=lambda h: h[0])[1] if hits else None
