"""Megatron-LM's sequence parallelism (``--sp --sp-style megatron``): the column-parallel linears keep the shard.

Under torch's plan (``coursekit.tp.plan``, ``--sp-style torch``) the attention's and the MLP's input, the norm's
sequence shard, is all-gathered entering the block and the gathered tensor is what q, k, v (gate, up) save for
their weight gradients: ``b·s·h`` per block input on every rank. Megatron-LM (Korthikanti et al. 2022, §4.2.2;
``LinearWithGradAccumulationAndAsyncCommunication`` with ``sequence_parallel``) saves the rank's ``b·s/t·h``
shard instead and all-gathers it again in backward, where the weight gradients need it — one more all-gather per
block input and step, ``(t-1)/t`` of that activation less on every rank.

``GatherLinears`` is that, for the column-parallel linears of one block input at once (q, k, v; or gate, up: one
gather serves them, as Megatron's fused QKV does):

    forward   x = all_gather(shard, seq dim);  y_i = x W_iᵀ (+ b_i)             saves: shard, W_i
    backward  x = all_gather(shard) again;     dW_i = dy_iᵀ x,  db_i = Σ dy_i
              dx = Σ_i dy_i W_i  ->  reduce_scatter(dx, seq dim) = d shard

The block's own projections are left in place, their weights sharded as the torch plan shards them (DTensors on the
tp mesh: FSDP2, the optimizer and checkpoints see the same parameters); each of them returns its slice of the
output ``GatherLinears`` computed for its block (``install``).
"""
from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol


class GatherLinears(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, group, n_out, *params):
        weights, biases = params[:n_out], params[n_out:]
        full = funcol.wait_tensor(funcol.all_gather_tensor(shard.contiguous(), 1, group))
        outs = [torch.nn.functional.linear(full, w, b) for w, b in zip(weights, biases)]
        ctx.group, ctx.n_out, ctx.has_bias = group, n_out, [b is not None for b in biases]
        ctx.save_for_backward(shard, *weights)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        shard, *weights = ctx.saved_tensors
        full = funcol.wait_tensor(funcol.all_gather_tensor(shard.contiguous(), 1, ctx.group))  # again
        dt = weights[0].dtype  # autocast is off in backward: compute in the weights' dtype, return each input's
        x2 = full.reshape(-1, full.shape[-1]).to(dt)
        grads = [g.to(dt) for g in grads]
        d_full = sum(g @ w for g, w in zip(grads, weights)).to(shard.dtype)
        d_shard = funcol.wait_tensor(funcol.reduce_scatter_tensor(d_full.contiguous(), "sum", 1, ctx.group))
        dws = [g.reshape(-1, g.shape[-1]).t() @ x2 for g in grads]
        dbs = [g.reshape(-1, g.shape[-1]).sum(0) if has else None for g, has in zip(grads, ctx.has_bias)]
        return (d_shard, None, None, *dws, *dbs)


def install(parent, names: tuple[str, ...], mesh) -> None:
    """``parent``'s linears ``names`` (already column-parallel DTensor modules) computed by one ``GatherLinears``
    from the sequence-sharded input ``parent`` is called with."""
    from torch.distributed.tensor import DTensor

    mods = [parent.get_submodule(n) for n in names]
    for m in mods:  # the torch plan's input / output redistributions of these linears: GatherLinears does them
        m._forward_pre_hooks.clear()
        m._forward_hooks.clear()
    cache: dict = {}

    def enter(module, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        local = x.to_local() if isinstance(x, DTensor) else x
        ws = [m.weight.to_local() for m in mods]
        bs = [m.bias.to_local() if m.bias is not None else None for m in mods]
        outs = GatherLinears.apply(local, mesh.get_group(), len(mods), *ws, *bs)
        cache.update(zip(names, outs))
        # the block reshapes with the input's sizes: give it the whole sequence's shape (a placeholder view)
        full = local.new_empty(()).expand(local.shape[0], local.shape[1] * mesh.size(), local.shape[2])
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": full}
        return (full, *args[1:]), kwargs

    parent.register_forward_pre_hook(enter, with_kwargs=True)
    for n, m in zip(names, mods):
        m.forward = (lambda key: lambda *a, **k: cache.pop(key))(n)
