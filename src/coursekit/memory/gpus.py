"""Accelerators for the calculator's fit check: the one GPU table of the run description (``coursekit.spec.gpus``)."""
from coursekit.spec.gpus import GPU, GPUS, GiB, gpu

__all__ = ["GPU", "GPUS", "GiB", "gpu"]
