"""Module 1 in ``coursekit demo``: the 16Ψ model state and the saved activations of a real model, predicted by the
pure-Python calculator and measured from the tensors; DDP's all-reduce bytes counted on a live job vs the volume
model; DDP's losses equal one process's."""
from __future__ import annotations

from coursekit.tour import Check

MODULE, TITLE = 1, "Memory math and collectives"  # found by coursekit.tour.discover()

DDP_STEP = '''
import torch
from coursekit.comm.counter import CollectiveCounter
from coursekit.dist import session
from coursekit.launch import report
from coursekit.models import build_model
from torch.nn.parallel import DistributedDataParallel
with session(seed=0) as info:
    m = DistributedDataParallel(build_model("tiny-llama", seed=0), bucket_cap_mb=25, gradient_as_bucket_view=True)
    ids = torch.randint(0, 256, (2, 32))
    with CollectiveCounter() as cc:
        m(input_ids=ids).logits.float().pow(2).mean().backward()
    report({"all_reduce_bytes": cc.total_bytes("all_reduce"), "calls": cc.calls("all_reduce"),
            "num_params": sum(p.numel() for p in m.parameters())})
    del m
'''


def checks(tour) -> list[Check]:
    import torch

    from coursekit.comm import volume
    from coursekit.launch import launch_code
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

    r = launch_code(DDP_STEP, nproc=2, timeout=tour.timeout, stream=False).results[0]
    plan_bytes = volume.payload_bytes(volume.ddp(r["num_params"], 2, grad_bytes=4), "all_reduce")
    out.append(Check(1, "DDP all-reduce bytes in one backward", f"{plan_bytes:,} B", f"{r['all_reduce_bytes']:,} B "
                     f"counted ({r['calls']} buckets)", plan_bytes == r["all_reduce_bytes"]))
    out.append(tour.equal_losses(1, "DDP on 2 processes = 1 process", tour.train("ddp", 2)))
    return out
