"""Measure what one FSDP2 rank holds, per category and per phase, in one process (no launch).

    python -m coursekit.fsdp.memcheck --shard 3 --rank 2          # one JSON line: measured bytes
    measure(shard=3, rank=2, reshard=True)                         # the same, in the calling process

FSDP2 runs over torch's *fake* process group (``init_process_group("fake", rank=r, world_size=N)``): collectives
move no data, but every tensor has the shape it has on rank r of N, so what rank r allocates is exact. Two
measurements of one training step (forward, loss, backward, AdamW step):

- the course's path (``coursekit.measure.state_bytes``): sharded parameters, gradients, optimizer states as held;
- torch's ``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``): per module and phase (before/after
  pre-forward ... post-backward, peaks), bytes by kind: sharded / unsharded parameters and gradients, all-gather
  outputs, reduce-scatter buffers, activations, optimizer states. Reported here: the peak-backward snapshot, and the
  largest all-gather and reduce-scatter buffer seen at any phase.

The numbers are compared with ``coursekit memory --strategy fsdp2`` in tests/test_fsdp_memory.py (a fresh
process per run: a fake process group cannot be re-created with another size in one process).
"""
from __future__ import annotations

import argparse
import json


def measure(*, model: str = "tiny-llama", shard: int = 2, rank: int = 0, reshard: bool = True,
            offload: bool = False, batch: int = 2, seq: int = 32, seed: int = 0) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from coursekit.measure import state_bytes
    from coursekit.models import blocks, build_model
    from coursekit.parallel.api import adamw
    from coursekit.train.loss import cross_entropy

    dist.init_process_group("fake", rank=rank, world_size=shard, store=FakeStore())
    try:
        m = build_model(model, seed=seed)
        pol = CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy()
        for b in blocks(m):
            fully_shard(b, reshard_after_forward=reshard, offload_policy=pol)
        fully_shard(m, reshard_after_forward=False, offload_policy=pol)
        opt = adamw(m.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, m.config.vocab_size, (batch, seq + 1), generator=g)

        def step():
            loss = cross_entropy(m(input_ids=x[:, :-1]).logits, x[:, 1:])
            loss.backward()
            opt.step()
            return loss

        step()  # optimizer states exist from here on: the next step is steady
        opt.zero_grad(set_to_none=True)
        tracker = FSDPMemTracker(m, opt)
        tracker.track_inputs((x,))
        with tracker:
            step()
            held = state_bytes(m, opt)
        snaps = tracker.memory_tracking
        peak_bw = _kinds(snaps[m].snapshots["Peak Backward"][-1])
        buffers = {"all_gather": 0, "reduce_scatter": 0}
        for mod_stats in snaps.values():
            for per_state in mod_stats.snapshots.values():
                for snap in per_state:
                    k = _kinds(snap)
                    for b in buffers:
                        buffers[b] = max(buffers[b], k.get(b, 0))
        return {"shard": shard, "rank": rank, "reshard": reshard, "offload": offload, "held": held,
                "peak_backward": peak_bw, "max_buffers": buffers}
    finally:
        dist.destroy_process_group()


def _kinds(snap: dict) -> dict:
    """One tracker snapshot ({device: {kind: bytes}}) as {kind: bytes} summed over devices, snake_case names."""
    out: dict = {}
    for dev, kinds in snap.items():
        for kind, n in kinds.items():
            key = str(getattr(kind, "value", kind)).lower().replace(" ", "_").replace("-", "_")
            out[key] = out.get(key, 0) + int(n)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coursekit.fsdp.memcheck", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--shard", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--no-reshard", action="store_true")
    ap.add_argument("--offload", action="store_true")
    a = ap.parse_args(argv)
    print(json.dumps(measure(model=a.model, shard=a.shard, rank=a.rank, reshard=not a.no_reshard,
                             offload=a.offload)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
