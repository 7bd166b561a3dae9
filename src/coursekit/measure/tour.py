"""Module 1 in ``coursekit demo``: the 16Ψ model state and the saved activations of a real model, predicted by the
pure-Python calculator and measured from the tensors; on a live 2-process DDP job, its last step's all-reduce
bytes counted vs the volume model and its peak of saved activations vs the calculator; DDP's losses equal one
process's."""
from __future__ import annotations

from coursekit.tour import Check

MODULE, TITLE = 1, "Memory math and collectives"  # found by coursekit.tour.discover()


def checks(tour) -> list[Check]:
    import torch

    from coursekit.comm import volume
    from coursekit.measure.activations import saved_activation_bytes
    from coursekit.memory import activation_bytes, estimate, preset
    from coursekit.models import build_model

    out = []
    s = tour.single()["final"]
    e = estimate("tiny-llama", micro_batch=8, seq=tour.seq, dtype="fp32", precision="fp32", strategy="single")
    want = e.categories["parameters"] + e.categories["gradients"] + e.categories["optimizer_states"]
    got = s["params_bytes"] + s["grads_bytes"] + s["optimizer_bytes"]
    out.append(Check(1, "model states (fp32 AdamW, 16 B/param)", f"{want:,} B", f"{got:,} B held", want == got))

    m = build_model("tiny-llama", seed=0).train()
    ids = torch.randint(0, 256, (2, tour.seq))
    meas = saved_activation_bytes(m, ids, labels=ids)["total_bytes"]
    pred = activation_bytes(preset("tiny-llama"), 2, tour.seq, dtype="fp32", attention="sdpa", impl="hf",
                            kernels="cpu").total_bytes
    out.append(Check(1, "saved activations, one forward (b=2)", f"{pred:,} B", f"{meas:,} B saved", pred == meas))

    ddp = tour.ddp()  # its last step counted by coursekit.profiling.stepcount (CollectiveCounter)
    f = ddp[0]["final"]
    plan_bytes = volume.payload_bytes(volume.ddp(f["num_params"], 2, grad_bytes=4), "all_reduce")
    got = f["comm"].get("all_reduce", {"bytes": 0, "calls": 0})
    out.append(Check(1, "DDP all-reduce bytes in one step", f"{plan_bytes:,} B", f"{got['bytes']:,} B "
                     f"counted ({got['calls']} bucket{'s' * (got['calls'] != 1)})", plan_bytes == got["bytes"]))
    live = activation_bytes(preset("tiny-llama"), f["micro_batch"], tour.seq, dtype="fp32", attention="sdpa",
                            impl="hf", kernels="cpu", position_ids="per-sequence").total_bytes
    peaks = [r["final"]["peak_saved_bytes"] for r in ddp]
    out.append(Check(1, f"saved activations, DDP step (b={f['micro_batch']})", f"{live:,} B",
                     " / ".join(f"{p:,}" for p in peaks) + " B peak (ranks)", all(p == live for p in peaks)))
    out.append(tour.equal_losses(1, "DDP on 2 processes = 1 process", ddp))
    return out
