"""Accelerators: memory and dense peak FLOP/s, from the vendors' data sheets.

``memory_bytes`` is the marketed capacity read as GiB (HBM stacks are built in binary units); the CUDA driver shows a
little less to PyTorch (ECC and driver reservations: an "80GB" H100 reports about 79.1 GiB), which is one more reason
the calculator adds a runtime constant. Peak FLOP/s are *dense* (no 2:4 sparsity) tensor-core figures for bf16, and
the plain fp32 (non-tensor-core) figure; use ``tf32`` where the data sheet gives one.
"""
from __future__ import annotations

from dataclasses import dataclass

from coursekit.memory.errors import ConfigError

GiB = 1 << 30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    bf16_flops: float  # dense tensor-core peak
    fp32_flops: float  # plain fp32 (CUDA cores / vector units)
    tf32_flops: float | None = None

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


GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("A100-40GB", 40 * GiB, 312e12, 19.5e12, 156e12),  # SXM4 data sheet
    GPU("A100-80GB", 80 * GiB, 312e12, 19.5e12, 156e12),
    GPU("H100-80GB", 80 * GiB, 989.4e12, 66.9e12, 494.7e12),  # SXM5
    GPU("H100-PCIe", 80 * GiB, 756.5e12, 51.2e12, 378e12),
    GPU("H200", 141 * GiB, 989.4e12, 66.9e12, 494.7e12),  # SXM, H100 compute with 141 GB HBM3e
    GPU("L4", 24 * GiB, 121e12, 30.3e12, 60e12),
    GPU("A10", 24 * GiB, 125e12, 31.2e12, 62.5e12),
    # AWS g5's A10G has no NVIDIA data sheet; these are AWS's / commonly quoted figures (A10 silicon, lower clocks)
    GPU("A10G", 24 * GiB, 70e12, 31.2e12, 35e12),
    GPU("RTX-4090", 24 * GiB, 165.2e12, 82.6e12, 82.6e12),  # fp16/bf16 with fp32 accumulate
    GPU("MI300X", 192 * GiB, 1307.4e12, 163.4e12, 653.7e12),
)}
# Other spellings of one GPU only: a family name with several memory sizes or form factors ("H100": 80GB SXM or
# PCIe; "A100": 40GB or 80GB) is refused with the candidates, never resolved silently.
_ALIASES = {"h100-sxm": "H100-80GB", "h100-sxm-80gb": "H100-80GB", "rtx4090": "RTX-4090", "4090": "RTX-4090",
            "h200-141gb": "H200"}


def gpu(name: str) -> GPU:
    """The GPU called ``name`` (case-insensitive; a ConfigError names the candidates of an ambiguous or partial
    name, or lists the known names)."""
    if isinstance(name, GPU):
        return name
    key = str(name).lower()
    key = _ALIASES.get(key, key).lower()
    if key not in _BY_LOWER:
        starts = [n for n in GPUS if n.lower().startswith(key)] if key else []
        if len(starts) > 1:
            raise ConfigError(f"ambiguous gpu {name!r}: {' or '.join(starts)}; give the full name")
        if starts:
            raise ConfigError(f"unknown gpu {name!r}; did you mean {starts[0]}?")
        raise ConfigError(f"unknown gpu {name!r}; known: {', '.join(GPUS)}")
    return _BY_LOWER[key]


_BY_LOWER = {k.lower(): v for k, v in GPUS.items()}
