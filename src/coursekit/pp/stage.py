"""Pipeline parallelism with ``torch.distributed.pipelining``: split the model into stages, run a schedule.

Each rank of the ``pp`` sub-mesh keeps one contiguous run of transformer blocks (uneven splits allowed: the first
``L % pp`` stages get one more); the first stage also keeps the embedding, the last the final norm and the head.
Blocks of other stages are replaced by a pass-through placeholder, so parameter names keep their global index
(``model.layers.3...``) and checkpoints of different stages never collide. Stages are made by hand (the
``pipeline()`` tracer fails on gloo: HF's rotary cos/sin are views, and gloo sends only contiguous tensors).

The schedule owns the micro-batch loop (``train_step``): GPipe runs every forward, then every backward, so it holds
the activations of all m micro-batches; 1F1B starts backwards as soon as it can and holds at most p. The bubble is
(p−1)/(m+p−1) of the step either way. Only the last stage computes a loss.
"""
from __future__ import annotations

import torch
from torch import nn

from coursekit.pp import PipelineOptions


class _Skip(nn.Module):
    """Placeholder for a block that lives on another stage."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


class StageModule(nn.Module):
    """One stage of a causal LM: (embedding) → its blocks → (norm → head)."""

    def __init__(self, lm: nn.Module, first: bool, last: bool):
        super().__init__()
        self.lm, self.first, self.last = lm, first, last

    def forward(self, x, position_ids=None):
        # position ids come to every stage from outside (a context-parallel shard starts mid-sequence, and RoPE
        # rotates each token at its true position in every block)
        inputs = {"input_ids": x} if self.first else {"inputs_embeds": x}
        h = self.lm.model(**inputs, position_ids=position_ids).last_hidden_state
        return (self.lm.lm_head(h) if self.last else h).contiguous()  # gloo sends contiguous tensors only


def split(num_layers: int, stages: int, stage: int) -> range:
    """Blocks of ``stage``: contiguous, the first ``num_layers % stages`` stages one block longer."""
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


class Pipeline:
    name = "pp"

    @classmethod
    def check(cls, opts, dims) -> None:
        from coursekit.memory.calculator import resolve_model

        if resolve_model(opts.train.model).tied_embeddings:
            raise ValueError(f"--pp with a tied embedding/head ({opts.train.model}) needs their gradients summed "
                             "across the first and last stage, which this pipeline does not do")

    def __init__(self, ctx):
        self.ctx = ctx
        self.stage_index = ctx.dims.coord(ctx.info.rank, "pp")
        self.num_stages = ctx.dims.pp
        self.schedule = None

    def apply(self, model, strategy):
        s, n = self.stage_index, self.num_stages
        first, last = s == 0, s == n - 1
        keep = split(len(model.model.layers), n, s)
        for i in range(len(model.model.layers)):
            if i not in keep:
                model.model.layers[i] = _Skip()
        if not first:
            model.model.embed_tokens = None
        if not last:
            model.model.norm, model.lm_head = nn.Identity(), nn.Identity()
        strategy.pipeline = self
        return StageModule(model, first, last)

    def attach(self, module: nn.Module) -> None:
        """Build the stage and schedule around the (data-parallel wrapped) stage module."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        from coursekit.train.loss import cross_entropy

        self.stage = PipelineStage(module, self.stage_index, self.num_stages, self.ctx.device,
                                   group=self.ctx.mesh["pp"].get_group())
        kind = self.ctx.opts.of(PipelineOptions).pp_schedule
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind]
        self.n_micro = self.ctx.opts.train.grad_accum
        # scale_grads: gradients are divided by the number of micro-batches, as the plain loop's loss / n does
        self.schedule = cls(self.stage, n_microbatches=self.n_micro, loss_fn=cross_entropy, scale_grads=True)

    def train_step(self, strategy, micro_batches: list) -> torch.Tensor | None:
        x = torch.cat([b.input_ids for b in micro_batches])
        y = torch.cat([b.labels for b in micro_batches])
        pos = torch.cat([b.position_ids for b in micro_batches])  # kwargs reach every stage, split like x
        losses: list = []
        with strategy.autocast():
            if self.stage_index == 0:
                self.schedule.step(x, target=y if self.num_stages == 1 else None, position_ids=pos)
            elif self.stage_index == self.num_stages - 1:
                self.schedule.step(target=y, losses=losses, position_ids=pos)
            else:
                self.schedule.step(position_ids=pos)
        if not losses:
            return None
        return torch.stack([l.detach().float() for l in losses]).mean()
