"""A QLoRA + FSDP2 training run on every rank: a frozen NF4 base (torchao) with peft LoRA adapters on tiny-llama,
``fully_shard`` per block then the root, AdamW on the adapters only.

    launch("coursekit.fsdp.qlora_run", ["--steps", "4", "--batch", "4"], nproc=2)

Each rank reports its step times and losses, what it holds after the last step (``coursekit.measure.state_bytes``:
gradients and optimizer states; ``memcheck._by_kind``: NF4 data + scalers, the frozen rest, the adapters), its
trainable parameter count and the bytes its last step's collectives moved. Used by tests/test_fsdp_qlora.py and
bench/bench_fsdp.py's QLoRA row; what these figures should be is ``coursekit memory --strategy fsdp2 --qlora``.
"""
from __future__ import annotations

import argparse
import sys
import time


def run(argv) -> dict:
    import torch
    from torch.distributed.fsdp import fully_shard

    from coursekit.comm.counter import CollectiveCounter
    from coursekit.dist import session
    from coursekit.fsdp.memcheck import _by_kind
    from coursekit.fsdp.qlora import qlora_model
    from coursekit.measure import state_bytes
    from coursekit.models import blocks
    from coursekit.parallel.api import adamw
    from coursekit.parallel.loss import cross_entropy

    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit.fsdp.qlora_run")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank (33 tokens: 32 inputs, shifted labels)")
    p.add_argument("--model", default="tiny-llama")
    a = p.parse_args(argv)
    with session(seed=0) as info:
        m = qlora_model(a.model)
        for b in blocks(m.base_model.model):
            fully_shard(b)
        fully_shard(m)
        opt = adamw([q for q in m.parameters() if q.requires_grad], lr=1e-2)
        vocab = m.config.vocab_size
        x = torch.randint(0, vocab, (a.batch, 33), generator=torch.Generator().manual_seed(info.rank))
        times, losses = [], []
        for _ in range(a.steps):
            t = time.perf_counter()
            with CollectiveCounter() as cc:
                loss = cross_entropy(m(input_ids=x[:, :-1]).logits, x[:, 1:])
                loss.backward()
                opt.step()
            held = state_bytes(m, opt)
            opt.zero_grad()
            times.append(time.perf_counter() - t)
            losses.append(loss.item())
        return {"rank": info.rank, "times": times, "losses": losses, "held": held, "kinds": _by_kind(m),
                "trainable": sum(q.numel() for q in m.parameters() if q.requires_grad),
                "sent": sum(r.bytes for r in cc.records)}


def main(argv=None) -> int:
    from coursekit.launch import report

    report(run(list(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())
