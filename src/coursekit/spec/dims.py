"""The parallel layout in pure Python: how many ranks along each axis, and where each rank sits.

    dims = ParallelDims(world_size=8, tp=2, pp=2)          # data parallel fills what is left: dp_replicate=2
    dims.coords(5)      -> {'pp': 1, 'dp_replicate': 0, 'dp_shard': 0, 'cp': 0, 'tp': 1}
    dims.group(5, 'tp') -> [4, 5]                          # the ranks rank 5 talks to in its TP all-reduces

One object serves the trainer (which turns it into a ``DeviceMesh``, ``coursekit.parallel.mesh``), the memory
calculator and the planner; it imports no torch and validates once, with a message that names every degree.

Axes, outermost first (the rank grid of picotron's process-group manager, the mesh of torchtitan's ParallelDims):

    pp  ×  dp_replicate  ×  dp_shard  ×  cp  ×  tp          (tp varies fastest: neighbouring ranks, same node)

TP talks most (every layer, on the critical path), so it sits innermost, inside an NVLink node; PP talks least
(point-to-point activations once per micro-batch), so it spans nodes. Naming convention (torchtitan's): an "axis"
belongs to the mesh, a "dim" to a tensor.

Derived groups, each a product of axes:
    batch  = dp_replicate × dp_shard       ranks that see different data (the global batch is sliced over these)
    loss   = dp_replicate × dp_shard × cp  ranks whose losses are averaged (a CP rank holds part of a sequence)
    fsdp   = dp_shard × cp                 ranks FSDP shards parameters over (CP ranks hold the same weights)
"""
from __future__ import annotations

from math import prod

from coursekit.spec import registry


def _axes() -> tuple[str, ...]:
    places = {**registry.DATA_AXES, **{n: registry.PARALLELISMS[n].mesh for n in registry.MESH_PARALLELISMS}}
    return tuple(sorted(places, key=places.get))


def _derived() -> dict[str, tuple[str, ...]]:
    joins = {g: [n for n, e in registry.PARALLELISMS.items() if g in e.groups] for g in ("batch", "loss", "fsdp")}
    ordered = lambda names: tuple(a for a in AXES if a in names)  # noqa: E731 - mesh order (outermost first)
    data = ("dp_replicate", "dp_shard")
    return {"batch": ordered([*data, *joins["batch"]]), "loss": ordered([*data, *joins["batch"], *joins["loss"]]),
            "fsdp": ordered(["dp_shard", *joins["fsdp"]]), "dp": data}


AXES = _axes()  # outermost first, from the registry's mesh places: pp, dp_replicate, dp_shard, cp, tp
PARALLEL_AXES = tuple(a for a in AXES if a in registry.PARALLELISMS)
BORROWED = {n: e.borrows for n, e in registry.PARALLELISMS.items() if e.borrows}  # ep -> loss: no axis of its own
DERIVED = _derived()
FLAVOURS = ("replicate", "shard", "hybrid")


class LayoutError(ValueError):
    """A layout that cannot work; raised before any process starts."""


class ParallelDims:
    """The degrees of a run (frozen): ``world_size``; ``dp_replicate`` / ``dp_shard`` (None: fill, see
    ``dp_flavour``); one degree per registered parallelism (``tp``, ``pp``, ``cp``, ...: 1 when not given), read as
    attributes; ``dp_flavour``: which data-parallel axis fills the ranks left by the parallelisms: replicate (DDP,
    ZeRO), shard (FSDP2), hybrid (HSDP: both given, or shard filled within). ``degrees`` holds every axis, resolved.
    """

    def __init__(self, *, world_size: int, dp_replicate: int | None = None, dp_shard: int | None = None,
                 dp_flavour: str = "replicate", **degrees):
        unknown = sorted(set(degrees) - set(PARALLEL_AXES) - set(BORROWED))
        if unknown:
            raise LayoutError(f"unknown parallel degree(s) {', '.join(unknown)}; the axes are {', '.join(AXES)}")
        borrowed = {n: degrees.get(n, 1) for n in BORROWED}
        for k, v in borrowed.items():
            _positive(k, v)
        given = {a: degrees.get(a, 1) for a in PARALLEL_AXES}
        for k, v in (("world_size", world_size), *given.items()):
            _positive(k, v)
        if dp_flavour not in FLAVOURS:
            raise LayoutError(f"unknown data-parallel flavour {dp_flavour!r}; choose one of {', '.join(FLAVOURS)}")
        for k, v in (("dp_replicate", dp_replicate), ("dp_shard", dp_shard)):
            if v is not None:
                _positive(k, v)
        rep, shard = _fill(world_size, dp_replicate, dp_shard, dp_flavour, given)
        d = {a: {"dp_replicate": rep, "dp_shard": shard}.get(a, given.get(a)) for a in AXES}
        if prod(d.values()) != world_size:
            raise LayoutError(" x ".join(f"{a} {v}" for a, v in d.items()) + f" = {prod(d.values())}, but the world "
                              f"size is {world_size}")
        if dp_flavour == "replicate" and shard != 1:
            raise LayoutError(f"dp_shard {shard} needs a sharding data-parallel strategy (fsdp2, hsdp); "
                              "this one replicates (use --dp-replicate)")
        for k, v in dict(world_size=world_size, dp_replicate=dp_replicate, dp_shard=dp_shard, dp_flavour=dp_flavour,
                         degrees=d, borrowed=borrowed).items():
            object.__setattr__(self, k, v)
        for n, v in borrowed.items():
            host = self.size(BORROWED[n])
            if host % v:
                raise LayoutError(f"{n} {v} does not divide the {host} ranks it borrows ({BORROWED[n]} = "
                                  f"{' x '.join(f'{a} {d[a]}' for a in DERIVED[BORROWED[n]])}); choose {n} dividing "
                                  f"{host}")

    def __getattr__(self, name):  # tp, pp, cp, ep, ...: the registered parallelisms' degrees
        d = self.__dict__.get("degrees")
        if d is not None and name in PARALLEL_AXES:
            return d[name]
        if d is not None and name in BORROWED:
            return self.__dict__["borrowed"][name]
        raise AttributeError(name)

    def degree(self, name: str) -> int:
        """The degree of a registered parallelism (mesh axis or borrowed)."""
        return self.borrowed[name] if name in BORROWED else self.degrees[name]

    def __setattr__(self, name, value):
        raise AttributeError("ParallelDims is frozen")

    def __eq__(self, other):
        return isinstance(other, ParallelDims) and (self.world_size, self.dp_flavour, self.degrees, self.borrowed) == (
            other.world_size, other.dp_flavour, other.degrees, other.borrowed)

    def __hash__(self):
        return hash((self.world_size, self.dp_flavour, tuple(self.degrees.items()), tuple(self.borrowed.items())))

    def _shown(self) -> dict:
        return {**self.degrees, **{n: v for n, v in self.borrowed.items() if v > 1}}

    def __repr__(self):
        return f"ParallelDims({', '.join(f'{a}={v}' for a, v in self._shown().items())}, flavour={self.dp_flavour})"

    # -- degrees ----------------------------------------------------------------------------------------------
    def size(self, name: str) -> int:
        """Ranks along an axis, a derived group (batch, loss, fsdp, dp) or a borrowed one (ep, ep_rest)."""
        b = self._borrowed(name)
        if b:
            n, rest = b
            return self.size(BORROWED[n]) // self.borrowed[n] if rest else self.borrowed[n]
        return prod(self.degrees[a] for a in self._axes(name))

    def _borrowed(self, name: str):
        """(parallelism, is_rest) for ``ep`` / ``ep_rest``; None for anything else."""
        if name in BORROWED:
            return name, False
        if name.endswith("_rest") and name[:-5] in BORROWED:
            return name[:-5], True
        return None

    @property
    def dp(self) -> int:
        return self.size("dp")

    @property
    def enabled(self) -> list[str]:
        """Axes with more than one rank, outermost first, then the borrowed parallelisms switched on."""
        return [a for a in AXES if self.degrees[a] > 1] + [n for n, v in self.borrowed.items() if v > 1]

    # -- where a rank sits --------------------------------------------------------------------------------------
    def coords(self, rank: int) -> dict:
        """The mesh coordinate of ``rank`` (row-major over AXES: tp fastest)."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world size {self.world_size}")
        out = {}
        for a in reversed(AXES):
            rank, out[a] = divmod(rank, self.degrees[a])
        return {a: out[a] for a in AXES}

    def rank_of(self, coords: dict) -> int:
        r = 0
        for a in AXES:
            r = r * self.degrees[a] + coords.get(a, 0)
        return r

    def coord(self, rank: int, name: str) -> int:
        """The index of ``rank`` inside its group ``name`` (an axis, a derived group, or a borrowed one: the
        borrowed parallelism's slices lie innermost in its host group, ``ep`` index = host index % ep)."""
        b = self._borrowed(name)
        if b:
            n, rest = b
            return divmod(self.coord(rank, BORROWED[n]), self.borrowed[n])[0 if rest else 1]
        c, idx = self.coords(rank), 0
        for a in self._axes(name):
            idx = idx * self.degrees[a] + c[a]
        return idx

    def group(self, rank: int, name: str) -> list[int]:
        """Every rank in ``rank``'s group along ``name``: same coordinates on all other axes."""
        b = self._borrowed(name)
        if b:
            n, rest = b
            host, other = BORROWED[n], f"{n}_rest" if not rest else n
            return [r for r in self.group(rank, host) if self.coord(r, other) == self.coord(rank, other)]
        axes, base = self._axes(name), self.coords(rank)
        members = [dict(base)]
        for a in axes:
            members = [dict(m, **{a: i}) for m in members for i in range(self.degrees[a])]
        return sorted(self.rank_of(m) for m in members)

    def groups(self, name: str) -> list[list[int]]:
        """All groups along ``name`` (each rank in exactly one)."""
        seen, out = set(), []
        for r in range(self.world_size):
            if r not in seen:
                g = self.group(r, name)
                seen.update(g)
                out.append(g)
        return out

    def describe(self, gpus_per_node: int | None = None) -> str:
        """A table: each global rank, its coordinate, and the groups it talks in (node number when given)."""
        names = self.enabled or ["dp_replicate"]
        head = "rank " + (" node" if gpus_per_node else "") + "".join(f" {a:>12}" for a in names) + "   groups"
        rows = [f"layout: {self}", head]
        for r in range(self.world_size):
            talks = "  ".join(f"{a}{self.group(r, a)}" for a in names)
            node = f" {r // gpus_per_node:>4}" if gpus_per_node else ""
            rows.append(f"{r:>4}{node}" + "".join(f" {self.coord(r, a):>12}" for a in names) + f"   {talks}")
        return "\n".join(rows)

    def __str__(self) -> str:
        borrowed = "".join(f", {n}={v} over {BORROWED[n]}" for n, v in self.borrowed.items() if v > 1)
        return " x ".join(f"{a}={self.degrees[a]}" for a in AXES) + f" (world {self.world_size}{borrowed})"

    def to_dict(self) -> dict:
        return dict(self._shown(), world_size=self.world_size)

    def _axes(self, name: str) -> tuple:
        if name in self.degrees:
            return (name,)
        if name in DERIVED:
            return DERIVED[name]
        raise LayoutError(f"unknown mesh axis or group {name!r}; axes: {', '.join(AXES)}; groups: {', '.join(DERIVED)}")


def _fill(world: int, rep, shard, flavour: str, degrees: dict) -> tuple[int, int]:
    """The data-parallel degrees: what the parallelisms leave of the world, filled along the flavour's axis."""
    names = [n for n in registry.PARALLELISMS if n in degrees]  # the registry's order: tp, pp, cp, ...
    rest = prod(degrees.values())
    what = " x ".join(f"{n} {degrees[n]}" for n in names)
    if world % rest:
        raise LayoutError(f"world size {world} is not divisible by {what} = {rest}; choose degrees whose product "
                          "divides it")
    left = world // rest
    if rep is None and shard is None:
        return (left, 1) if flavour == "replicate" else (1, left)
    for name, given, other in (("dp_shard", shard, rep), ("dp_replicate", rep, shard)):
        if other is None and left % given:
            raise LayoutError(f"{name} {given} does not divide the {left} data-parallel ranks left by world {world} / "
                              f"({what})")
    return (left // shard, shard) if rep is None else (rep, left // rep) if shard is None else (rep, shard)


def _positive(name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise LayoutError(f"{name} must be a positive integer, got {v!r}")


def check_model(dims: ParallelDims, *, num_layers: int, num_heads: int, num_kv_heads: int | None = None,
                seq: int | None = None, cp_impl: str | None = None, sp: bool = False,
                virtual_stages: int = 1) -> None:
    """Refuse layouts a model cannot be split into, before anything launches. Key/value heads fewer than the TP or
    Ulysses degree are replicated (as Megatron and DeepSpeed do), not refused."""
    tp, cp, pp = dims.tp, dims.cp, dims.pp
    if num_heads % tp:
        raise LayoutError(f"{num_heads} query heads do not split over tp {tp}; choose tp dividing {num_heads}")
    if cp_impl == "ulysses" and num_heads % (tp * cp):
        raise LayoutError(f"Ulysses needs query heads % (tp x cp) == 0: {num_heads} heads, tp {tp} x cp {cp}")
    kv = num_kv_heads or num_heads
    if kv >= tp and kv % tp:
        raise LayoutError(f"{kv} key/value heads do not split over tp {tp} (nor is tp a multiple of them)")
    if kv < tp and tp % kv:
        raise LayoutError(f"tp {tp} is not a multiple of the {kv} key/value heads, so they cannot be replicated "
                          "evenly")
    if num_layers < pp * virtual_stages:
        raise LayoutError(f"{num_layers} layers cannot fill pp {pp} x {virtual_stages} stage(s) per rank")
    if seq is not None and cp > 1:
        need = 2 * cp if cp_impl in (None, "ring") else cp
        if seq % need:
            raise LayoutError(f"sequence length {seq} is not divisible by {need} "
                              f"({'2 x cp for load-balanced ring attention' if need == 2 * cp else 'cp'})")
    if seq is not None and sp and seq % (tp * cp):
        raise LayoutError(f"sequence length {seq} is not divisible by tp {tp} x cp {cp} (sequence parallelism "
                          "splits each CP shard over the TP ranks)")
