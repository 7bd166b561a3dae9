"""Memory at the moments the calculator predicts: one training step, probed where its phases begin and end.

The calculator (``coursekit.memory.estimate``) predicts three phases of a step: the start of backward (states +
saved activations + loss buffers + the recompute working set), the end of backward (states + gradients) and the
optimizer step. ``measure_step`` runs one steady-state step of a Hugging Face causal LM and reports, for each:

- ``level_bytes``: bytes allocated at the moment the phase ends (what is *held*), and
- ``peak_bytes``: the highest allocation since the previous mark (what the allocator had to find).

Marks, in order: ``forward`` (loss computed), ``start_of_backward`` (the gradient of the last transformer block's
input exists: loss, head and that block's backward — and, with recompute, its re-run forward — are done),
``end_of_backward`` (``backward()`` returned), ``optimizer_step`` (parameters updated, gradients not yet cleared).

Where the numbers come from (``PhaseProbe``):

- CUDA: ``torch.cuda.memory_allocated`` / ``max_memory_allocated`` (the caching allocator's host-side bookkeeping,
  exact in program order without a synchronisation), peak statistics reset at every mark;
- CPU: the profiler's memory events (``profile_memory=True``): a running sum of every CPU allocation and free made
  while the probe is open, plus the ``baseline`` the caller states (bytes held when the probe opened). A mark
  allocates and frees a sentinel tensor of a unique size, so each mark sits at an exact place in the event stream
  (no reliance on timestamps); sentinel bytes are not counted.

``MasterAdamW`` is the calculator's 16Ψ mixed precision done by hand: the model (and so its activations and
gradients) in bf16, fp32 master weights and AdamW states; at the step the bf16 gradients are copied to fp32 all at
once (+4Ψ, as DeepSpeed's fp32 gradient partition), AdamW updates the masters, and the bf16 weights are copied back.
torch's ``autocast`` (fp32 weights, bf16 compute: what ``coursekit.train --dtype bf16`` runs) is a different memory
model: fp32 weights and gradients, and bf16 weight copies plus an fp32 residual stream among the saved activations.
"""
from __future__ import annotations

import contextlib
import gc

import torch

from coursekit.measure.states import tensor_bytes
from coursekit.spec.run import ADAMW

MARKS = ("forward", "start_of_backward", "end_of_backward", "optimizer_step")
_SENTINEL = 7_777_777  # bytes of the first sentinel; mark k uses _SENTINEL + 64·k


class MasterAdamW:
    """AdamW over fp32 master copies of a low-precision model's parameters (16Ψ: 2 + 2 + 4 + 8 bytes/param).

    ``fused=None`` uses torch's fused kernel (one launch, no temporaries) where the device supports it.
    """

    def __init__(self, params, *, lr: float = 1e-4, betas=ADAMW["betas"], eps: float = ADAMW["eps"],
                 weight_decay: float = 0.0, fused: bool | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]  # leaves without autograd: we set .grad
        if fused is None:
            fused = self.params[0].device.type in ("cuda", "cpu")
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                           fused=fused or None, foreach=False if not fused else None)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master):  # all fp32 gradients at once: +4Ψ during the step
            m.grad = p.grad.float() if p.grad is not None else torch.zeros_like(m)
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)  # in place: no new storage
            m.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> dict:
        from coursekit.measure.states import optimizer_state_bytes

        return {"master_bytes": tensor_bytes(self.master), "optimizer_bytes": optimizer_state_bytes(self.optimizer)}


class PhaseProbe:
    """Allocated bytes at named marks and the peak since the previous mark (see module docstring)."""

    def __init__(self, device, baseline_bytes: int = 0):
        self.device = torch.device(device)
        self.baseline = int(baseline_bytes)
        self.marks: list[str] = []
        self.results: dict[str, dict] = {}
        self.start_bytes: int | None = None
        self._raw: list[tuple[str, int, int]] = []

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self.start_bytes = self.baseline
            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    def mark(self, name: str) -> None:
        if name in self.marks:
            raise ValueError(f"mark {name!r} given twice")
        self.marks.append(name)
        if self.cuda:
            self._raw.append((name, torch.cuda.memory_allocated(self.device),
                              torch.cuda.max_memory_allocated(self.device)))
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            s = torch.empty(_SENTINEL + 64 * (len(self.marks) - 1), dtype=torch.uint8)
            del s

    def __exit__(self, *exc):
        if self.cuda:
            self.results = {n: {"level_bytes": lvl, "peak_bytes": pk} for n, lvl, pk in self._raw}
            return False
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return False
        events = _memory_event_bytes(self._prof)
        live, peak, k = self.baseline, self.baseline, 0
        i = 0
        while i < len(events) and k < len(self.marks):
            size = _SENTINEL + 64 * k
            if events[i] == size and i + 1 < len(events) and events[i + 1] == -size:
                self.results[self.marks[k]] = {"level_bytes": live, "peak_bytes": peak}
                peak, k, i = live, k + 1, i + 2
                continue
            live += events[i]
            peak = max(peak, live)
            i += 1
        if k != len(self.marks):
            raise RuntimeError(f"profiler memory events lost marks ({k} of {len(self.marks)} found)")
        return False


def _memory_event_bytes(prof) -> list[int]:
    """Signed bytes of every allocation (+) and free (-) the profiler saw, in program order.

    Not ``prof.events()``: there an allocation made inside an op is folded into that op's ``cpu_memory_usage`` and
    only frees and allocations outside any op stay ``[memory]`` events, so a running sum over them is wrong.
    """
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None:
        evs = [e for e in raw.events() if e.name() == "[memory]"]
        return [e.nbytes() for e in sorted(evs, key=lambda e: e.start_ns())]  # stable: ties keep record order
    import json
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            evs = [e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    finally:
        os.unlink(path)
    return [int(e["args"]["Bytes"]) for e in sorted(evs, key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))]


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's list of blocks: ``model.model.layers`` (Llama) or ``model.transformer.h`` (GPT-2)."""
    for path in ("model.layers", "transformer.h"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.nn.ModuleList):
            return obj
    raise ValueError(f"cannot find the transformer blocks of {type(model).__name__}")


@contextlib.contextmanager
def _on_last_block_input_grad(model, callback):
    """Call ``callback()`` once, when autograd has computed the gradient of the last block's input."""
    state = {"armed": True}

    def pre_hook(module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        # once per forward: with recompute the block's forward runs again inside backward
        if state["armed"] and isinstance(x, torch.Tensor) and x.requires_grad:
            state["armed"] = False
            x.register_hook(lambda g: callback())

    h = transformer_blocks(model)[-1].register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield
    finally:
        h.remove()


def measure_step(model, step_fn, input_ids, labels, *, autocast_dtype=None, baseline_bytes: int | None = None) -> dict:
    """One training step of ``model`` under a ``PhaseProbe``; ``step_fn()`` applies the optimizer (and must not clear
    gradients: this function clears them after the ``optimizer_step`` mark, as ``zero_grad(set_to_none=True)``).

    Run it at a steady state (after a step has created the optimizer states), with gradients already ``None``.
    The loss is taken as the reference trainer takes it (``model(...).loss``): the returned logits are dropped
    before backward. ``baseline_bytes`` (CPU only) is what is held when the probe opens; by default the model's
    parameters and the inputs (add optimizer and master bytes yourself).
    Returns ``{"start_bytes", "phases": {mark: {"level_bytes", "peak_bytes"}}, "peak_bytes", "loss"}``.
    """
    device = input_ids.device
    if any(p.grad is not None for p in model.parameters()):
        raise ValueError("measure_step needs gradients cleared (None) before the step")
    if baseline_bytes is None:
        baseline_bytes = tensor_bytes(list(model.parameters()) + [input_ids, labels])
    gc.collect()
    probe = PhaseProbe(device, baseline_bytes)
    ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with probe:
        with _on_last_block_input_grad(model, lambda: probe.mark("start_of_backward")):
            with ctx:
                loss = model(input_ids=input_ids, labels=labels, use_cache=False).loss
            probe.mark("forward")
            loss.backward()
        value = float(loss.detach())
        del loss
        probe.mark("end_of_backward")
        step_fn()
        probe.mark("optimizer_step")
    for p in model.parameters():
        p.grad = None
    phases = probe.results
    return {"start_bytes": probe.start_bytes, "phases": phases, "loss": value,
            "peak_bytes": max(v["peak_bytes"] for v in phases.values())}
