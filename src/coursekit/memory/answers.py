"""The answer of ``coursekit memory --solve`` as a sentence, with what would make it fit when nothing does.

    no micro-batch fits on 8 × H100-80GB at seq 4096; with --recompute full, 2 fit; or 16 GPUs (--dp 16)

Pure Python, like the rest of ``coursekit.memory``: each alternative is one more solver call (milliseconds).
"""
from __future__ import annotations

from coursekit.memory.errors import ConfigError
from coursekit.memory.gpus import GiB
from coursekit.memory.solvers import max_micro_batch, max_seq_len, min_gpus

EXAMPLES = {"seq": 4096, "batch": 1}  # shown in "--seq is required (e.g. --seq 4096)"


def missing_argument(name: str, solve: str | None) -> str:
    """The message for a required option that was not given."""
    example = f" (e.g. --{name} {EXAMPLES[name]})" if name in EXAMPLES else ""
    return f"--solve {solve} needs --{name}{example}" if solve else f"--{name} is required{example}"


def _gpus(est) -> str:
    return f"{est.config.world} × {est.config.gpu}"


def _fewest(model, kw: dict) -> str:
    """"; or N GPUs (--dp N)" where more data-parallel GPUs make it fit (with --recompute full if need be)."""
    kw = {**kw, "batch": kw.get("batch") or 1}
    for extra, say in (({}, ""), ({"recompute": "full"}, " with --recompute full")):
        if say and kw.get("recompute") == "full":
            break
        try:
            e = min_gpus(model, **{**kw, **extra})
        except ConfigError:
            continue
        return f"; or {e.config.world} GPUs (--dp {e.config.dp}){say}"
    return "; more GPUs do not help this configuration"


def describe(solve: str, model, kw: dict, solution: dict, est) -> str:
    """One sentence for ``solution`` (the solver's answer); ``kw`` are the TrainConfig fields as given, ``est`` the
    estimate printed under it."""
    peak = f"peak {est.peak_bytes / GiB:.1f} of {est.gpu_memory_bytes / GiB:.0f} GiB"
    if solve == "max-batch":
        b, seq = solution["max_batch"], kw["seq"]
        if b:
            return f"solution: up to {b} sequence{'s' * (b > 1)} of {seq} tokens per micro-batch fit on each GPU of " \
                   f"{_gpus(est)} ({peak} at micro-batch {b})"
        alt, full = "", 0
        if kw.get("recompute") != "full":
            full = max_micro_batch(model, **{**kw, "recompute": "full"})
            alt = f"; with --recompute full, {full} fit{'s' * (full == 1)}" if full else \
                "; not even with --recompute full"
        more = "" if full else _fewest(model, {**kw, "batch": 1})  # more GPUs only where recomputing is not enough
        return f"no micro-batch fits on {_gpus(est)} at seq {seq}{alt}{more}"
    if solve == "max-seq":
        s, b = solution["max_seq"], kw["batch"]
        if s:
            return f"solution: up to {s} tokens per sequence fit at micro-batch {b} on each GPU of {_gpus(est)} " \
                   f"({peak})"
        alt, full = "", 0
        if kw.get("recompute") != "full":
            full = max_seq_len(model, **{**kw, "recompute": "full"})
            alt = f"; with --recompute full, {full} tokens fit" if full else "; not even with --recompute full"
        return f"no sequence length fits at micro-batch {b} on {_gpus(est)}{alt}{'' if full else _fewest(model, kw)}"
    return f"solution: {solution['min_gpus']} GPUs of {est.config.gpu} (--dp {solution['dp']}) are the fewest that " \
           f"fit ({peak})"
