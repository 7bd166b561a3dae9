"""Ring collectives built from point-to-point messages: the algorithm behind NCCL's and gloo's big all-reduces.

The tensor is cut into n chunks (n = group size). Each rank only ever talks to its two neighbours:
sends go right (rank r -> r+1), receives come from the left (r-1 -> r).

  reduce-scatter, n-1 steps: at step k rank r sends chunk (r-k-1) and adds the chunk (r-k-2) it receives into its
      own copy. A chunk travels once around the ring collecting one addend per hop, so after n-1 hops rank r holds
      the complete sum of chunk r.
  all-gather, n-1 steps: at step k rank r sends chunk (r-k) (at k=0 the one it completed) and stores chunk (r-k-1).

    n = 3, chunks a b c; x_r = chunk x as rank r holds it; every message goes to the right neighbour
      step 0:  r0 sends c0,     r1 sends a1,     r2 sends b2      ->  r0: b0+b2   r1: c1+c0   r2: a2+a1
      step 1:  r0 sends b0+b2,  r1 sends c1+c0,  r2 sends a2+a1   ->  r0: a (all three)  r1: b  r2: c

Each step a rank sends one chunk of S/n bytes, so all-reduce sends 2(n-1)·S/n bytes per rank — exactly nccl-tests'
bus-bandwidth factor 2(n-1)/n (volume.py), and ``CollectiveCounter`` sees these sends and can check it.

Sends and receives of a step are posted together with ``batch_isend_irecv``: with plain blocking ``send`` every
rank would send first and wait for a receiver that is itself still sending. Only SUM is implemented; the summation
order differs from the library's, so floating-point results may differ from ``dist.all_reduce`` by rounding.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _ring(group):
    """(rank in group, group size, global rank of the right neighbour, global rank of the left neighbour)."""
    n = dist.get_world_size(group)
    r = dist.get_rank(group)
    # P2POp wants global ranks, also inside a sub-group
    right = dist.get_global_rank(group, (r + 1) % n) if group is not None else (r + 1) % n
    left = dist.get_global_rank(group, (r - 1) % n) if group is not None else (r - 1) % n
    return r, n, right, left


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group) -> None:
    """Send ``send`` to the right and receive ``recv`` from the left, concurrently."""
    ops = []
    if send.numel():  # chunk sizes are known to both sides, so an empty chunk is skipped by sender and receiver
        ops.append(dist.P2POp(dist.isend, send, right, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, left, group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def _reduce_scatter_chunks(chunks: list[torch.Tensor], group) -> None:
    """In place: afterwards ``chunks[rank]`` on each rank holds the sum of that chunk over all ranks."""
    r, n, right, left = _ring(group)
    for k in range(n - 1):
        send, dst = chunks[(r - k - 1) % n], chunks[(r - k - 2) % n]
        incoming = torch.empty_like(dst)  # the addend arrives in a scratch buffer, then is summed into place
        _exchange(send, incoming, right, left, group)
        dst.add_(incoming)


def _all_gather_chunks(chunks: list[torch.Tensor], group) -> None:
    """In place: ``chunks[rank]`` of every rank is copied into the same slot on all ranks."""
    r, n, right, left = _ring(group)
    for k in range(n - 1):
        # received straight into its slot: 1-D slices of a contiguous buffer are contiguous, as gloo requires
        _exchange(chunks[(r - k) % n], chunks[(r - k - 1) % n], right, left, group)


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """SUM-all-reduce ``tensor`` in place over ``group`` (reduce-scatter, then all-gather); any shape and numel.

    The flattened tensor is split with ``tensor_split``: when n does not divide numel the first numel % n chunks
    hold one element more, and chunks may be empty when numel < n. Returns ``tensor``.
    """
    n = dist.get_world_size(group)
    if n == 1:
        return tensor
    work = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    chunks = list(torch.tensor_split(work, n))
    _reduce_scatter_chunks(chunks, group)
    _all_gather_chunks(chunks, group)
    if work.data_ptr() != tensor.data_ptr():  # non-contiguous input: we worked on a copy
        tensor.copy_(work.view_as(tensor))
    return tensor


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None) -> torch.Tensor:
    """Like ``dist.reduce_scatter_tensor`` (SUM): ``output`` = this rank's 1/n of the sum of every rank's ``input``.

    ``input`` is left unchanged (the ring works on a copy).
    """
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if input.numel() != n * output.numel():
        raise ValueError(f"input has {input.numel()} elements, expected group size {n} x output {output.numel()}")
    chunks = list(input.detach().reshape(-1).clone().chunk(n))
    _reduce_scatter_chunks(chunks, group)
    output.copy_(chunks[r].view_as(output))
    return output


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group=None) -> torch.Tensor:
    """Like ``dist.all_gather_into_tensor``: ``output`` = every rank's ``input`` concatenated in rank order."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if output.numel() != n * input.numel():
        raise ValueError(f"output has {output.numel()} elements, expected group size {n} x input {input.numel()}")
    if not output.is_contiguous():
        raise ValueError("output must be contiguous (its chunks are received in place)")
    chunks = list(output.view(-1).chunk(n))
    chunks[r].copy_(input.reshape(-1))
    _all_gather_chunks(chunks, group)
    return output
