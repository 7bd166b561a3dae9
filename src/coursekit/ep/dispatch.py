"""Token dispatch and combine over all-to-all: the heart of expert parallelism, by hand.

A mixture-of-experts layer routes each token to ``k`` of ``E`` experts (the router's top-k). With ``n`` EP ranks each
rank holds ``E / n`` consecutive experts (rank r: experts ``r·E/n ...``), and a token's choices must travel to the
ranks that hold them. One layer's forward on one rank:

    1. sort this rank's (token, choice) pairs by expert       -> rows for rank 0's experts first, then rank 1's ...
    2. all-to-all the counts per expert                       -> how many rows each rank will send me, per expert
    3. all-to-all the rows (uneven splits: send[r], recv[r])  -> every row at its expert's rank      (dispatch)
    4. regroup the received rows by local expert, run each expert's SwiGLU on its rows
    5. all-to-all the results back (the splits reversed)      -> every row home again                (combine)
    6. weight each row by its router probability and add it into its token's output

Autograd runs the same path backwards: the gradient of step 5 is an all-to-all with the splits of step 3 and the
other way round (``all_to_all_single_autograd``), so each expert's weights receive the gradient of every token any
rank sent it. Per rank and layer the dispatch sends ``Σ_r≠me send[r]`` rows of ``hidden`` values and the combine
the same number back (``coursekit.comm.volume.moe_all_to_all``).

Dropless by default: an expert computes every row it receives, however uneven. With a capacity factor ``c`` an
expert takes at most ``ceil(c · T·k / E)`` of one rank's ``T·k`` choices (the first ones, in token order); the
rest are dropped (their token keeps only its residual path) and counted.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor, all_to_all_single_autograd


class ExpertShard(nn.Module):
    """Experts ``first ... first + local - 1`` of one MoE layer on one EP rank, called as transformers' fused experts
    module is: ``(hidden (T, h), top_k_index (T, k), top_k_weights (T, k)) -> (T, h)``."""

    def __init__(self, experts: nn.Module, *, group, rank: int, size: int, capacity_factor: float | None = None):
        super().__init__()
        E = experts.gate_up_proj.shape[0]
        if E % size:
            raise ValueError(f"{E} experts do not split over {size} EP ranks")
        self.num_experts, self.local, self.first = E, E // size, rank * (E // size)
        keep = slice(self.first, self.first + self.local)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[keep].clone())  # (local, 2f, h)
        self.down_proj = nn.Parameter(experts.down_proj.detach()[keep].clone())  # (local, h, f)
        self.act_fn = experts.act_fn
        self.group, self.size, self.capacity_factor = group, size, capacity_factor
        self.grad_scale = 1.0  # the trainer's EP sets 1/ep: see coursekit.parallel.split
        self.dropped: list[int] = []  # per forward: choices dropped by the capacity

    def expert(self, e: int, rows: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        gate, up = nn.functional.linear(rows, gate_up[e].to(rows.dtype)).chunk(2, dim=-1)
        return nn.functional.linear(self.act_fn(gate) * up, down[e].to(rows.dtype))

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        T, k = top_k_index.shape
        E, L, n = self.num_experts, self.local, self.size
        expert = top_k_index.reshape(-1)  # (T·k,): the expert of every (token, choice)
        order = torch.argsort(expert, stable=True)  # 1. grouped by expert, in token order inside each
        counts = torch.bincount(expert, minlength=E)  # (the trainer records them at the router: measure.experts)
        if self.capacity_factor is not None:
            order, counts = self._cap(order, expert, counts, T * k)
        token = order // k
        recv_counts = torch.empty_like(counts)  # 2. [src rank, my local expert] row counts
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        send = counts.view(n, L).sum(1).tolist()
        recv = recv_counts.view(n, L).sum(1).tolist()
        rows = _wait(all_to_all_single_autograd(x[token], recv, send, self.group))  # 3. dispatch
        local = torch.arange(L, device=x.device).repeat(n).repeat_interleave(recv_counts)  # each row's expert
        by_expert = torch.argsort(local, stable=True)  # 4. regroup: expert 0's rows from every source first
        per_expert = recv_counts.view(n, L).sum(0).tolist()
        gate_up, down = (_GradScale.apply(w, self.grad_scale) if self.grad_scale != 1 else w
                         for w in (self.gate_up_proj, self.down_proj))
        y = torch.cat([self.expert(e, chunk, gate_up, down)
                       for e, chunk in enumerate(rows[by_expert].split(per_expert))])
        y = y[torch.argsort(by_expert)]  # back to the order the rows arrived in
        back = _wait(all_to_all_single_autograd(y, send, recv, self.group))  # 5. combine
        weight = top_k_weights.reshape(-1)[order].unsqueeze(-1)  # 6. weight and add into each token
        return torch.zeros_like(x).index_add(0, token, (back * weight).to(x.dtype))

    def _cap(self, order, expert, counts, choices: int):
        """Keep the first ``capacity`` choices of each expert (in token order), drop the rest."""
        capacity = math.ceil(self.capacity_factor * choices / self.num_experts)
        start = torch.cumsum(counts, 0) - counts  # where each expert's run starts in ``order``
        position = torch.arange(choices, device=order.device) - start[expert[order]]
        kept = position < capacity
        self.dropped.append(int((~kept).sum()))
        return order[kept], counts.clamp(max=capacity)

    def extra_repr(self) -> str:
        return (f"experts {self.first}..{self.first + self.local - 1} of {self.num_experts}, ep {self.size}"
                + (f", capacity factor {self.capacity_factor}" if self.capacity_factor else ", dropless"))


class _GradScale(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` (the trainer's 1/ep, see ``coursekit.parallel.split``)."""

    @staticmethod
    def forward(ctx, w, scale):
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def _wait(t: torch.Tensor) -> torch.Tensor:
    """The all-to-all's result, waited for here (not whenever its first use happens to unwrap it)."""
    return t.wait() if isinstance(t, AsyncCollectiveTensor) else t
