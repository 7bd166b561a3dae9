"""Module 3 in ``coursekit demo``: FSDP2's per-rank bytes against ``coursekit memory --engine fsdp2``, its losses
against one process's, and a DCP checkpoint saved on 2 ranks and resumed on 1."""
from __future__ import annotations

import tempfile

from coursekit.tour import Check

MODULE, TITLE = 3, "FSDP2 and DCP checkpoints"  # found by coursekit.tour.discover()


def checks(tour) -> list[Check]:
    from coursekit.memory import estimate

    # one FSDP2 run of the first half of the steps, saving a DCP checkpoint at its end: its bytes and losses are
    # checked, then one process resumes from the checkpoint and runs the second half
    half = tour.steps // 2
    with tempfile.TemporaryDirectory(prefix="coursekit-tour-dcp-") as d:
        recs = tour.train("fsdp2", 2, "--steps", half, "--ckpt-dir", d)
        resumed = tour.train("single", 1, "--ckpt-dir", d)[0]
    e = estimate("tiny-llama", micro_batch=4, seq=tour.seq, dtype="fp32", precision="fp32", strategy="fsdp2",
                 dp_shard=2)
    want = [e.categories["parameters"], e.categories["gradients"], e.categories["optimizer_states"]]
    out = []
    for r in recs:
        f = r["final"]
        got = [f["params_bytes"], f["grads_bytes"], f["optimizer_bytes"]]
        out.append(Check(3, f"FSDP2 rank {r['rank']}: params / grads / optimizer",
                         " / ".join(f"{x:,}" for x in want) + " B", " / ".join(f"{x:,}" for x in got) + " B held",
                         got == want))
    out.append(tour.equal_losses(3, f"FSDP2 on 2 processes = 1 process (steps 0-{half - 1})", recs))
    base = tour.losses(tour.single())[half:]
    worst = max(abs(a - b) for a, b in zip(tour.losses(resumed), base))
    ok = resumed["final"]["resumed_from_step"] == half and len(resumed["steps"]) == len(base) and worst <= 1e-5
    out.append(Check(3, f"DCP: saved by FSDP2 on 2 ranks, resumed on 1", f"steps {half}.. = uninterrupted",
                     f"resumed at {resumed['final']['resumed_from_step']}, max |Δloss| {worst:.1e}", ok))
    return out
