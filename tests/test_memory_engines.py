"""The calculator's engines: one protocol (a new engine needs no calculator edit), and the ``ddp`` engine checked
against live runs — the trainer's DDP to the byte, and DDP's buckets as torch allocates them."""
from __future__ import annotations

import textwrap

import pytest

from coursekit.memory import PRESETS, engines, estimate, preset
from coursekit.memory.engines.ddp import DDP

MODEL, SEQ, GLOBAL_BATCH = "tiny-llama", 32, 8


def test_a_new_engine_needs_only_a_module_and_a_registry_line(monkeypatch):
    """What the calculator reports comes from the engine it asks: an engine that replicates like DDP but keeps one
    extra bucket of 1000 bytes changes exactly that category and every phase; options it does not take are refused."""
    class OneBucket(DDP):
        name = "one-bucket"

        def buckets(self, c, P, params, largest_unit):
            return 1000, 1000

    monkeypatch.setitem(engines.REGISTRY, "one-bucket", OneBucket())
    kw = dict(batch=2, seq=SEQ, dp=2, dtype="fp32")
    ddp, new = estimate(MODEL, engine="ddp", **kw), estimate(MODEL, engine="one-bucket", **kw)
    assert new.categories == {**ddp.categories, "communication_buckets": 1000}
    assert {k: v - ddp.phases[k] for k, v in new.phases.items()} == dict.fromkeys(ddp.phases, 1000)
    with pytest.raises(ValueError, match="zero stages are DeepSpeed's; engine 'one-bucket'"):
        estimate(MODEL, engine="one-bucket", zero=1, **kw)


def predicted(dtype: str, precision: str | None, world: int) -> dict:
    e = estimate(MODEL, batch=GLOBAL_BATCH // world, seq=SEQ, dtype=dtype, precision=precision, engine="ddp",
                 dp=world).categories
    return {"params_bytes": e["parameters"], "grads_bytes": e["gradients"],
            "master_bytes": e["master_weights"], "optimizer_bytes": e["optimizer_states"]}


def test_trainer_ddp_bf16_autocast_is_fp32_states_to_the_byte(no_orphans):
    """``coursekit train --strategy ddp --dtype bf16`` is autocast with fp32 master weights: the calculator's
    ``precision="fp32", dtype="bf16"`` predicts what every rank holds after the last step, to the byte. The
    calculator's bf16 default for ``engine="ddp"`` (16Ψ: bf16 weights and grads + an fp32 master) is DeepSpeed's
    layout, not the trainer's: the same total, split differently; ``strategy="ddp"`` means the trainer's run."""
    from coursekit.launch import launch

    res = launch("coursekit.train", ["--strategy", "ddp", "--steps", "2", "--model", MODEL, "--seq", str(SEQ),
                                     "--global-batch", str(GLOBAL_BATCH), "--dtype", "bf16", "--quiet"],
                 nproc=2, timeout=240, stream=False)
    want = predicted("bf16", "fp32", 2)
    assert want["master_bytes"] == 0  # the fp32 weights are their own master copy
    n = preset(MODEL).num_params()
    assert want["params_bytes"] == want["grads_bytes"] == 4 * n
    for rank, rec in enumerate(res.results):  # every rank: DDP replicates
        f = rec["final"]
        assert rec["rank"] == rank and f["dtype"] == "bf16" and f["micro_batch"] == GLOBAL_BATCH // 2
        assert {k: f[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")} == {
            k: want[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")}
    default = predicted("bf16", None, 2)
    assert default["params_bytes"] == 2 * n != res.results[0]["final"]["params_bytes"]
    assert sum(default.values()) == sum(want.values())
    # in the trainer's words the calculator means the trainer's run: --strategy ddp --dtype bf16 is autocast
    e = estimate(MODEL, micro_batch=GLOBAL_BATCH // 2, seq=SEQ, dtype="bf16", strategy="ddp", dp_replicate=2)
    assert e.categories["parameters"] == want["params_bytes"] and e.categories["master_weights"] == 0


@pytest.mark.slow  # ~20-40 s on a shared 2-core machine; the fp32 case is also covered by tests/test_train.py
def test_trainer_ddp_fp32_with_accumulation_to_the_byte(no_orphans):
    from coursekit.launch import launch

    res = launch("coursekit.train", ["--strategy", "ddp", "--steps", "2", "--model", MODEL, "--seq", str(SEQ),
                                     "--global-batch", str(GLOBAL_BATCH), "--grad-accum", "2", "--dtype", "fp32",
                                     "--quiet"], nproc=2, timeout=240, stream=False)
    e = estimate(MODEL, batch=GLOBAL_BATCH // 4, seq=SEQ, dtype="fp32", engine="ddp", dp=2, microbatches=2)
    for rec in res.results:
        f = rec["final"]
        assert (f["params_bytes"], f["grads_bytes"], f["optimizer_bytes"]) == (
            e.categories["parameters"], e.categories["gradients"], e.categories["optimizer_states"])


BUCKETS = textwrap.dedent("""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel
    from coursekit import dist as ckdist
    from coursekit.launch import report
    from coursekit.models import build_model

    def storage(t):
        return t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()

    out = {}
    with ckdist.session(seed=0) as info:
        for view in (True, False):
            model = build_model("tiny-llama", seed=0)
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.1, gradient_as_bucket_view=view)
            buckets = {}
            def hook(state, bucket):
                buckets.__setitem__(*storage(bucket.buffer()))
                return allreduce_hook(None, bucket)
            ddp.register_comm_hook(None, hook)
            ids = torch.randint(0, 256, (2, 32))
            for _ in range(2):  # DDP rebuilds its buckets after the first iteration: look at the second
                buckets.clear()
                ddp(input_ids=ids, labels=ids).loss.backward()
            grads = dict(storage(p.grad) for p in model.parameters())
            out[str(view)] = {"buckets": len(buckets), "bucket_bytes": sum(buckets.values()),
                              "grad_bytes": sum(grads.values()), "grads_in_buckets": set(grads) <= set(buckets),
                              "shared": bool(set(grads) & set(buckets))}
            del ddp
        report(out)
    from coursekit.launch import finish
    finish(0)  # no interpreter teardown of a distributed worker (coursekit.launch.finish)
""")


def test_ddp_buckets_are_the_gradients_with_bucket_views(no_orphans):
    """Live DDP (2 gloo ranks, several 0.1 MB buckets): with ``gradient_as_bucket_view=True`` (the trainer's) every
    ``.grad`` lives in a bucket and the buckets hold exactly the calculator's gradient bytes, nothing more; with
    torch's default the buckets are a second copy, the calculator's communication buckets."""
    from coursekit.launch import launch_code

    res = launch_code(BUCKETS, nproc=2, timeout=240, stream=False)
    kw = dict(batch=2, seq=SEQ, dtype="fp32", engine="ddp", dp=2)
    views, copies = estimate(MODEL, **kw), estimate(MODEL, ddp_bucket_view=False, **kw)
    for rec in res.results:
        on, off = rec["True"], rec["False"]
        assert on["buckets"] > 1 and on["grads_in_buckets"] and on["grad_bytes"] == on["bucket_bytes"]
        assert on["bucket_bytes"] == views.categories["gradients"] and views.categories["communication_buckets"] == 0
        assert not off["shared"] and off["grad_bytes"] == copies.categories["gradients"]
        assert off["bucket_bytes"] == copies.categories["communication_buckets"]
    assert copies.peak_bytes - views.peak_bytes == views.categories["gradients"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fsdp2_layout_lists_every_tensor_of_every_family(name):
    """FSDP2's exact layout shards each tensor on dim 0: its (dim 0, row size) list is the real model's tensors, in
    order, for every family (Qwen3's q/k norms and the 3-D experts included)."""
    from coursekit.memory.engines.fsdp2 import param_dims

    shape = preset(name)
    shape = shape.with_(layers=min(shape.layers, 2))
    assert tuple(d0 * rest for d0, rest in param_dims(shape)) == shape.param_numels()
