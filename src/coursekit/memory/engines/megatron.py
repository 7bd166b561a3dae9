"""Model parallelism the Megatron way: what TP, SP, PP and CP split, for every data-parallel engine alike.

- **TP** (tensor parallel) splits each layer's heads and FFN width over ``tp`` ranks: parameters per rank from
  ``ModelShape.local_params(tp)`` (norms and row-parallel biases replicated; K/V heads split, or one kept per rank
  when there are fewer than ``tp``), activations from ``activation_bytes(tp=)``.
- **SP** (sequence parallel, with TP) also splits the residual-stream activations (norms, dropout masks) over TP.
- **PP** (pipeline parallel) gives each of ``pp`` stages ``layers // pp`` layers (the first ``layers % pp`` one more);
  the first stage holds the embedding, the last the final norm, the head and the loss, and with ``pp > 1`` its own
  copy of a tied embedding. 1F1B keeps ``min(pp - i, m)`` micro-batches of activations in flight on stage ``i``,
  GPipe all ``m`` (``m``: micro-batches per step, ``TrainConfig.microbatches``).
- **CP** (context parallel) splits the sequence: activations and the loss buffers of ``seq / cp`` tokens per rank.
  CP ranks hold the same weights, so engines shard model states over dp · cp (``TrainConfig.shard_degree``).

Only the first and the last stage are estimated: a middle stage holds no more than the first.
"""
from __future__ import annotations

from dataclasses import dataclass

from coursekit.memory.activations import ActivationReport, activation_bytes


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
    """Micro-batches whose activations this stage holds at once."""

    @property
    def params(self) -> int:
        return self.layers * self.per_layer + self.embed_params + self.head_params

    @property
    def largest_unit(self) -> int:
        """Parameters of the largest FSDP / ZeRO-3 unit (a layer, the embedding or the head)."""
        return max(self.per_layer if self.layers else 0, self.embed_params, self.head_params)


def stage(shape, c, i: int) -> Stage:
    """Pipeline stage ``i`` as one TP rank holds it."""
    per_layer, first, last, tied = shape.local_params(c.tp)
    t_layer, t_first, t_last = shape.local_tensors()
    tied_copy = tied if c.pp > 1 else 0  # with pipelining the last stage keeps its own copy of a tied embedding
    base, extra = divmod(shape.layers, c.pp)
    layers = base + (1 if i < extra else 0)
    is_first, is_last = i == 0, i == c.pp - 1
    tensors = layers * t_layer + (t_first if is_first else 0) + (t_last + bool(tied_copy) if is_last else 0)
    in_flight = c.microbatches if c.pp_schedule == "gpipe" else min(c.pp - i, c.microbatches)
    return Stage(i, layers, is_first, is_last, per_layer, first if is_first else 0,
                 (last + tied_copy) if is_last else 0, tensors, in_flight)


def stages(shape, c) -> list[Stage]:
    """The stages to estimate: stage 0, and the last one when ``pp > 1``."""
    return [stage(shape, c, i) for i in ([0] if c.pp == 1 else [0, c.pp - 1])]


def per_stage(shape, c, acts: ActivationReport) -> list[dict]:
    """Every stage's layers, in-flight micro-batches and saved activation bytes at its peak."""
    out = []
    for i in range(c.pp):
        st = stage(shape, c, i)
        out.append({"stage": i, "layers": st.layers, "in_flight": st.in_flight,
                    "saved_activations_bytes": saved_bytes(acts, st, c)})
    return out


def activations(shape, c) -> tuple[ActivationReport, int]:
    """Saved activations of one micro-batch on this TP/CP rank, and the recompute working set: one layer's
    activations under full recompute, one attention core under selective (backward re-runs one at a time)."""
    kw = dict(dtype=c.dtype, attention=c.attention, impl=c.impl, kernels=c.kernels, dropout=c.dropout, tp=c.tp,
              sp=c.sp, cp=c.cp, cp_impl=c.cp_impl, position_ids=c.position_ids)
    acts = activation_bytes(shape, c.batch, c.seq, recompute=c.recompute, **kw)
    working = 0
    if c.recompute != "none":
        plain = activation_bytes(shape, c.batch, c.seq, recompute="none", **kw)
        working = plain.layer_bytes - (acts.layer_bytes if c.recompute == "selective" else 0)
    return acts, working


def saved_bytes(acts: ActivationReport, stage: Stage, c=None) -> int:
    """Saved activations on ``stage`` at its peak: its in-flight micro-batches' saved tensors and, under pipelining
    (``c`` given), what the other micro-batches of the step pin meanwhile (``pinned_bytes``)."""
    held = stage.in_flight * acts.stage_bytes(stage.layers, stage.first, stage.last)
    if c is None or c.pp == 1 or c.pp_runtime != "torch" or stage.in_flight >= c.microbatches:
        return held
    return held + (c.microbatches - stage.in_flight) * pinned_bytes(acts, stage, c)


def pinned_bytes(acts: ActivationReport, stage: Stage, c) -> int:
    """Saved storages of one micro-batch that ``torch.distributed.pipelining`` keeps alive for the whole step,
    after that micro-batch's backward (measured, tests/test_pp.py): the schedule cuts the step's input ids and labels
    into micro-batch *views* of one tensor, so the embedding's saved ids (first stage) and the loss's saved labels
    (last stage) pin all m; a later stage receives each micro-batch into its own buffer, allocated once and kept, and
    where the first block saves its input as it is (an fp32 RMSNorm input, a LayerNorm input, a checkpoint's input)
    that buffer is a saved storage of every micro-batch."""
    n = acts.embed.get("input_ids(int64)", 0) if stage.first else 0
    n += acts.head.get("loss.labels(int64)", 0) if stage.last else 0
    if not stage.first and stage.layers:
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
