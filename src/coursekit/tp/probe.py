"""Measure one TP rank of the trainer's own tensor-parallel model: collectives and saved activation bytes per layer.

    launch("coursekit.tp.probe", ["--tp", "2", "--sp", "--seq", "32", "--micro-batch", "2"], nproc=2)

Each rank builds the model the trainer builds (``coursekit.parallel.compose``, no data-parallel wrap), runs one
forward + backward under ``coursekit.comm.CollectiveCounter`` and one forward under the course's measurement path
(``coursekit.measure.saved_activation_bytes``), and reports per layer what it counted and what
``coursekit.comm.volume.tensor_parallel`` and ``coursekit.memory.activations`` predict for it.
"""
from __future__ import annotations

import sys
from collections import Counter


def run(argv) -> dict:
    import torch

    from coursekit import dist as ckdist
    from coursekit.comm.counter import CollectiveCounter
    from coursekit.comm import volume
    from coursekit.measure.activations import saved_activation_bytes
    from coursekit.memory.activations import activation_bytes
    from coursekit.memory.calculator import resolve_model
    from coursekit.options import parse
    from coursekit.parallel.loss import cross_entropy
    from coursekit.parallel.run import build_run
    from coursekit.tp import TPOptions

    opts = parse(["--strategy", "ddp", "--attention", "eager", *argv])
    t, sp, style = opts.train, opts.of(TPOptions).sp, opts.of(TPOptions).sp_style
    with ckdist.session(seed=t.seed) as info:
        run_ = build_run(info, opts, setup=False)  # the trainer's model, without the data-parallel wrap
        ctx, model = run_.ctx, run_.model
        shape, tp = resolve_model(t.model), ctx.dims.tp
        b, s = t.micro_batch, t.seq
        g = torch.Generator().manual_seed(t.seed)
        ids = torch.randint(0, shape.vocab, (b, s), generator=g)
        pos = torch.arange(s).expand(b, s)
        with CollectiveCounter() as cc:
            cross_entropy(model(input_ids=ids, position_ids=pos).logits, ids).backward()
        ops = Counter()
        for r in cc.records:
            if r.group_size == tp:
                ops[(r.op, r.bytes)] += 1
        saved = saved_activation_bytes(model, ids, breakdown=True, position_ids=pos)["by_layer"]
        predicted = activation_bytes(shape, b, s, dtype="fp32", attention="eager", kernels="cpu", tp=tp,
                                     sp=sp, sp_style=style).per_layer
        model_ops = volume.tensor_parallel(shape.layers, b * s, shape.hidden, tp, act_bytes=4,
                                           sequence_parallel=sp, vocab=shape.vocab, sp_style=style)
        return {"rank": info.rank, "layers": shape.layers,
                "counted": [[op, n, k] for (op, n), k in sorted(ops.items())],
                "modelled": [[c.op, c.bytes, c.count] for c in model_ops],
                "saved_per_layer": [saved.get(f"layers.{i}", 0) for i in range(shape.layers)],
                "predicted_per_layer": sum(predicted.values())}


def main(argv=None) -> int:
    from coursekit.launch import report

    report(run(list(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # results reported: skip the interpreter's slow teardown
