"""The planner (coursekit plan): CLI contract, bad input, the time model's stated rules, published runs, and this
machine's own runs predicted from what coursekit measures here.

Bounds (why each is what it is):
  * published runs (bench/bench_planner.py, 30 rows; the planner's constants are not fitted to them): the rows
    within PUBLISHED_BOUND (25 %) of the published figure today stay there (WITHIN_BOUND), a published layout the
    calculator says does not fit is a failure, and the error distribution is guarded a little above what was
    measured (docs/planner.md, "Published runs", has the table and why the worst rows miss).
  * ranking rule: among the layouts the publication's software could run (its ``era`` knobs held fixed), the
    published layout's predicted step time is within RANK_GAP (30 %) of the fastest fitting candidate's; for the
    two runs the issue names (GPT-1T, MPT-7B) it is the fastest (rank 1). A gap, not a percentile: the candidate
    sets range from 6 to 5,000 layouts.
  * this machine: predicted step time within a factor CPU_FACTOR (2.5) of the measured median. The CPU is shared
    and loaded (load averages of 20-50 on 2 cores while this was written; one run's step times vary by +-30 %),
    rates are measured seconds before and after each run, and the trainer's own loop (data, loss sync, records) is
    not modelled (seen here, load ~20-40: single 0.52, ddp 1.09, zero1 1.04, zero2 0.70 of measured).
"""
import json
import math
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from coursekit.memory import preset
from coursekit.memory.gpus import GiB
from coursekit.plan import Cluster, Layout, evaluate, hardware, network, pareto, plan, predict
from coursekit.plan.search import layouts_of, make_cluster
from coursekit.plan.cli import main
from coursekit.plan.hardware import collectives_from_rows, fit_alpha_beta, load_overrides
from coursekit.plan.layout import parse_layout
from coursekit.plan.steptime import Links

PUBLISHED_BOUND = 0.25
RANK_GAP = 0.30
CPU_FACTOR = 2.5
REQUIRED = ("layout", "fits", "peak_bytes", "step_time_s", "tokens_per_s_per_gpu", "mfu")
LAYOUT_KEYS = {"dp_replicate", "dp_shard", "tp", "pp", "cp", "micro_batch", "recompute", "zero", "pp_schedule",
               "microbatches", "virtual_stages", "cp_impl", "engine"}


def _cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


# -- CLI contract ------------------------------------------------------------------------------------------------------
def test_json_lists_candidates_with_the_contract_keys(capsys):
    rc, out, _ = _cli(capsys, "--model", "llama3-8b", "--gpus", "16", "--gpus-per-node", "8", "--gpu", "H100-80GB",
                      "--seq", "4096", "--global-batch", "64", "--top", "4", "--json")
    assert rc == 0
    cands = json.loads(out)
    assert len(cands) == 4
    for c in cands:
        assert set(REQUIRED) <= set(c)
        assert LAYOUT_KEYS <= set(c["layout"])
        lay = c["layout"]
        assert lay["dp_replicate"] * lay["dp_shard"] * lay["tp"] * lay["pp"] * lay["cp"] == 16
        assert c["fits"] and c["peak_bytes"] <= 80 * GiB
        # tokens/s/GPU and MFU follow from the step time (one consistent prediction)
        assert c["tokens_per_s_per_gpu"] == pytest.approx(64 * 4096 / c["step_time_s"] / 16)
    times = [c["step_time_s"] for c in cands]
    assert times == sorted(times)


def test_plain_output_says_why_the_best_win(capsys):
    rc, out, _ = _cli(capsys, "--model", "llama3-8b", "--gpus", "8", "--seq", "4096", "--global-batch", "32",
                      "--top", "3")
    assert rc == 0
    assert out.count("why:") == 3 and "compute" in out and "vs #1" in out


def test_layout_evaluates_one_given_layout(capsys):
    rc, out, _ = _cli(capsys, "--model", "llama3-8b", "--gpus", "8", "--seq", "4096", "--global-batch", "32",
                      "--layout", "dp_shard=4,tp=2,micro_batch=2,recompute=selective", "--json")
    assert rc == 0
    (c,) = json.loads(out)
    assert (c["layout"]["dp_shard"], c["layout"]["tp"], c["layout"]["engine"]) == (4, 2, "fsdp2")
    assert c["layout"]["recompute"] == "selective"


def test_overlap_and_gradient_dtype_flags_reach_each_layout_they_apply_to(capsys):
    """--overlap sets each name on the layouts it can act on (tp only on TP x SP ones) and the JSON / table say what
    was assumed; --grad-reduce-dtype bf16 halves a DDP reduce that outlasts the backward, so the step shrinks."""
    base = ["--model", "llama3-8b", "--gpus", "16", "--seq", "4096", "--global-batch", "64"]
    rc, out, _ = _cli(capsys, *base, "--overlap", "tp", "--top", "0", "--json")
    assert rc == 0
    cands = json.loads(out)
    for c in cands:
        L = c["layout"]
        assert c["overlap"].get("tp", False) == (L["tp"] > 1 and L["sp"]), c["summary"]
        assert L["overlap"] == ("tp" if L["tp"] > 1 and L["sp"] else "")
    assert any(c["overlap"].get("tp") for c in cands)
    lay = "dp_replicate=16,micro_batch=4,overlap=no-grad_reduce"
    times = {}
    for dt in ("fp32", "bf16"):
        rc, out, _ = _cli(capsys, *base, "--layout", lay, "--grad-reduce-dtype", dt, "--json")
        (c,) = json.loads(out)
        assert c["overlap"] == {"grad_reduce": False, "grad_reduce_dtype": dt}
        times[dt] = c["exposed_s"]["dp"]
    assert times["bf16"] < 0.55 * times["fp32"]  # half the bytes, the same latency
    rc, out, _ = _cli(capsys, *base, "--top", "1", "--overlap", "param_gather")
    assert "assumed: overlap" in out


@pytest.mark.parametrize("argv, needle", [
    (["--overlap", "warp"], "overlap 'warp': unknown"),
    (["--layout", "dp_replicate=8,overlap=tp"], "needs tp > 1 with sequence parallelism"),
    (["--gpu", "H900"], "unknown GPU 'H900'"),
    (["--gpus", "12"], "does not divide --gpus 12"),
    (["--model", "llama3-405b", "--gpu", "A100-40GB"], "GiB more per GPU"),
    (["--layout", "tp=3"], "tp x pp x cp = 3 does not divide"),
    (["--network", "carrier-pigeon"], "unknown network"),
])
def test_bad_input_one_message_exit_2(capsys, argv, needle):
    base = {"--model": "llama3-8b", "--gpus": "8", "--gpus-per-node": "8", "--gpu": "H100-80GB", "--seq": "4096",
            "--global-batch": "32"}
    extra = []
    for k, v in zip(argv[::2], argv[1::2]):
        if k in base:
            base[k] = v
        else:
            extra += [k, v]
    rc, out, err = _cli(capsys, *[x for kv in base.items() for x in kv], *extra)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err


def test_coursekit_plan_is_a_registered_command():
    ok = subprocess.run([sys.executable, "-m", "coursekit.cli", "plan", "--model", "llama3.2-1b", "--gpus", "8",
                         "--seq", "2048", "--global-batch", "16", "--top", "1", "--json"], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and len(json.loads(ok.stdout)) == 1
    bad = subprocess.run([sys.executable, "-m", "coursekit.cli", "plan", "--model", "llama3.2-1b", "--gpus", "8",
                          "--gpu", "TPU-v9", "--seq", "2048", "--global-batch", "16"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and "unknown GPU 'TPU-v9'" in bad.stderr


def test_no_fit_names_the_smallest_extra_memory():
    from coursekit.plan import NoFit

    with pytest.raises(NoFit) as e:
        plan("llama3-70b", gpus=8, gpu="A100-40GB", seq=4096, global_batch=8)
    need = e.value.extra_bytes
    assert need > 0
    # give the GPU exactly that much more (plus the slack on it): now the closest layout fits
    from coursekit.plan.search import MEMORY_SLACK

    hw = hardware("A100-40GB")
    bigger = replace(hw, memory_bytes=math.ceil(hw.memory_bytes + need / (1 - MEMORY_SLACK)) + 1)
    assert plan("llama3-70b", gpus=8, hw=bigger, seq=4096, global_batch=8)[0].fits


def test_plot_marks_the_pareto_front(tmp_path, capsys):
    png = tmp_path / "plan.png"
    rc, out, _ = _cli(capsys, "--model", "llama3.2-1b", "--gpus", "8", "--seq", "2048", "--global-batch", "16",
                      "--plot", str(png))
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cands = plan("llama3.2-1b", gpus=8, seq=2048, global_batch=16)
    front = pareto(cands)
    assert front and all(a.peak_bytes <= b.peak_bytes and a.prediction.step_time_s > b.prediction.step_time_s
                         for a, b in zip(front, front[1:]))
    for c in cands:  # nothing fitting beats a front point on both axes
        assert not any(c.peak_bytes < f.peak_bytes and c.prediction.step_time_s < f.prediction.step_time_s
                       for f in front)


def test_planner_imports_no_torch():
    code = "import sys, coursekit.plan, coursekit.plan.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_search_of_3072_gpus_takes_a_few_seconds():
    t0 = time.process_time()  # CPU time: the machine is shared, wall time measures the neighbours
    cands = plan("gpt3-175b", gpus=3072, gpus_per_node=8, gpu="A100-80GB", network="ib-200", seq=2048,
                 global_batch=3072)
    assert time.process_time() - t0 < 5.0
    assert len(cands) > 100 and cands[0].fits


# -- the model's stated rules ------------------------------------------------------------------------------------------
def _cluster(gpus, gpu="H100-80GB", net="ib-400", g=8):
    return Cluster(hardware(gpu), network(net), gpus, g)


def test_each_virtual_stage_count_is_pruned_on_its_own_memory():
    """Interleaved 1F1B holds more chunk micro-batches at v = 2 than at v = 4 (``coursekit.memory.pp_order``), so
    a (degrees, strategy) whose v = 2 set-up does not fit must not take v = 4 down with it: llama2-70b on 32 H100s,
    ZeRO-1 dp 4 x pp 8, micro-batch 1, full recompute — v = 2 over the 95 % bound, v = 4 under it."""
    args = dict(gpus=32, gpus_per_node=8, gpu="H100-80GB", seq=8192, global_batch=256)
    base = dict(dp_replicate=4, pp=8, zero=1, engine="deepspeed", micro_batch=1, recompute="full")
    v2, v4 = (evaluate("llama2-70b", dict(base, virtual_stages=v), **args) for v in (2, 4))
    assert not v2.fits and v4.fits, (v2.peak_bytes / GiB, v4.peak_bytes / GiB)
    found = [c.layout for c in plan("llama2-70b", **args)]
    assert any(L.pp == 8 and L.tp == 1 and L.zero == 1 and L.virtual_stages == 4 and L.dp == 4 for L in found)


def test_a_ulysses_layout_is_sized_as_ulysses_and_selective_recompute_is_skipped():
    """The planner sizes a layout's own context-parallel kernel: Ulysses saves the attention output twice (and a
    replicated K/V head when kv_heads < cp), so it holds more than ring attention at the same degrees; and a search
    does not stop at a recompute the calculator does not model under Ulysses (selective)."""
    args = dict(gpus=8, gpus_per_node=8, gpu="H100-80GB", seq=4096, global_batch=64)
    base = dict(tp=2, cp=2, dp_shard=2, engine="fsdp2", micro_batch=1)
    ring, ulysses = (evaluate("llama3-8b", dict(base, cp_impl=impl), **args) for impl in ("ring", "ulysses"))
    assert ulysses.peak_bytes > ring.peak_bytes, (ring.peak_bytes, ulysses.peak_bytes)
    found = plan("llama3-8b", **args, fixed={"cp_impl": "ulysses", "cp": 2})
    assert found and {c.layout.recompute for c in found} <= {"none", "full"}


def test_ddps_gradient_all_reduce_hides_behind_backward_derived_by_hand():
    """llama3-8b, DDP over the 8 H100s of one node, seq 4096, micro-batch 1, worked out on paper:
    Ψ = 2·128256·4096 (embedding, head) + 32·(2·4096² + 2·4096·1024 + 3·4096·14336 + 2·4096) + 4096 = 8,030,261,248;
    fp32 gradients 4Ψ = 32.12 GB, reduced in DDP's 25 MiB buckets: ceil(32.12 GB / 26,214,400 B) = 1,226 all-reduces
    of 26,199,874 B each. NCCL's pick for one (``coursekit.comm.nccl``, ring of 8 on NVLink at 450 GB/s x 0.80 =
    360 GB/s, algorithm bandwidth 360 x 8/14): LL128, 14 + 14 x 1.9 = 40.6 µs + 26.2 MB / (0.92 x 205.7 GB/s) =
    0.1790 ms (Simple: 56 µs + 0.1274 ms = 0.1834 ms). All 1,226: 219.5 ms. The backward pass (2/3 of a ~0.39 s
    micro-batch) is longer, so every bucket but the last reduces behind it: exposed 0.1790 ms. A model that did not
    overlap would expose all 219 ms."""
    c = evaluate("llama3-8b", dict(dp_replicate=8, engine="ddp", micro_batch=1), gpus=8, gpus_per_node=8,
                 gpu="H100-80GB", seq=4096, global_batch=8)
    p = c.prediction
    assert p.links["dp"] == "nvlink"
    assert 2 / 3 * p.compute_s > 0.2195  # the window is longer than the whole all-reduce
    assert p.exposed_s["dp"] == pytest.approx(0.17904e-3, rel=2e-4)


def test_groups_sit_on_nvlink_or_the_network_by_mesh_order():
    L = Layout(tp=8, pp=4, dp_replicate=4)  # 128 GPUs, 16 nodes
    links = Links(L, _cluster(128))
    assert links.kind(("tp",)) == "nvlink"  # tp innermost: 8 neighbours, one node
    assert links.placement(("dp_replicate", "dp_shard", "cp")) == (4, 1, 4)  # stride 8: one member per node
    assert links.kind(("pp",)) == "network"
    L2 = Layout(tp=2, dp_shard=32, engine="fsdp2")  # 4 FSDP members per node, 8 nodes
    assert Links(L2, _cluster(64)).placement(("dp_shard", "cp")) == (32, 4, 8)


def test_pipeline_bubble_is_p_minus_1_over_v_m_plus_p_minus_1():
    cl = _cluster(64)
    for v, mb in ((1, 1), (2, 1), (4, 2)):
        L = Layout(tp=8, pp=8, micro_batch=mb, virtual_stages=v)
        p = predict(_shape("llama3-70b"), L, cl, seq=4096, global_batch=64)
        m = p.microbatches
        pipe = p.step_time_s - p.exposed_s["dp"] - p.optimizer_s
        assert p.bubble_s / pipe == pytest.approx(7 / (v * m + 7))


def test_tp_allreduces_are_exposed_and_fsdp_gathers_hide_behind_compute():
    cl = _cluster(8)
    shape = _shape("llama3-8b")
    tp2 = predict(shape, Layout(tp=2, dp_replicate=4), cl, seq=4096, global_batch=32)
    tp8 = predict(shape, Layout(tp=8), cl, seq=4096, global_batch=32)
    assert 0 < tp2.exposed_s["tp"] < tp8.exposed_s["tp"]
    big = predict(shape, Layout(dp_shard=8, engine="fsdp2", micro_batch=4), cl, seq=4096, global_batch=32)
    tiny = predict(shape, Layout(dp_shard=8, engine="fsdp2", micro_batch=1), cl, seq=256, global_batch=8)
    # a long micro-batch hides nearly all of its gathers; a 256-token one cannot
    assert big.exposed_s["dp"] / big.step_time_s < 0.05 < tiny.exposed_s["dp"] / tiny.step_time_s


def test_gemm_efficiency_depends_on_shape_not_one_constant():
    from coursekit.plan.steptime import gemm_time

    hw = hardware("H100-80GB")
    rate = lambda n: 2 * n ** 3 / gemm_time(n, n, n, hw, "bf16")  # noqa: E731
    assert rate(128) < 0.5 * rate(8192) and rate(8192) < hw.gemm_fraction * hw.peak("bf16")


def _shape(name):
    from coursekit.memory import resolve_model

    return resolve_model(name)


# -- hardware presets and overrides ------------------------------------------------------------------------------------
def test_presets_cite_sources_and_cover_the_required_gpus():
    for name in ("A100-40GB", "A100-80GB", "H100-80GB", "H100-PCIe", "H200", "MI300X"):
        hw = hardware(name)
        assert hw.source and {"bf16", "fp16", "fp32", "tf32"} <= set(hw.peak_flops)
        assert hw.hbm_bw > 1e12 and hw.link_bw > 1e10
    assert hardware("H200").hbm_bw > hardware("H100-80GB").hbm_bw


def test_alpha_beta_fit_recovers_the_line_and_overrides_load(tmp_path):
    alpha, busbw = 20e-6, 3e9
    rows = [{"op": "all_reduce", "size": s, "world_size": 2, "time_us": 1e6 * (alpha + s * 1.0 / busbw)}
            for s in (4096, 65536, 1 << 20, 1 << 24)]
    a, b = fit_alpha_beta(rows, "all_reduce")
    assert a == pytest.approx(alpha) and b == pytest.approx(busbw)
    (tmp_path / "rows.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "hw.yaml").write_text("gpu:\n  hbm_bw: 1.0e12\n  name: my-gpu\nnetwork:\n  bw_per_gpu: 1.0e10\n"
                                      "collectives:\n  intra: rows.json\n")
    hw, net = load_overrides(tmp_path / "hw.yaml", hardware("A100-80GB"), network("ib-200"))
    assert (hw.name, hw.hbm_bw, net.bw_per_gpu) == ("my-gpu", 1e12, 1e10)
    assert hw.collectives["all_reduce"] == pytest.approx((alpha, busbw))
    assert collectives_from_rows(rows) == {"all_reduce": pytest.approx((alpha, busbw))}
    (tmp_path / "bad.yaml").write_text("gpu:\n  warp_drive: 1\n")
    with pytest.raises(ValueError, match="unknown Hardware fields"):
        load_overrides(tmp_path / "bad.yaml", hw, net)


def test_parse_layout_types_values_and_refuses_unknown_keys():
    assert parse_layout("tp=2,zero=1,sp=false") == {"tp": 2, "zero": 1, "sp": False, "engine": "deepspeed"}
    with pytest.raises(ValueError, match="unknown --layout key"):
        parse_layout("tensor=2")


# -- published runs ----------------------------------------------------------------------------------------------------
def _bench():
    """bench/bench_planner.py, the one list of published cases (imported, not copied)."""
    import importlib.util
    from pathlib import Path

    if "bench_planner" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "bench" / "bench_planner.py"
        spec = importlib.util.spec_from_file_location("bench_planner", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bench_planner"] = mod  # dataclasses look their module up while the file executes
        spec.loader.exec_module(mod)
    return sys.modules["bench_planner"]


# The published runs predicted within PUBLISHED_BOUND when this set was written (and whose layout fits): they stay
# there. The others are outside it or do not fit (bench/bench_planner.py says why, docs/planner.md "Published runs"):
# sharded data parallelism at hundreds of GPUs (ZeRO-3 at 384 / 1,536 GPUs), FSDP at 64 GPUs with a small batch
# per GPU (MPT-3B, MPT-13B), and six layouts the calculator puts over the GPU's memory.
WITHIN_BOUND = {
    "GPT 1T (Megatron-LM)", "GPT-3 175B (Megatron-LM)", "GPT-3 175B, 768 GPUs (Megatron-LM)",
    "GPT-3 175B, 1536 GPUs (Megatron-LM)", "GPT 530B (Megatron-LM)", "GPT 18.4B (Megatron-LM)",
    "GPT 145.6B (Megatron-LM)", "BLOOM 176B (Megatron-DeepSpeed)", "MPT-7B (LLM Foundry, FSDP)",
    "MPT-70B (LLM Foundry, FSDP)", "MPT-70B, 32 GPUs (LLM Foundry)", "MPT-30B, 32 GPUs (LLM Foundry)",
    "MPT-7B, seq 8192 (LLM Foundry)", "MPT-7B, A100-80GB (LLM Foundry)", "MPT-70B, A100-80GB (LLM Foundry)",
    "MPT-7B, 128 A100-40GB (LLM Foundry)", "MPT-13B, 128 A100-40GB (LLM Foundry)",
    "Llama 3 70B, FSDP + CP 2 (NeMo AutoModel)", "Llama 3 70B, FSDP 32 x TP 8 (torchtitan)",
    "Qwen3-235B-A22B, TP 2 x EP 8 x FSDP (Megatron)", "Llama 3.1 8B, FSDP 8, compile (torchtitan)",
    "Llama 3.1 8B, FSDP 128, compile (torchtitan)", "Llama 3.1 70B, FSDP 32 x TP 8, compile + Float8 (torchtitan)",
    # since the eager element-wise traffic is read from op counts (steptime.ELEMENTWISE; was a guess of 32 + 8 passes)
    "Llama 3.1 8B, FSDP 8 (torchtitan)", "Llama 3.1 8B, FSDP 128 (torchtitan)", "Llama 3 8B, FSDP 8 x TP 8 (torchtitan)",
    "Llama 3.1 8B, FSDP 8, compile + Float8 (torchtitan)", "Llama 3.1 8B, FSDP 128, compile + Float8 (torchtitan)",
    "Llama 3.1 70B, FSDP 32 x TP 8, compile + Float8 + async TP (torchtitan)",
    # added after that change, runs the model had not seen (Trainy's H200s: +19 % and +21 %)
    "Llama 3.1 8B, FSDP 32, H200, compile + Float8 (torchtitan, Trainy)",
    "Llama 3.1 8B, FSDP 64, H200, compile + Float8 (torchtitan, Trainy)",
}
# Regression guards on the error distribution, a little above what was measured (2026-12-05: 38 runs, 35 fitting:
# median |error| 9.0 % over all, non-fitting counted as infinite; over the fitting ones median 8.0 %, 90th percentile
# 31.5 %; 31 within 25 %; before the two H200 rows: 8.0 % / 7.0 % / 31.5 %, 29 of 36). History: 30 runs, 12.4 % / 4.0 % / 53.5 %, 20 within 25 %, with torchtitan's runs priced on
# an SXM H100; the H100-96GB-500W preset (its source's part) and six compile / Float8 / async-TP rows of the same
# source: 17.1 % / 9.9 % / 32.2 %, 24 within 25 %; eager element-wise traffic from op counts (torchtitan's eager
# Llama rows +28 % -> +5 %): 9.0 % / 8.0 % / 31.5 % (2026-12-05); the overlap interference (2026-12-06): 8.2 % / 6.8 %
# / 28.0 %, 31 within 25 %. A change to the time or memory model that makes the table worse fails.
MEDIAN_GUARD, FITTING_MEDIAN_GUARD, FITTING_P90_GUARD, MIN_WITHIN_25 = 0.09, 0.075, 0.30, 31


def _published_rows():
    b = _bench()
    return b, [b.run_case(case, search=False) for case in b.CASES]


def test_published_runs_predicted_within_bound():
    b, rows = _published_rows()
    by_name = {r["case"]: r for r in rows}
    assert WITHIN_BOUND <= set(by_name), WITHIN_BOUND - set(by_name)
    for name in sorted(WITHIN_BOUND):
        r = by_name[name]
        assert r["fits"] and not r["failed"] and abs(r["error"]) <= PUBLISHED_BOUND, r
    s = b.summarize(rows)
    assert s["n"] == len(rows) >= 18 and s["within_25"] >= MIN_WITHIN_25, s
    assert s["median_abs_error"] is not None and s["median_abs_error"] <= MEDIAN_GUARD, s
    f = s["fitting_only"]
    assert f["median_abs_error"] <= FITTING_MEDIAN_GUARD and f["p90_abs_error"] <= FITTING_P90_GUARD, s
    assert sum(r["metric"] == "tokens" for r in rows) >= 3 and any(b.resolve_model(c.model).is_moe
                                                                   for c in b.CASES)


def test_compile_and_float8_speed_ups_on_the_same_part_match_the_published_ratios():
    """torchtitan's compile and Float8 rows sit beside a bf16 eager row on the same part, so the published ratio
    checks the compile and fp8 terms alone: each predicted speed-up within 10 % of the published one (measured:
    compile x1.194 vs x1.157 and x1.195 vs x1.162; Float8 x1.326 vs x1.280 and x1.329 vs x1.286). Async TP is not
    (x1.28 vs x1.057): the overlap model is optimistic, and its predictions say so (``unchecked``)."""
    b, rows = _published_rows()
    qs = {q["run"]: q for q in b.ratios(rows)}
    assert len(qs) == len(b.RATIOS) == 5
    for run, q in qs.items():
        if "async" in run:
            assert q["predicted"] > q["published"] > 1
            continue
        assert q["published"] > 1 and q["predicted"] > 1, q
        assert abs(q["predicted"] / q["published"] - 1) <= 0.10, q
    async_row = next(c for c in b.CASES if "async" in c.name)
    c = evaluate(async_row.model, async_row.layout, gpus=async_row.gpus, gpu=async_row.gpu,
                 network=async_row.network, seq=async_row.seq, global_batch=async_row.global_batch,
                 dtype=async_row.dtype, compile=True)
    assert any("tp overlap" in u for u in c.unchecked), c.unchecked


def test_a_published_layout_that_does_not_fit_is_a_failure():
    """A Case whose layout the calculator puts over the GPU (Llama 3 70B under plain DDP on 8 H100s: 16 bytes per
    parameter alone is ~1 TB per GPU) is failed in its row and counts as |error| infinite in the summary, however
    close its throughput; a fitting row beside it is counted as usual."""
    b = _bench()
    bad = b.Case("no-fit", "made up", "llama3-70b", 8, "H100-80GB", "ib-400", 2048, 8,
                 Layout(dp_replicate=8, micro_batch=1), "mfu", 0.40)
    good = next(c for c in b.CASES if c.name == "MPT-7B (LLM Foundry, FSDP)")
    rb, rg = b.run_case(bad, search=False), b.run_case(good, search=False)
    assert not rb["fits"] and rb["failed"] and rb["peak_gib"] > 80, rb
    assert rg["fits"] and not rg["failed"], rg
    rb = {**rb, "error": 0.0}  # even a perfect throughput match
    s = b.summarize([rb, rg])
    assert s["not_fitting"] == ["no-fit"] and "no-fit" in s["failed"], s
    assert s["within_25"] == (abs(rg["error"]) <= 0.25) and s["worst_abs_error"] is None, s
    assert s["worst_case"] == "no-fit" and s["fitting_only"]["n"] == 1, s
    assert "does not fit" in "\n".join(b.summary_lines(s))


def test_gpt3_row_is_the_cited_table_2_row():
    """Narayanan et al. 2021 has no 175B row in Table 1: 153 TFLOP/s is Table 2's PTD-P row (t8 x p12, 384 GPUs,
    batch 1536, micro-batch 1). The row's numbers are the citation's, and its layout reproduces them."""
    b = _bench()
    c = next(c for c in b.CASES if c.name == "GPT-3 175B (Megatron-LM)")
    assert "Table 2" in c.source and "Table 1" not in c.source, c.source
    L = c.layout
    assert (c.gpus, L.tp, L.pp, c.global_batch, L.micro_batch, c.published) == (384, 8, 12, 1536, 1, 153.0)
    assert L.world == c.gpus and L.dp == 4
    for text in (f"{c.gpus} GPUs", f"t{L.tp} x p{L.pp}", f"batch {c.global_batch}", f"micro-batch {L.micro_batch}",
                 f"{c.published:.0f} TFLOP/s"):
        assert text in c.source, (text, c.source)
    r = b.run_case(c, search=False)
    assert r["fits"] and abs(r["error"]) <= 0.10, r


@pytest.mark.parametrize("name", ["GPT 1T (Megatron-LM)", "MPT-7B (LLM Foundry, FSDP)"])
def test_published_layout_ranks_near_the_top(name):
    b = _bench()
    r = b.run_case(next(c for c in b.CASES if c.name == name))
    assert r["rank"] == 1, r


@pytest.mark.slow  # six searches up to 8,192 GPUs: ~5 s of CPU, much more wall time on a loaded machine
def test_every_published_layout_ranks_near_the_top():
    """The ranking rule on the cases it was set on (bench_planner.RANKED, the six of its first table); the later rows
    are ranked by ``--search-all`` and not held to it (several published layouts are 30-100 % slower than the best
    the planner finds: docs/planner.md)."""
    b = _bench()
    for case in (c for c in b.CASES if c.name in b.RANKED):
        r = b.run_case(case)
        assert r["gap_to_best"] <= RANK_GAP, r


# -- this machine ------------------------------------------------------------------------------------------------------
CPU_MODEL = {"model": "tiny-llama", "seq": 64, "global_batch": 8}


def _run(strategy, nproc, **kw):
    from coursekit.plan.measure import TrainerRun

    return TrainerRun(strategy=strategy, nproc=nproc, **kw)


# one benchmark launch + one training launch (~15 s on an idle machine); slow tier (see below)
FAST_ROWS = [_run("ddp", 2)]
# slow tier: one launch each (~7-15 s idle), 4-process rows one more collectives benchmark on 4 processes
SLOW_ROWS = [_run("single", 1), _run("zero1", 2), _run("zero2", 2), _run("fsdp2", 2), _run("ddp", 2, tp=2),
             _run("ddp", 2, tp=2, sp=True), _run("ddp", 2, pp=2, grad_accum=4), _run("ddp", 2, cp=2),
             _run("hsdp", 4, dp_shard=2), _run("ddp", 4, tp=2)]


@pytest.fixture(scope="module")
def measured():
    """This machine's gloo collectives (a comm benchmark on as many processes as a run has), shared by the tests
    below with their runs."""
    return {"coll": {}, "runs": {}}


@pytest.fixture(scope="module")
def dtensor_cost():
    """The DTensor calibration (one process, calibrate.CALIBRATION_MODEL): extra cost per DTensor op, op counts."""
    from coursekit.plan.calibrate import dtensor_op_cost

    return dtensor_op_cost()


def _compare(measured, run, zero3=None, dtensor=None):
    """Predicted and measured step time of one trainer run; compute rates are measured as close to its steps as
    the cores allow (``run_measured``: beside them with a core to spare, else just before and after the launch),
    because the shared machine's load changes from minute to minute."""
    from coursekit.memory import resolve_model
    from coursekit.plan.measure import host_hardware, measure_collectives, run_measured

    n = max(2, run.nproc)
    if n not in measured["coll"]:
        measured["coll"][n] = measure_collectives(n)
    if run not in measured["runs"]:
        measured["runs"][run] = run_measured(run, **CPU_MODEL)
    out, compute = measured["runs"][run]
    hw, net = host_hardware(compute, measured["coll"][n], run.nproc, zero3=zero3, dtensor=dtensor)
    p = predict(resolve_model(CPU_MODEL["model"]), run.layout(CPU_MODEL["global_batch"]),
                Cluster(hw, net, run.nproc, max(2, run.nproc)), seq=CPU_MODEL["seq"],
                global_batch=CPU_MODEL["global_batch"], dtype="fp32")
    parts = {k: round(v * 1e3, 1) for k, v in {"compute": p.compute_s, "bubble": p.bubble_s, **p.exposed_s,
                                                 "optimizer": p.optimizer_s, "host": p.host_s}.items() if v}
    print(f"{run.name}: predicted {p.step_time_s * 1e3:.1f} ms {parts}, measured {out['step_time_s'] * 1e3:.1f} ms"
          f" ({hw.source})")
    return p.step_time_s, out["step_time_s"]


# slow tier since 2026-12-01: on an idle machine the ddp row sits at its bound (ratio 0.34-0.42 against 0.4 in four
# measurements: the model leaves out the trainer's fixed per-step host work, which dominates a 40 ms step when
# nothing else runs; under load the row measured 0.84); the published-run checks above stay in the default tier
@pytest.mark.slow
@pytest.mark.parametrize("run", FAST_ROWS, ids=lambda r: r.name.replace(" ", "-"))
def test_cpu_runs_predicted_from_measured_rates(measured, no_orphans, run):
    pred, meas = _compare(measured, run)
    if not 1 / CPU_FACTOR <= pred / meas <= CPU_FACTOR:
        # one re-measurement (rates and run taken again): on a shared 2-core machine a burst of other work can
        # stretch one short run's steps 3-4x (seen once in four full runs of the tier); a real model error repeats
        print(f"{run.name}: outside the bound (ratio {pred / meas:.2f}), measuring again")
        measured["runs"].pop(run, None)
        measured["coll"].clear()
        pred, meas = _compare(measured, run)
    assert 1 / CPU_FACTOR <= pred / meas <= CPU_FACTOR, (run.name, pred, meas)


@pytest.mark.slow  # one training launch each (~7-15 s idle, several times that under load)
@pytest.mark.parametrize("run", SLOW_ROWS, ids=lambda r: r.name.replace(" ", "-"))
def test_cpu_more_runs_predicted_from_measured_rates(measured, dtensor_cost, no_orphans, run):
    pred, meas = _compare(measured, run, dtensor=dtensor_cost)
    assert 1 / CPU_FACTOR <= pred / meas <= CPU_FACTOR, (run.name, pred, meas)


@pytest.mark.slow  # a calibration (two 1-process DeepSpeed launches) and a ZeRO-3 run: ~1 min idle
def test_cpu_zero3_predicted_with_its_hook_cost_measured_on_another_model(measured, no_orphans):
    """ZeRO-3 on a CPU is mostly DeepSpeed's per-module hooks: without their cost the prediction was 0.13 of the
    measured step. The cost per parameter tensor comes from a different model on one process (measure.
    zero3_hook_cost); the 2-process tiny-llama run is then predicted within the same bound as every other row."""
    from coursekit.plan.calibrate import zero3_hook_cost

    cost = zero3_hook_cost()
    print(f"ZeRO-3 hooks: {cost}")
    assert cost["per_tensor_s"] > 0, cost
    pred, meas = _compare(measured, _run("zero3", 2), zero3=cost)
    assert 1 / CPU_FACTOR <= pred / meas <= CPU_FACTOR, ("zero3", pred, meas, cost)


@pytest.mark.slow  # shares the DTensor calibration (~20-60 s, one process) with the TP / FSDP2 / PP rows
def test_dtensor_op_counts_stated_in_the_model_are_what_torch_runs(dtensor_cost):
    """steptime's DTensor op counts are counted, not fitted: the calibration counts them again on this torch."""
    from coursekit.plan import steptime

    from coursekit.plan.calibrate import CALIBRATION_MODEL

    layers, raw = CALIBRATION_MODEL["num_hidden_layers"], dtensor_cost["raw"]
    outside = steptime.DTENSOR_OPS_OUTSIDE_LAYERS  # the vocab-parallel embedding and head
    assert raw["tp"]["dtensor_ops"] == layers * steptime.DTENSOR_OPS_TP_LAYER + outside
    assert raw["tp_sp"]["dtensor_ops"] == layers * steptime.DTENSOR_OPS_SP_LAYER + outside
    assert dtensor_cost["opt_ops_per_dtensor_param"] == steptime.DTENSOR_OPT_OPS
    plain = dtensor_cost["raw"]["plain"]  # the trainer's AdamW (coursekit.parallel.api.adamw): ops per tensor
    assert plain["opt_ops"] // plain["params"] == steptime.OPT_OPS_PER_TENSOR
    assert dtensor_cost["per_op_ops"] > 1  # a DTensor op costs more than another plain op on top of its own


def test_an_ambiguous_gpu_name_is_refused_with_both_names():
    from coursekit.plan.hardware import hardware

    with pytest.raises(ValueError, match="ambiguous GPU 'H100': H100-80GB or H100-PCIe"):
        hardware("H100")
    with pytest.raises(ValueError, match="A100-40GB or A100-80GB"):
        hardware("a100")
    assert hardware("h100-sxm").name == "H100-80GB"


def test_expert_parallel_all_to_alls_sit_inside_a_node_or_cross_it():
    """EP groups are the innermost ep of the dp x cp ranks (ParallelDims): with tp 1, ep 8 is one node of 8 GPUs and
    two nodes of 4. Its all-to-alls (4 per layer: dispatch and combine, forward and backward) are then on NVLink or
    on the network, and the network's cost more; ep 1 has none."""
    shape = _shape("mixtral-8x7b")
    L = Layout(dp_shard=16, engine="fsdp2", ep=8, micro_batch=1)
    on8, on4 = Links(L, make_cluster(16, 8)), Links(L, make_cluster(16, 4))
    assert on8.placement(("ep",)) == (8, 8, 1) and on8.kind(("ep",)) == "nvlink"
    assert on4.placement(("ep",)) == (8, 4, 2) and on4.kind(("ep",)) == "network"
    assert on8.placement(("ep_rest",)) == (2, 1, 2)  # the ranks holding the same experts: one per node
    fast, slow = (predict(shape, L, make_cluster(16, g), seq=4096, global_batch=16) for g in (8, 4))
    assert 0 < fast.exposed_s["ep"] < slow.exposed_s["ep"]
    assert fast.links["ep"] == "nvlink" and slow.links["ep"] == "network"
    assert "ep" not in predict(shape, Layout(dp_shard=16, engine="fsdp2"), make_cluster(16, 8), seq=4096,
                               global_batch=16).exposed_s


def test_planner_searches_expert_parallelism_for_moe_models(capsys):
    """The search visits EP degrees (dividing the experts and dp x cp) for an MoE model and none for a dense one;
    more EP ranks hold fewer expert bytes; --ep keeps one degree; bad degrees are refused in one line."""
    args = dict(gpus=16, gpus_per_node=8, seq=4096, global_batch=64)
    found = plan("mixtral-8x7b", keep_unfit=True, **args)
    assert {c.layout.ep for c in found} >= {1, 2, 4, 8}
    assert {c.layout.ep for c in plan("llama3-8b", **args)} == {1}
    # TP on an MoE model (the TP ranks split the sparse blocks' tokens): the search visits it with every EP degree;
    # SP there takes the sparse block's gather away (the block keeps the rank's sequence shard)
    visited = list(layouts_of(preset("mixtral-8x7b"), 16, 8, 4096, 64))
    assert {L.tp for L in visited if L.ep > 1} == {1, 2, 4, 8}
    tp2 = {sp: evaluate("mixtral-8x7b", dict(tp=2, ep=2, engine="fsdp2", micro_batch=1, recompute="full", sp=sp),
                        **args) for sp in (False, True)}
    assert all(c.prediction.exposed_s["tp"] > 0 and c.prediction.exposed_s["ep"] > 0 for c in tp2.values())
    assert tp2[True].prediction.exposed_s["tp"] < tp2[False].prediction.exposed_s["tp"]
    base = dict(dp_replicate=16, engine="ddp", micro_batch=1, recompute="full")  # DDP: every rank holds its experts
    e1, e8 = (evaluate("mixtral-8x7b", dict(base, ep=e), **args) for e in (1, 8))
    # the peak is the optimizer step: 16 bytes per parameter (bf16 weights and grads, fp32 master, m, v) and the
    # step's fp32 temporary, 20 in all; ep 8 keeps 1/8 of the experts
    experts = preset("mixtral-8x7b").expert_params() * 20
    assert e1.peak_bytes - e8.peak_bytes == pytest.approx(experts * 7 / 8, rel=0.02)
    assert main(["--model", "mixtral-8x7b", "--gpus", "16", "--seq", "4096", "--global-batch", "64", "--ep", "4",
                 "--json", "--top", "0"]) == 0
    assert {c["layout"]["ep"] for c in json.loads(capsys.readouterr().out)} == {4}
    assert main(["--model", "mixtral-8x7b", "--gpus", "16", "--seq", "4096", "--global-batch", "64",
                 "--layout", "dp_shard=16,ep=3"]) == 2
    assert "ep 3 does not divide" in capsys.readouterr().err


def test_attention_flag_selects_the_kernel_memory_and_time(capsys):
    """--attention eager keeps the score matrices (memory) and runs them through HBM (time); sdpa (its flash kernel
    on a GPU) does neither. The names are the trainer's."""
    out = {}
    for kernel in ("sdpa", "eager"):
        assert main(["--model", "llama3-8b", "--gpus", "8", "--seq", "4096", "--global-batch", "32", "--attention",
                     kernel, "--layout", "dp_shard=8,micro_batch=1,recompute=none", "--json"]) == 0
        out[kernel] = json.loads(capsys.readouterr().out)[0]
    assert out["eager"]["peak_bytes"] > out["sdpa"]["peak_bytes"]
    assert out["eager"]["step_time_s"] > out["sdpa"]["step_time_s"]
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        main(["--model", "llama3-8b", "--gpus", "8", "--seq", "4096", "--global-batch", "32", "--attention", "flash"])


def test_a_prediction_outside_the_checked_runs_says_so():
    """``unchecked`` names each regime no published run behind the model covers, worked case by case: exposed
    communication over 30 % of the step (31 of 100 ms: flagged; 30 of 100: not), sharded data parallelism without
    TP/PP beyond 32 GPUs (fsdp2 dp64: flagged; dp32, or dp128 with tp2: not), context parallelism beyond ring cp 2,
    experts over more than 8 EP ranks (the published runs checked: bench/bench_planner.py)."""
    from coursekit.plan.search import unchecked
    from coursekit.plan.steptime import Prediction

    def pred(exposed_ms):
        return Prediction(step_time_s=0.1, compute_s=0.1 - exposed_ms / 1e3, bubble_s=0.0,
                          exposed_s={"dp": exposed_ms / 1e3}, optimizer_s=0.0, host_s=0.0, microbatches=1,
                          tokens_per_s_per_gpu=1.0, mfu=0.5, hfu=0.5)

    dense, moe = preset("llama3-8b"), preset("qwen3-30b-a3b")
    assert unchecked(dense, Layout(dp_replicate=8), pred(30)) == ()
    assert unchecked(dense, Layout(dp_replicate=8), pred(31)) == (
        "exposed communication 31% of the step (checked runs: <= 30%)",)
    fsdp = Layout(dp_shard=64, engine="fsdp2", recompute="full")
    assert unchecked(dense, fsdp, pred(0)) == ("sharded data parallelism over 64 GPUs without TP or PP (holds up to "
                                               "32; beyond, published runs are up to 4x slower than predicted)",)
    assert unchecked(dense, Layout(dp_shard=32, engine="fsdp2", recompute="full"), pred(0)) == ()
    assert unchecked(dense, Layout(dp_shard=128, engine="fsdp2", tp=2, recompute="full"), pred(0)) == ()
    assert unchecked(dense, Layout(dp_replicate=64, engine="deepspeed", zero=3), pred(0))[0].startswith("sharded")
    # without checkpointing, sharded: LLM Foundry's H100 runs of the kind were slower than predicted at any scale
    assert unchecked(dense, Layout(dp_shard=8, engine="fsdp2"), pred(0))[0].startswith(
        "sharded data parallelism without activation checkpointing")
    assert unchecked(dense, Layout(dp_replicate=64, engine="deepspeed", zero=2), pred(0)) == ()  # not ZeRO-3
    assert unchecked(moe, Layout(dp_replicate=16, cp=2, ep=8), pred(0)) == ()
    assert unchecked(moe, Layout(dp_replicate=16, cp=2, cp_impl="ulysses", ep=16), pred(0)) == (
        "context parallelism cp 2 ulysses (checked: ring, cp 2)", "experts over 16 EP ranks (checked: EP 8 inside a "
                                                                  "node)")
    assert unchecked(dense, Layout(dp_replicate=2, cp=4), pred(0)) == ("context parallelism cp 4 ring (checked: ring, "
                                                                       "cp 2)",)
    # data-parallel communication over half the compute it hides behind (50 ms of comm behind 100: not; 51: flagged)
    comm = lambda ms: replace(pred(0), dp_comm_s=ms / 1e3)  # noqa: E731
    assert unchecked(dense, Layout(dp_replicate=8), comm(50)) == ()
    assert unchecked(dense, Layout(dp_replicate=8), comm(51)) == (
        "data-parallel communication 0.51x the compute it hides behind (checked runs: <= 0.5x; GPT-3 175B ZeRO-3 on "
        "1,536 A100s, 1.1x, ran 3.7x slower than predicted)",)
    # and the planner's own rows carry it, in the table and in --json
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "plan", "--model", "llama3-8b", "--gpus", "512",
                          "--seq", "4096", "--global-batch", "1024", "--top", "1", "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row, L = json.loads(out.stdout)[0], json.loads(out.stdout)[0]["layout"]
    assert any(u.startswith("context parallelism") for u in row["unchecked"]) == (
        L["cp"] > 2 or (L["cp"] > 1 and L["cp_impl"] != "ring"))
    wide_fsdp = L["engine"] == "fsdp2" and L["tp"] == L["pp"] == 1 and L["dp_shard"] * L["dp_replicate"] > 32
    assert any(u.startswith("sharded data parallelism over") for u in row["unchecked"]) == wide_fsdp


def test_the_checked_communication_ratio_is_the_published_runs():
    """CHECKED_DP_COMM is read off the published table: every fitting row predicted within 25 % has its data-parallel
    communication at most that multiple of its compute; the two rows above it are MPT-13B on 64 H100s (+29 % or
    worse) and GPT-3 175B ZeRO-3 on 1,536 A100s (the only one above 1: bound by its gathers, still >3x off, and
    flagged). A model change that moves these ratios moves this test."""
    from coursekit.plan.search import CHECKED_DP_COMM

    b = _bench()
    ratios = {}
    for c in b.CASES:
        cand = evaluate(c.model, c.layout, gpus=c.gpus, gpus_per_node=c.gpus_per_node, gpu=c.gpu, network=c.network,
                        seq=c.seq, global_batch=c.global_batch, attention=c.attention, dtype=c.dtype,
                        compile=c.compile, elementwise=c.elementwise)
        p = cand.prediction
        ratios[c.name] = (p.dp_comm_s / p.compute_s, b.run_case(c, search=False), cand)
    good = [r for r, row, cand in ratios.values() if row["fits"] and abs(row["error"]) <= 0.25]
    assert max(good) <= CHECKED_DP_COMM < max(good) * 1.05, max(good)  # the bound is the largest good row's
    above = {name for name, (r, row, _) in ratios.items() if r > CHECKED_DP_COMM}
    assert above == {"MPT-13B, 64 GPUs (LLM Foundry)", "GPT-3 175B ZeRO-3, 1536 GPUs (DeepSpeed)"}, above
    r, row, cand = ratios["GPT-3 175B ZeRO-3, 1536 GPUs (DeepSpeed)"]
    assert r > 1 and row["error"] > 2 and any(u.startswith("data-parallel communication") for u in cand.unchecked)
    assert ratios["MPT-13B, 64 GPUs (LLM Foundry)"][1]["error"] > 0.25


def test_sp_style_sizes_the_column_parallel_inputs_as_torch_or_megatron_keep_them():
    """--layout sp_style: torch's plan keeps each block input all-gathered (b·s·h), Megatron's its sequence shard:
    llama3-70b, TP 8 with SP, micro-batch 1 x 8192 tokens, bf16: 2 block inputs x 80 layers, and the LM head's (a
    column-parallel linear too), x 8192 x 8192 x 2 B x (1 - 1/8) more under torch (17.6 GiB). Unsaid, the flash
    kernel is sized as Megatron's fused profile."""
    args = dict(gpus=64, gpus_per_node=8, gpu="H100-80GB", seq=8192, global_batch=256)
    base = dict(tp=8, dp_shard=8, engine="fsdp2", micro_batch=1, recompute="none")
    c = {st: evaluate("llama3-70b", dict(base, sp_style=st) if st else base, **args) for st in ("torch", "megatron", "")}
    assert c["torch"].peak_bytes - c["megatron"].peak_bytes == (2 * 80 + 1) * 8192 * 8192 * 2 * 7 // 8
    assert c[""].peak_bytes == c["megatron"].peak_bytes
    assert c["megatron"].prediction.exposed_s["tp"] > c["torch"].prediction.exposed_s["tp"]  # the re-gathers


def test_compile_and_fp8_predictions_say_how_far_they_were_checked():
    args = dict(gpus=8, gpu="H100-80GB", seq=8192, global_batch=16)
    lay = dict(dp_shard=8, engine="fsdp2", micro_batch=2, recompute="op")
    plain = evaluate("llama3-8b", lay, **args)
    both = evaluate("llama3-8b", lay, dtype="fp8", compile=True, **args)
    assert not any("compile" in u or "fp8" in u for u in plain.unchecked)
    assert any(u.startswith("torch.compile") for u in both.unchecked) and any(u.startswith("fp8") for u in both.unchecked)
    assert both.to_dict()["run"] == {"gemm_dtype": "fp8", "compile": True, "elementwise": "eager"}
