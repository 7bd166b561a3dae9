"""Model parallelism the Megatron way: what TP, SP, PP and CP split, for every data-parallel engine alike.

- **TP** (tensor parallel) splits each layer's heads and FFN width over ``tp`` ranks: parameters per rank from
  ``ModelShape.local_params(tp)`` (norms and row-parallel biases replicated; K/V heads split, or one kept per rank
  when there are fewer than ``tp``), activations from ``activation_bytes(tp=)``.
- **SP** (sequence parallel, with TP) also splits the residual-stream activations (norms, dropout masks) over TP.
- **PP** (pipeline parallel) gives each of ``pp`` stages ``layers // pp`` layers (the first ``layers % pp`` one more);
  the first stage holds the embedding, the last the final norm, the head and the loss, and with ``pp > 1`` its own
  copy of a tied embedding. 1F1B keeps ``min(pp - i, m)`` micro-batches of activations in flight on stage ``i``,
  GPipe all ``m`` (``m``: micro-batches per step, ``TrainConfig.microbatches``). Interleaved 1F1B, LoopedBFS and
  interleaved zero bubble give each rank ``v`` stages of the ``v·pp`` (``layers // (v·pp)`` layers each,
  front-loaded), ZBV and DualPipeV two in a V (rank 0 the first and the last); what a rank holds at its peak comes
  from the schedule's order of forwards and backwards (``coursekit.memory.pp_order``).
- **CP** (context parallel) splits the sequence: activations and the loss buffers of ``seq / cp`` tokens per rank.
  CP ranks hold the same weights, so engines shard model states over dp · cp (``TrainConfig.shard_degree``).

With in-flight-only inputs (``pp_runtime`` megatron) only the first and the last stage are estimated: a middle
stage holds no more than the first. torch's runtime keeps each done micro-batch's receive buffer on every stage but
the first, so there every stage is estimated.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from coursekit.memory import pp_order
from coursekit.memory.activations import ActivationReport, activation_bytes
from coursekit.spec.schedules import stages_of


@dataclass(frozen=True)
class Stage:
    """One pipeline stage as one TP rank holds it."""
    index: int
    layers: int
    first: bool
    last: bool
    per_layer: int
    """Parameters of one layer on this TP rank."""
    embed_params: int
    """Embedding parameters (first stage; else 0)."""
    head_params: int
    """Final norm + head (+ a tied embedding's copy under pipelining) parameters (last stage; else 0)."""
    tensors: int
    """Parameter tensors on this stage."""
    in_flight: int
    """Micro-batches whose activations this stage holds at once (with several stages per rank: the most chunk
    micro-batches it holds at once, which need not be when its bytes peak)."""
    expert_per_layer: int = 0
    """Of ``per_layer``: this rank's expert parameters (experts/ep of each expert term)."""
    ep: int = 1

    @property
    def expert_params(self) -> int:
        return self.layers * self.expert_per_layer

    @property
    def shard_equivalent(self) -> int:
        """Parameters that a sharding engine divides by its N ranks: the expert slices are sharded over the N/ep
        ranks holding the same slice, so they count ep times (dense/N + experts_local/(N/ep))."""
        return self.params + (self.ep - 1) * self.expert_params

    @property
    def params(self) -> int:
        return self.layers * self.per_layer + self.embed_params + self.head_params

    @property
    def largest_unit(self) -> int:
        """Parameters of the largest FSDP / ZeRO-3 unit (a layer, the embedding or the head)."""
        return max(self.per_layer if self.layers else 0, self.embed_params, self.head_params)


def virtual(c) -> int:
    """Stages per pipeline rank under ``c.pp_schedule``."""
    if c.pp == 1:
        return 1
    return c.pp_virtual if c.pp_virtual is not None else pp_order.VIRTUAL[c.pp_schedule]


def rank_stages(c, i: int) -> list[int]:
    """The global stages pipeline rank ``i`` holds (rank i, i+pp, ...; r and 2·pp−1−r under zbv and dualpipev)."""
    return [0] if c.pp == 1 else stages_of(i, c.pp, c.pp_schedule, virtual(c))


def chunk_layers(shape, c, g: int) -> int:
    """Layers of global stage ``g`` of ``v·pp`` (front-loaded, as coursekit.pp splits them)."""
    base, extra = divmod(shape.layers, c.pp * virtual(c))
    return base + (1 if g < extra else 0)


def stage(shape, c, i: int) -> Stage:
    """Pipeline rank ``i``'s stages as one TP rank holds them."""
    return _stage(shape, _StageKey(c.tp, c.ep, c.pp, c.pp_schedule, c.pp_virtual, c.microbatches), i)


@dataclass(frozen=True)
class _StageKey:  # the fields of a run a stage depends on (the planner asks the same ones for many dp / ZeRO choices)
    tp: int
    ep: int
    pp: int
    pp_schedule: str
    pp_virtual: int | None
    microbatches: int


def _stage_of(shape, c: _StageKey, i: int) -> Stage:
    per_layer, first, last, tied = shape.local_params(c.tp, c.ep)
    t_layer, t_first, t_last = shape.local_tensors()
    tied_copy = tied if c.pp > 1 else 0  # with pipelining the last stage keeps its own copy of a tied embedding
    held = rank_stages(c, i)
    layers = sum(chunk_layers(shape, c, g) for g in held)
    is_first, is_last = 0 in held, c.pp * virtual(c) - 1 in held  # the V shape puts both on rank 0
    tensors = layers * t_layer + (t_first if is_first else 0) + (t_last + bool(tied_copy) if is_last else 0)
    if c.pp == 1:
        in_flight = 1
    elif virtual(c) == 1:
        in_flight = c.microbatches if c.pp_schedule == "gpipe" else min(c.pp - i, c.microbatches)
    else:  # chunk micro-batches held at the peak (the order of the schedule)
        # the most at once (not always when the bytes peak)
        in_flight = _in_flight(c.pp_schedule, c.pp, i, c.microbatches, virtual(c))
    experts = shape.expert_params_per_layer() // c.ep
    return Stage(i, layers, is_first, is_last, per_layer, first if is_first else 0,
                 (last + tied_copy) if is_last else 0, tensors, in_flight, experts, c.ep)


_stage = lru_cache(maxsize=8192)(_stage_of)  # wrapped, not decorated: mutmut mutates only undecorated functions


def stages(shape, c) -> list[Stage]:
    """The stages to estimate: stage 0, and the last one when ``pp > 1`` (every one under torch's runtime)."""
    if c.pp > 1 and c.pp_runtime == "torch":
        return [stage(shape, c, i) for i in range(c.pp)]
    return [stage(shape, c, i) for i in ([0] if c.pp == 1 else [0, c.pp - 1])]


def per_stage(shape, c, acts: ActivationReport) -> list[dict]:
    """Every stage's layers, in-flight micro-batches and saved activation bytes at its peak."""
    out = []
    for i in range(c.pp):
        st = stage(shape, c, i)
        out.append({"stage": i, "layers": st.layers, "in_flight": st.in_flight,
                    "saved_activations_bytes": saved_bytes(acts, st, c, shape)})
    return out


def activations(shape, c) -> tuple[ActivationReport, int]:
    """Saved activations of one micro-batch on this TP/CP rank, and the recompute working set: one layer's
    activations under full recompute, one attention core under selective (backward re-runs one at a time); under
    op (torchtitan's per-op policy) one layer's activations too, as under full (an upper bound: the re-run's kept
    outputs are the ones already counted)."""
    kw = dict(dtype=c.dtype, attention=c.attention, impl=c.impl, kernels=c.kernels, dropout=c.dropout, tp=c.tp,
              sp=c.sp, sp_style=c.sp_style, cp=c.cp, cp_impl=c.cp_impl, position_ids=c.position_ids, ep=c.ep,
              aux_loss=c.aux_loss and shape.aux_loss_coef > 0)
    acts = activation_bytes(shape, c.batch, c.seq, recompute=c.recompute, **kw)
    working = 0
    if c.recompute != "none":
        plain = activation_bytes(shape, c.batch, c.seq, recompute="none", **kw)
        working = plain.layer_bytes - (acts.layer_bytes if c.recompute == "selective" else 0)
        if c.recompute_layers is not None:  # only the first N of each stage recomputed: the rest hold it all
            acts = replace(acts, recompute_layers=c.recompute_layers, plain_layer_bytes=plain.layer_bytes,
                           plain_shared=dict(plain.shared))
    return acts, working


def saved_bytes(acts: ActivationReport, stage: Stage, c=None, shape=None, graph_only: bool = False) -> int:
    """Saved activations on ``stage`` at its peak. Under pipelining (``c`` given, pp > 1) the peak is found along
    the schedule's order (``coursekit.memory.pp_order``): each of the rank's stages holds its in-flight
    micro-batches whole and, with ``pp_runtime`` torch, the pinned part of those it is done with
    (``pinned_bytes``). ``graph_only``: only what the autograd graph itself keeps after a backward — the views of
    the step's ids and labels, not the stage's receive buffers — which is what ``--count-step`` measures.
    ``shape`` is needed with several stages per rank (their layers)."""
    if c is None or c.pp == 1:
        return stage.in_flight * acts.stage_bytes(stage.layers, stage.first, stage.last)
    kept_of = lambda st: (pinned_bytes(acts, st, c, buffers=not graph_only)  # noqa: E731
                          if graph_only or c.pp_runtime == "torch" else 0)
    S = c.pp * virtual(c)
    if S == c.pp:  # one stage per rank: in flight at the peak, the rest done (1F1B peaks at its last forward)
        held = stage.in_flight * acts.stage_bytes(stage.layers, stage.first, stage.last)
        return held + (c.microbatches - stage.in_flight) * kept_of(stage)
    if shape is None:
        raise ValueError("saved_bytes of a multi-stage pipeline rank needs the model shape")
    chunks = {g: Stage(g, chunk_layers(shape, c, g), g == 0, g == S - 1, 0, 0, 0, 0, 0)
              for g in rank_stages(c, stage.index)}
    # the step's ids (first stage) and labels (last) are micro-batch views of one tensor each: under torch's
    # runtime that storage is held whole from the stage's first forward (measured), not one view at a time
    step = {g: step_shared(acts, ch) if c.pp_runtime == "torch" or graph_only else 0 for g, ch in chunks.items()}
    whole = {g: acts.stage_bytes(ch.layers, ch.first, ch.last) - step[g] for g, ch in chunks.items()}
    kept = {g: kept_of(ch) - step[g] for g, ch in chunks.items()}
    loss = {g: loss_bytes(acts, ch) for g, ch in chunks.items()}
    return _peak_bytes(c.pp_schedule, c.pp, stage.index, c.microbatches, virtual(c), tuple(whole.items()),
                       tuple(kept.items()) if any(kept.values()) else None, tuple(loss.items()),
                       tuple((g, c.microbatches * n) for g, n in step.items()) if any(step.values()) else None)


# the planner asks the same schedules over and over (layouts that differ only in dp, ZeRO stage or overlap hold the
# same bytes per pipeline stage): both walks are pure functions of their integer arguments, cached
def _in_flight_of(schedule: str, pp: int, rank: int, m: int, v: int) -> int:
    return pp_order.peak(schedule, pp, rank, m, v, lambda g: 1)[0]


def _peak_bytes_of(schedule, pp, rank, m, v, whole, kept, loss, step) -> int:
    d = lambda items: dict(items).__getitem__ if items is not None else None  # noqa: E731
    return pp_order.peak(schedule, pp, rank, m, v, d(whole), d(kept), d(loss), d(step))[0]


_in_flight = lru_cache(maxsize=8192)(_in_flight_of)
_peak_bytes = lru_cache(maxsize=8192)(_peak_bytes_of)


def step_shared(acts: ActivationReport, stage: Stage) -> int:
    """One micro-batch's share of the step-wide tensors torch's schedule cuts into views: the ids the embedding
    saves (first stage), the labels the loss saves (last)."""
    return ((acts.embed.get("input_ids(int64)", 0) if stage.first else 0)
            + (acts.head.get("loss.labels(int64)", 0) if stage.last else 0))


def loss_bytes(acts: ActivationReport, stage: Stage) -> int:
    """What a split backward's input pass frees at once on the last stage: the loss's saved buffers (log-softmax's
    output, the total weight), which lie above the head's weight in the graph; the labels stay (the step's)."""
    if not stage.last:
        return 0
    return sum(v for k, v in acts.head.items() if k.startswith("loss.") and k != "loss.labels(int64)")


def pinned_bytes(acts: ActivationReport, stage: Stage, c, buffers: bool = True) -> int:
    """Saved storages of one micro-batch that ``torch.distributed.pipelining`` keeps alive for the whole step,
    after that micro-batch's backward (measured, tests/test_pp.py): the schedule cuts the step's input ids and labels
    into micro-batch *views* of one tensor, so the embedding's saved ids (first stage) and the loss's saved labels
    (last stage) pin all m; a later stage receives each micro-batch into its own buffer, allocated once and kept, and
    where the first block saves its input as it is (an fp32 RMSNorm input, a LayerNorm input, a checkpoint's input)
    that buffer is a saved storage of every micro-batch (``buffers``)."""
    n = acts.embed.get("input_ids(int64)", 0) if stage.first else 0
    n += acts.head.get("loss.labels(int64)", 0) if stage.last else 0
    if buffers and not stage.first and stage.layers:
        t = acts.per_layer
        as_is = [k for k in ("layer_input(checkpoint)", "attn_norm.input") if k in t]
        if not as_is and c.dtype == "fp32" and "attn_norm.input_fp32" in t:  # x.to(float32) is x itself
            as_is = ["attn_norm.input_fp32"]
        n += t[as_is[0]] if as_is else 0
    return n


def logits_bytes(shape, c, stage: Stage) -> int:
    """The loss buffers on the last stage: the two fp32 b·s·V gradient buffers of log-softmax's backward (vocab split
    over TP with fused, vocab-parallel cross-entropy). The activation-dtype logits HF returns are already freed by a
    trainer that keeps only ``.loss`` (coursekit.train, HF Trainer) — measured."""
    if not stage.last:
        return 0
    v_loc = shape.vocab // c.tp if c.impl == "fused" and shape.vocab % c.tp == 0 else shape.vocab
    return 8 * c.batch * (c.seq // c.cp) * v_loc
