"""Answers cross from a student's process to the checks as JSON text, never as objects.

A check then compares only plain built-in values that it decoded itself: an answer object whose ``__eq__`` always
returns True, a ``float`` subclass that lies about itself, or a proxy that patches ``assert`` cannot cross. Values
keep their shape: tuples stay tuples and dicts may have int or tuple keys (both tagged in the JSON), numpy and torch
values become numbers and lists, a matplotlib figure becomes its ``describe_figure`` record.
"""
from __future__ import annotations

import dataclasses
import json
import math

TUPLE, DICT = "__tuple__", "__dict__"
MAX_DEPTH = 64


class NotPlainData(TypeError):
    """An answer that is not plain data (numbers, strings, booleans, None, lists, tuples, dicts)."""


def _prep(x, depth: int = 0):
    if depth > MAX_DEPTH:
        raise NotPlainData(f"answer nested more than {MAX_DEPTH} levels deep")
    t = type(x)
    if x is None or t in (bool, str, int, float):
        return x
    if isinstance(x, bool):  # numpy.bool_ is not a bool subclass, bool itself cannot be subclassed
        return bool(x)
    if isinstance(x, int):  # the builtin slots bypass whatever a subclass overrides
        return int.__index__(x)
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, (list, tuple)):
        items = [_prep(v, depth + 1) for v in x]
        return {TUPLE: items} if isinstance(x, tuple) else items
    if isinstance(x, dict):
        if all(type(k) is str for k in x) and not (len(x) == 1 and next(iter(x)) in (TUPLE, DICT)):
            return {k: _prep(v, depth + 1) for k, v in x.items()}
        return {DICT: [[_prep(k, depth + 1), _prep(v, depth + 1)] for k, v in x.items()]}
    module = type(x).__module__.split(".")[0]
    if module in ("numpy", "torch") and hasattr(x, "tolist"):
        return _prep(x.tolist(), depth + 1)
    if module == "matplotlib" and hasattr(x, "get_axes"):
        from coursekit.course.testing import describe_figure

        return _prep(describe_figure(x), depth + 1)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _prep(dataclasses.asdict(x), depth + 1)
    raise NotPlainData(f"a {type(x).__name__} is not plain data: return numbers, strings, booleans, None, "
                       "lists, tuples or dicts")


def encode(x) -> str:
    """JSON text for a plain value (raises NotPlainData for anything else)."""
    return json.dumps(_prep(x), allow_nan=True)


def _hook(d: dict):
    if len(d) == 1 and TUPLE in d:
        return tuple(d[TUPLE])
    if len(d) == 1 and DICT in d:
        return {(tuple(k) if isinstance(k, list) else k): v for k, v in d[DICT]}
    return d


def decode(text: str):
    """The plain value in ``text`` (built only from JSON: dict, list, tuple, str, int, float, bool, None)."""
    return json.loads(text, object_hook=_hook)


def roundtrip(x):
    """``x`` as a check sees it after it crossed a process boundary (kernel-side helpers use this)."""
    return decode(encode(x))


def close(a, b, rel: float = 1e-9, abs_: float = 0.0) -> bool:
    """Numbers (or equal-shaped lists/tuples/dicts of numbers) equal within a tolerance; False for anything else."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, rel, abs_) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel, abs_) for k in a)
    return type(a) is type(b) and a == b
