"""Communication volume of one training step, per strategy: the collectives each rank issues and the bytes it sends.

Pure Python (no torch): the same numbers serve slides, the benchmark and ``CollectiveCounter`` (counter.py).

Two byte counts per collective — keep them apart:

* **payload** ``S`` (what ``CollectiveCounter`` records; nccl-tests' "size"): the full logical buffer of one call.
    all_reduce, broadcast, reduce   the tensor
    all_gather, gather              the gathered *output* = group size x each rank's input
    reduce_scatter, scatter         the full *input*      = group size x each rank's output
    all_to_all                      one rank's send buffer (= its receive buffer)
    send / recv                     the message
* **wire bytes per rank**: what one rank puts on the link for that call with a bandwidth-optimal (ring) algorithm,
  ``S x busbw_factor(op, n)``. The factors are nccl-tests' bus-bandwidth corrections (nccl-tests
  doc/PERFORMANCE.md): all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all (n-1)/n, broadcast / reduce 1.
  Hence nccl-tests' busbw = wire bytes per rank / time. A send counts S, a recv 0 (it sends nothing).

A *plan* is a list of ``Collective(op, bytes, count, group_size)``: ``count`` calls of payload ``bytes`` per
optimizer step. Strategy functions return plans; ``merge`` puts one in canonical order so a counted plan
(``CollectiveCounter.as_plan()``) can be compared with ``==``.

Textbook per-rank send volume per step, Ψ parameters, b bytes per element, N ranks (large N):
    DDP        all-reduce gradients                          2(N-1)/N · Ψ·b   ≈ 2Ψb
    ZeRO-1/2   reduce-scatter grads + all-gather params      2(N-1)/N · Ψ·b   ≈ 2Ψb  (same as DDP: ZeRO is free)
    ZeRO-3     all-gather fwd + all-gather bwd + reduce-scatter  3(N-1)/N · Ψ·b   ≈ 3Ψb  (1.5x DDP)
    TP         4 all-reduces of activations per layer (2 fwd, 2 bwd), independent of Ψ
Context parallelism, C ranks, per layer forward (backward mirrors it): Ulysses 4 all-to-alls of b·s·h/C elements
(q, k, v, out; GQA K/V at max(kv_heads, C) heads); Ring C-1 exchanges of a K/V block (2·b·(s/C)·h_kv elements).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from coursekit.spec.run import SP_STYLES

# nccl-tests bus-bandwidth factor, as a function of group size n (doc/PERFORMANCE.md, "Summary").
_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "gather": lambda n: (n - 1) / n,  # the root receives n-1 of n pieces; each sender sends its 1/n
    "scatter": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,  # a receiver sends nothing
    "barrier": lambda n: 0.0,
}
OPS = tuple(_FACTORS)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio for ``op`` on ``n`` ranks (0 for a 1-rank group: nothing moves)."""
    if op not in _FACTORS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    return _FACTORS[op](n) if n > 1 else 0.0


def wire_bytes(op: str, payload: float, n: int) -> float:
    """Bytes one rank sends for one call of payload ``payload`` (the nccl-tests size) on ``n`` ranks, ring algorithm."""
    return payload * busbw_factor(op, n)


@dataclass(frozen=True, order=True)
class Collective:
    """``count`` calls per step of collective ``op`` with payload ``bytes`` each, in a group of ``group_size``."""

    op: str
    bytes: int
    count: int
    group_size: int

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count

    @property
    def wire_bytes(self) -> float:
        """Bytes each rank sends for all ``count`` calls (ring algorithm)."""
        return self.count * wire_bytes(self.op, self.bytes, self.group_size)


def merge(plan) -> list[Collective]:
    """Canonical form of a plan: calls with equal (op, bytes, group_size) summed into one entry, sorted."""
    counts: Counter = Counter()
    for c in plan:
        counts[(c.op, int(c.bytes), c.group_size)] += c.count
    return sorted(Collective(op, b, k, n) for (op, b, n), k in counts.items() if k)


def payload_bytes(plan, op: str | None = None) -> int:
    """Σ payload over the plan (optionally one op): what a counter records."""
    return sum(c.total_bytes for c in plan if op is None or c.op == op)


def send_bytes_per_rank(plan) -> float:
    """Σ wire bytes one rank sends per step under ring algorithms: the number to divide by a link's bandwidth."""
    return sum(c.wire_bytes for c in plan)


def _check(num_params: int, world: int, micro_batches: int = 1) -> None:
    if num_params < 0 or world < 1 or micro_batches < 1:
        raise ValueError(f"need num_params >= 0, world >= 1, micro_batches >= 1; got {num_params}, {world}, "
                         f"{micro_batches}")


# -- strategies ------------------------------------------------------------------------------------------------------
def ddp(num_params: int, world: int, *, grad_bytes: int = 4, bucket_bytes=None,
        buffer_bytes: int = 0) -> list[Collective]:
    """DDP: one all-reduce of every gradient per optimizer step (accumulation micro-batches run under no_sync).

    ``bucket_bytes``: the sizes of DDP's gradient buckets in that step (``[b.buffer().nbytes for b in
    ddp.reducer._get_zeros_like_grad_buckets()]``); then the plan has one all-reduce per bucket, as issued, instead
    of one of Ψ·b. Torch's DDP puts every gradient in one bucket for the first step (it does not yet know the
    order gradients become ready), then rebuilds buckets of ``bucket_cap_mb`` in that order; the rebuild step
    also broadcasts the new bucket layout from rank 0 (a few small int64 broadcasts, once, not modelled here).
    ``buffer_bytes``: module buffers (e.g. rotary ``inv_freq``) that DDP broadcasts from rank 0 before the first
    forward of each step (``broadcast_buffers=True``, the default; forwards after a no_sync backward skip it).
    """
    _check(num_params, world)
    total = num_params * grad_bytes
    buckets = list(bucket_bytes) if bucket_bytes is not None else [total]
    if sum(buckets) != total:
        raise ValueError(f"bucket sizes sum to {sum(buckets)} bytes but the gradients are {num_params} x "
                         f"{grad_bytes} = {total} bytes")
    plan = [Collective("all_reduce", b, 1, world) for b in buckets]
    if buffer_bytes:
        plan.append(Collective("broadcast", buffer_bytes, 1, world))
    return merge(plan)


def zero(stage: int, num_params: int, world: int, *, param_bytes: int = 4, grad_bytes: int = 4,
         micro_batches: int = 1, grad_op: str = "reduce_scatter") -> list[Collective]:
    """ZeRO (textbook, as in the ZeRO paper §7): which collectives move gradients and parameters per step.

    Stage 1: gradients stay whole until the step, then reduce-scatter once; each rank updates its shard and the
    new parameters are all-gathered. Stage 2: gradients are sharded as they are produced, so the reduce-scatter
    runs every micro-batch. Stage 3 (= FSDP): parameters are sharded too; see ``fsdp``.
    ``grad_op="all_reduce"`` models engines that all-reduce gradient buckets and keep their own partition:
    DeepSpeed 0.19 does so by default (``use_multi_rank_bucket_allreduce``); counted on 2 ranks, stages 1 and 2
    issue all_reduce Ψ·4 (+ a 4-byte overflow flag) and all_gather Ψ·4 per step. Real engines also bucket these
    calls (``reduce_bucket_size`` / ``allgather_bucket_size``): compare bytes first, calls after splitting by bucket.
    """
    _check(num_params, world, micro_batches)
    if stage == 3:
        return fsdp(num_params, world, param_bytes=param_bytes, grad_bytes=grad_bytes, micro_batches=micro_batches)
    if stage not in (1, 2):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
    if grad_op not in ("reduce_scatter", "all_reduce"):
        raise ValueError(f"grad_op must be 'reduce_scatter' or 'all_reduce', got {grad_op!r}")
    rs = micro_batches if stage == 2 else 1
    return merge([Collective(grad_op, num_params * grad_bytes, rs, world),
                  Collective("all_gather", num_params * param_bytes, 1, world)])


def fsdp(units, world: int, *, param_bytes: int = 4, grad_bytes: int = 4, reshard_after_forward: bool | int = True,
         micro_batches: int = 1, reduce_per_micro_batch: bool = True, replicate: int = 1) -> list[Collective]:
    """ZeRO-3 / FSDP: per micro-batch, each unit all-gathers its parameters for forward, again for backward (if it
    freed them after forward), and reduce-scatters its gradients.

    ``units``: Ψ (one unit) or a list of per-unit parameter counts as the engine pads them (FSDP2 pads each
    parameter's dim 0 to a multiple of the world size; pass the padded counts to match a counter exactly).
    FSDP2 keeps the root module's parameters after forward; model that by passing the root as its own plan with
    ``reshard_after_forward=False``. ``reshard_after_forward=K`` (1 < K < world): a unit keeps a 1/K slice after
    forward and backward gathers it over those K ranks only (K = world is True, K = 1 False, as torch reads it).
    ``reduce_per_micro_batch=False``: gradients are reduced once per step (accumulation without sync, as the
    trainer's FSDP2 does). ``replicate`` R > 1 (HSDP): each reduce-scattered shard (unit / world) is then
    all-reduced over the R replicas.
    """
    units = [units] if isinstance(units, int) else list(units)
    _check(sum(units), world, micro_batches)
    back = _backward_group(reshard_after_forward, world)
    reduces = micro_batches if reduce_per_micro_batch else 1
    plan = []
    for u in units:
        plan += [Collective("all_gather", u * param_bytes, micro_batches, world),
                 Collective("reduce_scatter", u * grad_bytes, reduces, world)]
        if back:
            plan.append(Collective("all_gather", u * param_bytes, micro_batches, back))
        if replicate > 1:
            plan.append(Collective("all_reduce", u // world * grad_bytes, reduces, replicate))
    return merge(plan)


def _backward_group(reshard, world: int) -> int:
    """The group backward all-gathers a unit over: ``world`` (resharded), K (resharded to K ranks), 0 (kept)."""
    if isinstance(reshard, bool):
        return world if reshard else 0
    if not isinstance(reshard, int) or reshard < 1 or world % reshard:
        raise ValueError(f"reshard_after_forward {reshard!r} must be true, false or a number of ranks dividing "
                         f"{world}")
    return 0 if reshard == 1 else reshard


def tensor_parallel(layers: int, tokens: int, hidden: int, tp: int, *, act_bytes: int = 2,
                    sequence_parallel: bool = False, micro_batches: int = 1,
                    vocab: int | None = None, sp_style: str = "torch") -> list[Collective]:
    """Megatron tensor parallelism of the transformer blocks (Shoeybi et al. 2019, §3, operators f and g).

    Per layer and micro-batch: the attention block and the MLP each end in an all-reduce of the activations
    (``tokens`` = micro-batch x sequence, x ``hidden`` x ``act_bytes``) in forward (g) and one in backward (f):
    4 all-reduces. With sequence parallelism (Korthikanti et al. 2022) each all-reduce becomes an all-gather plus a
    reduce-scatter of the same full-sequence payload — same wire bytes, activations sharded in between.

    ``vocab``: also the vocabulary-parallel embedding and head as ``coursekit.tp.plan.vocab_parallel`` runs them,
    per micro-batch: the embedding's partial outputs all-reduced (forward), the head's V/tp logits all-gathered for
    the loss (``tokens x vocab x act_bytes``, forward), its input's partial gradient all-reduced (backward).
    Megatron's vocab-parallel cross-entropy keeps the logits split instead (three all-reduces of ``tokens`` floats).

    ``sp_style`` megatron (``coursekit.tp.megatron_sp``): the column-parallel linears keep the sequence shard and
    all-gather it again in backward: 2 more all-gathers per layer (6 with the 4 reduce-scatters).
    """
    _check(hidden, tp, micro_batches)
    if sp_style not in SP_STYLES:
        raise ValueError(f"sp_style must be torch or megatron, got {sp_style!r}")
    s = tokens * hidden * act_bytes
    k = 4 * layers * micro_batches
    gathers = k + (2 * layers * micro_batches if sp_style == "megatron" else 0)
    out = [Collective("all_gather", s, gathers, tp), Collective("reduce_scatter", s, k, tp)] if sequence_parallel \
        else [Collective("all_reduce", s, k, tp)]
    if vocab is not None and tp > 1:
        out += [Collective("all_reduce", s, 2 * micro_batches, tp),
                Collective("all_gather", tokens * vocab * act_bytes, micro_batches, tp)]
    return merge(out)


def _cp_check(batch: int, seq: int, kv_heads: int, head_dim: int, cp: int, layers: int, micro_batches: int) -> None:
    if min(batch, seq, kv_heads, head_dim, cp, layers, micro_batches) < 1 or seq % cp:
        raise ValueError(f"need positive sizes and seq divisible by cp; got batch={batch}, seq={seq}, "
                         f"kv_heads={kv_heads}, head_dim={head_dim}, cp={cp}, layers={layers}")


def ulysses_attention(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, cp: int, *,
                      act_bytes: int = 2, layers: int = 1, micro_batches: int = 1,
                      backward: bool = True) -> list[Collective]:
    """DeepSpeed-Ulysses context parallelism (Jacobs et al. 2023, §3), as ``coursekit.cp.ulysses`` runs it.

    Per layer and micro-batch, forward: 4 all-to-alls — q, k and v from the sequence split to the head split, the
    output back. Payload of each = one rank's whole tensor: q and out b·(s/C)·heads·d = b·s·h/C elements (h =
    heads·d); k and v b·(s/C)·max(kv_heads, C)·d (with fewer K/V heads than C each is replicated up to C before
    the all-to-all, as DeepSpeed's UlyssesSPAttentionHF does; with kv_heads ≥ C that is b·s·h_kv/C). Backward: the
    4 inverse all-to-alls of the gradients (out's gradient in, dq/dk/dv out), same payloads.
    """
    _cp_check(batch, seq, kv_heads, head_dim, cp, layers, micro_batches)
    if cp == 1:
        return []
    n = batch * seq // cp * head_dim * act_bytes
    k = layers * micro_batches * (2 if backward else 1)
    return merge([Collective("all_to_all", n * heads, 2 * k, cp),
                  Collective("all_to_all", n * max(kv_heads, cp), 2 * k, cp)])


def ring_attention(batch: int, seq: int, kv_heads: int, head_dim: int, cp: int, *, act_bytes: int = 2,
                   grad_bytes: int = 4, layers: int = 1, micro_batches: int = 1,
                   backward: bool = True) -> list[Collective]:
    """Ring Attention (Liu, Zaharia & Abbeel 2023), as ``coursekit.cp.ring`` runs it.

    Per layer and micro-batch, forward: C-1 exchanges of one K/V block — K and V of this rank's s/C tokens as one
    message of 2·b·kv_heads·(s/C)·d elements, a send to the next rank and a receive from the previous. Backward:
    C-1 K/V exchanges again, plus C-1 exchanges of the dK/dV accumulator (same shape, ``grad_bytes`` per element:
    fp32 in coursekit.cp.ring). Zig-zag or contiguous layout moves the same bytes; only the compute differs.
    """
    _cp_check(batch, seq, kv_heads, head_dim, cp, layers, micro_batches)
    if cp == 1:
        return []
    block = 2 * batch * kv_heads * (seq // cp) * head_dim
    k = layers * micro_batches * (cp - 1)
    kv = 2 * k if backward else k
    plan = [Collective("send", block * act_bytes, kv, cp), Collective("recv", block * act_bytes, kv, cp)]
    if backward:
        plan += [Collective("send", block * grad_bytes, k, cp), Collective("recv", block * grad_bytes, k, cp)]
    return merge(plan)


def expert_rows(counts, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rows each EP rank sends to and receives from every other, from the router's counts.

    ``counts[r][e]``: how many of rank r's (token, choice) pairs picked expert e (after any capacity drop); rank q
    holds experts q·E/ep ... (q+1)·E/ep - 1. Returns (send, recv) with ``send[r][q]`` = rows r sends q =
    ``recv[q][r]``."""
    n = len(counts)
    E = len(counts[0]) if n else 0
    if n != ep or ep < 1 or any(len(c) != E for c in counts) or E % ep:
        raise ValueError(f"need one count per expert for each of the {ep} EP ranks and experts divisible by ep; got "
                         f"{n} ranks of {sorted({len(c) for c in counts})} experts")
    L = E // ep
    send = [[sum(c[q * L:(q + 1) * L]) for q in range(ep)] for c in counts]
    return send, [[send[r][q] for r in range(ep)] for q in range(ep)]


def moe_all_to_all(send_rows, recv_rows, hidden: int, experts: int, ep: int, *, act_bytes: int = 4,
                   count_bytes: int = 8, backward: bool = True) -> list[Collective]:
    """One MoE layer's all-to-alls on one EP rank for one micro-batch, as ``coursekit.ep.dispatch`` runs them.

    Forward: the counts per expert (``experts`` int64s, equal splits), the dispatch (this rank's rows: Σ send_rows
    x hidden x act_bytes) and the combine (the rows it computed for others come back: Σ recv_rows x hidden x
    act_bytes). Backward: the two inverse all-to-alls of the gradients (the combine's input is then Σ send_rows
    rows, the dispatch's Σ recv_rows). Payload convention: a call's input tensor, the rows a rank keeps for itself
    included (they never leave it: wire bytes subtract them, ``send_rows[me]``).
    """
    if ep < 2:
        return []
    S, R = sum(send_rows) * hidden * act_bytes, sum(recv_rows) * hidden * act_bytes
    k = 2 if backward else 1
    return merge([Collective("all_to_all", experts * count_bytes, 1, ep),
                  Collective("all_to_all", S, k, ep), Collective("all_to_all", R, k, ep)])


def moe_step(group_counts, rank: int, hidden: int, experts: int, *, act_bytes: int = 4,
             backward: bool = True) -> tuple[list[Collective], list[int]]:
    """Every MoE layer's all-to-alls on EP rank ``rank`` in one micro-batch, from its EP group's router counts
    (``group_counts[r][layer][e]``, rank r of the group, as the trainer's ``expert_tokens`` records them), and the rows
    its experts received per layer (what ``coursekit.memory.activation_bytes(expert_rows=)`` takes)."""
    ep = len(group_counts)
    plan, rows = [], []
    for layer in range(len(group_counts[0])):
        send, recv = expert_rows([c[layer] for c in group_counts], ep)
        plan += moe_all_to_all(send[rank], recv[rank], hidden, experts, ep, act_bytes=act_bytes, backward=backward)
        rows.append(sum(recv[rank]))
    return merge(plan), rows


def textbook_table(num_params: int, world: int, *, bytes_per_elem: int = 2) -> dict[str, float]:
    """Bytes each rank sends per step for DDP / ZeRO-1 / ZeRO-2 / ZeRO-3, one micro-batch: the lecture table."""
    b = bytes_per_elem
    plans = {"ddp": ddp(num_params, world, grad_bytes=b),
             "zero1": zero(1, num_params, world, param_bytes=b, grad_bytes=b),
             "zero2": zero(2, num_params, world, param_bytes=b, grad_bytes=b),
             "zero3": zero(3, num_params, world, param_bytes=b, grad_bytes=b)}
    return {k: send_bytes_per_rank(p) for k, p in plans.items()}
