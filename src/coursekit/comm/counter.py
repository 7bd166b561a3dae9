"""CollectiveCounter: record every collective a live job issues — op, payload bytes, dtype, group.

    with CollectiveCounter() as cc:
        loss = model(x).sum(); loss.backward(); opt.step()
    cc.total_bytes("all_reduce"), cc.calls("all_reduce"), cc.summary()
    assert cc.as_plan() == volume.ddp(num_params, world, bucket_bytes=...)

Why a dispatch mode, not wrappers around ``torch.distributed.all_reduce`` & co.? Wrappers miss real traffic:
  * DDP's reducer calls ``ProcessGroup::allreduce`` from C++; no Python collective function runs;
  * DeepSpeed keeps a reference to ``torch.distributed.all_gather_into_tensor`` / ``reduce_scatter_tensor`` taken
    when its backend starts (deepspeed/comm/torch.py), so patching the module afterwards misses ZeRO's traffic;
  * DTensor (TP, FSDP2's DTensor ops) issues functional collectives (``torch.ops._c10d_functional.*``).
Every one of these paths ends in a dispatcher op — ``c10d::allreduce_``, ``c10d::_allgather_base_``, … or
``_c10d_functional::*`` — and a ``TorchDispatchMode`` sees those ops. It is thread-local: on GPUs backward runs on
autograd's device threads, which receive the caller's dispatch modes with the rest of ATen's ThreadLocalState
(checked here on CPU only, where backward runs on the calling thread). While the mode handles an op it is switched
off, so a collective made inside another is never counted twice (``all_gather_object`` shows as its two
all-gathers, of the pickled sizes and of the pickles).

Seen in tests: dist.* and distributed_c10d.* calls, a reference captured before counting, DDP's reducer (one
all-reduce per bucket), FSDP2 (``_allgather_base_`` / ``_reduce_scatter_base_``), DTensor TP (functional
all-reduces), ``batch_isend_irecv``. Collectives issued by a thread the job starts itself are not seen.

Payload convention: ``volume.py``'s (the nccl-tests size: all_gather = gathered output, reduce_scatter = full
input). ``record.wire_bytes`` is what this rank sends for it under a ring algorithm.

Cost: while active every tensor op passes through Python — count a step or two, not a whole run.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coursekit.comm import volume

# dispatcher op -> (collective, which arguments hold the payload):
#   "all": every tensor argument; "in": the input* arguments; "in*n" / "out*n": input / output x group size.
_C10D = {
    "allreduce_": ("all_reduce", "all"), "allreduce_coalesced_": ("all_reduce", "all"),
    "broadcast_": ("broadcast", "all"), "reduce_": ("reduce", "all"),
    "send": ("send", "all"), "recv_": ("recv", "all"), "recv_any_source_": ("recv", "all"),
    "allgather_": ("all_gather", "in*n"), "_allgather_base_": ("all_gather", "in*n"),
    "allgather_coalesced_": ("all_gather", "in*n"), "allgather_into_tensor_coalesced_": ("all_gather", "in*n"),
    "reduce_scatter_": ("reduce_scatter", "in"), "_reduce_scatter_base_": ("reduce_scatter", "in"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "in"),
    "alltoall_": ("all_to_all", "in"), "alltoall_base_": ("all_to_all", "in"),
    "gather_": ("gather", "in*n"), "scatter_": ("scatter", "out*n"),
    "barrier": ("barrier", "none"), "monitored_barrier_": ("barrier", "none"),
}
_FUNCTIONAL = {  # torch.distributed._functional_collectives (DTensor, TP, compiled code)
    "all_reduce": ("all_reduce", "all"), "all_reduce_": ("all_reduce", "all"),
    "all_reduce_coalesced": ("all_reduce", "all"), "all_reduce_coalesced_": ("all_reduce", "all"),
    "all_gather_into_tensor": ("all_gather", "in*n"), "all_gather_into_tensor_out": ("all_gather", "in*n"),
    "all_gather_into_tensor_coalesced": ("all_gather", "in*n"),
    "reduce_scatter_tensor": ("reduce_scatter", "in"), "reduce_scatter_tensor_out": ("reduce_scatter", "in"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "in"),
    "all_to_all_single": ("all_to_all", "in"), "shard_dim_alltoall": ("all_to_all", "in"),
    "broadcast": ("broadcast", "all"), "broadcast_": ("broadcast", "all"),
    "isend": ("send", "all"), "irecv": ("recv", "all"),
}
OPS = {f"c10d::{k}": v for k, v in _C10D.items()}
OPS.update({f"{ns}::{k}": v for ns in ("_c10d_functional", "_c10d_functional_autograd", "_dtensor")
            for k, v in _FUNCTIONAL.items()})


@dataclass(frozen=True)
class CollectiveRecord:
    op: str          # collective: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, ...
    bytes: int       # payload (nccl-tests size), see volume.py
    dtype: str       # e.g. "float32"
    group_size: int
    group: str       # the process group's description ("default_pg", a mesh dimension, ...)
    impl: str        # the dispatcher op that carried it, e.g. "c10d::allreduce_"

    @property
    def wire_bytes(self) -> float:
        return volume.wire_bytes(self.op, self.bytes, self.group_size)

    def to_dict(self) -> dict:
        return asdict(self)


def _tensors(x):
    """Every tensor inside an argument (a tensor, a list of tensors, a list of lists)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _nbytes(x) -> int:
    # logical bytes (numel x element size), not storage bytes: a bucket view into a bigger buffer counts its own size
    return sum(t.numel() * t.element_size() for t in _tensors(x))


def _group(named: dict):
    """(size, description) of the process group an op runs on, from its 'process_group' or 'group_name' argument."""
    from torch._C._distributed_c10d import ProcessGroup, _resolve_process_group

    pg = named.get("process_group")
    if pg is not None and not isinstance(pg, ProcessGroup):
        pg = ProcessGroup.unbox(pg)  # the dispatcher hands the group over as a TorchScript object
    if pg is None:
        name = named.get("group_name")
        pg = _resolve_process_group(name) if isinstance(name, str) else name
    if pg is None:
        return 1, ""
    return pg.size(), (getattr(pg, "group_desc", "") or getattr(pg, "group_name", ""))


def describe(func, args, kwargs) -> CollectiveRecord | None:
    """The record for one dispatcher call, or None if ``func`` is not a collective (e.g. ``wait_tensor``)."""
    schema = getattr(func, "_schema", None)
    rule = OPS.get(schema.name) if schema is not None else None
    if rule is None:
        return None
    op, where = rule
    named = {a.name: v for a, v in zip(schema.arguments, args)} | dict(kwargs)
    n, desc = _group(named)
    if where == "all":
        payload = _nbytes([v for v in named.values()])
    elif where == "none":
        payload = 0
    else:
        prefix = "in" if where.startswith("in") else "out"
        payload = _nbytes([v for k, v in named.items() if k.startswith(prefix)])
        payload *= n if where.endswith("*n") else 1
    first = next(_tensors(list(named.values())), None)
    # a barrier's tensor is a dummy: no payload, no dtype
    dtype = str(first.dtype).removeprefix("torch.") if first is not None and where != "none" else ""
    return CollectiveRecord(op, payload, dtype, n, desc, schema.name)


def _dtensor_types() -> tuple:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed tensors
        return ()
    return (DTensor,)


class _Mode(TorchDispatchMode):
    def __init__(self, sink):
        super().__init__()
        self.sink = sink
        self.lowers = _dtensor_types()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if self.lowers and any(issubclass(t, self.lowers) for t in types):
            # Modes run before subclasses. Step aside so DTensor turns this op into plain ops and collectives,
            # which then come back through this mode (as torch's CommDebugMode does). Only DTensor: others, such
            # as the FakeTensor DTensor uses for sharding propagation, issue no collectives and would step aside too.
            return NotImplemented
        rec = describe(func, args, kwargs)
        if rec is not None:
            self.sink(rec)
        return func(*args, **kwargs)


class CollectiveCounter:
    """Context manager recording every collective this process issues while active (``records``, in order).

    Counters nest (an outer one sees what an inner one sees). Works on gloo and NCCL alike; on a GPU the payload is
    counted when the op is enqueued, not when it completes.
    """

    def __init__(self):
        self.records: list[CollectiveRecord] = []
        self._lock = threading.Lock()  # backward may record from autograd threads
        self._mode: _Mode | None = None

    def _add(self, rec: CollectiveRecord) -> None:
        with self._lock:
            self.records.append(rec)

    def __enter__(self) -> "CollectiveCounter":
        if self._mode is not None:
            raise RuntimeError("this CollectiveCounter is already active")
        self._mode = _Mode(self._add)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        mode, self._mode = self._mode, None
        mode.__exit__(*exc)

    def clear(self) -> None:
        with self._lock:
            self.records.clear()

    # -- summaries ------------------------------------------------------------------------------------------------
    def _select(self, op):
        return [r for r in self.records if op is None or r.op == op]

    def calls(self, op: str | None = None) -> int:
        return len(self._select(op))

    def total_bytes(self, op: str | None = None) -> int:
        """Σ payload (nccl-tests size) of the recorded calls, optionally of one op."""
        return sum(r.bytes for r in self._select(op))

    def wire_bytes(self, op: str | None = None) -> float:
        """Σ bytes this rank sent under ring algorithms (see volume.wire_bytes)."""
        return sum(r.wire_bytes for r in self._select(op))

    def summary(self) -> dict[str, dict]:
        """{op: {"calls", "bytes", "wire_bytes"}} over the records."""
        out: dict[str, dict] = {}
        for r in self.records:
            s = out.setdefault(r.op, {"calls": 0, "bytes": 0, "wire_bytes": 0.0})
            s["calls"] += 1
            s["bytes"] += r.bytes
            s["wire_bytes"] += r.wire_bytes
        return out

    def step_plan(self) -> dict:
        """The counted step as JSON: ``summary`` and ``calls``, the merged (op, bytes, dtype, group_size) list with
        a count each (what ``coursekit train --count-step`` and the ZeRO sweep report)."""
        from collections import Counter

        calls = Counter((r.op, r.bytes, r.dtype, r.group_size) for r in self.records)
        return {"summary": self.summary(),
                "calls": [{"op": op, "bytes": b, "dtype": dt, "group_size": n, "count": k}
                          for (op, b, dt, n), k in sorted(calls.items())]}

    def as_plan(self, ops=None) -> list[volume.Collective]:
        """The records as a ``volume`` plan (merged, sorted), restricted to ``ops`` if given: compare with ``==``."""
        return volume.merge(volume.Collective(r.op, r.bytes, 1, r.group_size)
                            for r in self.records if ops is None or r.op in ops)

    def to_dict(self) -> dict:
        """JSON-able: the summary and every record (for ``coursekit.launch.report``)."""
        return {"summary": self.summary(), "records": [r.to_dict() for r in self.records]}
