"""The reference trainer: one loop, every strategy and layout of the course, on one device mesh.

    python -m coursekit.train --strategy single --steps 5                      # one process
    torchrun --nproc-per-node 4 -m coursekit.train --strategy ddp --tp 2       # or: coursekit train --tp 2 ...

- ``loop``: the plain step loop (``strategy.train_step(micro_batches)``), records per step and a final record
- ``layout``: every check that needs no process group (layout, model split, batch sizes, strategy limits)
- ``loss``: the course's loss from logits, reduced over the loss group, from the last pipeline stage
- ``checkpoint``: DCP save / resume with an atomic marker · ``faults``: fault injection · ``progress``: the bar

Options are typed dataclasses (``coursekit.options``); ``coursekit train --help`` lists them all. Global batch =
micro-batch × grad-accum × data-parallel ranks, the same at every layout, so runs compare step by step.
"""
from __future__ import annotations

import contextlib
import gc
import io
import sys


def main(argv=None) -> int:
    collecting = gc.isenabled()
    # the imports (torch, transformers: ~600k objects, ~12k of them garbage) run without the collector, which would
    # scan the growing heap again and again (~1 s of a worker's start on 2 CPU cores); then they are frozen, out of
    # the loop's gc.collect (0.25 -> 0.07 s), before anything of the run is built (the model, DDP's reducer: the
    # loop frees them with gc.collect while the process group still exists, so they must not be frozen)
    gc.disable()
    try:
        from coursekit.launch import report
        from coursekit.options import parse
        from coursekit.train.loop import prepare, run

        opts = parse(argv)
        prepare(opts)
        gc.freeze()
        if collecting:
            gc.enable()
        out = run(opts)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        gc.unfreeze()
        if collecting:
            gc.enable()
    report(out)
    return 0


def preload(argv) -> None:
    """What a run imports, imported ahead of it: ``coursekit.launch.agent`` calls this once and then forks every
    worker from its process, so the workers start with torch, transformers and the model's modules loaded (frozen
    out of the collector, as ``main`` does). Imports only: nothing is built or computed here (a forked process must
    not inherit torch's thread pools), and bad arguments are left to the workers, which report them."""
    gc.disable()
    try:
        from coursekit.options import parse
        from coursekit.train.loop import preload_run, prepare

        try:
            with contextlib.redirect_stderr(io.StringIO()):  # argparse's message: the workers print it
                opts = parse(argv)
        except (SystemExit, ValueError):
            return
        prepare(opts)
        preload_run(opts)
    finally:
        gc.freeze()
        gc.enable()
