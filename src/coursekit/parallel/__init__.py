"""The parallel core: one layout (``dims``, pure Python), one mesh (``mesh``), composable parallelisms.

Importing this package imports no torch: the calculator and the planner use ``ParallelDims`` too.
"""
from coursekit.spec.dims import AXES, DERIVED, LayoutError, ParallelDims, check_model

__all__ = ["AXES", "DERIVED", "LayoutError", "ParallelDims", "check_model"]
