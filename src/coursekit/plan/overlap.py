"""Which communication a layout overlaps with compute: one option per engine, with the defaults each engine ships.
Pure Python.

``Layout.overlap`` is '' (the engine's defaults) or names joined by '+', each switching one on, or off with a
``no-`` prefix: ``overlap=param_gather+tp`` (Megatron-Core with ``--overlap-param-gather --tp-comm-overlap``),
``overlap=no-grad_reduce`` (gradients reduced after backward). The prediction lists what it assumed
(``Prediction.overlap``).

| name | what overlaps | engines | default |
| --- | --- | --- | --- |
| grad_reduce | bucketed gradient reduce with the last micro-batch's backward (DDP's reducer; Megatron-Core ``--overlap-grad-reduce``; DeepSpeed ``overlap_comm``) | ddp, ZeRO-1/2 | on (torch DDP always overlaps; DeepSpeed's ZeRO-1/2 default ``overlap_comm`` is off: set ``no-grad_reduce``) |
| param_gather | the all-gather of updated parameters (ZeRO-1/2, Megatron's distributed optimizer) with the next step's first forward, bucket by bucket (``--overlap-param-gather``) | ZeRO-1/2 | off |
| prefetch | a sharded unit's gather with the previous unit's compute, its reduce-scatter with the next one's (FSDP2's implicit prefetch; ZeRO-3 ``overlap_comm``, on by default at stage 3) | fsdp2 / hsdp, ZeRO-3 | on |
| tp | TP's all-gather / reduce-scatter with the GEMM they feed, in tp chunks (Megatron-Core ``--tp-comm-overlap``, torchtitan's async TP); needs sequence parallelism | tp > 1 with sp | off |

``Layout.grad_reduce_dtype`` (fp32, the default of DDP / DeepSpeed / FSDP2 mixed precision, or bf16: Megatron-Core
``--grad-reduce-in-bf16``, FSDP2 ``reduce_dtype=bfloat16``) halves the gradient bytes on the wire.
"""
from __future__ import annotations

OVERLAPS = ("grad_reduce", "param_gather", "prefetch", "tp")
GRAD_DTYPES = {"fp32": 4, "bf16": 2}


def applies(name: str, layout) -> str | None:
    """None when ``name`` can act on this layout, else why not."""
    L = layout
    if name in ("grad_reduce", "param_gather") and L.shards_params:
        return f"{name} is for DDP and ZeRO-1/2 (a sharded engine's reduce-scatter overlaps under 'prefetch')"
    if name == "param_gather" and not (L.engine == "deepspeed" and L.zero in (1, 2)):
        return "param_gather overlaps ZeRO-1/2's all-gather of updated parameters: engine deepspeed, zero 1 or 2"
    if name == "prefetch" and not L.shards_params:
        return "prefetch overlaps a sharded engine's gathers: fsdp2 / hsdp or ZeRO-3"
    if name == "tp" and not (L.tp > 1 and L.sp):
        return "tp overlap (Megatron-Core --tp-comm-overlap, async TP) needs tp > 1 with sequence parallelism"
    return None


def defaults(layout) -> dict:
    """The engine's own defaults: every name that applies, on but param_gather and tp."""
    return {n: n in ("grad_reduce", "prefetch") for n in OVERLAPS if applies(n, layout) is None}


def resolve(layout) -> dict:
    """{name: on} for every overlap that applies to ``layout``, its ``overlap`` option over the engine's defaults;
    a ValueError names an unknown option or one that cannot act on this layout."""
    out = defaults(layout)
    for item in (s.strip() for s in layout.overlap.split("+") if s.strip()):
        on = not item.startswith("no-")
        name = item if on else item[3:]
        if name not in OVERLAPS:
            raise ValueError(f"layout overlap {item!r}: unknown; choose from {', '.join(OVERLAPS)} (no-NAME: off)")
        why = applies(name, layout)
        if why:
            raise ValueError(f"layout overlap {item!r} does not apply to {layout.short()}: {why}")
        out[name] = on
    return out
