"""A run set up the one way: the trainer's loop and every probe (``tp.probe``, ``pp.probe``, ``zero.sweep``) and
Accelerate's run (``zero.accel_train``) build it here, so what a probe measures is the model the trainer trains.

    run = build_run(info, opts)          # validate + mesh, the strategy, the model (same init on every rank),
                                         # the parallelisms in their order, the strategy's wrap and optimizer
    run.strategy.train_step(run.micro_batches(step))

``setup=False`` stops after the parallelisms (a probe that measures the model without a data-parallel wrap);
``strategy=`` picks another strategy class than ``--strategy`` names (a probe's own); ``ctx=`` a Context built
elsewhere (``zero.accel_train``: Accelerate owns the process group, no mesh); ``model_overrides`` config keys of
the model (``cp.probe``: its K/V head count).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Run:
    ctx: object  # coursekit.parallel.api.Context
    strategy: object  # coursekit.parallel.api.Strategy (its .model: the wrapped model after setup)
    model: object  # the model after the parallelisms (before the data-parallel wrap)
    num_params: int  # of the whole model, before a pipeline split keeps one stage
    dataset: object
    cut: object = None  # this rank's cut of every sequence (context parallelism), or None

    def micro_batches(self, step: int) -> list:
        """This rank's micro-batches of ``step``: rows by its batch coordinate, cut by the parallelism that cuts."""
        from coursekit.data import micro_batches

        t, dims, rank = self.ctx.opts.train, self.ctx.dims, self.ctx.info.rank
        return micro_batches(self.dataset, step, micro_batch=t.micro_batch, grad_accum=t.grad_accum,
                             rank=dims.coord(rank, "batch"), world=dims.size("batch"), cut=self.cut,
                             device=self.ctx.info.device)


def build_run(info, opts, *, strategy=None, setup: bool = True, ctx=None, model_overrides: dict | None = None) -> Run:
    """Validate ``opts`` for this process group and build everything a step needs (see the module docstring)."""
    from coursekit.data import VOCAB, Rows, make_rows
    from coursekit.models import build_model
    from coursekit.parallel.api import Context
    from coursekit.parallel.compose import parallelize
    from coursekit.parallel.validate import data_cut
    from coursekit.spec import registry

    t = opts.train
    ctx = ctx or Context.for_run(info, opts)
    strat = (strategy or registry.get(opts.parallel.strategy))(ctx)
    model = build_model(t.model, attention=t.attention, seed=t.seed, **(model_overrides or {}))  # same init everywhere
    num_params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    model = parallelize(model, strat, ctx)
    if setup:
        strat.setup(model)
    # tokens below the model's vocabulary (a config with fewer than the byte vocabulary's 256 ids trains too)
    ds = Rows(make_rows(t.data, seq_len=t.seq + 1, num_samples=max(256, 4 * t.global_batch), seed=t.seed,
                        vocab_size=min(VOCAB, vocab)))  # make_dataset's rows, without importing datasets
    return Run(ctx=ctx, strategy=strat, model=model, num_params=num_params, dataset=ds,
               cut=data_cut(opts, ctx.dims, info.rank))
