"""Ring Attention: exact attention over a sequence cut into C pieces, K/V blocks passed around a ring of ranks.

Each of the C ranks of the CP group holds s/C query rows and the keys/values of the same rows. Its queries need
*every* rank's K/V, so the K/V blocks travel: at step i rank r holds the block that started on rank r-i, computes its
queries against it while the next block is already in flight (``batch_isend_irecv`` is asynchronous, so the
transfer can hide behind the compute), and folds the partial result into a running output. After C steps each block
has visited every rank: C-1 exchanges of one K/V block per rank. What a rank keeps for backward is O(s/C): its own
rows, never another rank's block; while it runs it also holds the visiting block, the one in flight and one step's
score tile, (s/C)² per head (a flash kernel would tile that too). (Liu, Zaharia & Abbeel 2023, "Ring Attention with
Blockwise Transformers for Near-Infinite Context", arXiv:2310.01889.)

Online softmax (Milakov & Gimelshein 2018; Dao et al. 2022, FlashAttention): per query row keep the output o and the
log-sum-exp l of the scores seen so far. A block's own (o_b, l_b) merges exactly, in any order:
    l' = log(e^l + e^l_b),      o' = o·e^(l - l') + o_b·e^(l_b - l')

Causal balance (layouts in shard.py). Zig-zag: rank r holds chunks r and 2C-1-r of 2C. Against the block from src:
    src == r   my two chunks vs my two, causal: the local triangle *is* the global one (chunk r < chunk 2C-1-r)
    src <  r   both my chunks vs src's first chunk, no mask: src's second chunk comes after both of mine
    src >  r   my second chunk vs both of src's, no mask: my first chunk comes before both of src's
so every rank computes (2c)² + (C-1)·2c² scores (c = s/2C): equal work. Contiguous chunks give rank r r+1 blocks
(rank 0 idles while rank C-1 works), kept here so a learner can measure the difference (``stats``).

Backward: a custom autograd.Function, not autograd through the loop — autograd would keep every step's score matrix,
O(s²/C) per rank. We save q, k, v, the output and l (O(s/C)) and, in a second ring pass, recompute each tile's
probabilities P = exp(S - l) (FlashAttention's backward, Dao et al. 2022):
    dV += Pᵀ·dO     dP = dO·Vᵀ     dS = P∘(dP - D), D = rowsum(dO∘O)     dQ += dS·K·scale     dK += dSᵀ·Q·scale
dQ stays home. The K/V blocks travel as in forward, and each block's dK/dV accumulator follows one hop behind and
arrives home after the last step: C-1 K/V exchanges and C-1 dK/dV exchanges.

GQA: q has a heads, k/v have kvh = a/g; query head j uses K/V head j // g (HF's ``repeat_kv`` order). We view q as
(b, kvh, g, s, d) and k, v as (b, kvh, 1, s, d): matmul broadcasts, so K/V are never copied g times and the ring
moves only kvh heads. Tiles are plain matmuls in fp32 (any device, any dtype); on a GPU a flash kernel returning
(o, l) per tile would replace ``_tile_forward`` / ``_tile_backward`` — the ring around them stays the same.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from coursekit.cp.shard import LAYOUTS


def _tiles(rank: int, src: int, c: int, causal: bool, layout: str) -> list[tuple[slice, slice, bool]]:
    """(query rows, key rows, causal mask?) that rank ``rank`` computes against the block from ``src``."""
    every = slice(None)
    if not causal:
        return [(every, every, False)]
    if src == rank:
        return [(every, every, True)]
    if layout == "contiguous":  # earlier chunks fully visible, later ones fully masked (skipped)
        return [(every, every, False)] if src < rank else []
    if src < rank:
        return [(every, slice(0, c), False)]
    return [(slice(c, None), every, False)]


def _scores(q, k, scale: float, causal: bool) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # (b, kvh, g, sq, sk)
    if causal:  # a diagonal tile: local query i sees local keys 0..i
        above = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(above, float("-inf"))
    return s


def _tile_forward(q, k, v, scale: float, causal: bool):
    s = _scores(q, k, scale, causal)
    lse = torch.logsumexp(s, dim=-1)  # (b, kvh, g, sq)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def _merge(out, lse, o, o_lse) -> None:
    """Online-softmax merge of a tile's (o, o_lse) into the running (out, lse), in place (views of the accumulators)."""
    new = torch.logaddexp(lse, o_lse)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(o * torch.exp(o_lse - new).unsqueeze(-1))
    lse.copy_(new)


def _tile_backward(q, k, v, do, lse, D, scale: float, causal: bool):
    p = torch.exp(_scores(q, k, scale, causal) - lse.unsqueeze(-1))  # the tile's final softmax probabilities
    dv = torch.matmul(p.transpose(-1, -2), do).sum(2, keepdim=True)  # sum over the g query heads of a K/V head
    ds = p * (torch.matmul(do, v.transpose(-1, -2)) - D.unsqueeze(-1))
    dq = torch.matmul(ds, k) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q).sum(2, keepdim=True) * scale
    return dq, dk, dv


def _pass_on(t: torch.Tensor, group, tag: int):
    """Start sending ``t`` to the next rank and receiving the previous rank's tensor; returns (buffer, requests).
    Distinct tags keep the K/V stream and the dK/dV stream apart (on 2 ranks next and previous are the same peer)."""
    r, n = dist.get_rank(group), dist.get_world_size(group)
    buf = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(r + 1) % n, tag=tag),
           dist.P2POp(dist.irecv, buf, group=group, group_peer=(r - 1) % n, tag=tag)]
    return buf, dist.batch_isend_irecv(ops)


def _wait(pending) -> torch.Tensor:
    buf, reqs = pending
    for req in reqs:  # the send too: its tensor must not be freed or changed before it has left
        req.wait()
    return buf


def _count(stats, key: str, q_rows: torch.Tensor, k_rows: torch.Tensor) -> None:
    if stats is not None:
        stats[key] = stats.get(key, 0) + q_rows.shape[-2] * k_rows.shape[-2]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, layout, stats):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        b, a, s, d = q.shape
        kvh = k.shape[1]
        qg = q.unflatten(1, (kvh, a // kvh)).float()  # (b, kvh, g, s, d)
        kv = torch.stack([k, v]).unsqueeze(3)  # (2, b, kvh, 1, s, d): K and V travel as one message
        # the output is stored (b, s, a, d) and seen as (b, a, s, d): the caller's transpose(1, 2) + reshape to
        # (b, s, h) for o_proj is then a view, so o_proj saves this very storage (one copy, as with SDPA)
        out = torch.zeros(b, s, a, d, dtype=torch.float32, device=q.device).transpose(1, 2)
        outg = out.unflatten(1, (kvh, a // kvh))
        lse = torch.full(qg.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        for step in range(cp):
            src = (rank - step) % cp
            pending = _pass_on(kv, group, tag=0) if step + 1 < cp else None  # next block in flight meanwhile
            for qs, ks, diag in _tiles(rank, src, s // 2, causal, layout):
                kb, vb = kv[0][..., ks, :].float(), kv[1][..., ks, :].float()
                o, o_lse = _tile_forward(qg[..., qs, :], kb, vb, scale, diag)
                _merge(outg[..., qs, :], lse[..., qs], o, o_lse)
                _count(stats, "fwd_scores", o, kb)
            if pending is not None:
                kv = _wait(pending)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (group, causal, scale, layout, stats)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, scale, layout, stats = ctx.args
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        b, a, s, d = q.shape
        kvh = k.shape[1]
        grouped = lambda t: t.unflatten(1, (kvh, a // kvh)).float()  # noqa: E731  (b, a, ...) -> (b, kvh, g, ...)
        qg, dog = grouped(q), grouped(dout)
        D = (dog * grouped(out)).sum(-1)  # rowsum(dO∘O): the softmax backward's correction, (b, kvh, g, s)
        dq = torch.zeros_like(qg)
        kv = torch.stack([k, v]).unsqueeze(3)
        home = None  # dK/dV of my own block from my own queries (step 0); the others' share comes back at the end
        acc = None  # the accumulator of the block I hold next, on its way from the previous rank
        for step in range(cp):
            src = (rank - step) % cp
            pending = _pass_on(kv, group, tag=0) if step + 1 < cp else None
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)  # this step's share for the block
            for qs, ks, diag in _tiles(rank, src, s // 2, causal, layout):
                kb, vb = kv[0][..., ks, :].float(), kv[1][..., ks, :].float()
                dq_t, dk_t, dv_t = _tile_backward(qg[..., qs, :], kb, vb, dog[..., qs, :], lse[..., qs],
                                                  D[..., qs], scale, diag)
                dq[..., qs, :] += dq_t
                dkv[0][..., ks, :] += dk_t
                dkv[1][..., ks, :] += dv_t
                _count(stats, "bwd_scores", dq_t, kb)
            if step == 0:
                home = dkv
            else:
                if acc is not None:  # received while we computed: what the ranks before us added to this block
                    dkv += _wait(acc)
                acc = _pass_on(dkv, group, tag=1)  # on to the next rank, one hop behind its K/V block
            if pending is not None:
                kv = _wait(pending)
        if acc is not None:
            home += _wait(acc)  # my block, back from its trip around the ring with every other rank's share
        dk, dv = home[0].squeeze(2).to(k.dtype), home[1].squeeze(2).to(v.dtype)
        return dq.flatten(1, 2).to(q.dtype), dk, dv, None, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None, causal: bool = True,
                   scale: float | None = None, layout: str = "zigzag", stats: dict | None = None) -> torch.Tensor:
    """Exact (causal) attention of this rank's queries over the whole sequence of the CP ``group``.

    q: (b, heads, s/C, d); k, v: (b, kv_heads, s/C, d), heads % kv_heads == 0 — this rank's rows, cut by
    ``shard.shard(..., layout=layout)``. Returns (b, heads, s/C, d) for the same rows, like
    ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)`` on the full sequence.
    ``stats`` (a dict) accumulates the score elements computed per rank ("fwd_scores", "bwd_scores").
    """
    if q.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"need q (b, heads, s, d) and k, v (b, kv_heads, s, d); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if causal and layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"zig-zag rows come in two equal chunks; this rank holds {q.shape[2]} rows")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _RingAttention.apply(q, k, v, group, causal, scale, layout, stats)
