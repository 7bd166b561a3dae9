"""Context-parallel attention (coursekit.cp): Ulysses and Ring Attention equal full attention, forward and backward.

One 4-process gloo launch runs every check and reports them all: CP degree 2 (two independent pairs, ranks {0,1}
and {2,3}, in sub-groups) and CP degree 4 (the world), MHA / GQA / MQA, causal (plus a non-causal and a bf16 case). The
reference is ``F.scaled_dot_product_attention`` on the full sequence in each process, from the same seeds; each rank
compares its own rows. Also: the comm counted by ``CollectiveCounter`` equals ``coursekit.comm.volume``'s model,
zig-zag ring ranks compute equal numbers of scores (contiguous ones do not), Ulysses equals DeepSpeed's
``DistributedAttention`` and ``UlyssesSPAttentionHF`` on the same inputs, saved activation bytes per rank equal
``coursekit.cp.probe.modelled_bytes``, and torch's experimental ``context_parallel`` still has no CPU causal path.

Tolerances, and why:
  * vs full SDPA, 1e-5 absolute (fp32; values and gradients are O(1)): ring computes softmax blockwise in another
    summation order (online log-sum-exp), and Ulysses' SDPA sees the same rows as the reference but in a
    different batch of heads; seen: ≤ 1.5e-6. One bf16 case per impl, against fp32 SDPA on the same bf16 numbers:
    1e-2 of the largest value: outputs and gradients are rounded to bf16 (2^-9 relative) and Ulysses' bf16 SDPA
    rounds inside; seen: 3e-3 ring, 4.8e-3 Ulysses.
  * Ulysses vs DeepSpeed: bit-identical. Both run the same SDPA kernel on the same numbers; all-to-alls only move
    data, and the K/V replication is the same repeat_interleave.
  * bytes and call counts: exact.

This file is also the worker (run under torchrun by the tests).
"""
import sys
import time
from pathlib import Path

import pytest

B, SEQ, D = 2, 32, 8  # SEQ divisible by 2·C for C = 2 and 4
HEADS = [(4, 4), (8, 2), (4, 1)]  # MHA; GQA (kvh = C at C=2, < C at C=4: replicated); MQA
TOL = 1e-5


# -- worker side -------------------------------------------------------------------------------------------------
def _inputs(a, kvh, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed + 10 * a + kvh)
    q, k, v = (torch.randn(B, n, SEQ, D, generator=g) for n in (a, kvh, kvh))
    return q, k, v, torch.randn(B, a, SEQ, D, generator=g)


def _reference(q, k, v, do, causal):
    import torch.nn.functional as F

    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    out.backward(do)
    return [out.detach(), q.grad, k.grad, v.grad]


def _err(x, y) -> float:
    return float((x.detach() - y.detach()).abs().max())


def _equality_cases(cp, group):
    """Every impl x heads case against full SDPA: errors, comm plan, score counts."""
    import torch
    import torch.distributed as dist

    from coursekit.comm.counter import CollectiveCounter
    from coursekit.cp.ring import ring_attention
    from coursekit.cp.shard import shard
    from coursekit.cp.ulysses import ulysses_attention

    r = dist.get_rank(group)
    cases = [(a, kvh, True, "float32") for a, kvh in HEADS] + [(8, 2, False, "float32"), (8, 2, True, "bfloat16")]
    out = []
    for a, kvh, causal, dtype in cases:
        # bf16: the reference is fp32 SDPA on the same bf16-rounded numbers; errors are relative to its largest value
        q, k, v, do = (t.to(getattr(torch, dtype)) for t in _inputs(a, kvh))
        ref = _reference(*(t.float() for t in (q, k, v, do)), causal)
        scales = [1.0] * 4 if dtype == "float32" else [float(t.abs().max()) for t in ref]
        for impl, layout in [("ulysses", "contiguous"), ("ring", "zigzag"), ("ring", "contiguous")]:
            sh = lambda t, layout=layout: shard(t, cp, r, layout=layout, dim=2)  # noqa: E731
            ql, kl, vl = (sh(t).requires_grad_() for t in (q, k, v))
            stats = {}
            with CollectiveCounter() as cc:
                if impl == "ring":
                    o = ring_attention(ql, kl, vl, group=group, causal=causal, layout=layout, stats=stats)
                else:
                    o = ulysses_attention(ql, kl, vl, group=group, causal=causal)
                o.backward(sh(do))
            errs = [_err(x.float(), sh(y)) / sc for x, y, sc in zip([o, ql.grad, kl.grad, vl.grad], ref, scales)]
            assert o.dtype == ql.grad.dtype == kl.grad.dtype == q.dtype
            out.append({"impl": impl, "layout": layout, "cp": cp, "cp_rank": r, "heads": a, "kv_heads": kvh,
                        "causal": causal, "dtype": dtype, "errors": errs, "stats": stats,
                        "plan": [c.__dict__ for c in cc.as_plan()], "ops": sorted({x.impl for x in cc.records})})
    return out


def _deepspeed_cases(cp, group):
    """Our Ulysses vs DeepSpeed's two Ulysses front ends, same shards, forward and backward."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from deepspeed.sequence.layer import DistributedAttention

    from coursekit.cp.shard import shard
    from coursekit.cp.ulysses import ulysses_attention

    r = dist.get_rank(group)
    out = []
    for a, kvh in HEADS:
        q, k, v, do = _inputs(a, kvh)
        sh = lambda t: shard(t, cp, r, layout="contiguous", dim=2)  # noqa: E731
        ours = [sh(t).requires_grad_() for t in (q, k, v)]
        o = ulysses_attention(*ours, group=group)
        o.backward(sh(do))
        rec = {"cp": cp, "heads": a, "kv_heads": kvh}

        def local(qh, kh, vh):  # DeepSpeed hands over (b, s, heads/C, d)
            o_ = F.scaled_dot_product_attention(qh.transpose(1, 2), kh.transpose(1, 2), vh.transpose(1, 2),
                                                is_causal=True, enable_gqa=qh.shape[2] != kh.shape[2])
            return o_.transpose(1, 2)

        theirs = [sh(t).transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]  # (b, s/C, h, d)
        if kvh < cp:  # DistributedAttention refuses (before any collective, on every rank alike): no replication
            try:
                DistributedAttention(local, group, scatter_idx=2, gather_idx=1)(*theirs, batch_dim_idx=0)
            except AssertionError as e:
                rec["DistributedAttention_refuses"] = str(e)
        else:
            o2 = DistributedAttention(local, group, scatter_idx=2, gather_idx=1)(*theirs, batch_dim_idx=0)
            o2.backward(sh(do).transpose(1, 2))
            rec["DistributedAttention"] = [torch.equal(o.detach(), o2.detach().transpose(1, 2))] + [
                torch.equal(x.grad, y.grad.transpose(1, 2)) for x, y in zip(ours, theirs)]

        class Module(torch.nn.Module):  # what UlyssesSPAttentionHF reads (and rewrites) on the HF attention module
            num_key_value_groups = a // kvh

        def hf_sdpa(module, qh, kh, vh, mask, *args, **kwargs):  # HF attention-interface signature
            o_ = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=qh.shape[1] != kh.shape[1])
            return o_.transpose(1, 2), None

        hf = UlyssesSPAttentionHF(hf_sdpa, batch_size=B, attn_head_count=a, attn_head_size=D, kv_head_count=kvh,
                                  num_hidden_layers=1, process_group=group, seq_length_is_variable=True)
        theirs = [sh(t).requires_grad_() for t in (q, k, v)]
        pos = shard(torch.arange(SEQ).expand(B, SEQ), cp, r, layout="contiguous", dim=1).contiguous()
        o3, _ = hf(Module(), *theirs, None, position_ids=pos)
        o3 = o3.view(B, SEQ // cp, a, D).transpose(1, 2)
        o3.backward(sh(do))
        rec["UlyssesSPAttentionHF"] = [torch.equal(o.detach(), o3.detach())] + [
            torch.equal(x.grad, y.grad) for x, y in zip(ours, theirs)]
        out.append(rec)
    return out


def _saved_bytes_cases(cp, group):
    """Saved activation bytes of one attention block per rank, per impl and heads case."""
    import torch
    import torch.distributed as dist

    from coursekit.cp.probe import AttentionBlock, measured_bytes
    from coursekit.cp.ring import ring_attention
    from coursekit.cp.shard import layout_for, shard
    from coursekit.cp.ulysses import ulysses_attention

    r = dist.get_rank(group)
    fns = {"ring": lambda q, k, v: ring_attention(q, k, v, group=group),
           "ulysses": lambda q, k, v: ulysses_attention(q, k, v, group=group)}
    out = []
    for a, kvh in HEADS:
        x = torch.randn(B, SEQ, a * D, generator=torch.Generator().manual_seed(1))
        for impl, fn in fns.items():
            torch.manual_seed(0)
            block = AttentionBlock(a * D, a, kvh, fn)
            m = measured_bytes(block, shard(x, cp, r, layout=layout_for(impl), dim=1))
            out.append({"impl": impl, "cp": cp, "heads": a, "kv_heads": kvh, **m})
    return out


def _llama_cases(cp, group):
    """A tiny HF Llama (GQA) with CP attention and sharded ids/labels/positions vs the same model in one process."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from coursekit.cp.hf import use_cp_attention
    from coursekit.cp.shard import layout_for, next_token_labels, shard_batch

    r = dist.get_rank(group)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, attn_implementation="sdpa")
    ids = torch.randint(0, 256, (B, SEQ), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg)
    loss_ref = ref(input_ids=ids, labels=ids).loss  # HF shifts inside: the plain single-process run
    loss_ref.backward()
    out = []
    for impl in ("ulysses", "ring"):
        torch.manual_seed(0)
        model = use_cp_attention(LlamaForCausalLM(cfg), impl, group)
        b = shard_batch(ids, cp, r, layout=layout_for(impl))
        n = int((next_token_labels(ids) != -100).sum())  # the global count: each rank's loss is its share
        loss = model(input_ids=b["input_ids"], position_ids=b["position_ids"], labels=b["shift_labels"],
                     shift_labels=b["shift_labels"], num_items_in_batch=n).loss
        loss.backward()
        loss = loss.detach()
        dist.all_reduce(loss, group=group)
        grad_err = 0.0
        for p, p_ref in zip(model.parameters(), ref.parameters()):
            dist.all_reduce(p.grad, group=group)  # every CP rank holds part of the gradient (its tokens')
            grad_err = max(grad_err, _err(p.grad, p_ref.grad))
        out.append({"impl": impl, "cp": cp, "loss": loss.item(), "loss_ref": loss_ref.item(), "grad_err": grad_err})
    return out


def _torch_context_parallel_on_cpu():
    """torch's experimental context_parallel with causal SDPA on CPU: run it, or record why it cannot."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    from coursekit.cp.shard import shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    q, k, v, _ = _inputs(4, 4)
    ref = _reference(q, k, v, q, True)[0]
    buffers = [t.clone() for t in (q, k, v)]  # sharded in place by context_parallel; must not require grad
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            o = F.scaled_dot_product_attention(*buffers, is_causal=True)
        # its default load balancer is head-tail, like our zig-zag
        return {"ran": True, "error": _err(o, shard(ref, mesh.size(), dist.get_rank(), layout="zigzag", dim=2))}
    except Exception as e:  # noqa: BLE001 — the exception is the finding
        return {"ran": False, "type": type(e).__name__, "message": str(e).splitlines()[0]}


def _llama_worker() -> None:
    import torch.distributed as dist

    from coursekit import dist as ckdist
    from coursekit.launch import report

    with ckdist.session(seed=0) as info:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        report({"rank": info.rank, "llama": _llama_cases(2, pairs[info.rank // 2]) + _llama_cases(4, None)})


def _worker() -> None:
    import torch.distributed as dist

    from coursekit import dist as ckdist
    from coursekit.launch import report
    from coursekit.zero.strategy import _import_deepspeed  # CPU accelerator, no shm comm op build

    with ckdist.session(seed=0) as info:
        assert info.world_size == 4, "the CP checks run on 4 processes: two CP-2 pairs and one CP-4 group"
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
        ds = _import_deepspeed(info.device)
        ds.init_distributed(dist_backend="gloo")  # DeepSpeed adopts the initialised torch group
        rec = {"rank": info.rank, "equality": [], "deepspeed": [], "saved": [], "seconds": {}}
        t = time.perf_counter()
        for cp, group in ((2, pairs[info.rank // 2]), (4, dist.group.WORLD)):
            for key, cases in (("equality", _equality_cases), ("deepspeed", _deepspeed_cases),
                               ("saved", _saved_bytes_cases)):
                rec[key] += cases(cp, group)
                rec["seconds"][f"{key}@{cp}"], t = time.perf_counter() - t, time.perf_counter()
        rec["torch_cp"] = _torch_context_parallel_on_cpu()
        rec["seconds"]["torch_cp"] = time.perf_counter() - t
        report(rec)


# -- test side ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cp_run():
    from coursekit.launch import launch

    return launch(str(Path(__file__).resolve()), nproc=4, timeout=240, stream=False).results


def _all(cp_run, key):
    return [c | {"rank": r["rank"]} for r in cp_run for c in r[key]]


def test_cp_attention_equals_full_attention_forward_and_backward(cp_run, no_orphans):
    cases = _all(cp_run, "equality")
    # 4 ranks x 2 CP degrees x (3 causal + 1 non-causal + 1 bf16 cases) x (ulysses, ring zig-zag, ring contiguous)
    assert len(cases) == 4 * 2 * 5 * 3
    for c in cases:
        # out, dq, dk, dv; bf16: relative to the largest value, a few bf16 roundings (2^-8 each) of O(1) terms
        assert max(c["errors"]) <= (TOL if c["dtype"] == "float32" else 1e-2), c
    assert {(c["cp"], c["heads"], c["kv_heads"]) for c in cases} >= {(2, 8, 2), (4, 8, 2), (4, 4, 1), (2, 4, 4)}


def test_cp_comm_counted_equals_the_volume_model(cp_run):
    from coursekit.comm import volume

    for c in _all(cp_run, "equality"):
        act = 4 if c["dtype"] == "float32" else 2  # ring's dK/dV accumulators travel in fp32 either way
        if c["impl"] == "ulysses":
            model = volume.ulysses_attention(B, SEQ, c["heads"], c["kv_heads"], D, c["cp"], act_bytes=act)
            assert c["ops"] == ["c10d::alltoall_base_"], c["ops"]
        else:
            model = volume.ring_attention(B, SEQ, c["kv_heads"], D, c["cp"], act_bytes=act, grad_bytes=4)
            assert c["ops"] == ["c10d::recv_", "c10d::send"], c["ops"]  # batch_isend_irecv's p2p ops
        assert [volume.Collective(**p) for p in c["plan"]] == model, c
    # the statement, for MHA: 4 all-to-alls of b·s·h/C elements per layer forward
    fwd = volume.ulysses_attention(B, SEQ, 4, 4, D, 4, act_bytes=1, backward=False)
    assert fwd == [volume.Collective("all_to_all", B * SEQ * 4 * D // 4, 4, 4)]
    # ring: C-1 K/V block exchanges forward, each K and V of s/C tokens
    block = 2 * B * 2 * SEQ // 4 * D  # K and V, 2 K/V heads, s/C tokens
    assert volume.ring_attention(B, SEQ, 2, D, 4, act_bytes=1, backward=False) == [
        volume.Collective("recv", block, 3, 4), volume.Collective("send", block, 3, 4)]


def test_ring_zigzag_balances_causal_work(cp_run):
    rings = [c for c in _all(cp_run, "equality") if c["impl"] == "ring" and c["causal"]]
    for cp in (2, 4):
        s = SEQ // cp  # rows per rank
        zig = [c["stats"] for c in rings if c["cp"] == cp and c["layout"] == "zigzag"]
        # one (s x s) causal diagonal block and C-1 half blocks (s x s/2) per rank, forward and backward alike
        assert all(st == {"fwd_scores": s * s + (cp - 1) * s * s // 2, "bwd_scores": s * s + (cp - 1) * s * s // 2}
                   for st in zig), zig
        # contiguous chunks: rank r computes r + 1 blocks of s x s — rank C-1 does C times rank 0's work
        for c in rings:
            if c["cp"] == cp and c["layout"] == "contiguous":
                assert c["stats"]["fwd_scores"] == (c["cp_rank"] + 1) * s * s, c
        # both layouts compute the same total: the causal triangle in blocks, no more
        total = lambda lay, cp=cp: sum(c["stats"]["fwd_scores"] for c in rings  # noqa: E731
                                       if c["cp"] == cp and c["layout"] == lay and c["rank"] < cp
                                       and c["heads"] == 4 and c["kv_heads"] == 4)
        assert total("zigzag") == total("contiguous") == cp * (cp + 1) // 2 * s * s


def test_ulysses_equals_deepspeed(cp_run):
    recs = _all(cp_run, "deepspeed")
    assert len(recs) == 4 * 2 * len(HEADS)
    for r in recs:
        assert r["UlyssesSPAttentionHF"] == [True] * 4, r  # out, dq, dk, dv bit-identical; kv replicated below C
        if r["kv_heads"] >= r["cp"]:
            assert r["DistributedAttention"] == [True] * 4, r
        else:  # DeepSpeed's older front end does not replicate K/V heads; its HF front end (and ours) does
            assert "must be at least the sequence parallel size" in r["DistributedAttention_refuses"], r
    # DistributedAttention ran where kv_heads >= C: MHA and GQA (kvh 2) at C=2, MHA at C=4 — on each of 4 ranks
    assert sum("DistributedAttention" in r for r in recs) == 4 * 3


def test_saved_activation_bytes_per_cp_rank(cp_run):
    from coursekit.cp.probe import modelled_bytes

    for r in _all(cp_run, "saved"):
        m = modelled_bytes(r["impl"], batch=B, seq=SEQ, hidden=r["heads"] * D, heads=r["heads"],
                           kv_heads=r["kv_heads"], cp=r["cp"])
        # measured = derived by hand = what the calculator's --cp C --cp-impl IMPL counts
        assert r["attention"] == m["attention"] == m["calculator"], (r, m)
        if r["impl"] == "ring":  # the flash terms at s/C; o_proj saves the output's own storage
            assert m["ulysses_extra"] == 0 and r["o_proj_input"] == 0, r
        else:  # SDPA's head-sharded output and o_proj's input are two storages of n·a·d each
            assert r["o_proj_input"] == B * SEQ // r["cp"] * r["heads"] * D * 4, r
    kinds = {(r["cp"], r["kv_heads"] < r["cp"]) for r in _all(cp_run, "saved") if r["impl"] == "ulysses"}
    assert kinds == {(2, False), (2, True), (4, False), (4, True)}  # with and without replicated K/V heads


@pytest.mark.slow  # transformers in 4 more processes: ~15 s of CPU on top of the launch above
def test_llama_with_cp_attention_equals_single_process(no_orphans):
    from coursekit.launch import launch

    res = launch(str(Path(__file__).resolve()), ["llama"], nproc=4, timeout=240, stream=False).results
    recs = _all(res, "llama")
    assert {(r["impl"], r["cp"]) for r in recs} == {(i, c) for i in ("ulysses", "ring") for c in (2, 4)}
    for r in recs:
        # the loss is a sum over ranks of per-token terms in another order: fp32 rounding only
        assert abs(r["loss"] - r["loss_ref"]) <= 1e-5 and r["grad_err"] <= TOL, r


def test_torch_context_parallel_has_no_cpu_causal_path(cp_run):
    for r in cp_run:
        t = r["torch_cp"]
        if t["ran"]:  # torch gained a CPU path: then it must be right (and the GPU-only test can run here too)
            assert t["error"] <= TOL, t
        else:
            assert t["type"] == "NotImplementedError", t
            assert "_scaled_dot_product_flash_attention_for_cpu" in t["message"], t


def test_shard_layouts_roundtrip():
    import torch

    from coursekit.cp import shard as S

    x = torch.arange(2 * 16).view(2, 16)
    assert S.shard(x, 2, 0, layout="zigzag")[0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]  # chunks 0 and 3 of 4
    assert S.shard(x, 2, 1, layout="zigzag")[0].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]  # chunks 1 and 2
    for layout in S.LAYOUTS:
        for cp in (1, 2, 4):
            parts = [S.shard(x, cp, r, layout=layout) for r in range(cp)]
            assert torch.equal(S.unshard(parts, layout=layout), x)
    b = S.shard_batch(x, 2, 1, layout="zigzag")
    assert b["position_ids"][1].tolist() == list(range(4, 12))
    assert torch.equal(b["input_ids"], S.shard(x, 2, 1))
    assert b["shift_labels"][0].tolist() == list(range(5, 13))  # next tokens, shifted before sharding
    assert S.shard_batch(x, 2, 0)["shift_labels"][0, -1] == -100  # the last position of the sequence
    with pytest.raises(ValueError, match="divisible by 8"):
        S.shard(torch.zeros(1, 12), 4, 0, layout="zigzag")
    assert [S.layout_for(i) for i in ("ulysses", "ring")] == ["contiguous", "zigzag"]


@pytest.mark.slow  # one more 2-process launch (~8 s idle) for a script whose parts the launch above already checks
def test_bench_cp_quick(no_orphans, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_cp", Path(__file__).resolve().parents[1] / "bench/bench_cp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--quick", "--nproc", "2"])
    assert {(r["seq"], r["impl"]) for r in rows} == {(s, i) for s in (32, 64) for i in ("ulysses", "ring")}
    for r in rows:
        assert r["sent_bytes"] == r["sent_model"] and r["saved_bytes"] == r["saved_model"] and r["ms"] > 0, r
    assert "fwd+bwd ms" in capsys.readouterr().out


# -- GPU: torch's context_parallel next to ours, where it runs ------------------------------------------------------
def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _gpu_worker() -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    from coursekit import dist as ckdist
    from coursekit.cp.ring import ring_attention
    from coursekit.cp.shard import gather, shard
    from coursekit.cp.ulysses import ulysses_attention
    from coursekit.launch import report

    with ckdist.session(seed=0) as info:
        cp, r, dev = info.world_size, info.rank, info.device
        mesh = init_device_mesh("cuda", (cp,))
        q, k, v, do = (t.to(dev) for t in _inputs(8, 8))
        ref = _reference(q, k, v, do, True)
        buffers = [t.clone() for t in (q, k, v)]
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            o_torch = F.scaled_dot_product_attention(*buffers, is_causal=True)
        o_torch = context_parallel_unshard(mesh, [o_torch], [2])[0]
        ql, kl, vl = (shard(t, cp, r, dim=2).requires_grad_() for t in (q, k, v))
        o = ring_attention(ql, kl, vl)
        o.backward(shard(do, cp, r, dim=2))
        o_full = gather(o.detach(), layout="zigzag", dim=2)
        o_uly = ulysses_attention(*(shard(t, cp, r, layout="contiguous", dim=2) for t in (q, k, v)))
        o_uly = gather(o_uly, layout="contiguous", dim=2)
        report({"torch_vs_ref": _err(o_torch, ref[0]), "ours_vs_torch": _err(o_full, o_torch),
                "ulysses_vs_torch": _err(o_uly, o_torch),
                "grads": [_err(x.grad, shard(y, cp, r, dim=2)) for x, y in zip((ql, kl, vl), ref[1:])],
                "device": dev, "backend": dist.get_backend()})


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_count() < 2, reason="needs 2 CUDA GPUs (NCCL): torch 2.13's context_parallel has no CPU "
                    "path for causal attention (no sharding rule for aten._scaled_dot_product_flash_attention_for_cpu;"
                    " checked on CPU by test_torch_context_parallel_has_no_cpu_causal_path)")
def test_ring_equals_torch_context_parallel_on_gpus(no_orphans):
    from coursekit.launch import launch

    # conftest defaults COURSEKIT_DEVICE to cpu for every other test; this one is about the GPUs
    res = launch(str(Path(__file__).resolve()), ["gpu"], nproc=2, timeout=300, stream=False,
                 env={"COURSEKIT_DEVICE": "cuda"})
    for rec in res.results:
        assert rec["device"].startswith("cuda") and rec["backend"] == "nccl"
        assert rec["torch_vs_ref"] <= TOL and rec["ours_vs_torch"] <= TOL and rec["ulysses_vs_torch"] <= TOL, rec
        assert max(rec["grads"]) <= TOL, rec


if __name__ == "__main__":
    from coursekit.launch import finish

    finish({"gpu": _gpu_worker, "llama": _llama_worker}.get(sys.argv[1] if sys.argv[1:] else "", _worker)())
