"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with DTensor: the plan is a dictionary, as in torchtitan.

Per transformer block, on the ``tp`` sub-mesh:

    q_proj, k_proj, v_proj, gate_proj, up_proj   ColwiseParallel   weight rows split: each rank its heads / FFN slice
    o_proj, down_proj                            RowwiseParallel   weight columns split: partial sums, all-reduced
    self_attn, mlp                               PrepareModuleInput: the input becomes one replicated DTensor

So each block does one all-reduce after attention and one after the MLP in forward (Megatron's "g"), and one each
in backward at the attention's and the MLP's input (its "f"): the gradients of q, k and v (of gate and up) are
summed as partial DTensors first, so three projections cost one all-reduce, not three. The embedding and the LM
head are split over the vocabulary (``coursekit.tp.vocab``): V/tp rows of each per rank.

Sequence parallelism (``--sp``, Korthikanti et al. 2022): between the blocks' TP regions the residual stream and
the norms hold ``seq/tp`` tokens per rank (``SequenceParallel`` norms). Entering attention / the MLP the input is
all-gathered (Shard(1) → Replicate), leaving it the row-parallel output is reduce-scattered (Partial → Shard(1)):
same wire bytes as the all-reduce, activations split in between. ``--sp-style megatron`` (``coursekit.tp.
megatron_sp``): the column-parallel linears keep that input's sequence shard, not the gathered copy, and gather it
again in backward, as Megatron-LM does. The stage's first block takes its slice of the
(replicated) embedding output, its last block's output is all-gathered again, so the final norm and the head's
input stay whole sequences, and a pipeline stage sends whole sequences.

A mixture of experts (Mixtral, Qwen3-MoE; Megatron-Core's expert tensor-parallel size 1): TP splits the attention
only. The sparse MLP block (router and experts, or EP's slice of them) is whole on every TP rank, and the TP ranks
split its *tokens*: entering the block each rank keeps its 1/tp of every sequence (Replicate -> Shard(1), a slice:
no communication), leaving it the outputs are all-gathered (Shard(1) -> Replicate). Backward mirrors it (the input's
gradient all-gathered, the output's sliced). Each rank's router and expert gradients then cover its own tokens
only: they are summed over the TP ranks before the step (``coursekit.parallel.split.mark_partial``). Under
sequence parallelism the block's input already is the rank's 1/tp of the sequence (the norm's Shard(1) output):
the block runs on that shard and its output stays in the sequence-sharded residual stream, no slice or gather.

Qwen3's q/k RMSNorms (one ``head_dim`` weight every head uses) stay whole on every rank; a rank's gradient of them
covers its own heads only, so it is summed over the TP ranks too (the family plan's ``head_shared``).

Grouped-query attention with fewer key/value heads than ``tp`` (Megatron and DeepSpeed replicate them): k_proj and
v_proj stay whole (a replicated DTensor); each rank keeps the one K/V head its query heads use (head r·kv/tp) and
its slice of the gradient counts as a partial sum, summed over the TP ranks into the replicated weight's gradient.
"""
from __future__ import annotations

from coursekit.parallel import model_parts
from coursekit.parallel.validate import router_aux_coef
from coursekit.spec.families import plan_for
from coursekit.tp import TPOptions


class TensorParallel:
    name = "tp"

    @classmethod
    def check(cls, opts, dims) -> None:
        from coursekit.memory.calculator import resolve_model

        shape = resolve_model(opts.train.model)
        plan_for(shape.family, "--tp", opts.train.model)
        if shape.is_moe:
            cls._check_moe(opts, dims)
        o = opts.of(TPOptions)
        if o.sp and (opts.train.seq // dims.cp) % dims.tp:
            raise ValueError(f"--sp needs the sequence per CP rank ({opts.train.seq // dims.cp}) divisible by "
                             f"tp {dims.tp}")
        if o.sp_style == "megatron":
            why = ("it needs --sp" if not o.sp else "a mixture of experts splits its tokens, not weights" if
                   shape.is_moe else f"fewer K/V heads ({shape.kv_heads}) than tp are replicated" if
                   shape.kv_heads < dims.tp else f"--recompute {opts.train.recompute} checkpoints the block already"
                   if opts.train.recompute != "none" else "--compile is not supported with it" if opts.train.compile
                   else "")
            if why:
                raise ValueError(f"--sp-style megatron: {why}")

    @staticmethod
    def _check_moe(opts, dims) -> None:
        model, tp = opts.train.model, dims.tp
        if (opts.train.seq // dims.cp) % tp:
            raise ValueError(f"--tp {tp} on a mixture-of-experts model splits every sequence's tokens over the TP "
                             f"ranks for the experts: the sequence per CP rank ({opts.train.seq // dims.cp}) must be "
                             "divisible by it")
        if router_aux_coef(opts):
            raise ValueError(f"--tp {tp} on a mixture-of-experts model: the load-balancing loss would be computed on "
                             "each TP rank's tokens apart; pass --router-aux-loss-coef 0")

    def __init__(self, ctx):
        from coursekit.memory.calculator import resolve_model
        self.ctx = ctx
        self.sp = ctx.opts.of(TPOptions).sp
        self.megatron = self.sp and ctx.opts.of(TPOptions).sp_style == "megatron"
        model = ctx.opts.train.model
        self.family = plan_for(resolve_model(model).family, "--tp", model)

    def plan(self, kv_split: bool = True) -> dict:
        """The block's TP plan: submodule name -> DTensor style, from the model family's plan."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                       SequenceParallel)

        inp = Shard(1) if self.sp else Replicate()
        out = {"output_layouts": Shard(1)} if self.sp else {}
        f = self.family
        p = {}
        if not self.megatron:  # Megatron's style gathers inside its linears (coursekit.tp.megatron_sp)
            p[f.attention] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": inp},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()})
        if f.experts is None and not self.megatron:  # a sparse block's tokens are split (token_split), not weights
            p[f.mlp] = PrepareModuleInput(input_layouts=(inp,), desired_input_layouts=(Replicate(),))
        p |= {name: ColwiseParallel() for name in f.colwise + (f.kv if kv_split else ())}
        p |= {name: RowwiseParallel(**out) for name in f.rowwise}
        if self.sp:
            p |= {name: SequenceParallel() for name in f.norms}
        return p

    def apply(self, model, strategy):
        mesh, tp = self.ctx.mesh["tp"], self.ctx.dims.tp
        rank = self.ctx.dims.coord(self.ctx.info.rank, "tp")
        for lm in model_parts(model):  # the model, or this rank's pipeline stages
            self.apply_lm(lm, mesh, tp, rank)
        return model

    def apply_lm(self, lm, mesh, tp: int, rank: int) -> None:
        from torch.distributed.tensor.parallel import parallelize_module

        from coursekit.models import blocks

        attn_name = self.family.attention
        here = [b for b in blocks(lm) if hasattr(b, attn_name)]  # a pipeline stage keeps placeholders
        for block in here:
            attn = getattr(block, attn_name)
            kv = attn.k_proj.out_features // attn.head_dim
            parallelize_module(block, mesh, self.plan(kv_split=kv >= tp))
            if self.megatron:
                from coursekit.tp import megatron_sp  # torch: `check` runs in the CLI, before any launch

                for parent, names in _by_parent(self.family.colwise + self.family.kv).items():
                    megatron_sp.install(block.get_submodule(parent), names, mesh)
            if kv < tp:
                for proj in (attn.k_proj, attn.v_proj):
                    replicate_kv(proj, mesh, head=rank * kv // tp, head_dim=attn.head_dim)
            # query and key/value heads on this rank (HF repeats K/V heads by this factor)
            attn.num_key_value_groups = (attn.config.num_attention_heads // tp) // max(kv // tp, 1)
        from coursekit.tp.vocab import vocab_parallel  # torch: `check` runs in the CLI, before any launch

        vocab_parallel(lm, self.family, mesh)
        if self.sp and here:
            seq_shard(here[0], here[-1], mesh)
        from coursekit.parallel.split import mark_partial  # torch: `check` runs in the CLI, before any launch

        for block in here:
            for name in self.family.head_shared:  # each rank's heads' share of a module all heads use: summed
                mark_partial(block.get_submodule(name), mesh.get_group())
            if self.family.experts is not None:
                moe = block.get_submodule(self.family.mlp)
                token_split(moe, mesh, self.sp)
                mark_partial(moe, mesh.get_group())  # its router and experts saw 1/tp of the tokens


def _by_parent(names: tuple[str, ...]) -> dict:
    """{"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")} from dotted names."""
    out: dict = {}
    for n in names:
        parent, _, leaf = n.rpartition(".")
        out.setdefault(parent, ())
        out[parent] += (leaf,)
    return out


def replicate_kv(proj, mesh, *, head: int, head_dim: int) -> None:
    """k_proj / v_proj kept whole on every TP rank; the output keeps ``head``; the weight's gradient is summed."""
    import torch
    from torch.distributed.tensor import Partial, Replicate, distribute_tensor

    for name, p in list(proj.named_parameters()):
        d = torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()]))
        d.register_hook(lambda g: g.redistribute(placements=[Replicate()]))  # partial slices -> summed, replicated
        proj.register_parameter(name, d)

    def forward(module, args, output):
        # each rank uses its own head: its gradient is one rank's part of the sum (Partial), not a replica's copy
        return output.to_local(grad_placements=[Partial()])[..., head * head_dim:(head + 1) * head_dim]

    proj.register_forward_hook(forward)


def seq_shard(first, last, mesh) -> None:
    """The stage's residual stream sequence-sharded: slice entering ``first``, all-gather leaving ``last``."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def enter(module, args, kwargs):
        x = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False)
        return (x.redistribute(placements=[Shard(1)]).to_local(), *args[1:]), kwargs

    def leave(module, args, output):
        return DTensor.from_local(output, mesh, [Shard(1)], run_check=False).redistribute(
            placements=[Replicate()]).to_local()

    first.register_forward_pre_hook(enter, with_kwargs=True)
    last.register_forward_hook(leave)


def token_split(moe, mesh, sp: bool = False) -> None:
    """A sparse MLP block on 1/tp of the tokens: its input sliced along the sequence, its output all-gathered (both
    as DTensor redistributions, so autograd gathers the input's gradient and slices the output's). Under sequence
    parallelism the input already is this rank's tokens (the norm's Shard(1) output): the block takes the local
    shard and its output joins the sequence-sharded residual stream, no communication at all."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if sp:
        moe.register_forward_pre_hook(lambda module, args: (args[0].to_local(), *args[1:])
                                      if isinstance(args[0], DTensor) else None)
        return

    def enter(module, args):
        x = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False)
        return (x.redistribute(placements=[Shard(1)]).to_local().contiguous(), *args[1:])

    def leave(module, args, output):
        return DTensor.from_local(output, mesh, [Shard(1)], run_check=False).redistribute(
            placements=[Replicate()]).to_local()

    moe.register_forward_pre_hook(enter)
    moe.register_forward_hook(leave)
