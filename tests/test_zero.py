"""ZeRO 0-3 through DeepSpeed in the reference trainer: equal to DDP, bytes as predicted, collectives as modelled.

Runs (module-scoped, shared by the tests): DDP and ZeRO 0-3 on 2 ranks in fp32 with 2 micro-batches per step (so
DeepSpeed's gradient accumulation is exercised), ZeRO-3 on 2 and ZeRO 1-3 on 4 ranks in bf16, ZeRO-2 / ZeRO-3
with CPU offload, and ZeRO-3 stepping several sub-groups. Every rank is checked. Default tier: 9 launches (about
2.5 minutes on 2 idle cores), among them a sweep; the slow tier adds seven (ZeRO-0, ZeRO 1-3 bf16 at 4 ranks, ZeRO-3
offload, tiny-gpt2 at 3 ranks, an odd llama at 4 ranks).
"""
import json
import re
import subprocess
import sys

import pytest

from coursekit.launch import launch
from coursekit.memory import deepspeed as layout
from coursekit.models import param_numels
from coursekit.zero import collectives as comm
from coursekit.zero.ds_config import CONFIG_DIR, build_config, save_config

STEPS = 4  # ZeRO-3 settles from the third step (its parameter trace); the last step is measured and counted
COMMON = ["--model", "tiny-llama", "--steps", str(STEPS), "--seq", "32", "--global-batch", "8", "--quiet",
          "--seed", "3"]
# name -> (stage, nproc, dtype, grad_accum, config): config None = configs/deepspeed/zero<stage>.json through
# --strategy zero<stage>; a dict = build_config keywords, written to a JSON and run through --strategy deepspeed.
RUNS = {
    "zero0-2-fp32": (0, 2, "fp32", 2, None),
    "zero1-2-fp32": (1, 2, "fp32", 2, None),
    # a learner's JSON: no gradient_clipping (the trainer makes 0.0 explicit), small buckets (several reduces)
    "zero2-2-fp32": (2, 2, "fp32", 2, dict(reduce_bucket_size=20_000, drop=("gradient_clipping",))),
    "zero3-2-fp32": (3, 2, "fp32", 2, None),
    **{f"zero{s}-4-bf16": (s, 4, "bf16", 1, None) for s in (1, 2, 3)},
    "zero3-2-bf16": (3, 2, "bf16", 1, None),  # the default tier's bf16 ZeRO run (the 4-rank ones: slow tier)
    # ZeRO-Offload to the CPU with the trainer's torch AdamW (DeepSpeedCPUAdam needs a ~60 s build: slow tier)
    "zero2-offload-2-fp32": (2, 2, "fp32", 2, dict(offload_optimizer="cpu", ds_optimizer=False)),
    "zero3-offload-2-fp32": (3, 2, "fp32", 2, dict(offload_optimizer="cpu", offload_param="cpu", ds_optimizer=False)),
    # ZeRO-3 stepping several sub-groups (a "zero" entry: keys written into zero_optimization); its own test
    "zero3-subgroups-2-fp32": (3, 2, "fp32", 2, dict(zero={"sub_group_size": 20_000})),
}
# runs checked by a test of their own, not by the parametrized ones below (see that test's docstring)
OWN_TEST = {"zero3-subgroups-2-fp32"}
# in the slow tier (scripts/test.sh --slow) to keep the default run short; the slow tier also runs ZeRO-3 offload
# with DeepSpeedCPUAdam (test_zero_offload.py)
SLOW = {"zero0-2-fp32", "zero1-2-fp32", "zero1-4-bf16", "zero2-4-bf16", "zero3-4-bf16", "zero3-offload-2-fp32"}
# zero0, zero1 and the 4-rank bf16 runs: the default tier's budget (~15-30 s a launch); fp32 ZeRO 2-3, offload, ZeRO-3
# bf16 on 2 ranks stay there


def _names(keep=lambda name: True):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(RUNS)
            if keep(n) and n not in OWN_TEST]


# fp32 tolerance: DeepSpeed divides each gradient bucket by N and reduces it in other buckets and another order than
# DDP's reducer, so results differ by float rounding only (~1e-7 relative per step, compounding through Adam); 1e-5
# absolute on a loss of ~5.5 and 1e-6 relative on Σw² catch any real error (a wrong averaging factor, clipping left
# on, a lost micro-batch move them by >1e-3).
LOSS_ATOL = 1e-5


def _train(strategy, nproc, dtype, grad_accum, *extra):
    return launch("coursekit.train", ["--strategy", strategy, *COMMON, "--dtype", dtype, "--grad-accum",
                                      str(grad_accum), *extra], nproc=nproc, timeout=240, stream=False).results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def get(name):
        if name in cache:
            return cache[name]
        if name == "ddp":
            cache[name] = _train("ddp", 2, "fp32", 2)
            return cache[name]
        stage, n, dtype, m, cfg = RUNS[name]
        if cfg is None:
            cache[name] = _train(f"zero{stage}", n, dtype, m)
        else:
            kw = {k: v for k, v in cfg.items() if k not in ("drop", "zero")}
            c = build_config(stage, dtype=dtype, **kw)
            for k in cfg.get("drop", ()):
                c.pop(k)
            c["zero_optimization"].update(cfg.get("zero", {}))
            path = save_config(c, tmp_path_factory.mktemp("cfg") / f"{name}.json")
            cache[name] = _train("deepspeed", n, dtype, m, "--ds-config", path)
        return cache[name]

    return get


def _offload(name):
    cfg = RUNS[name][4] or {}
    return dict(offload_optimizer=cfg.get("offload_optimizer", "none"), offload_param=cfg.get("offload_param", "none"))


def _losses(rec):
    return [s["loss"] for s in rec["steps"]]


# -- 1. equivalence ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", _names(lambda n: n.endswith("fp32")))
def test_zero_equals_ddp_step_by_step(runs, name, no_orphans):
    ddp = runs("ddp")[0]
    recs = runs(name)
    for rank, rec in enumerate(recs):
        f = rec["final"]
        assert rec["rank"] == rank and f["zero_stage"] == RUNS[name][0]
        assert f["ds_config"]["gradient_clipping"] == 0.0  # DeepSpeed's default would clip (1.0)
        assert f["ds_config"]["gradient_accumulation_steps"] == 2 and f["micro_batch"] == 2
        assert _losses(rec) == pytest.approx(_losses(ddp), abs=LOSS_ATOL)
        assert f["param_sq_sum"] == pytest.approx(ddp["final"]["param_sq_sum"], rel=1e-6)
        assert f["param_sq_sum"] == recs[0]["final"]["param_sq_sum"]  # every rank holds the same model
    assert _losses(ddp)[-1] < _losses(ddp)[0]


@pytest.mark.parametrize("name", _names(lambda n: n.endswith("bf16")))
def test_bf16_zero_trains_and_ranks_agree(runs, name, no_orphans):
    """bf16 rounds differently from fp32 DDP, so no step-by-step equality: the loss falls, every rank reports the
    same loss and holds the same model, and it stays within bf16's drift of fp32 DDP (a wrong scale or a lost
    gradient moves the loss by far more than 0.05 in 4 steps)."""
    recs, ddp = runs(name), runs("ddp")[0]
    for rec in recs:
        assert _losses(rec)[-1] < _losses(rec)[0]
        assert _losses(rec) == _losses(recs[0])
        assert rec["final"]["param_sq_sum"] == recs[0]["final"]["param_sq_sum"]
    assert _losses(recs[0]) == pytest.approx(_losses(ddp), abs=0.05)


# -- 2. measured bytes == DeepSpeed's layout, every rank ---------------------------------------------------------------
FIELDS = {"params": "params_bytes", "grads": "grads_bytes", "master": "master_bytes", "optimizer": "optimizer_bytes",
          "fp32_grads": "fp32_grads_bytes", "buffers": "buffers_bytes", "scalars": "scalars_bytes",
          "grads_peak": "grads_peak_bytes"}


@pytest.mark.parametrize("name", _names())
def test_held_bytes_equal_deepspeed_layout(runs, name, no_orphans):
    stage, n, dtype, _, _ = RUNS[name]
    numels = param_numels("tiny-llama")
    for rank, rec in enumerate(runs(name)):
        f = rec["final"]
        assert f["num_params"] == sum(numels)
        assert f["other_bytes"] == 0, f"unclassified DeepSpeed tensors: {f['zero_held']}"
        want = layout.deepspeed_bytes(numels, stage=stage, world=n, rank=rank, dtype=dtype,
                                      micro_batches=RUNS[name][3], **_offload(name))
        got = {k: f[v] for k, v in FIELDS.items() if want[k] is not None}
        assert got == {k: want[k] for k in got}, f"rank {rank}"
        # where DeepSpeed keeps each category: on CPU its declared offload placement (zero/held.py: _on_host), on
        # GPUs the tensors' devices
        assert f["tiers"] == want["tiers"], f"rank {rank}: where DeepSpeed keeps each category"


# -- 3. measured bytes == `coursekit memory` ---------------------------------------------------------------------------
def memory_cli(stage, n, dtype, micro_batch, micro_batches, rank=None, offload_optimizer="none",
               offload_param="none", reduce_bucket_size=500_000, sub_group_size=None):
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "memory", "--model", "tiny-llama", "--batch",
                          str(micro_batch), "--seq", "32", "--dtype", dtype, "--dp", str(n), "--zero", str(stage),
                          "--microbatches", str(micro_batches), "--offload", offload_optimizer, "--offload-params",
                          offload_param, "--reduce-bucket-size", str(reduce_bucket_size), "--json",
                          *([] if rank is None else ["--dp-rank", str(rank)]),
                          *([] if sub_group_size is None else ["--sub-group-size", str(sub_group_size)])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def measured_vs_calculator(f, calc) -> dict:
    """(measured, predicted) per category, on the accelerator, plus everything offload put on the host. Gradients:
    the calculator's ZeRO-0/1 figure is the whole gradient held through backward (the peak, before DeepSpeed's
    end-of-backward reduction); its ZeRO-2/3 figure is the partition held at the end of backward. Buffers: ZeRO-3's
    reduce bucket, allocated whole up front (ZeRO-1/2 hold theirs only while reducing)."""
    acc = f["tiers"].get("accelerator", {})
    grads = f["grads_peak_bytes"] if f["zero_stage"] <= 1 else acc.get("grads", 0)
    bucket = {"communication_buckets": (acc.get("buffers", 0), calc["communication_buckets_bytes"])}
    return (bucket if f["zero_stage"] == 3 else {}) | {"parameters": (acc.get("params", 0), calc["parameters_bytes"]),
            "gradients": (grads, calc["gradients_bytes"]),
            "master_weights": (acc.get("master", 0), calc["master_weights_bytes"]),
            "optimizer_states": (acc.get("optimizer", 0), calc["optimizer_states_bytes"]),
            "step_grad_copy": (acc.get("fp32_grads", 0), calc["step_grad_copy_bytes"]),
            "cpu": (f["cpu_bytes"], calc["cpu_bytes"])}


@pytest.mark.parametrize("name", _names())
def test_held_bytes_equal_coursekit_memory(runs, name, no_orphans):
    stage, n, dtype, m, _ = RUNS[name]
    recs = runs(name)
    for rank, rec in enumerate(recs):
        f = rec["final"]
        assert f["other_bytes"] == 0, f"unclassified DeepSpeed tensors: {f['zero_held']}"
        bucket = f["ds_config"]["zero_optimization"].get("reduce_bucket_size", 500_000_000)  # DeepSpeed's default
        calc = memory_cli(stage, n, dtype, f["micro_batch"], m, rank, **_offload(name), reduce_bucket_size=bucket)
        assert calc["dp_rank"] == rank
        got = measured_vs_calculator(f, calc)
        assert {k: v[0] for k, v in got.items()} == {k: v[1] for k, v in got.items()}, f"rank {rank}"
    if stage == 2 and "offload" not in name:  # ranks differ; without --dp-rank the calculator reports the fullest
        fullest = memory_cli(stage, n, dtype, recs[0]["final"]["micro_batch"], m)
        assert fullest["gradients_bytes"] == max(r["final"]["grads_bytes"] for r in recs)


def test_zero3_steps_one_sub_group_of_fp32_gradients_at_a_time(runs, no_orphans):
    """ZeRO-3 with ``sub_group_size`` 20,000: each rank's 62,624-element partition of tiny-llama packs into three
    sub-groups (DeepSpeed's ``_create_fp16_sub_groups``; hand-worked in test_zero_config.py), and ``stage3.step``
    builds, steps and frees one sub-group's fp32 gradients at a time. Measured: the trainer snapshots what the engine
    holds after each sub-group's inner optimizer step, inside the only window in which that sub-group's fp32
    gradients exist (``_prepare_sub_group`` .. ``_release_sub_group``), and keeps each category's maximum: the peak
    over the step. On every rank it equals `coursekit memory --sub-group-size` (the largest sub-group) and is below
    the whole partition's (the formula before); the rest of what DeepSpeed holds equals its layout, the losses DDP's.
    Where each category is kept (per tier) is also each category's maximum over the sub-groups (``_max_merge``
    merges the nested tiers too; it used to keep the last sub-group's split). Not in the parametrized tests: the
    gradient norm is all-reduced once per sub-group."""
    stage, n, dtype, m, cfg = RUNS["zero3-subgroups-2-fp32"]
    numels = param_numels("tiny-llama")
    all_at_once = 4 * sum(layout.zero3_partitions(numels, n))
    ddp = runs("ddp")[0]
    for rank, rec in enumerate(runs("zero3-subgroups-2-fp32")):
        f = rec["final"]
        assert f["zero_stage"] == 3 and f["ds_config"]["zero_optimization"]["sub_group_size"] == 20_000
        assert f["other_bytes"] == 0, f"unclassified DeepSpeed tensors: {f['zero_held']}"
        calc = memory_cli(stage, n, dtype, f["micro_batch"], m, rank, sub_group_size=20_000)
        assert f["fp32_grads_bytes"] == calc["step_grad_copy_bytes"] < all_at_once, f"rank {rank}"
        got = measured_vs_calculator(f, calc) | {"step_grad_copy": (f["fp32_grads_bytes"],
                                                                    calc["step_grad_copy_bytes"])}
        assert {k: v[0] for k, v in got.items()} == {k: v[1] for k, v in got.items()}, f"rank {rank}"
        want = layout.deepspeed_bytes(numels, stage=3, world=n, rank=rank, micro_batches=m, sub_group_size=20_000)
        assert {k: f[v] for k, v in FIELDS.items()} == {k: want[k] for k in FIELDS}, f"rank {rank}"
        assert f["tiers"] == want["tiers"], f"rank {rank}: where DeepSpeed keeps each category, at its peak"
        assert _losses(rec) == pytest.approx(_losses(ddp), abs=LOSS_ATOL)  # sub-groups change memory, not results


_OFF = {"offload_optimizer": "cpu", "ds_optimizer": False}
SMALL_GRID = [{"name": "z0-bf16", "stage": 0, "dtype": "bf16"}, {"name": "z1", "stage": 1}, {"name": "z2", "stage": 2},
              {"name": "z3", "stage": 3}, {"name": "z2-bf16", "stage": 2, "dtype": "bf16"},
              {"name": "z1-off", "stage": 1, **_OFF}, {"name": "z2-off", "stage": 2, **_OFF},
              {"name": "z3-off", "stage": 3, "offload_param": "cpu", **_OFF}]
FULL_GRID = [{"name": f"z{s}-{dt}{'-off' if off else ''}", "stage": s, "dtype": dt,
              **((_OFF | ({"offload_param": "cpu"} if s == 3 else {})) if off else {})}
             for dt in ("fp32", "bf16") for s in range(4) for off in ((False, True) if s else (False,))]
# a llama with biases, a tied head, GQA and sizes that are multiples of nothing in particular
ODD_LLAMA = {"model_type": "llama", "hidden_size": 60, "intermediate_size": 201, "num_hidden_layers": 2,
             "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 301, "max_position_embeddings": 64,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_dropout": 0.0, "attention_bias": True,
             "mlp_bias": True}


@pytest.mark.parametrize("model,n,points", [
    pytest.param("tiny-gpt2", 3, SMALL_GRID, marks=pytest.mark.slow, id="tiny-gpt2-3"),  # default-tier budget: ~25 s
    pytest.param(ODD_LLAMA, 4, FULL_GRID, marks=pytest.mark.slow, id="odd-llama-4-full"),
])
def test_other_models_and_world_sizes_match_coursekit_memory(model, n, points, tmp_path, no_orphans):
    """Other tensor lists (tiny-gpt2: tied head, biases, LayerNorms; an odd llama) on other world sizes (Ψ not a
    multiple of 2N: padding; other boundaries straddled), fp32 and bf16, with and without CPU offload: every rank,
    every category, against DeepSpeed's layout and against `coursekit memory`; and the collectives of each step."""
    from coursekit.memory import estimate, resolve_model
    from coursekit.models import build_model
    from coursekit.zero.sweep import run_sweep

    if isinstance(model, dict):
        (tmp_path / "config.json").write_text(json.dumps(model))
        model = str(tmp_path / "config.json")
    numels = [p.numel() for p in build_model(model, device="meta").parameters()]
    tied = resolve_model(model).tied_embeddings
    assert sum(numels) % (2 * n)
    per_rank = run_sweep(points, nproc=n, steps=3, seq=16, global_batch=2 * n, model=model, per_rank=True)
    grads = {}
    for rank, rows in enumerate(per_rank):
        for pt, row in zip(points, rows):
            where = (pt["name"], rank)
            want = layout.deepspeed_bytes(numels, stage=pt["stage"], world=n, rank=rank, dtype=pt.get("dtype", "fp32"),
                                          offload_optimizer=pt.get("offload_optimizer", "none"),
                                          offload_param=pt.get("offload_param", "none"))
            fields = {k: v for k, v in FIELDS.items() if k != "scalars" and want[k] is not None}
            assert {k: row[v] for k, v in fields.items()} == {k: want[k] for k in fields}, where
            assert row["tiers"] == want["tiers"], where
            e = estimate(model, batch=2, seq=16, dtype=pt.get("dtype", "fp32"), dp=n, zero=pt["stage"],
                         offload=pt.get("offload_optimizer", "none"), offload_params=pt.get("offload_param", "none"),
                         microbatches=1, dp_rank=rank, bucket_elems=500_000)  # build_config's reduce_bucket_size
            got = measured_vs_calculator(row | {"zero_stage": row["stage"]}, e.to_dict())
            assert {k: v[0] for k, v in got.items()} == {k: v[1] for k, v in got.items()}, where
            grads.setdefault(pt["name"], set()).add(row["grads_bytes"])
            # collectives, padding and the tied embedding's second gather (the head) included
            ops = comm.expected(pt["stage"], sum(numels), n, elem_bytes=2 if pt.get("dtype") == "bf16" else 4,
                                numels=numels, reused=numels[:1] if tied else ())
            assert {op: v["bytes"] for op, v in row["ops"].items()} == ops, where
    assert len(next(g for name, g in grads.items() if name.startswith("z2"))) > 1  # the ranks really differ


# -- 4. collectives per step == the volume model -----------------------------------------------------------------------
@pytest.mark.parametrize("name", _names())
def test_collectives_equal_volume_model(runs, name, no_orphans):
    _, n, dtype, m, _ = RUNS[name]
    b = 4 if dtype == "fp32" else 2
    for rec in runs(name):
        f = rec["final"]
        psi, stage, coll = f["num_params"], f["zero_stage"], f["collectives"]
        want = comm.expected(stage, psi, n, elem_bytes=b, micro_batches=m)
        assert comm.measured(coll) == want
        # the paper's per-step volume in Ψ: ZeRO-2 reduces every micro-batch, ZeRO-3 gathers twice per micro-batch
        assert comm.paper_volume(want, psi, b) == {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[stage]
        # what is left out, exactly: the gradient norm (fp32 in stages 1-2 and under offload, fp64 in stage 3) and,
        # in bf16 stages 1-2, a one-byte overflow flag; stage 0 issues nothing else
        scalars = [(c["op"], c["bytes"], c["count"]) for c in comm.scalar_calls(coll)]
        norm = 8 if stage == 3 and "offload" not in name else 4
        flag = [("all_reduce", 1, 1)] if dtype == "bf16" and stage in (1, 2) else []
        assert scalars == ([] if stage == 0 else flag + [("all_reduce", norm, 1)])


# -- 5. input a learner gets wrong: refused before DeepSpeed starts ------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["--strategy", "deepspeed"], "pass --ds-config"),
    (["--strategy", "zero2", "--ds-config", str(CONFIG_DIR / "zero3.json")], "use --strategy zero3"),
    (["--strategy", "zero1", "--bucket-mb", "1"], "--bucket-mb belongs to ddp, which this run does not use"),
    (["--strategy", "zero1", "--ckpt-dir", "x"], "--strategy zero1 does not support checkpoint"),
    (["--strategy", "zero3", "--compile"], "--strategy zero3 does not support compile"),
    (["--strategy", "zero2", "--tp", "2"], "--strategy zero2 does not support tp"),
    (["--strategy", "zero1", "--ds-config", "nope.json"], "no such DeepSpeed config"),
])
def test_bad_zero_input_gives_a_clear_error(args, needle):
    """Refused by the checks `coursekit train` runs before launching anything (no process group, no DeepSpeed)."""
    from coursekit.train.launcher import plan

    with pytest.raises((ValueError, FileNotFoundError), match=re.escape(needle)):
        plan(["--nproc", "2", *args])


# -- 6. sweeps (the lab's bucket sweep, bench/bench_zero.py) -----------------------------------------------------------
@pytest.mark.parametrize("zero,needle", [
    ({"stage": 7}, "zero_optimization.stage: Input should be 0, 1, 2"),
    ({"stage": 2, "reduce_bucket_sizee": 5e8}, "zero_optimization.reduce_bucket_sizee: Extra inputs are not permitted"),
    ({"stage": 2, "overlap_comm": "sometimes"}, "zero_optimization.overlap_comm: Input should be a valid boolean"),
    ("stage 2", "zero_optimization must be a JSON object"),
])
def test_a_users_deepspeed_config_is_checked_with_deepspeeds_schema_before_launch(tmp_path, zero, needle):
    """A --ds-config of the user's own is read with DeepSpeed's pydantic models (its stage, its key names, its
    types) by the checks before launching: one line naming the field, not a traceback on every rank."""
    from coursekit.train.launcher import plan

    cfg = tmp_path / "mine.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}))
    with pytest.raises(ValueError, match=re.escape(f"--ds-config {cfg}: {needle}")):
        plan(["--nproc", "2", "--strategy", "deepspeed", "--ds-config", str(cfg)])
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}))
    plan(["--nproc", "2", "--strategy", "deepspeed", "--ds-config", str(ok)])  # a valid one passes


def test_sweep_builds_several_engines_in_one_launch(no_orphans):
    from coursekit.zero.sweep import run_sweep

    rows = run_sweep([{"name": "small", "stage": 3, "reduce_bucket_size": 5_000},
                      {"name": "kept", "stage": 3, "stage3_keep_params": True},
                      {"name": "prefetch", "stage": 3, "reduce_bucket_size": 5_000, "prefetch_bucket_size": 200_000},
                      {"name": "z2", "stage": 2}, {"name": "z2-agb", "stage": 2, "allgather_bucket_size": 2_000}],
                     nproc=2, steps=3, seq=32)
    by = {r["name"]: r for r in rows}
    # what the lab says does *not* change traffic: prefetch (when, not what, is gathered) and, with a backend that
    # has all_gather_into_tensor, ZeRO-1/2's allgather_bucket_size (one flat gather of the updated partitions)
    assert by["prefetch"]["ops"] == by["small"]["ops"]
    assert by["z2-agb"]["ops"] == by["z2"]["ops"] and by["z2"]["ops"]["all_gather"]["calls"] == 1
    assert by["small"]["buffers_bytes"] == 4 * 5_000 and by["kept"]["buffers_bytes"] == 4 * 500_000
    rs = {k: by[k]["ops"]["reduce_scatter"]["calls"] for k in ("small", "kept")}
    assert rs["small"] > rs["kept"] == 1  # smaller buckets: more, smaller collectives, less memory held
    psi = sum(param_numels("tiny-llama"))
    # DeepSpeed's prefetch defaults gather the tiny model once per step and keep it through backward (2Ψ, not 3Ψ)
    assert by["kept"]["ops"]["all_gather"]["bytes"] == 4 * psi
    assert by["small"]["ops"]["all_gather"]["bytes"] == 2 * 4 * psi
    assert by["small"]["losses"] == pytest.approx(by["kept"]["losses"], abs=LOSS_ATOL)  # traffic, not results


# -- 7. on GPUs: the same checks with NCCL, where a tensor's device says where it lives -------------------------------
def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_count() == 0, reason="needs CUDA GPUs: ZeRO 1-3 and CPU offload with NCCL, bytes by device")
def test_zero_on_gpus_holds_what_coursekit_memory_predicts(tmp_path, no_orphans):
    n = min(2, _cuda_count())
    for stage, offload in [(1, False), (2, False), (3, False), (2, True), (3, True)]:
        kw = dict(offload_optimizer="cpu") | (dict(offload_param="cpu") if stage == 3 else {}) if offload else {}
        path = save_config(build_config(stage, dtype="bf16", ds_optimizer=False, **kw),
                           tmp_path / f"ds{stage}{offload}.json")
        recs = launch("coursekit.train", ["--strategy", "deepspeed", "--ds-config", path, *COMMON, "--dtype",
                                          "bf16"], nproc=n, timeout=300, stream=False).results
        for rank, rec in enumerate(recs):
            f = rec["final"]
            assert f["device"].startswith("cuda") and f["backend"] == "nccl"
            calc = memory_cli(stage, n, "bf16", f["micro_batch"], 1, rank, **kw)
            got = measured_vs_calculator(f, calc)
            assert {k: v[0] for k, v in got.items()} == {k: v[1] for k, v in got.items()}, (stage, offload, rank)
