"""Exact per-rank training memory of a decoder-only transformer, in pure Python (no torch import).

Start with ``estimate(model, batch=..., seq=...)``; see ``coursekit.memory.calculator``.
"""
