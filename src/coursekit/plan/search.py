"""Search the layouts of a model on a cluster: enumerate, keep those that fit, rank by predicted step time.

Enumerated (``plan``): tp over divisors of the node size that split the heads; cp (ring, and Ulysses where the
heads split over tp x cp) while each rank keeps >= MIN_CP_TOKENS tokens; pp over divisors of what is left, up to
the layer count, with 1, 2 or 4 virtual stages; data parallel as DDP, ZeRO-1/2/3, FSDP2 and HSDP (sharded within a
node, replicated across; with pp > 1 only DDP, ZeRO-1 and FSDP2, as Megatron / DeepSpeed / torchtitan compose
them); recompute none / selective / full, and op (torchtitan's per-op policy) where the calculator models it (no
CP or EP; TP for dense blocks); every micro-batch that divides the per-rank batch. 1F1B only: GPipe has
the same bubble and holds more activations, so it never wins (``--layout pp_schedule=gpipe`` evaluates it).

Pruning (exact, never drops a fitting layout): a (degrees, strategy) whose smallest configuration (micro-batch 1,
full recompute) does not fit is skipped whole; micro-batches grow until the first that does not fit (memory grows
with the micro-batch); a layout that does not fit is not priced. Virtual stages are part of the skip key
(interleaved 1F1B holds more chunk micro-batches at v = 2 than at v = 4), and a micro-batch count torch cannot
split into interleaved rounds skips that micro-batch, not the layout.

Fit: ``coursekit.memory.estimate`` peak <= (1 - MEMORY_SLACK) x GPU memory: the calculator's stated slack for
allocator fragmentation and caching (its docstring: "leave 5-10 %").
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from coursekit.memory import ConfigError, TrainConfig, estimate, resolve_model
from coursekit.memory.gpus import GiB
from coursekit.memory.pp_order import RoundsError
from coursekit.parallel import LayoutError, check_model
from coursekit.plan import overlap
from coursekit.plan.hardware import Hardware, Network, hardware as hw_lookup, network as net_lookup
from coursekit.plan.layout import RECOMPUTE, Layout
from coursekit.plan.steptime import Cluster, Prediction, check_elementwise, predict

MEMORY_SLACK = 0.05
_RUN_FIELDS = tuple(f.name for f in fields(Layout)
                    if f.name not in ("micro_batch", "recompute", "recompute_layers", "microbatches"))
MIN_CP_TOKENS = 1024
VIRTUAL_STAGES = (1, 2, 4)


class NoFit(ValueError):
    """No layout fits; ``extra_bytes`` is the smallest extra memory per GPU that would make one fit."""

    def __init__(self, msg, extra_bytes=None, closest=None):
        super().__init__(msg)
        self.extra_bytes, self.closest = extra_bytes, closest


@dataclass
class Candidate:
    layout: Layout
    prediction: Prediction
    peak_bytes: int
    capacity_bytes: int
    unchecked: tuple[str, ...] = ()
    """Where this prediction lies outside what the published runs behind it cover (``unchecked``)."""

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def to_dict(self) -> dict:
        p = self.prediction
        return {"layout": self.layout.to_dict(), "strategy": self.layout.strategy, "summary": self.layout.short(),
                "fits": self.fits, "peak_bytes": self.peak_bytes, "capacity_bytes": self.capacity_bytes,
                "unchecked": list(self.unchecked), **p.to_dict()}


# What the published runs of bench/bench_planner.py cover (docs/planner.md, "Published runs"): their exposed
# communication stays under 30 % of the step; sharded data parallelism without TP/PP holds to a few % up to 32 GPUs,
# beyond that published runs range from within 3 % (A100, large micro-batches) to 4x slower than predicted (ZeRO-3
# at 1,536 GPUs: bandwidth-bound, which the model does not predict); context parallelism: one run, ring cp 2
# (Llama 3 70B, +4.6 %); experts: EP 8 inside a node (Qwen3-235B-A22B with TP 2, Qwen3-30B-A3B).
CHECKED_EXPOSED_COMM = 0.30
# data-parallel communication over the compute it hides behind (Prediction.dp_comm_s / compute_s): the published
# runs predicted within 25 % reach 0.5 (Megatron's Qwen3-235B-A22B with FSDP over 128 ranks); above it MPT-13B on 64
# H100s (0.51) is +29 %, GPT-3 175B ZeRO-3 on 1,536 A100s (1.1: the step bound by its gathers) 3.7x slower
CHECKED_DP_COMM = 0.5
CHECKED_SHARDED_DP = 32
CHECKED_CP = 2
CHECKED_EP = 8


def unchecked(shape, L: Layout, p: Prediction) -> tuple[str, ...]:
    """The regimes of this prediction that no checked published run covers, each in words (empty: covered)."""
    out = []
    exposed = sum(p.exposed_s.values()) / p.step_time_s
    if exposed > CHECKED_EXPOSED_COMM:
        out.append(f"exposed communication {exposed:.0%} of the step (checked runs: <= {CHECKED_EXPOSED_COMM:.0%})")
    ratio = p.dp_comm_s / p.compute_s if p.compute_s else 0.0
    if ratio > CHECKED_DP_COMM:
        out.append(f"data-parallel communication {ratio:.2f}x the compute it hides behind (checked runs: <= "
                   f"{CHECKED_DP_COMM}x; GPT-3 175B ZeRO-3 on 1,536 A100s, 1.1x, ran 3.7x slower than predicted)")
    sharded = (L.engine == "fsdp2" and L.dp_shard > 1) or (L.engine == "deepspeed" and L.zero == 3)
    if sharded and L.tp == L.pp == 1 and L.dp > CHECKED_SHARDED_DP:
        out.append(f"sharded data parallelism over {L.dp} GPUs without TP or PP (holds up to {CHECKED_SHARDED_DP}; "
                   "beyond, published runs are up to 4x slower than predicted)")
    if L.cp > CHECKED_CP or (L.cp > 1 and L.cp_impl != "ring"):
        out.append(f"context parallelism cp {L.cp} {L.cp_impl} (checked: ring, cp {CHECKED_CP})")
    if shape.is_moe and L.ep > CHECKED_EP:
        out.append(f"experts over {L.ep} EP ranks (checked: EP {CHECKED_EP} inside a node)")
    if sharded and L.recompute == "none" and p.run.get("elementwise", "eager") == "eager":
        out.append("sharded data parallelism without activation checkpointing: LLM Foundry's H100 runs of this kind "
                   "are 17-39 % slower than predicted at 8 to 64 GPUs (its A100 run within 5 %; checkpointed runs "
                   "+6-14 %)")
    if p.overlap.get("tp"):
        out.append("tp overlap: the one published pair (torchtitan async TP, Llama 3.1 70B) gained x1.06 where the "
                   "model predicts x1.28: optimistic")
    if p.run.get("compile"):
        out.append("torch.compile: only its element-wise fusion is modelled (torchtitan's pairs: x1.19 predicted, "
                   "x1.16 measured)")
    if p.run.get("gemm_dtype") == "fp8":
        out.append("fp8: checked on torchtitan's Float8 tensorwise rows only (x1.33 predicted, x1.28 measured)")
    return tuple(out)


def make_cluster(gpus: int, gpus_per_node: int, gpu="H100-80GB", network="ib-400", hw: Hardware | None = None,
                 net: Network | None = None) -> Cluster:
    for k, v in (("gpus", gpus), ("gpus_per_node", gpus_per_node)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
    if gpus % gpus_per_node and gpus > gpus_per_node:
        raise ValueError(f"--gpus-per-node {gpus_per_node} does not divide --gpus {gpus}: nodes must be whole")
    g = min(gpus, gpus_per_node)
    return Cluster(hw=hw or hw_lookup(gpu), net=net or net_lookup(network), gpus=gpus, gpus_per_node=g)


class _Evaluator:
    def __init__(self, shape, cluster: Cluster, seq, global_batch, dtype, attention, compile=False,
                 elementwise="eager"):
        self.shape, self.cluster, self.seq, self.B, self.dtype, self.attention = (shape, cluster, seq, global_batch,
                                                                                  dtype, attention)
        check_elementwise(elementwise)  # before the search: where nothing fits, nothing is predicted
        self.compile, self.elementwise = compile, elementwise
        # memory: fp8 runs as bf16 (torchao float8 keeps bf16 weights and saves the bf16 input and weight of each
        # linear for backward; its fp8 copies are transient); torch.compile sized as eager
        self.mem_dtype = "bf16" if dtype == "fp8" else dtype
        self.capacity = int(cluster.hw.memory_bytes * (1 - MEMORY_SLACK))
        self.cache: dict = {}  # Layout -> peak bytes
        self.runs: dict = {}  # degrees and strategy -> the calculator's keywords
        self.closest: tuple | None = None  # (extra bytes, layout) of the best non-fitting layout

    def _run(self, L: Layout) -> dict:
        """The calculator's keywords for L's degrees and strategy (``RunSpec.calculator``), shared by its
        micro-batches and recompute policies: those set only ``batch``, ``recompute`` (``recompute_layers``) and
        ``microbatches``."""
        key = tuple(getattr(L, k) for k in _RUN_FIELDS)
        if key not in self.runs:
            base = replace(L, micro_batch=1, recompute="none", recompute_layers=None, microbatches=self.B // L.dp)
            self.runs[key] = base.spec(seq=self.seq, dtype=self.mem_dtype,
                                       attention="sdpa" if self.attention == "flash" else "eager").calculator()
        return self.runs[key]

    def peak(self, L: Layout) -> int:
        if L not in self.cache:
            # the planner prices mixed precision as Megatron-LM runs it for every engine (16 bytes per parameter, 16Ψ),
            # not the trainer's CPU autocast; a pipeline runtime that keeps only in-flight micro-batches' inputs
            # (Megatron-LM, DeepSpeed): torch's pipelining (2.13) keeps every micro-batch's receive buffer for the
            # step, which at hundreds of micro-batches is tens of GiB (`coursekit memory --pp-runtime torch`)
            kw = {**self._run(L), "batch": L.micro_batch, "recompute": L.recompute, "recompute_layers": L.recompute_layers,
                  "microbatches": self.B // (L.dp * L.micro_batch), "impl": "fused" if self.attention == "flash" else "hf",
                  "pp_runtime": "megatron"}
            if self.dtype != "fp32":
                kw["precision"] = "16psi"
            try:
                config = TrainConfig(**kw)
            except LayoutError as exc:
                raise ConfigError(str(exc)) from exc
            self.cache[L] = estimate(self.shape, config).peak_bytes
        peak = self.cache[L]
        if peak > self.capacity and (self.closest is None or peak - self.capacity < self.closest[0]):
            self.closest = (peak - self.capacity, L)
        return peak

    def candidate(self, L: Layout, *, unfit: bool = True) -> Candidate | None:
        """L's memory and predicted step time; None when it does not fit and ``unfit`` is false (nothing predicted)."""
        peak = self.peak(L)
        if peak > self.capacity and not unfit:
            return None
        p = predict(self.shape, L, self.cluster, seq=self.seq, global_batch=self.B, dtype=self.dtype,
                    attention=self.attention, compile=self.compile, elementwise=self.elementwise)
        return Candidate(L, p, peak, self.capacity, unchecked(self.shape, L, p))


def _check(shape, L: Layout, seq: int) -> None:
    check_model(L.dims(), num_layers=shape.layers, num_heads=shape.heads, num_kv_heads=shape.kv_heads, seq=seq,
                cp_impl=L.cp_impl if L.cp > 1 else None, sp=L.sp and L.tp > 1, virtual_stages=L.virtual_stages)


def evaluate(model, layout: Layout | dict, *, gpus: int | None = None, gpus_per_node: int = 8, gpu="H100-80GB",
             network="ib-400", seq: int, global_batch: int, dtype: str = "bf16", attention: str = "flash",
             hw: Hardware | None = None, net: Network | None = None, compile: bool = False,
             elementwise: str = "eager") -> Candidate:
    """One given layout (``--layout``): its memory, fit and predicted step time. A dict may omit the data-parallel
    degree: what tp·pp·cp leave of ``gpus`` goes to dp_shard (engine fsdp2) or dp_replicate."""
    shape = resolve_model(model)
    if isinstance(layout, dict):
        layout = _fill(dict(layout), gpus)
    gpus = gpus or layout.world
    if layout.world != gpus:
        raise ValueError(f"layout uses {layout.world} GPUs (dp {layout.dp} x tp {layout.tp} x pp {layout.pp} x cp "
                         f"{layout.cp}) but --gpus is {gpus}")
    _check(shape, layout, seq)
    ev = _Evaluator(shape, make_cluster(gpus, gpus_per_node, gpu, network, hw, net), seq, global_batch, dtype,
                    attention, compile, elementwise)
    return ev.candidate(layout)


def _fill(d: dict, gpus: int | None) -> Layout:
    if gpus and "dp_replicate" not in d and "dp_shard" not in d:
        rest = d.get("tp", 1) * d.get("pp", 1) * d.get("cp", 1)
        if gpus % rest:
            raise ValueError(f"tp x pp x cp = {rest} does not divide --gpus {gpus}")
        d["dp_shard" if d.get("engine") == "fsdp2" else "dp_replicate"] = gpus // rest
    elif gpus and d.get("engine") == "fsdp2" and "dp_shard" not in d:
        rest = d.get("tp", 1) * d.get("pp", 1) * d.get("cp", 1) * d["dp_replicate"]
        d["dp_shard"] = max(1, gpus // rest)
    elif gpus and "dp_replicate" not in d:
        rest = d.get("tp", 1) * d.get("pp", 1) * d.get("cp", 1) * d["dp_shard"]
        d["dp_replicate"] = max(1, gpus // rest)
    return Layout(**d)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _dp_variants(dp: int, pp: int, node_left: int) -> list[dict]:
    if dp == 1:
        return [dict(engine="ddp")]
    out = [dict(engine="ddp", dp_replicate=dp), dict(engine="deepspeed", zero=1, dp_replicate=dp),
           dict(engine="fsdp2", dp_shard=dp)]
    if pp == 1:
        out += [dict(engine="deepspeed", zero=2, dp_replicate=dp), dict(engine="deepspeed", zero=3, dp_replicate=dp)]
        if 1 < node_left < dp and dp % node_left == 0:
            out.append(dict(engine="fsdp2", dp_shard=node_left, dp_replicate=dp // node_left))
    return out


def layouts_of(shape, gpus: int, gpus_per_node: int, seq: int, global_batch: int):
    """Every (tp, cp, cp_impl, pp, data-parallel variant) the search visits, as Layout stubs (micro-batch 1)."""
    g = min(gpus, gpus_per_node)
    for tp in _divisors(g):
        for cp in _divisors(gpus // tp):
            if cp > 1 and (seq // cp < MIN_CP_TOKENS or seq % (2 * cp)):
                continue
            for impl in (("ring", "ulysses") if cp > 1 else ("ring",)):
                for pp in _divisors(gpus // (tp * cp)):
                    if pp > shape.layers:
                        break
                    dp = gpus // (tp * cp * pp)
                    if global_batch % dp:
                        continue
                    for var in _dp_variants(dp, pp, max(1, g // (tp * cp))):
                        for v in (VIRTUAL_STAGES if pp > 1 else (1,)):
                            if pp * v > shape.layers:
                                continue
                            for ep in _ep_degrees(shape, dp * cp):
                                try:
                                    L = Layout(tp=tp, cp=cp, pp=pp, cp_impl=impl, virtual_stages=v, ep=ep, **var)
                                    _check(shape, L, seq)
                                except (LayoutError, ValueError):
                                    continue
                                yield L


def _ep_degrees(shape, host: int) -> list[int]:
    """Expert-parallel degrees of an MoE model: those dividing its experts and the dp x cp ranks (1 for dense)."""
    if not shape.is_moe:
        return [1]
    return [e for e in _divisors(host) if shape.experts % e == 0]


def plan(model, *, gpus: int, gpus_per_node: int = 8, gpu="H100-80GB", network="ib-400", seq: int,
         global_batch: int, dtype: str = "bf16", attention: str = "flash", hw: Hardware | None = None,
         net: Network | None = None, keep_unfit: bool = False, fixed: dict | None = None,
         compile: bool = False, elementwise: str = "eager") -> list[Candidate]:
    """All evaluated candidates, fitting ones first, each group by predicted step time. Raises NoFit if none fits.

    ``fixed``: Layout fields held at a value (e.g. {"sp": False, "recompute": "full"} to search only what a 2021
    Megatron-LM could run); everything else is searched."""
    fixed = dict(fixed or {})
    names = {f.name for f in fields(Layout)}
    if set(fixed) - names:
        raise ValueError(f"unknown fixed layout keys {sorted(set(fixed) - names)}; known: {', '.join(sorted(names))}")
    preset = {k: fixed.pop(k) for k in ("sp", "pp_schedule", "grad_reduce_dtype") if k in fixed}  # set, not filtered
    wanted = fixed.pop("overlap", None)  # overlap names: each set on the layouts it applies to
    shape = resolve_model(model)
    cluster = make_cluster(gpus, gpus_per_node, gpu, network, hw, net)
    for k, v in (("seq", seq), ("global_batch", global_batch)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")
    ev = _Evaluator(shape, cluster, seq, global_batch, dtype, attention, compile, elementwise)
    out: list[Candidate] = []
    skipped: set = set()
    for stub in layouts_of(shape, gpus, cluster.gpus_per_node, seq, global_batch):
        if preset:
            stub = replace(stub, **preset)
        if wanted:
            stub = replace(stub, overlap=applicable(wanted, stub))
        if any(getattr(stub, k) != v for k, v in fixed.items() if k not in ("micro_batch", "recompute")):
            continue
        # ring and Ulysses share a key: layouts_of yields ring first, and Ulysses holds more at the same degrees
        # (tests/test_plan.py), so a ring stub that does not fit rules out its Ulysses twin
        key = (stub.tp, stub.cp, stub.pp, stub.strategy, stub.dp_shard, stub.virtual_stages, stub.ep)
        if key in skipped:
            continue
        try:
            smallest = ev.peak(replace(stub, recompute="full"))
        except RoundsError:  # micro-batch 1 cannot run interleaved; larger ones may: no pruning bound then
            smallest = 0
        except ValueError:  # a layout the memory calculator refuses (e.g. CP without a flash kernel)
            skipped.add(key)
            continue
        if smallest > ev.capacity:
            skipped.add(key)
            continue
        per_rank = global_batch // stub.dp
        for rc in ([fixed["recompute"]] if "recompute" in fixed else RECOMPUTE):
            if rc == "op" and "recompute" not in fixed and (max(stub.cp, stub.ep) > 1 or (stub.tp > 1 and shape.is_moe)):
                continue  # the calculator models op without CP or EP, under TP for dense blocks (memory.op_recompute)
            for mb in ([fixed["micro_batch"]] if "micro_batch" in fixed else _divisors(per_rank)):
                L = replace(stub, micro_batch=mb, recompute=rc)
                try:
                    c = ev.candidate(L, unfit=keep_unfit)
                except RoundsError:  # interleaved 1F1B with micro-batches torch cannot split into rounds
                    continue
                except ConfigError:  # a recompute the calculator does not model here (selective under Ulysses)
                    continue
                if c is None or not c.fits:
                    if c is not None:
                        out.append(c)
                    break
                out.append(c)
    fitting = sorted((c for c in out if c.fits), key=lambda c: (c.prediction.step_time_s, c.peak_bytes))
    if not fitting:
        cap = cluster.hw.memory_bytes
        if ev.closest is None:
            raise NoFit(f"no layout of {shape.name} splits over {gpus} GPUs with global batch {global_batch} and "
                        f"sequence {seq} (check that the batch divides over some data-parallel degree)")
        extra, L = ev.closest
        raise NoFit(f"no layout fits in {cap / GiB:.1f} GiB per GPU ({cluster.hw.name}, keeping "
                    f"{MEMORY_SLACK:.0%} slack); the closest, {L.short()}, needs {extra / GiB:.2f} GiB more per GPU",
                    extra_bytes=extra, closest=L)
    return fitting + sorted((c for c in out if not c.fits), key=lambda c: c.prediction.step_time_s)


def applicable(names: str, layout: Layout) -> str:
    """The overlap names ('+'-joined, ``no-`` to switch off) that can act on ``layout``; an unknown one is refused."""
    keep = []
    for item in (x.strip() for x in names.split("+") if x.strip()):
        name = item.removeprefix("no-")
        if name not in overlap.OVERLAPS:
            raise ValueError(f"overlap {item!r}: unknown; choose from {', '.join(overlap.OVERLAPS)} (no-NAME: off)")
        if overlap.applies(name, layout) is None:
            keep.append(item)
    return "+".join(keep)


def pareto(cands: list[Candidate]) -> list[Candidate]:
    """Fitting candidates no other beats on both memory and step time, by memory ascending."""
    front, best_t = [], float("inf")
    for c in sorted((c for c in cands if c.fits), key=lambda c: (c.peak_bytes, c.prediction.step_time_s)):
        if c.prediction.step_time_s < best_t:
            front.append(c)
            best_t = c.prediction.step_time_s
    return front


def explain(c: Candidate, best: Candidate | None = None) -> str:
    """Why a candidate ranks where it does: where its step time goes, and what it loses to the best."""
    p, s = c.prediction, c.prediction.step_time_s
    parts = {"compute": p.compute_s, "bubble": p.bubble_s, **{f"{k} comm": v for k, v in p.exposed_s.items()},
             "overlap interference": p.interference_s, "optimizer": p.optimizer_s, "host": p.host_s}
    shares = ", ".join(f"{k} {v / s:.0%}" for k, v in parts.items() if v / s >= 0.01)
    head = f"{shares}; {c.peak_bytes / GiB:.1f} of {c.capacity_bytes / GiB:.1f} GiB"
    if best is None or best is c:
        return head
    bp = best.prediction
    other = {"compute": bp.compute_s, "bubble": bp.bubble_s, **{f"{k} comm": v for k, v in bp.exposed_s.items()},
             "overlap interference": bp.interference_s, "optimizer": bp.optimizer_s, "host": bp.host_s}
    worst = max(parts, key=lambda k: parts[k] - other[k])
    more = (parts[worst] - other[worst]) * 1e3
    return f"{head}; {s / bp.step_time_s - 1:+.1%} vs #1, mostly {worst} (+{more:.0f} ms)"
