"""Module 2 in ``coursekit demo``: ZeRO 1-3 with the real DeepSpeed engine on 2 ranks — the bytes every rank holds
against DeepSpeed's layout as ``coursekit memory`` predicts it, and the losses against DDP's."""
from __future__ import annotations

from coursekit.tour import Check

MODULE, TITLE = 2, "DeepSpeed ZeRO"  # found by coursekit.tour.discover()

CATS = {"params": "params_bytes", "grads": "grads_bytes", "master": "master_bytes", "optimizer": "optimizer_bytes"}


def checks(tour) -> list[Check]:
    from coursekit.memory.deepspeed import deepspeed_bytes
    from coursekit.models import param_numels
    from coursekit.zero.sweep import run_sweep

    stages = (2,) if tour.quick else (1, 2, 3)
    tour.say(f"  running DeepSpeed ZeRO {', '.join(map(str, stages))} on 2 processes (one launch)")
    rows = run_sweep([{"name": f"zero{s}", "stage": s} for s in stages], nproc=2, steps=tour.steps, seq=tour.seq,
                     global_batch=8, timeout=tour.timeout, per_rank=True)
    numels = param_numels("tiny-llama")
    ddp = tour.ddp()[0]  # Module 1's run: the sweep trains from seed 0 too
    out = []
    for i, s in enumerate(stages):
        want = [deepspeed_bytes(numels, stage=s, world=2, rank=r, dtype="fp32") for r in range(2)]
        got = [{k: rows[r][i][v] for k, v in CATS.items()} for r in range(2)]
        ok = all(got[r] == {k: want[r][k] for k in CATS} for r in range(2))
        held = " / ".join(f"{sum(g.values()):,}" for g in got)
        pred = " / ".join(f"{sum(want[r][k] for k in CATS):,}" for r in range(2))
        out.append(Check(2, f"ZeRO-{s} bytes held, rank 0 / 1", pred + " B", held + " B (to the byte per category)",
                         ok))
        local = [st["local_loss"] for st in ddp["steps"]]  # the sweep reports rank 0's own loss
        worst = max(abs(a - b) for a, b in zip(rows[0][i]["losses"], local))
        out.append(Check(2, f"ZeRO-{s} losses = DDP (rank 0)", "= DDP", f"max |Δloss| {worst:.1e}", worst <= 1e-5))
    return out
