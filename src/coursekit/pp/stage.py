"""Pipeline parallelism with ``torch.distributed.pipelining``: split the model into stages, run a schedule.

The model is cut into ``pp · v`` stages of contiguous transformer blocks (uneven splits allowed: the first
``L % (pp·v)`` stages get one more); stage 0 also keeps the embedding, the last stage the final norm and the head.
Each rank of the ``pp`` sub-mesh holds ``v`` of them (``coursekit.pp.stages_of``): v = 1 for GPipe and 1F1B; v = 2
for the interleaved schedules (stages r and r+pp) and the V schedules ZBV / DualPipeV (stages r and 2pp−1−r).
Blocks of other stages are replaced by a pass-through placeholder, so parameter names keep their global index
(``model.layers.3...``) and checkpoints of different stages never collide. Stages are made by hand (the
``pipeline()`` tracer fails on gloo: HF's rotary cos/sin are views, and gloo sends only contiguous tensors).

The schedule owns the micro-batch loop (``train_step``): GPipe runs every forward, then every backward, so it holds
the activations of all m micro-batches; 1F1B starts backwards as soon as it can and holds at most p. The bubble is
(p−1)/(m+p−1) of the step for both, (p−1)/(v·m+p−1) interleaved. Only the last stage computes a loss.
Every chunk a stage runs is timed (``timeline``): forward, backward (input) and backward (weight) with start and end;
the loss and every send/recv wait too (``events``), so the bubble is measured, not assumed (``coursekit.pp.bubble``).
"""
from __future__ import annotations

import copy
import time

import torch
from torch import nn

from coursekit.parallel.validate import router_aux_coef
from coursekit.pp import SCHEDULES, SPLIT_BACKWARD, PipelineOptions, stages_of
from coursekit.spec import registry
from coursekit.spec.families import LLAMA, plan_for


_WAITS: list = []  # send/recv waits of this process's current step (see Pipeline._time_loss_and_waits)


class _Skip(nn.Module):
    """Placeholder for a block that lives on another stage."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


class StageModule(nn.Module):
    """One stage of a causal LM: (embedding) → its blocks → (norm → head)."""

    def __init__(self, lm: nn.Module, first: bool, last: bool, family=None):
        super().__init__()
        self.lm, self.first, self.last = lm, first, last
        self.family = family or LLAMA

    def parts(self) -> list:
        return [self.lm]

    def forward(self, x, position_ids=None):
        # position ids reach every stage from outside: a context-parallel shard starts mid-sequence, and RoPE
        # rotates each token at its true position in every block
        inputs = {"input_ids": x} if self.first else {"inputs_embeds": x}
        f = self.family
        h = getattr(self.lm, f.body)(**inputs, position_ids=position_ids).last_hidden_state
        return (getattr(self.lm, f.head)(h) if self.last else h).contiguous()  # gloo sends contiguous tensors only


class Chunks(nn.Module):
    """The stages one rank holds (v > 1): the data-parallel wrap and the optimizer see all their parameters, and
    every chunk runs through this root's forward (so a composable data-parallel wrap sees each call)."""

    def __init__(self, chunks: list[StageModule]):
        super().__init__()
        self.chunks = nn.ModuleList(chunks)

    def parts(self) -> list:
        return [c.lm for c in self.chunks]

    def forward(self, x, chunk: int, position_ids=None):
        return self.chunks[chunk](x, position_ids=position_ids)


class _Call(nn.Module):
    """Chunk ``i`` of a (wrapped) ``Chunks`` root as a module of its own for ``PipelineStage``: its parameters are
    the chunk's, its forward goes through the root."""

    def __init__(self, root: Chunks, i: int):
        super().__init__()
        self.chunk, self.i = root.chunks[i], i
        object.__setattr__(self, "_root", root)  # not a submodule: the stage's parameters are the chunk's only

    def forward(self, x, position_ids=None):
        return self._root(x, chunk=self.i, position_ids=position_ids)


def split(num_layers: int, stages: int, stage: int) -> range:
    """Blocks of ``stage``: contiguous, the first ``num_layers % stages`` stages one block longer."""
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


def cut(model, keep: range, first: bool, last: bool, family=None) -> StageModule:
    """Stage of ``model`` holding blocks ``keep`` (the others become pass-throughs), the embedding if ``first``, the
    final norm and the head if ``last``; submodule names from the family's plan (``coursekit.spec.families``)."""
    f = family or LLAMA
    body = getattr(model, f.body)
    layers = getattr(body, f.blocks)
    for i in range(len(layers)):
        if i not in keep:
            layers[i] = _Skip()
    if not first:
        setattr(body, f.embed, None)
    if not last:
        setattr(body, f.final_norm, nn.Identity())
        setattr(model, f.head, nn.Identity())
    return StageModule(model, first, last, f)


class Pipeline:
    name = "pp"

    @classmethod
    def check(cls, opts, dims) -> None:
        from coursekit.memory.calculator import resolve_model
        shape = resolve_model(opts.train.model)
        plan_for(shape.family, "--pp", opts.train.model)
        if shape.tied_embeddings:
            raise ValueError(f"--pp with a tied embedding/head ({opts.train.model}) needs their gradients summed "
                             "across the first and last stage, which this pipeline does not do")
        if router_aux_coef(opts):
            raise ValueError(f"--pp {dims.pp} on a mixture-of-experts model: the load-balancing loss needs every "
                             "layer's router logits at the loss, which sits on the last stage; pass "
                             "--router-aux-loss-coef 0")
        kind = opts.of(PipelineOptions).pp_schedule
        _, v, _ = SCHEDULES[kind]
        if kind in SPLIT_BACKWARD and registry.get(opts.parallel.strategy).wraps_stages(dims):
            raise ValueError(f"--pp-schedule {kind} splits each backward into input and weight gradients, and its "
                             "weight step does not find the parameters behind a data-parallel wrap: torch 2.13's "
                             "stage_backward_weight (pipelining/_backward.py) keys each weight by the AccumulateGrad "
                             "node of stage.submod.parameters(), but under composable replicate / fully_shard the "
                             "forward ran on the unsharded parameters FSDP's machinery swaps in, whose AccumulateGrad "
                             "nodes are other ones (KeyError). It runs with bare stages: --strategy ddp with one "
                             "data-parallel replica and no TP or CP (dp = 1, the stages are then not wrapped)")
        if v > 1 and dims.size("loss") > 1:
            raise ValueError(f"--pp-schedule {kind} keeps {v} stages per rank; combining it with data or context "
                             "parallelism is not supported here (use gpipe or 1f1b)")
        if shape.layers < dims.pp * v:
            raise ValueError(f"{shape.layers} layers cannot fill pp {dims.pp} x {v} stages per rank ({kind})")
        if kind != "gpipe" and opts.train.grad_accum < dims.pp:
            raise ValueError(f"--pp-schedule {kind} needs at least pp = {dims.pp} micro-batches (--grad-accum "
                             f"{opts.train.grad_accum}); GPipe runs with fewer")
        if kind == "dualpipev" and opts.train.grad_accum < 2 * dims.pp:
            raise ValueError(f"--pp-schedule dualpipev needs at least 2 x pp = {2 * dims.pp} micro-batches "
                             f"(--grad-accum {opts.train.grad_accum})")

    def __init__(self, ctx):
        self.ctx = ctx
        self.kind = ctx.opts.of(PipelineOptions).pp_schedule
        self.rank = ctx.dims.coord(ctx.info.rank, "pp")
        self.pp = ctx.dims.pp
        self.stage_ids = stages_of(self.rank, self.pp, self.kind)
        self.num_stages = self.pp * len(self.stage_ids)
        self.stage_index = self.stage_ids[0]
        self.schedule, self.timeline, self.events = None, [], []

    def apply(self, model, strategy):
        from coursekit.memory.calculator import resolve_model
        model_name = self.ctx.opts.train.model
        f = plan_for(resolve_model(model_name).family, "--pp", model_name)
        n, L = self.num_stages, len(getattr(getattr(model, f.body), f.blocks))
        copies = [model] + [copy.deepcopy(model) for _ in self.stage_ids[1:]]
        mods = [cut(m, split(L, n, s), s == 0, s == n - 1, f) for m, s in zip(copies, self.stage_ids)]
        strategy.pipeline = self
        return mods[0] if len(mods) == 1 else Chunks(mods)

    def attach(self, module: nn.Module) -> None:
        """Build the stages and the schedule around the (data-parallel wrapped) stage module(s)."""
        import torch.distributed.pipelining as pipelining
        from torch.distributed.pipelining import PipelineStage

        from coursekit.parallel.loss import cross_entropy

        group = self.ctx.mesh["pp"].get_group()
        mods = [_Call(module, i) for i in range(len(module.chunks))] if isinstance(module, Chunks) else [module]
        self.stages = [PipelineStage(m, s, self.num_stages, self.ctx.device, group=group)
                       for m, s in zip(mods, self.stage_ids)]
        for st in self.stages:
            self._time(st)
        cls = getattr(pipelining.schedules, SCHEDULES[self.kind][0])
        self.n_micro = self.ctx.opts.train.grad_accum
        arg = self.stages[0] if len(self.stages) == 1 else self.stages
        # scale_grads: gradients are divided by the number of micro-batches, as the plain loop's loss / n does
        self.schedule = cls(arg, n_microbatches=self.n_micro, loss_fn=cross_entropy, scale_grads=True)
        self._time_loss_and_waits()

    def _time_loss_and_waits(self) -> None:
        """Also record the last stage's loss (kind L: compute the schedule runs outside the stage's chunks) and
        every wait on a send/recv (kind P, stage -1): what a stage does between chunks is then split into waiting
        for a neighbour and the schedule's own overhead (``coursekit.pp.bubble.breakdown``)."""
        from torch.distributed.pipelining import schedules

        loss = self.schedule._maybe_compute_loss

        def timed_loss(stage, output, target_mbs, mb, *a, **k):
            t0, c0 = time.perf_counter(), time.thread_time()
            loss(stage, output, target_mbs, mb, *a, **k)
            if stage.is_last:
                self.events.append((stage.stage_index, "L", mb, t0, time.perf_counter(), time.thread_time() - c0))
        self.schedule._maybe_compute_loss = timed_loss
        wait = getattr(schedules._wait_batch_p2p, "untimed", schedules._wait_batch_p2p)

        def timed_wait(work):  # module-level in torch: one pipeline per process, the latest one records
            t0 = time.perf_counter()
            try:
                return wait(work)
            finally:
                _WAITS.append((-1, "P", -1, t0, time.perf_counter()))
        timed_wait.untimed = wait
        schedules._wait_batch_p2p = timed_wait

    def _time(self, stage) -> None:
        """Record (stage, kind, micro-batch, start, end, cpu) for every chunk this stage runs: start and end on
        perf_counter (one clock for all processes of a machine), cpu = this thread's CPU seconds in the chunk (on CPU
        autograd runs the backward in the calling thread), which other jobs on a shared machine do not stretch."""
        for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk"), ("W", "backward_weight_one_chunk")):
            fn = getattr(stage, name)

            def timed(mb, *a, _fn=fn, _kind=kind, **k):
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return _fn(mb, *a, **k)
                finally:
                    self.timeline.append((stage.stage_index, _kind, mb, t0, time.perf_counter(),
                                          time.thread_time() - c0))
            setattr(stage, name, timed)

    def train_step(self, strategy, micro_batches: list) -> torch.Tensor | None:
        import torch.distributed as dist

        x = torch.cat([b.input_ids for b in micro_batches])
        y = torch.cat([b.labels for b in micro_batches])
        pos = torch.cat([b.position_ids for b in micro_batches])  # kwargs reach every stage, split like x
        first, last = 0 in self.stage_ids, self.num_stages - 1 in self.stage_ids
        losses: list = []
        self.timeline, self.events = [], []
        _WAITS.clear()
        with strategy.autocast():
            self.schedule.step(*([x] if first else []), position_ids=pos,
                               **({"target": y, "losses": losses} if last else {}))
        self.events += _WAITS
        loss = torch.stack([l.detach().float() for l in losses]).mean() if losses else None
        if SCHEDULES[self.kind][2] == "v" and self.pp > 1:  # the last stage sits on pp rank 0: hand its loss on
            t = loss if loss is not None else torch.zeros((), device=self.ctx.device)
            dist.broadcast(t, group_src=0, group=self.ctx.mesh["pp"].get_group())
            loss = t
        return loss
