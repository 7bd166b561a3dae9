"""How many tokens each expert of a mixture-of-experts model received: the load imbalance, step by step.

    load = ExpertLoad(model_parts(model), family_plan, experts)   # forward hooks on every block's router
    ... one step ...
    load.take()  ->  [[tokens of expert 0, 1, ...] per layer]   (this rank's (token, choice) pairs, then reset)

The router (transformers' ``TopKRouter``) returns ``(logits, weights, top-k ids)``; the hook counts the ids, so the
numbers are the router's decisions before any capacity drop, the same with and without expert parallelism.
A backward that recomputes the forward (activation checkpointing) is not counted twice.
"""
from __future__ import annotations

import torch

from coursekit.models import blocks


class ExpertLoad:
    def __init__(self, lms: list, plan, experts: int):
        self.experts, self.layers = experts, []
        for lm in lms:  # the causal LMs this rank holds (its pipeline stages)
            for block in blocks(lm):
                try:
                    router = block.get_submodule(plan.router)
                except AttributeError:
                    continue  # a pipeline stage's placeholder
                counts = torch.zeros(experts, dtype=torch.long)
                router.register_forward_hook(self._hook(counts))
                self.layers.append(counts)

    def _hook(self, counts):
        def hook(module, args, out):
            if torch._C._current_graph_task_id() != -1:  # inside backward: a checkpoint's recompute
                return
            counts.add_(torch.bincount(out[-1].detach().reshape(-1).cpu(), minlength=self.experts))
        return hook

    def take(self) -> list[list[int]]:
        out = [c.tolist() for c in self.layers]
        for c in self.layers:
            c.zero_()
        return out


def imbalance(per_layer: list[list[int]]) -> float:
    """The worst layer's busiest expert over the mean expert load (1.0: perfectly balanced)."""
    worst = 0.0
    for counts in per_layer:
        mean = sum(counts) / len(counts)
        if mean:
            worst = max(worst, max(counts) / mean)
    return worst
