"""What a strategy provides to the trainer, and the one step every strategy and layout runs.

The trainer builds a ``Context`` (who this rank is, the layout, the mesh, the options), picks the strategy class
(``--strategy``: the data-parallel flavour), lets ``compose.parallelize`` apply the model transforms in their fixed
order (PP split, TP, CP, activation checkpointing, compile) and then calls only:

    strategy.setup(model)                      # strategy.wrap(model) on its sub-mesh, then the optimizer
    loss = strategy.train_step(micro_batches)  # forward, loss, backward per micro-batch, then the optimizer step
    strategy.state_bytes(), .param_sq_sum(), .state_dict(), .load_state_dict(sd), .close()

``train_step``'s default is the plain loop (gradient accumulation: DDP skips the all-reduce on all but the last
micro-batch); a pipeline schedule replaces the loop (``coursekit.pp``: only the last stage holds a loss), an engine
such as DeepSpeed replaces ``backward`` and ``step``. The loss is the course's own (``coursekit.parallel.loss``),
computed from the logits, so tensor-parallel and pipeline runs need nothing from transformers' internal loss.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from coursekit.measure import state_bytes
from coursekit.parallel import split
from coursekit.parallel.loss import cross_entropy
from coursekit.parallel.rules import Rules
from coursekit.parallel.validate import router_aux_coef
from coursekit.spec.run import ADAMW  # the course's AdamW, everywhere (trainer, ZeRO, Accelerate, measure)


def adamw(params, *, lr: float, weight_decay: float = 0.0, device_type: str = "cpu", fused: bool | None = None):
    """The one optimizer factory. CPU: the per-parameter loop (foreach=False) keeps the step's temporaries small
    and identical across strategies, so held bytes compare exactly; CUDA: the fused kernel, as a fast trainer uses."""
    fused = (device_type == "cuda") if fused is None else fused
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False, fused=fused or None, **ADAMW)


@contextlib.contextmanager
def no_gradient_sync(model):
    """FSDP2-style modules (fully_shard, composable replicate): skip the gradient reduction inside the block, so
    gradients accumulate locally until the last micro-batch."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


@dataclass
class Context:
    info: object  # coursekit.dist.DistInfo
    dims: object  # coursekit.parallel.ParallelDims
    mesh: object  # torch DeviceMesh with the axes and derived groups of dims
    opts: object  # coursekit.options.Options

    @property
    def device(self) -> torch.device:
        return torch.device(self.info.device)

    @classmethod
    def for_run(cls, info, opts) -> "Context":
        """Validate ``opts`` for this process group (filling the batch sizes) and build the mesh."""
        from coursekit.parallel.mesh import build_mesh
        from coursekit.parallel.validate import validate

        dims = validate(opts, info.world_size)
        return cls(info=info, dims=dims, mesh=build_mesh(dims, torch.device(info.device).type), opts=opts)

    @classmethod
    def local(cls, opts, device: str = "cpu") -> "Context":
        """One process without a process group (the GPU check, notebooks): no mesh, world size 1."""
        from coursekit.dist import DistInfo
        from coursekit.parallel.validate import validate

        info = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, backend="none", device=str(device),
                        source="single")
        return cls(info=info, dims=validate(opts, 1), mesh=None, opts=opts)


class Strategy(Rules):
    """The data-parallel flavour of a run; owns the (wrapped) model and the optimizer. What it supports and its
    checks before launch: ``Rules`` (torch-free, so the CLI checks without importing torch)."""

    @classmethod
    def wraps_stages(cls, dims) -> bool:
        """Whether this strategy wraps each pipeline stage's module in its data-parallel machinery on ``dims`` (the
        zero-bubble schedules need bare stages: coursekit.pp asks)."""
        return True

    def __init__(self, ctx: Context):
        self.ctx, self.opts = ctx, ctx.opts
        self.info = ctx.info
        self.device = ctx.device
        self.autocast_dtype = torch.bfloat16 if self.opts.train.dtype == "bf16" else None
        self.last_state_bytes: dict | None = None
        self.pipeline = None  # set by coursekit.pp when the model is split into stages
        self.aux_coef = router_aux_coef(self.opts)  # MoE: the load-balancing loss's weight (None: dense)
        self.aux_losses: list[float] = []  # MoE: each micro-batch's load-balancing loss (the trainer's record)

    # -- set-up ---------------------------------------------------------------------------------------------
    def setup(self, model: torch.nn.Module) -> None:
        self.model = self.wrap(model.to(self.device))
        self.optimizer = self.make_optimizer([p for p in self.model.parameters() if p.requires_grad])
        if self.pipeline is not None:
            self.pipeline.attach(self.model)

    def wrap(self, model):
        return model

    def make_optimizer(self, params):
        t = self.opts.train
        return adamw(params, lr=t.lr, weight_decay=t.weight_decay, device_type=self.device.type)

    # -- one step ---------------------------------------------------------------------------------------------
    def sync_context(self, micro: int, n_micro: int):
        return contextlib.nullcontext()

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)

    def forward_loss(self, batch) -> torch.Tensor:
        moe = {"output_router_logits": True} if self.aux_coef else {}  # 0: no auxiliary loss computed at all
        with self.autocast():
            out = self.model(input_ids=batch.input_ids, position_ids=batch.position_ids, **moe)
        loss = cross_entropy(out.logits, batch.labels)
        if not self.aux_coef:
            return loss
        self.aux_losses.append(out.aux_loss.item())
        return loss + self.aux_coef * out.aux_loss.float()

    def backward(self, loss: torch.Tensor, micro: int, n_micro: int) -> None:
        (loss / n_micro).backward()

    def train_step(self, micro_batches: list, measure: bool = False) -> torch.Tensor | None:
        """One optimizer step over this rank's micro-batches; returns the mean micro-batch loss of this rank
        (None on a pipeline stage that holds no loss)."""
        if self.pipeline is not None:
            loss = self.pipeline.train_step(self, micro_batches)
        else:
            n, loss = len(micro_batches), torch.zeros((), device=self.device)
            for i, b in enumerate(micro_batches):
                with self.sync_context(i, n):
                    li = self.forward_loss(b)
                    self.backward(li, i, n)
                loss += li.detach().float() / n
        self.step(measure=measure)
        return loss

    def reduce_grads(self) -> None:
        """What is left of the gradient reduction after backward: TP's token-split MoE blocks (each rank's gradient
        is its tokens' part) summed over the TP ranks (``coursekit.parallel.split.sum_partial_grads``)."""
        split.sum_partial_grads(self.model)

    def step(self, measure: bool = False) -> None:
        self.reduce_grads()
        self.optimizer.step()
        if measure:
            self.last_state_bytes = self.state_bytes()
        self.optimizer.zero_grad(set_to_none=True)

    # -- what it holds --------------------------------------------------------------------------------------
    def state_bytes(self) -> dict:
        return state_bytes(self.model, self.optimizer)

    def param_sq_sum(self) -> float:
        """Σ w² over the full model in float64: DTensor shards are gathered, pipeline stages summed."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        s, hand = torch.zeros((), dtype=torch.float64), {id(p) for p, _ in split.split_params(self.model).values()}
        for p in self.model.parameters():
            if id(p) in hand:
                continue  # split by a parallelism (experts): summed over its ranks below
            t = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
            s += t.double().pow(2).sum().cpu()
        if hand:
            s += split.sq_sum(self.model)
        if self.ctx.dims.pp > 1:
            s = s.to(self.device)
            dist.all_reduce(s, group=self.ctx.mesh["pp"].get_group())
        return float(s)

    def close(self) -> None:
        """Drop the model and optimizer (called before the process group is destroyed)."""
        self.model = self.optimizer = None
        self.pipeline = None

    # -- checkpoints (DCP: works for replicated and sharded states alike) --------------------------------------
    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        split.slice_keys(self.model, model_sd, optim_sd)  # a hand-split slice (experts) gets its own key
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        split.unslice_keys(sd["model"], sd["optim"])
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
