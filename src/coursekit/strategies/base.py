"""What the trainer asks of a strategy. Subclasses override ``wrap`` (and, for engines, the step methods)."""
from __future__ import annotations

import contextlib

import torch

from coursekit.measure import state_bytes


class Strategy:
    """Owns the (wrapped) model and the optimizer; the trainer calls only the methods below.

    ``forward_backward(input_ids, labels, micro, n_micro)`` runs one micro-batch and returns its unscaled loss;
    ``step()`` applies the optimizer and clears gradients; ``state_bytes()`` reports what this rank holds.
    """

    name = "base"
    needs_process_group = True

    def __init__(self, args, info):
        self.args, self.info = args, info
        self.device = torch.device(info.device)
        self.autocast_dtype = torch.bfloat16 if args.dtype == "bf16" else None
        self.last_state_bytes: dict | None = None

    # -- set-up ---------------------------------------------------------------------------------------------
    def setup(self, model: torch.nn.Module) -> None:
        model = model.to(self.device)
        self.model = self.wrap(model)
        if getattr(self.args, "compile", False):
            model.compile()  # in place, so wrappers (DDP, FSDP) keep their hooks on the same module
        self.optimizer = self.make_optimizer(self.model.parameters())

    def wrap(self, model):
        return model

    def make_optimizer(self, params):
        a = self.args
        # foreach=False: the per-parameter loop keeps the step's temporaries small and identical across strategies
        # CPU: foreach=False, the per-parameter loop keeps the step's temporaries small and identical across
        # strategies. CUDA: the fused kernel (one launch for all parameters) as a fast trainer would use.
        fused = self.device.type == "cuda"
        return torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay,
                                 foreach=False, fused=fused or None)

    # -- one step ---------------------------------------------------------------------------------------------
    def sync_context(self, micro: int, n_micro: int):
        return contextlib.nullcontext()

    def forward_backward(self, input_ids, labels, micro: int, n_micro: int) -> torch.Tensor:
        with self.sync_context(micro, n_micro):
            with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                                enabled=self.autocast_dtype is not None):
                loss = self.model(input_ids=input_ids, labels=labels).loss
            (loss / n_micro).backward()
        return loss.detach()

    def step(self, measure: bool = False) -> None:
        self.optimizer.step()
        if measure:
            self.last_state_bytes = self.state_bytes()
        self.optimizer.zero_grad(set_to_none=True)

    def state_bytes(self) -> dict:
        return state_bytes(self.model, self.optimizer)

    def param_sq_sum(self) -> float:
        """Σ w² over the full model in float64 (sharded strategies sum their shards), to compare runs and ranks."""
        return float(sum(p.detach().double().pow(2).sum() for p in self.model.parameters()))

    def close(self) -> None:
        """Drop the model and optimizer (called before the process group is destroyed)."""
        self.model = self.optimizer = None

    # -- checkpoints (DCP: works for replicated and sharded states alike) --------------------------------------
    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
