"""Bytes a live job holds for model states, counted from the tensors themselves."""
from __future__ import annotations

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage this rank really holds (a DTensor's local shard)."""
    return t.to_local() if hasattr(t, "to_local") else t


def distinct_storages(items, seen: set | None = None, *, meta: bool = True):
    """The one storage walk: yield ``(label, tensor, nbytes)`` once per distinct storage behind ``items`` (pairs of
    a label and a tensor; non-tensors skipped). A view pins, and is charged, its whole storage; a DTensor counts its
    local shard; a meta tensor (no storage) counts its own size, or is skipped with ``meta=False``."""
    seen = set() if seen is None else seen
    for label, t in items:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        t = _local(t)
        on_meta = t.device.type == "meta"
        if on_meta and not meta:
            continue
        key = id(t) if on_meta else t.untyped_storage()._cdata
        if key in seen:
            continue
        seen.add(key)
        yield label, t, (t.numel() * t.element_size() if on_meta else t.untyped_storage().nbytes())


def tensor_bytes(tensors, seen: set | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view pins its whole storage; shared storage once)."""
    return sum(n for _, _, n in distinct_storages(((None, t) for t in tensors), seen))


def _quantized(t: torch.Tensor):
    """The inner tensors of a quantized wrapper subclass (torchao's NF4Tensor: 4-bit data, scalers, factors, mean,
    the code table), whose own storage is empty; None for a plain tensor."""
    for x in (t, getattr(t, "data", t)):
        if type(x).__name__ == "NF4Tensor":
            return [getattr(x, k) for k in x.__tensor_flatten__()[0]]
    return None


def param_kind_bytes(model: torch.nn.Module, *, grads: bool = False) -> dict:
    """This rank's parameter bytes by kind, as QLoRA holds them: ``nf4_base`` (the quantized inner tensors),
    ``rest`` (other frozen parameters), ``adapters`` (trainable) and, with ``grads``, ``adapter_grads``."""
    out = {"nf4_base": 0, "rest": 0, "adapters": 0} | ({"adapter_grads": 0} if grads else {})
    for p in model.parameters():
        loc = _local(p)
        inner = _quantized(loc)
        if inner is not None:
            out["nf4_base"] += sum(t.untyped_storage().nbytes() for t in inner)
        elif p.requires_grad:
            out["adapters"] += loc.untyped_storage().nbytes()
            if grads:
                out["adapter_grads"] += tensor_bytes([p.grad])
        else:
            out["rest"] += loc.untyped_storage().nbytes()
    return out


def optimizer_state_bytes(optimizer) -> int:
    tensors = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return tensor_bytes(tensors)


def state_bytes(model: torch.nn.Module, optimizer=None) -> dict:
    """Per-rank ``{"params_bytes", "grads_bytes", "optimizer_bytes"}`` as held right now."""
    params = list(model.parameters())
    out = {
        "params_bytes": tensor_bytes(params),
        "grads_bytes": tensor_bytes([p.grad for p in params]),
        "optimizer_bytes": optimizer_state_bytes(optimizer) if optimizer is not None else 0,
    }
    out["numel"] = sum(_local(p).numel() for p in params)
    return out


class PeakMemory:
    """Peak bytes allocated over a block, above what was live at its start: CUDA's allocator on GPU; on CPU the
    profiler's record of every allocation and free (exact sizes as requested from the CPU allocator).

        with PeakMemory(device) as pm: ...
        pm.peak_bytes, pm.source
    """

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.peak_bytes = None
        self.source = None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
            self.source = "torch.cuda.max_memory_allocated"
        else:
            self._prof.__exit__(*exc)
            # walk the allocator's events in time order: running sum of bytes allocated (+) and freed (-) inside
            # the block; tensors alive before it do not count, frees of them can take the sum below zero
            events = sorted(((e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                             if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU))
            live = peak = 0
            for _, nbytes in events:
                live += nbytes
                peak = max(peak, live)
            self.peak_bytes = peak
            self.source = "torch.profiler (CPU allocations inside the block)"
        return False
