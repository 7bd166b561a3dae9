"""The parallel core: one layout (``dims``, pure Python), one mesh (``mesh``), composable parallelisms.

Importing this package imports no torch: the calculator and the planner use ``ParallelDims`` too.
"""
from coursekit.spec.dims import AXES, DERIVED, LayoutError, ParallelDims, check_model

__all__ = ["AXES", "DERIVED", "LayoutError", "ParallelDims", "check_model", "model_parts"]


def model_parts(model) -> list:
    """The causal LMs a rank holds (torchtitan's ``model_parts``): the model itself, or the LMs of its pipeline
    stages (a stage module answers ``parts()``). Here, torch-free, so that the parallelisms' modules, whose
    ``check`` the CLI runs before launching, import no torch (``compose`` re-exports it)."""
    parts = getattr(model, "parts", None)
    return list(parts()) if callable(parts) else [model]
