"""Saved-for-backward bytes of one forward pass, measured from the autograd graph itself.

Every tensor autograd saves for backward passes through ``torch.autograd.graph.saved_tensors_hooks``' pack hook.
We record the *untyped storage* behind each one, once:

- a saved view pins its whole storage (GPT-2 saves ``q`` as a view of the fused ``c_attn`` output: the whole
  ``b·s·3h`` buffer stays alive), so we count ``storage.nbytes()``, not ``view.numel()``;
- the same storage saved by several ops (RoPE's ``cos``/``sin`` used by every layer, a norm output read by q, k and v)
  is counted once;
- parameters and buffers are excluded (they are model state, not activations), keyed by storage too, so a tied or
  transposed weight view is excluded as well.

The key is ``untyped_storage()._cdata`` (the address of the StorageImpl): ``data_ptr()`` is 0 on the meta device,
and the meta device is what makes a 70B graph measurable in seconds (no data, exact shapes and dtypes).
We keep a reference to every packed tensor until counting is done, so no storage is freed and its address reused.

Usage (training mode matters: dropout saves tensors only when ``model.train()``)::

    model.train()
    r = saved_activation_bytes(model, input_ids, labels=input_ids, breakdown=True)
    r["total_bytes"], r["by_layer"]["layers.0"], r["by_module"]["model.layers.0.mlp.act_fn"]
"""
from __future__ import annotations

import contextlib
import re
from collections import defaultdict

import torch

from coursekit.measure.sac import observing

_LAYER_RE = re.compile(r"^(.*?\.?)(\d+)(\.|$)")  # the first integer path segment: model.layers.3.mlp -> layers.3


def _held(t: torch.Tensor) -> torch.Tensor:
    """What this rank really holds: a DTensor's local shard (tensor-parallel saves), else the tensor itself."""
    return getattr(t, "_local_tensor", t)


def _storage_key(t: torch.Tensor) -> int:
    return _held(t).untyped_storage()._cdata


def _region(path: str) -> str:
    """``model.layers.3.self_attn.q_proj`` -> ``layers.3``; anything outside a numbered block -> ``other``."""
    m = _LAYER_RE.match(path)
    if not m:
        return "other"
    prefix = m.group(1).rstrip(".").split(".")[-1]
    return f"{prefix}.{m.group(2)}"


def _capture(model: torch.nn.Module, input_ids, labels, forward_kwargs, on_new, track_modules: bool) -> None:
    """Run one forward; call ``on_new(tensor, module_path)`` once per distinct saved storage (parameters and
    buffers excluded). Every packed tensor is held until the end: a freed storage could hand its address to a new
    one."""
    excluded = {_storage_key(t) for t in model.parameters()} | {_storage_key(t) for t in model.buffers()}
    seen: set[int] = set()
    keep: list[torch.Tensor] = []
    stack: list[str] = []
    handles = []
    if track_modules:
        for name, mod in model.named_modules():
            handles.append(mod.register_forward_pre_hook(lambda m, a, _n=name: stack.append(_n)))
            handles.append(mod.register_forward_hook(lambda m, a, o: _pop(stack)))

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key not in excluded and key not in seen:
            seen.add(key)
            keep.append(t)
            on_new(_held(t), stack[-1] if stack else "")
        return t

    forward_kwargs.setdefault("use_cache", False)
    try:  # a selective checkpoint's kept outputs bypass the hooks (coursekit.measure.sac)
        with _meta_friendly(input_ids), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), observing(pack):
            out = model(input_ids=input_ids, labels=labels, **forward_kwargs)
    finally:
        for h in handles:
            h.remove()
    del out, keep


def saved_activation_bytes(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor | None = None, *,
                           breakdown: bool = False, **forward_kwargs) -> dict:
    """Saved-for-backward bytes of one forward pass ``model(input_ids, labels=labels)`` (embedding to loss).

    Returns ``{"total_bytes", "count", "by_dtype"}``; with ``breakdown=True`` also ``"by_module"`` (bytes by the
    innermost module running when the storage was first saved; ``""`` is the root, e.g. the loss) and
    ``"by_layer"`` (``"layers.<i>"`` / ``"h.<i>"`` per numbered block, ``"other"`` for embedding, final norm, head
    and loss). Pass ``use_cache=False`` implicitly; extra keyword arguments go to the forward call.
    Works on any device, the meta device included. The model's train/eval mode is left as the caller set it.
    """
    rows: list[tuple[int, str, torch.dtype]] = []  # (storage bytes, innermost module, dtype) per distinct storage
    _capture(model, input_ids, labels, forward_kwargs,
             lambda t, path: rows.append((t.untyped_storage().nbytes(), path, t.dtype)), track_modules=breakdown)
    result = {
        "total_bytes": sum(n for n, _, _ in rows),
        "count": len(rows),
        "by_dtype": dict(_sum_by(rows, lambda v: str(v[2]).removeprefix("torch."))),
    }
    if breakdown:
        result["by_module"] = dict(_sum_by(rows, lambda v: v[1]))
        result["by_layer"] = dict(_sum_by(rows, lambda v: _region(v[1])))
    return result


@contextlib.contextmanager
def _meta_friendly(input_ids: torch.Tensor):
    """On the meta device, stop transformers' packed-sequence detection from reading tensor values (``.item()``
    is impossible on meta): with no attention mask and no cache it only ever answers "not packed" for our inputs."""
    if input_ids.device.type != "meta":
        yield
        return
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    orig = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = orig


def _pop(stack: list) -> None:
    stack.pop()  # returns None: a forward hook's non-None return value would replace the module's output


def _sum_by(values, key) -> dict:
    acc: dict = defaultdict(int)
    for v in values:
        acc[key(v)] += v[0]
    return acc


def saved_tensors_listing(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                          **forward_kwargs) -> list[tuple[str, str, tuple, str, int]]:
    """Debug aid: one row per distinct saved storage, in save order:
    (innermost module path, the saved tensor's own grad_fn name, shape, dtype, storage bytes).
    A pack hook cannot see which op saves a tensor; the tensor's grad_fn says which op made it."""
    rows = []
    _capture(model, input_ids, labels, forward_kwargs,
             lambda t, path: rows.append((path, type(t.grad_fn).__name__ if t.grad_fn else "-", tuple(t.shape),
                                          str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes())),
             track_modules=True)
    return rows
