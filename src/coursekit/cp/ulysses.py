"""DeepSpeed-Ulysses: trade the sequence split for a head split around attention, with two all-to-alls.

Outside attention every CP rank holds s/C tokens of all heads. Attention needs all tokens, but each head is
independent — so before attention one all-to-all turns "my tokens, every head" into "every token, my heads":

    before: rank r holds q[:, all a heads, tokens of chunk r]        (b, a, s/C, d)
    after:  rank r holds q[:, heads r·a/C .. (r+1)·a/C, all tokens]  (b, a/C, s, d)

Each rank then runs ordinary (causal, flash) attention over the full sequence for its a/C heads, and a second
all-to-all brings the output back to the token split. Per layer forward: 4 all-to-alls (q, k, v, out); each rank
sends (C-1)/C of its b·(s/C)·h elements per tensor, so per-rank traffic *falls* as 1/C — constant when s and C grow
together, the paper's argument (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training
of Extreme Long Sequence Transformer Models", arXiv:2309.14509, §3). Ring attention's per-rank K/V traffic,
(C-1)·2·b·(s/C)·h_kv, stays near 2·b·s·h_kv instead (``coursekit.comm.volume``). The limit: C must divide the
number of query heads, and every rank talks to every other (all-to-all wants a full-bandwidth network, e.g. NVLink).

Chunks are gathered in rank order, so the inputs use the contiguous layout (shard.py): rank r holds tokens
[r·s/C, (r+1)·s/C), the gathered sequence is the original one and a plain causal mask is right; the work is the
same on every rank (a/C heads of full causal attention each), so no zig-zag is needed.

GQA (kvh < a key/value heads): with kvh ≥ C, K/V split by head like q (query head j still meets K/V head j // g).
With kvh < C there are not enough K/V heads to go round: each is replicated C/kvh times before the all-to-all
(``repeat_interleave``, as DeepSpeed's ``UlyssesSPAttentionHF`` does), so rank r receives K/V head r·kvh/C — the one
its a/C query heads use. Autograd sums the replicas' gradients back. K/V all-to-alls then move b·(s/C)·C·d elements
instead of b·(s/C)·kvh·d.

Autograd: an all-to-all is a permutation of data across ranks, so its backward is the inverse all-to-all of the
gradient (scatter and gather dimensions swapped) — ``_AllToAll`` below, as DeepSpeed's ``_SeqAllToAll``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Cut ``x`` into C pieces along ``scatter_dim``, send piece i to rank i, and join what arrives (in rank order)
    along ``gather_dim``. Not differentiable by itself; ``_AllToAll`` is."""
    n = dist.get_world_size(group)
    if n == 1:
        return x
    send = torch.stack(x.chunk(n, dim=scatter_dim)).contiguous()  # (C, ...): row i goes to rank i
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[j] = rank j's piece for me
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.args = (group, gather_dim, scatter_dim)  # the backward swaps the two dimensions
        return all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        return all_to_all(grad.contiguous(), *ctx.args), None, None, None


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(b, heads, s/C, d) sequence-sharded -> (b, heads/C, s, d) head-sharded (differentiable)."""
    return _AllToAll.apply(x, group, 1, 2)


def heads_to_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """(b, heads/C, s, d) head-sharded -> (b, heads, s/C, d) sequence-sharded (differentiable)."""
    return _AllToAll.apply(x, group, 2, 1)


def kv_replication(kv_heads: int, cp: int) -> int:
    """How many copies of each K/V head the all-to-all needs: 1 when kv_heads ≥ cp, else cp / kv_heads."""
    if kv_heads % cp and cp % kv_heads:
        raise ValueError(f"key/value heads ({kv_heads}) and the Ulysses degree ({cp}) must divide one another")
    return max(1, cp // kv_heads)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None, causal: bool = True,
                      scale: float | None = None, attention=None) -> torch.Tensor:
    """Exact (causal) attention over the CP ``group``'s whole sequence, Ulysses-style.

    q: (b, heads, s/C, d), k, v: (b, kv_heads, s/C, d) — this rank's contiguous chunk (``shard(...,
    layout="contiguous")``). Returns (b, heads, s/C, d), like SDPA on the full sequence. ``attention(q, k, v)``
    replaces the local kernel (default: ``F.scaled_dot_product_attention`` with ``is_causal``, ``scale`` and
    ``enable_gqa``): any exact attention works, since it sees whole sequences.
    """
    cp = dist.get_world_size(group)
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % cp:
        raise ValueError(f"Ulysses splits heads: query heads ({heads}) must be divisible by the CP degree ({cp})")
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    rep = kv_replication(kv_heads, cp)
    if rep > 1:  # not enough K/V heads to go round: copy each so rank r receives the one its queries use
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    qh, kh, vh = seq_to_heads(q, group), seq_to_heads(k, group), seq_to_heads(v, group)
    if attention is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=scale,
                                             enable_gqa=qh.shape[1] != kh.shape[1])
    else:
        out = attention(qh, kh, vh)
    return heads_to_seq(out, group)  # (b, heads, s/C, d)
