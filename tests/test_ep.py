"""Expert parallelism: the hand-written dispatch and combine equal transformers' experts, and the trainer with
``--ep`` equals one process.

1. The dispatch (``coursekit.ep.dispatch.ExpertShard``) on 2 and 4 ranks against transformers' own fused experts
   module on the whole batch, forward and backward, for routings chosen to be hard: an expert no token picks and
   one every token picks (top-1), random top-2, top-8 of 8 (every expert gets every token), and a capacity factor
   that drops choices (the dropped count is the one the capacity rule gives). Every all-to-all the step issues is
   counted (``CollectiveCounter``) and equals ``coursekit.comm.volume.moe_all_to_all`` of the router's counts.
2. ``coursekit train --ep`` (DDP over 2 ranks, EP 2; DDP over 4, EP 4; FSDP2 over 4 with EP 2, so each expert slice
   is also sharded over 2 ranks) equals the single-process run step by step on every rank (Qwen3-MoE and Mixtral
   tiny models; the router's auxiliary loss off, since it is a product of batch means, not a mean).
3. DCP checkpoints with ``--ep``: saved, resumed (FSDP2 also onto fewer replicas), equal to one process; another
   ``--ep`` on resume is refused naming the saved one.
4. Bad input is refused before launch in one line.

This file is also the worker of part 1 (run under torchrun).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from parity import assert_equal_to_single, baseline, train

H, F, E, T = 16, 8, 8, 12  # hidden, expert width, experts, tokens per rank
CASES = {  # name -> (top_k, routing, capacity factor)
    "one-expert-takes-all": (1, "skewed", None),
    "random-top2": (2, "random", None),
    "top8-of-8": (8, "all", None),
    "capacity-drops": (2, "skewed", 1.0),
}


def _routing(kind: str, k: int, n_tokens: int, gen):
    import torch

    if kind == "all":
        idx = torch.stack([torch.randperm(E, generator=gen) for _ in range(n_tokens)])
    elif kind == "skewed":  # every token picks expert 1 first; expert 0 is never picked
        rest = torch.stack([torch.randperm(E - 2, generator=gen)[: k - 1] + 2 for _ in range(n_tokens)])
        idx = torch.cat([torch.ones(n_tokens, 1, dtype=torch.long), rest], 1)
    else:
        idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(n_tokens)])
    w = torch.rand(n_tokens, k, generator=gen)
    return idx, w / w.sum(1, keepdim=True)


def _experts():
    """transformers' own fused experts module (Qwen3-MoE's: 3-D gate_up_proj / down_proj), random weights."""
    import torch
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=2)
    m = Qwen3MoeExperts(cfg)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        m.gate_up_proj.copy_(torch.randn(m.gate_up_proj.shape, generator=g) * 0.3)
        m.down_proj.copy_(torch.randn(m.down_proj.shape, generator=g) * 0.3)
    return m


def _case(name, rank, n, group):
    import torch

    from coursekit.comm.counter import CollectiveCounter
    from coursekit.ep.dispatch import ExpertShard

    k, kind, cf = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    x = torch.randn(n * T, H, generator=gen)
    idx, w = _routing(kind, k, n * T, gen)
    gout = torch.randn(n * T, H, generator=gen)
    ref = _experts()
    mine = slice(rank * T, (rank + 1) * T)
    keep_w = w.clone()
    if cf is not None:  # the reference drops the same choices: each rank's first `capacity` per expert
        cap = math.ceil(cf * T * k / E)
        for r in range(n):
            seen = [0] * E
            for t in range(r * T, (r + 1) * T):
                for j in range(k):
                    e = int(idx[t, j])
                    seen[e] += 1
                    if seen[e] > cap:
                        keep_w[t, j] = 0.0
    xr, wr = x.clone().requires_grad_(), keep_w.clone().requires_grad_()
    (ref(xr, idx, wr) * gout).sum().backward()
    shard = ExpertShard(_experts(), group=group, rank=rank, size=n, capacity_factor=cf)
    xs, ws = x[mine].clone().requires_grad_(), w[mine].clone().requires_grad_()
    with CollectiveCounter() as cc:
        out = shard(xs, idx[mine], ws)
        (out * gout[mine]).sum().backward()
    with torch.no_grad():
        want = ref(x, idx, keep_w)[mine]
    sl = slice(shard.first, shard.first + shard.local)
    # relative to the reference's largest magnitude: a weight gradient sums every rank's tokens in another order
    # than one process does (fp32 rounding ~1e-7 of the largest term); a wrong row, split or weight is off by O(1)
    err = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp(min=1.0))  # noqa: E731
    rec = {"out": err(out, want), "dx": err(xs.grad, xr.grad[mine]),
           "d_gate_up": err(shard.gate_up_proj.grad, ref.gate_up_proj.grad[sl]),
           "d_down": err(shard.down_proj.grad, ref.down_proj.grad[sl]),
           "counts": torch.bincount(idx[mine].reshape(-1), minlength=E).tolist(), "dropped": shard.dropped,
           "a2a": [[c.op, c.bytes, c.group_size] for c in cc.as_plan()]}
    kept = keep_w[mine] != 0  # a dropped choice's weight gets no gradient here (its expert never ran)
    rec["dw"] = max(err(ws.grad[kept], wr.grad[mine][kept]), float(ws.grad[~kept].abs().max()) if (~kept).any() else 0)
    return rec


def _worker() -> None:
    import torch.distributed as dist

    from coursekit import dist as ckdist
    from coursekit.launch import report

    with ckdist.session(seed=0) as info:
        report({name: _case(name, info.rank, info.world_size, dist.group.WORLD) for name in CASES})


def _max_rel(a, b) -> float:
    scale = max(1e-12, max(abs(x) for x in b))
    return max(abs(x - y) for x, y in zip(a, b)) / scale


def _expected_a2a(counts, n, k, cf):
    """The volume model of one forward + backward from every rank's router counts (after the capacity drop)."""
    from coursekit.comm import volume

    if cf is not None:
        cap = math.ceil(cf * T * k / E)
        counts = [[min(c, cap) for c in rank] for rank in counts]
    send, recv = volume.expert_rows(counts, n)
    return [[[c.op, c.bytes, c.group_size] for c in volume.moe_all_to_all(send[r], recv[r], H, E, n)]
            for r in range(n)]


@pytest.mark.parametrize("nproc", [2, 4])
def test_dispatch_and_combine_equal_transformers_experts(nproc, no_orphans):
    from coursekit.launch import launch

    res = launch(str(Path(__file__).resolve()), nproc=nproc, timeout=180, stream=False).results
    for name, (k, kind, cf) in CASES.items():
        recs = [r[name] for r in res]
        for rank, rec in enumerate(recs):
            for key in ("out", "dx", "d_gate_up", "d_down", "dw"):
                assert rec[key] <= 1e-6, (name, rank, key, rec[key])
            assert sum(rec["counts"]) == T * k
        counts = [rec["counts"] for rec in recs]
        if kind == "skewed":
            assert all(c[0] == 0 and c[1] == T for c in counts), counts  # none for expert 0, all for expert 1
        if cf is not None:
            cap = math.ceil(cf * T * k / E)
            assert [rec["dropped"] for rec in recs] == [[sum(max(0, c - cap) for c in cs)] for cs in counts]
            assert all(rec["dropped"][0] > 0 for rec in recs)
        assert [rec["a2a"] for rec in recs] == _expected_a2a(counts, nproc, k, cf), name


MOE = ("--router-aux-loss-coef", "0")


# default-tier budget: 4 ranks with ep_rest 2 run in the slow tier; dp2xcp2-ep2 (4 ranks, ep_rest 2) stays
@pytest.mark.parametrize("strategy, nproc, extra", [
    ("ddp", 2, ()),
    pytest.param("ddp", 4, (), marks=pytest.mark.slow),
    ("ddp", 4, ("--cp", "2")),
    ("ddp", 4, ("--tp", "2")),
    pytest.param("fsdp2", 4, ("--tp", "2"), marks=pytest.mark.slow),  # default tier: ddp's tp case, fsdp2-ep below
    ("ddp", 4, ("--pp", "2", "--pp-schedule", "gpipe")),
    ("ddp", 2, ("--recompute", "full")),
    pytest.param("ddp", 4, ("--tp", "2", "--sp"), marks=pytest.mark.slow),  # default tier: the SP trainer case below
    # default tier: fsdp2's trainer case below (HSDP shards the expert slices through the same split_modules path)
    pytest.param("hsdp", 4, ("--dp-replicate", "2", "--dp-shard", "2"), marks=pytest.mark.slow),
], ids=["ddp2-ep2", "ddp4-ep2", "dp2xcp2-ep2", "dp2xtp2-ep2", "fsdp2-dp2xtp2-ep2", "pp2xdp2-ep2", "ep2-recompute",
        "dp2xtp2-sp-ep2", "hsdp2x2-ep2"])
def test_every_gradient_equals_one_process(strategy, nproc, extra, no_orphans):
    """Adam is blind to a uniformly scaled gradient (a missing 1/ep would still train 'equal to one process'), so
    the gradients themselves: after one backward and the strategy's reduction, every dense parameter's gradient and
    every expert slice's equal the one-process gradient (of the whole batch) and its slice, within 2e-6; also with
    context parallelism, whose ranks EP borrows as well, and with tensor parallelism, whose ranks split the sparse
    block's tokens (router and expert gradients summed over them; without that sum they are each rank's part); with
    pipeline stages (each stage's experts split over the data ranks of that stage) and with full recompute (the
    dispatch and combine run again in backward, with the same splits); with HSDP (EP borrows the shard ranks; each
    expert slice is sharded over the replicate ranks that hold it)."""
    from parity import assert_grads_equal_one_process

    assert_grads_equal_one_process(["--model", "tiny-qwen3-moe", *MOE], strategy, nproc, layout=["--ep", 2, *extra])


# default-tier budget: ep 4 on 4 ranks is slow-tier (the dispatch test runs ep 4; the FSDP2 case runs 4 ranks)
# TP x EP (dp2 x tp2, ep 2 over the data ranks): the TP ranks split each sparse block's tokens
@pytest.mark.parametrize("strategy, nproc, ep, model, tp, sp", [
    ("ddp", 2, 2, "tiny-qwen3-moe", 1, False),
    pytest.param("ddp", 4, 4, "tiny-qwen3-moe", 1, False, marks=pytest.mark.slow),
    ("fsdp2", 4, 2, "tiny-mixtral", 1, False),
    ("ddp", 4, 2, "tiny-qwen3-moe", 2, False),
    ("ddp", 4, 2, "tiny-mixtral", 2, True),
])
def test_trainer_with_ep_equals_one_process(strategy, nproc, ep, model, tp, sp, no_orphans):
    """Equal to one process; and on the counted (last) step every rank's all-to-all bytes equal the volume model of
    the router counts the ranks recorded (its EP group: the ranks of its TP coordinate), and its peak of saved
    activations equals the calculator's for the rows its experts received (uneven: the router is random); with TP
    each rank routes 1/tp of the tokens (under SP the tokens its residual stream holds)."""
    from coursekit.comm import volume
    from coursekit.memory import activation_bytes, estimate, preset
    from coursekit.spec.dims import ParallelDims

    base = baseline("--model", model, *MOE)
    res = train(strategy, nproc, "--model", model, "--ep", ep, "--tp", tp, "--count-step", *MOE, *["--sp"] * sp)
    assert_equal_to_single(res, base, nproc)
    shape, recs = preset(model), res.results
    last = [r["steps"][-1]["expert_tokens"] for r in recs]  # [rank][layer][expert]
    # ep borrows the data ranks of one TP coordinate: with tp 2 on 4 ranks, {0, 2} and {1, 3} (tp is innermost)
    groups = [[g * ep * tp + i * tp + c for i in range(ep)] for g in range(nproc // (ep * tp)) for c in range(tp)]
    assert sorted(map(sorted, ParallelDims(world_size=nproc, tp=tp, ep=ep).groups("ep"))) == sorted(groups)
    for rank, rec in enumerate(recs):
        f, step = rec["final"], rec["steps"][-1]
        n = f["micro_batch"] * f["seq"] // tp
        assert all(sum(layer) == n * shape.top_k for layer in step["expert_tokens"])
        assert step["expert_tokens_all_ranks"] == [[sum(c[l][e] for c in last) for e in range(shape.experts)]
                                                  for l in range(shape.layers)]
        group = next(g for g in groups if rank in g)
        me = group.index(rank)
        plan, rows = volume.moe_step([last[r] for r in group], me, shape.hidden, shape.experts)
        want = volume.payload_bytes(plan)
        assert f["comm"]["all_to_all"]["bytes"] == want
        reports = [activation_bytes(shape, f["micro_batch"], f["seq"], dtype="fp32", attention="sdpa", impl="hf",
                                    kernels="cpu", position_ids="per-sequence", ep=ep, tp=tp, sp=sp, expert_rows=r)
                   for r in rows]
        assert f["peak_saved_bytes"] == sum(x.layer_bytes for x in reports) + sum(reports[0].model.values())
        assert rows != [n * shape.top_k] * shape.layers or ep == 1  # the split really was uneven somewhere
        # the model states this rank holds: the dense parameters whole (DDP) or 1/N (FSDP2), its experts' slices
        e = estimate(model, batch=f["micro_batch"], seq=f["seq"], dtype="fp32", strategy=strategy, dp=nproc // tp,
                     tp=tp, ep=ep, aux_loss=False, kernels="cpu", position_ids="per-sequence").to_dict()
        # (under TP embedding and head split over the vocabulary, coursekit.tp.vocab, as the calculator has them)
        assert {k: f[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")} == {
            "params_bytes": e["parameters_bytes"], "grads_bytes": e["gradients_bytes"],
            "optimizer_bytes": e["optimizer_states_bytes"]}, rank


def _resumed_equal(res, base, half):
    from parity import LOSS_ATOL, losses

    for r in res.results:
        assert r["final"]["resumed_from_step"] == half, r["rank"]
        assert losses(r) == pytest.approx(losses(base)[half:], abs=LOSS_ATOL), r["rank"]


@pytest.mark.parametrize("strategy, saved_on, resumed_on, model", [("ddp", 2, 2, "tiny-qwen3-moe"),
                                                                  ("fsdp2", 4, 2, "tiny-mixtral")],
                         ids=["ddp2-ep2", "fsdp2-4to2-ep2"])
def test_dcp_checkpoint_with_ep_resumes_equal_to_one_process(strategy, saved_on, resumed_on, model, tmp_path,
                                                             no_orphans):
    """Each EP rank's expert slice is saved under its own key (``coursekit.parallel.split.slice_keys``; under one
    FQN rank 1's slice would be overwritten by rank 0's and the resumed losses would move). Saved at step 2 of 4,
    resumed: the last two steps equal the uninterrupted single-process run. FSDP2 saved on 4 ranks (each slice
    sharded over its 2 replicas) resumes on 2 (one replica: the slice's shards are read whole)."""
    from parity import STEPS

    half, args = STEPS // 2, ("--model", model, "--ep", 2, *MOE, "--ckpt-dir", tmp_path)
    base = baseline("--model", model, *MOE)
    train(strategy, saved_on, *args, "--steps", half, "--save-every", half)
    _resumed_equal(train(strategy, resumed_on, *args), base, half)
    if strategy == "ddp":  # another number of slices is refused before anything is loaded, naming the --ep to use
        from coursekit.launch import LaunchError

        with pytest.raises(LaunchError, match="saved with --ep 2.*this run's are not split: resume with the same --ep"):
            train(strategy, 2, "--model", model, *MOE, "--ckpt-dir", tmp_path, "--steps", STEPS + 1)


def test_expert_slice_keys_round_trip_and_their_count_is_checked():
    """The key format and its check without a launch: a slice key names its slice, undoing it restores every
    model and optimizer entry, and a checkpoint of n slices is refused for m != n (and for an unsplit run)."""
    import torch

    from coursekit.parallel import split

    t = torch.zeros(1)
    model_sd = {"layers.0.mlp.experts.down_proj@slice1of4": t, "layers.0.norm.weight": t}
    optim_sd = {"state": {"layers.0.mlp.experts.down_proj@slice1of4": {"exp_avg": t}}, "param_groups": []}
    split.unslice_keys(model_sd, optim_sd)
    assert set(model_sd) == {"layers.0.mlp.experts.down_proj", "layers.0.norm.weight"}
    assert set(optim_sd["state"]) == {"layers.0.mlp.experts.down_proj"}
    saved = ["model.layers.0.mlp.experts.down_proj@slice3of4", "optim.state.layers.0.mlp.experts.x@slice0of4.exp_avg",
             "model.layers.0.norm.weight"]
    split.check_slices(saved, ["layers.0.mlp.experts.down_proj@slice0of4"])  # same count: fine, whichever slice
    with pytest.raises(ValueError, match=r"4 slices \(saved with --ep 4\); this run's are 2 slices"):
        split.check_slices(saved, ["layers.0.mlp.experts.down_proj@slice1of2"])
    with pytest.raises(ValueError, match="not split \\(saved with --ep 1\\); this run's are 2 slices"):
        split.check_slices(["model.layers.0.mlp.experts.down_proj"], ["x@slice0of2"])
    split.check_slices(["model.a", "model.b"], ["a", "b"])  # a dense run: nothing to check


@pytest.mark.parametrize("args, needle", [
    (["--model", "tiny-qwen3-moe", "--ep", "3", "--nproc", "3", "--global-batch", "6"],
     "--ep 3 does not divide the 4 experts"),
    (["--model", "tiny-llama", "--ep", "2", "--nproc", "2"], "--ep 2 needs a mixture-of-experts model"),
    (["--model", "tiny-qwen3-moe", "--ep", "4", "--nproc", "2"], "ep 4 does not divide the 2 ranks it borrows"),
    (["--model", "tiny-qwen3-moe", "--ep", "2", "--nproc", "2", "--capacity-factor", "0"],
     "--capacity-factor must be > 0"),
    (["--model", "tiny-qwen3-moe", "--ep", "2", "--nproc", "4", "--pp", "2"],  # the config's coefficient is > 0
     "--pp 2 on a mixture-of-experts model: the load-balancing loss .* pass --router-aux-loss-coef 0"),
    (["--model", "tiny-qwen3-moe", "--ep", "2", "--nproc", "2", "--compile", *MOE], "--ep with --compile"),
    (["--model", "tiny-llama", "--router-aux-loss-coef", "0.1"], "applies to mixture-of-experts models"),
    (["--model", "tiny-qwen3-moe", "--nproc", "2", "--tp", "2"],  # the config's own coefficient is > 0
     "--tp 2 on a mixture-of-experts model: the load-balancing loss .* pass --router-aux-loss-coef 0"),
    (["--model", "tiny-qwen3-moe", "--nproc", "4", "--tp", "4", "--seq", "30", *MOE],
     "sequence per CP rank \\(30\\) must be divisible by it"),
])
def test_bad_ep_input_is_refused_before_launch(args, needle):
    from coursekit.train.launcher import plan

    with pytest.raises(ValueError, match=needle):
        plan(["--strategy", "ddp", *args])


def test_a_router_asking_more_experts_than_exist_is_refused_before_launch(tmp_path):
    import json

    from coursekit.memory import preset, to_hf_config_dict
    from coursekit.train.launcher import plan

    path = tmp_path / "moe.json"
    path.write_text(json.dumps(to_hf_config_dict(preset("tiny-qwen3-moe")) | {"num_experts_per_tok": 5}))
    with pytest.raises(ValueError, match="top_k 5 is more than the 4 experts"):
        plan(["--strategy", "ddp", "--nproc", "2", "--model", str(path), "--ep", "2"])
    with pytest.raises(ValueError, match="top_k 5 is more than the 4 experts"):
        plan(["--strategy", "single", "--model", str(path)])


def test_cli_refuses_ep_in_one_line_with_exit_2():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--strategy", "ddp", "--nproc", "2",
                          "--model", "tiny-qwen3-moe", "--ep", "3", "--global-batch", "6"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "ep 3 does not divide" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(_worker())  # no interpreter teardown of a distributed worker (see coursekit.launch.finish)


def test_layout_shows_the_ep_groups_borrowed_from_the_data_ranks(capsys):
    """``coursekit layout --ep`` (pure Python): EP groups are the innermost ep ranks of the loss group; the ranks
    holding the same experts (ep_rest) are every ep-th; a degree that does not divide the loss ranks is refused."""
    import json

    from coursekit.layout_cli import main
    from coursekit.parallel import ParallelDims

    assert main(["--nproc", "8", "--ep", "2", "--tp", "2", "--strategy", "fsdp2", "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert [r["groups"]["ep"] for r in ranks[:4]] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["coords"]["ep"] for r in ranks] == [0, 0, 1, 1, 0, 0, 1, 1]
    dims = ParallelDims(world_size=8, tp=2, ep=2, dp_flavour="shard")
    assert dims.group(0, "ep_rest") == [0, 4] and dims.size("ep_rest") == 2 and dims.world_size == 8
    with pytest.raises(ValueError, match="ep 3 does not divide the 8 ranks it borrows"):  # the CLI: exit 2
        main(["--nproc", "8", "--ep", "3", "--strategy", "fsdp2"])
