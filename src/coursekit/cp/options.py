"""The context-parallel option group (pure Python, so the CLI parses without importing torch)."""
from __future__ import annotations

from dataclasses import dataclass, field

from coursekit.spec.run import CP_IMPLS


@dataclass(kw_only=True)
class CPOptions:
    cp_impl: str = field(default="ring", metadata={"choices": CP_IMPLS})
    """Context-parallel attention: ring (K/V blocks around a ring, zig-zag load balance) or ulysses (all-to-all
    from sequence to heads and back)."""
