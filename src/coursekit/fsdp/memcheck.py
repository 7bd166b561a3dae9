"""Measure what one FSDP2 rank holds, per category and per phase, in one process (no launch).

    python -m coursekit.fsdp.memcheck --shard 3 --rank 2          # one JSON line: measured bytes
    measure(shard=3, rank=2, reshard=True)                         # the same, in the calling process

The model, its ``fully_shard`` units and AdamW are the trainer's (``coursekit.parallel.run.build_run`` with
``--strategy fsdp2 --dp-shard N``): what is measured is what ``coursekit train`` holds. FSDP2 runs over torch's
*fake* process group (``init_process_group("fake", rank=r, world_size=N)``): collectives
move no data, but every tensor has the shape it has on rank r of N, so what rank r allocates is exact. Two
measurements of one training step (forward, loss, backward, AdamW step):

- the course's path (``coursekit.measure.state_bytes``): sharded parameters, gradients, optimizer states as held;
- torch's ``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``): per module and phase (before/after
  pre-forward ... post-backward, peaks), bytes by kind: sharded / unsharded parameters and gradients, all-gather
  outputs, reduce-scatter buffers, activations, optimizer states. Reported here: the peak-backward snapshot, and the
  largest all-gather and reduce-scatter buffer seen at any phase.

A third, direct count of the gathered units (``units``): the bytes of every unit's gathered parameters (FSDP2's
per-parameter all-gather outputs) and of the 1/N post-forward slices that ``reshard_after_forward=N`` keeps, right
after forward and at the start of backward (once the last block is gathered), read from FSDP2's parameter states.
``qlora={"r": 8}`` measures ``coursekit.fsdp.qlora``'s NF4 + LoRA model instead, with its bytes by kind.

The numbers are compared with ``coursekit memory --strategy fsdp2`` in tests/test_fsdp_memory.py (a fresh
process per run: a fake process group cannot be re-created with another size in one process).
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from coursekit import options
from coursekit.data import Batch
from coursekit.dist import DistInfo
from coursekit.measure import state_bytes
from coursekit.measure.states import param_kind_bytes, tensor_bytes  # the one storage walk
from coursekit.models import blocks
from coursekit.parallel.api import adamw
from coursekit.parallel.loss import cross_entropy
from coursekit.parallel.run import build_run


def measure(*, model: str = "tiny-llama", shard: int = 2, rank: int = 0, reshard: bool | int = True,
            offload: bool = False, batch: int = 2, seq: int = 32, seed: int = 0, qlora: dict | None = None) -> dict:
    dist.init_process_group("fake", rank=rank, world_size=shard, store=FakeStore())
    try:
        if qlora is None:
            m, opt, units, batches = _trainer_fsdp2(model, shard, rank, reshard, offload, batch, seq, seed)
        else:
            m, opt, units, batches = _qlora_fsdp2(model, qlora, reshard, offload, batch, seq, seed)
        return {"shard": shard, "rank": rank, "reshard": reshard, "offload": offload,
                **_tracked_step(m, opt, units, batches, kinds=qlora is not None)}
    finally:
        dist.destroy_process_group()


def _trainer_fsdp2(model, shard, rank, reshard, offload, batch, seq, seed):
    """The model, optimizer, units and a step's micro-batch exactly as ``coursekit train --strategy fsdp2`` builds
    them on rank ``rank`` of ``shard`` (``coursekit.parallel.run.build_run``: the trainer's wrap and AdamW)."""
    opts = options.build({"strategy": "fsdp2", "dp_shard": shard, "model": model, "seq": seq, "micro_batch": batch,
                          "seed": seed, "reshard_after_forward": str(reshard).lower(),
                          "offload": "cpu" if offload else "none"})
    info = DistInfo(rank=rank, world_size=shard, local_rank=rank, local_world_size=shard, backend="fake",
                    device="cpu", source="single")
    run = build_run(info, opts)
    s = run.strategy
    return s.model, s.optimizer, [*s.units, s.model], run.micro_batches(0)


def _qlora_fsdp2(model, qlora, reshard, offload, batch, seq, seed):
    """coursekit.fsdp.qlora's NF4 + LoRA model (what ``coursekit.fsdp.qlora_run`` trains), sharded per block then
    the root, AdamW on the adapters; one micro-batch of random tokens."""
    from coursekit.fsdp.qlora import qlora_model

    m = qlora_model(model, seed=seed, **qlora)
    pol = CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy()
    units = list(blocks(m.base_model.model))
    for b in units:
        fully_shard(b, reshard_after_forward=reshard, offload_policy=pol)
    fully_shard(m, reshard_after_forward=False, offload_policy=pol)
    opt = adamw([p for p in m.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randint(0, m.config.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))
    return m, opt, [*units, m], [Batch(x[:, :-1], x[:, 1:], torch.arange(seq).expand(batch, seq))]


def _tracked_step(m, opt, units, batches, *, kinds: bool) -> dict:
    """One warm-up step (AdamW's states exist from then on), then one steady step under FSDPMemTracker and the unit
    probe; what is held is read after the optimizer step, before gradients are dropped."""
    seen: dict = {}
    probe = _UnitProbe(units, seen)

    def after_forward(*_):  # the root's forward has ended: every block has resharded (returns None: output kept)
        seen.setdefault("after_forward", probe.held())
    m.register_forward_hook(after_forward)

    def step():
        for b in batches:
            cross_entropy(m(input_ids=b.input_ids, position_ids=b.position_ids).logits, b.labels).backward()
        opt.step()

    step()
    opt.zero_grad(set_to_none=True)
    seen.clear()
    tracker = FSDPMemTracker(m, opt)
    tracker.track_inputs(tuple(b.input_ids for b in batches))
    with tracker:
        step()
        held = state_bytes(m, opt)
        by_kind = _by_kind(m) if kinds else None
    snaps = tracker.memory_tracking
    peak_bw = _kinds(snaps[m].snapshots["Peak Backward"][-1])
    buffers = {"all_gather": 0, "reduce_scatter": 0}
    for mod_stats in snaps.values():
        for per_state in mod_stats.snapshots.values():
            for snap in per_state:
                k = _kinds(snap)
                for b in buffers:
                    buffers[b] = max(buffers[b], k.get(b, 0))
    return {"held": held, "peak_backward": peak_bw, "max_buffers": buffers, "units": seen, "kinds": by_kind}


class _UnitProbe:
    """Bytes of gathered parameters and post-forward slices over all FSDP2 units, from their parameter states;
    ``seen["start_of_backward"]``: the count right after the first block's pre-backward (the last block gathered)."""

    def __init__(self, modules, seen: dict):
        self.groups = [g for g in (mod._get_fsdp_state()._fsdp_param_group for mod in modules) if g is not None]
        for g in self.groups[:-1]:  # the blocks (the root's pre-backward gathers nothing: it kept its weights)
            orig = g.pre_backward

            def pre_backward(*args, _orig=orig):
                out = _orig(*args)
                seen.setdefault("start_of_backward", self.held())
                return out
            g.pre_backward = pre_backward

    def held(self) -> dict:
        from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState  # torch's private module

        gathered = post_forward = 0
        for g in self.groups:
            for fp in g.fsdp_params:
                if fp.sharded_state == ShardedState.UNSHARDED:
                    gathered += tensor_bytes(fp.all_gather_outputs)
                elif fp.sharded_state == ShardedState.SHARDED_POST_FORWARD:
                    post_forward += tensor_bytes([fp._sharded_post_forward_param_data])
        return {"gathered": gathered, "post_forward": post_forward, "total": gathered + post_forward}


def _by_kind(m) -> dict:
    """QLoRA: this rank's NF4 inner tensors (data, scalers, factors, mean, table), frozen rest and adapters."""
    return param_kind_bytes(m)


def _kinds(snap: dict) -> dict:
    """One tracker snapshot ({device: {kind: bytes}}) as {kind: bytes} summed over devices, snake_case names."""
    out: dict = {}
    for dev, kinds in snap.items():
        for kind, n in kinds.items():
            key = str(getattr(kind, "value", kind)).lower().replace(" ", "_").replace("-", "_")
            out[key] = out.get(key, 0) + int(n)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 prog="python -m coursekit.fsdp.memcheck", description=__doc__.split("\n")[0].replace("``", ""))
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--shard", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--reshard-after-forward", default="true", help="true, false or N")
    ap.add_argument("--offload", action="store_true")
    ap.add_argument("--qlora-rank", type=int, help="measure the NF4 + LoRA model with adapters of this rank")
    a = ap.parse_args(argv)
    r = a.reshard_after_forward.lower()
    reshard = r == "true" if r in ("true", "false") else int(r)
    print(json.dumps(measure(model=a.model, shard=a.shard, rank=a.rank, reshard=reshard, offload=a.offload,
                             qlora=None if a.qlora_rank is None else {"r": a.qlora_rank})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
