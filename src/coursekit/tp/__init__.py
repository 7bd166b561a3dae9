"""Tensor parallelism (Module 4) with DTensor ``parallelize_module``: the plan in ``plan.py``."""
