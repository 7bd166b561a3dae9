"""Every bench/ script runs, as a user runs it, with tiny settings: the figures it prints are sane (present, positive,
consistent with each other and with what is known independently), not fast. One run per script.

bench/gpu_check.py has its own CPU test (test_gpu_check.py). Speeds are never asserted: a loaded machine is slow.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import can_run_slurm

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def bench(script: str, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_bench_memory():
    d = json.loads(bench("bench_memory.py", "--n", "40", "--json"))
    assert d["grid_configs"] == 40
    for key in ("estimate_us", "estimate_cached_us", "grid_s", "grid_build_s", "max_micro_batch_ms", "min_gpus_ms"):
        assert math.isfinite(d[key]) and d[key] > 0, (key, d[key])


def test_bench_comm(tmp_path, no_orphans):
    out = bench("bench_comm.py", "--sizes", "4K,64K", "--iters", "2", "--warmup", "1", "--nproc", "2",
                "--out", str(tmp_path))
    rows = json.loads((tmp_path / "comm_busbw.json").read_text())
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "ring_all_reduce"]
    assert sorted((r["op"], r["size"]) for r in rows) == sorted((op, s) for op in ops for s in (4096, 65536))
    for r in rows:
        assert r["world_size"] == 2 and r["time_us"] > 0 and r["busbw"] > 0 and r["algbw"] > 0
    assert (tmp_path / "comm_busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the printed table: one busbw per (size, op), the same numbers as the rows
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("n = 2"))
    assert lines[head + 1].split() == ["size", *ops]
    for ln, size in zip(lines[head + 2: head + 4], (4096, 65536)):
        cells = ln.split()
        assert cells[0] == {4096: "4K", 65536: "64K"}[size]
        busbw = {r["op"]: r["busbw"] for r in rows if r["size"] == size}
        assert [float(c) for c in cells[1:]] == pytest.approx([busbw[op] for op in ops], abs=6e-4)


def test_bench_foundation(no_orphans):
    seq, batch = 16, 8
    out = bench("bench_foundation.py", "--steps", "3", "--repeats", "1", "--seq", str(seq), "--global-batch",
                str(batch))
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith(("single ", "ddp "))}
    assert sorted(rows) == ["ddp", "single"] and rows["single"][1] == "1" and rows["ddp"][1] == "2"
    for name, cells in rows.items():
        first, wall, steps_s, tokens_s = map(float, cells[2:6])
        assert 0 < first < wall, (name, cells)  # the first step comes before the job ends
        assert steps_s > 0 and tokens_s > 0


ZERO_POINTS = "zero0,zero3"  # no offload: DeepSpeedCPUAdam's first build takes a minute (slow tier below)


def _zero_rows(tmp_path, points):
    out = tmp_path / "zero.json"
    text = bench("bench_zero.py", "--nproc", "2", "--steps", "3", "--points", points, "--json", str(out),
                 timeout=600)
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert sorted(rows) == sorted(points.split(","))
    for name, r in rows.items():
        assert f"{name:<22} 2 " in text  # one printed line per row
        assert r["step_ms"] > 0 and r["accelerator_bytes"] > 0 and r["calls"] > 0, r
        # every host and NVMe byte equals coursekit memory's prediction (the README's claim for this table)
        assert r["cpu_bytes"] == r["calc_cpu_bytes"] and r["nvme_bytes"] == r["calc_nvme_bytes"] == 0, r
    return rows


def test_bench_zero(tmp_path, no_orphans):
    rows = _zero_rows(tmp_path, ZERO_POINTS)
    assert rows["zero0"]["cpu_bytes"] == rows["zero3"]["cpu_bytes"] == 0
    # ZeRO-3 shards the fp32 parameters over the 2 ranks: rank 0 holds at most half of them (plus padding)
    assert rows["zero3"]["params_bytes"] < 0.6 * rows["zero0"]["params_bytes"]
    assert rows["zero0"]["params_bytes"] == 4 * 125_248  # tiny-llama, fp32, whole on every rank


@pytest.mark.slow  # builds DeepSpeedCPUAdam once (~60 s on 2 cores)
def test_bench_zero_offload(tmp_path, no_orphans):
    rows = _zero_rows(tmp_path, "zero2+opt>cpu")
    assert rows["zero2+opt>cpu"]["cpu_bytes"] > 0


def test_bench_grading_on_the_toy_course(tmp_path):
    import test_course_toy as toy  # the course tests' toy lab: square (2 points) and hypot (3 points)

    toy.make_course(tmp_path / "course")
    d = json.loads(bench("bench_grading.py", "--root", str(tmp_path / "course"), "--lab", "toy", "--students", "2",
                         "--jobs", "2", "--no-nbgrader", "--skip-single", "--json"))
    (batch,) = d["batch"]
    assert batch["submissions"] == 2 and batch["jobs"] == 2 and batch["wall_s"] > 0 and batch["per_minute"] > 0
    rows = sorted(batch["rows"], key=lambda r: r["student"])
    # the solution, then a partial one (the first half of the exercises: square); two, to keep it cheap
    assert [(r["student"], r["status"], r["score"]) for r in rows] == [
        ("student00-solution", "graded", 5), ("student01-partial", "graded", 2)], rows
    assert all(r["seconds"] > 0 and r["recheck_s"] > 0 and r["autograde_s"] is None for r in rows)


@pytest.mark.slow  # Lab 1's re-check launches a 4-process benchmark and two torchrun jobs (~1 min)
def test_bench_grading_lab1(no_orphans):
    d = json.loads(bench("bench_grading.py", "--students", "1", "--jobs", "1", "--no-nbgrader", "--skip-single",
                         "--json", timeout=900))
    (row,) = d["batch"][0]["rows"]
    assert row["status"] == "graded" and row["score"] > 0, row


@pytest.mark.slow  # default-tier budget (~25 s); the same sbatch + torchrun path: test_slurm's multi-node training
@pytest.mark.skipif(bool(can_run_slurm()), reason=f"bench_slurm.py starts a local Slurm: {can_run_slurm()}")
def test_bench_slurm(tmp_path):
    out = tmp_path / "slurm.json"
    text = bench("bench_slurm.py", "--repeat", "1", "--only", "empty,1 node", "--json", str(out), timeout=400)
    figures = json.loads(out.read_text())
    jobs = [k for k in figures if k.startswith("job: ")]
    assert jobs == ["job: empty job (--wrap true)", "job: torchrun, 1 node x 2"], figures
    for label, times in figures.items():
        assert len(times) == 1 and times[0] >= 0, (label, times)
        assert label.startswith("install") or times[0] > 0, (label, times)
    # a torchrun job does more than an empty one
    assert figures["job: torchrun, 1 node x 2"][0] > figures["job: empty job (--wrap true)"][0]
    assert "clean machine -> ready Slurm" in text


def _plan_cli(*args) -> dict:
    proc = subprocess.run([sys.executable, "-m", "coursekit.cli", "plan", *args, "--json"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    (c,) = json.loads(proc.stdout)
    return c


def test_bench_planner_published_layouts():
    """The published-run table as a user prints it (without the search): every case evaluated, each published
    layout fitting by the calculator or said not to, a layout that does not fit marked failed; and three rows as
    ``coursekit plan --layout`` prints the same run (a case whose dtype, compile, kernel or hardware did not reach
    the planner would differ)."""
    rows = json.loads(bench("bench_planner.py", "--json", "--no-search"))
    assert len(rows) >= 18 and len({r["case"] for r in rows}) == len(rows)
    assert {r["metric"] for r in rows} == {"tflops", "mfu", "tokens"}
    for r in rows:
        assert r["metric"] in ("tflops", "mfu", "tokens") and r["published"] > 0 and r["step_time_s"] > 0, r
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0, r
        assert isinstance(r["fits"], bool) and r["peak_gib"] > 0 and "rank" not in r, r
        assert r["failed"] is (not r["fits"]), r
        if r["metric"] == "mfu":
            assert 0 < r["predicted"] < 1, r
    by = {r["case"]: r for r in rows}
    cli = _plan_cli("--model", "llama3-8b", "--gpus", "8", "--gpu", "H100-96GB-500W",
                    "--network", "roce-400", "--seq", "8192", "--global-batch", "16", "--dtype", "fp8", "--compile",
                    "--layout", "dp_shard=8,micro_batch=2,recompute=op")
    titan = by["Llama 3.1 8B, FSDP 8, compile + Float8 (torchtitan)"]
    assert cli["tokens_per_s_per_gpu"] == pytest.approx(titan["predicted"], rel=1e-9)
    assert cli["step_time_s"] == pytest.approx(titan["step_time_s"], rel=1e-9)
    assert cli["peak_bytes"] / 2**30 == pytest.approx(titan["peak_gib"], rel=1e-9)
    llama = _plan_cli("--model", "llama3-405b", "--gpus", "8192", "--gpu", "H100-80GB", "--network", "roce-400",
                      "--seq", "8192", "--global-batch", "2048", "--layout",
                      "tp=8,pp=16,dp_replicate=64,zero=1,micro_batch=1,recompute=selective,virtual_stages=4",
                      "--elementwise", "fused")  # the case assumes fused kernels (bench_planner._FUSED)
    meta = by["Llama 3 405B (Meta)"]
    assert llama["mfu"] == pytest.approx(meta["predicted"], rel=1e-9) and llama["fits"] is meta["fits"] is False


def _rows(text: str, section: str) -> list[dict]:
    """bench_fsdp's ``key=value`` rows under ``== section``."""
    rows, on = [], False
    for ln in text.splitlines():
        if ln.startswith("== "):
            on = ln == f"== {section}"
        elif on and ln.startswith("  "):
            rows.append(dict(kv.split("=", 1) for kv in ln.strip().split("  ")))  # values may hold one space
    return rows


def test_bench_fsdp_bytes_and_collectives():
    """Measured per-rank FSDP2 state and unsharded-unit bytes (fake process groups) equal the calculator's, on an
    even and an odd number of shards; HSDP appears at 4."""
    text = bench("bench_fsdp.py", "--shards", "3,4")
    rows = _rows(text, "bytes")
    assert {(r["N"], r["rank"], r["reshard"]) for r in rows} == {(n, r, rs) for n, r in (("3", "0"), ("3", "2"),
                                                                                     ("4", "0"), ("4", "3"))
                                                                  for rs in ("True", "False")}
    for r in rows:
        assert int(r["states_measured"]) == int(r["states_predicted"]) > 0, r
        assert int(r["units_measured"]) == int(r["units_predicted"]) > 0, r
    coll = {(r["N"], r["layout"]): r for r in _rows(text, "collectives")}
    assert ("4", "hsdp 2 x 2") in coll and ("3", "fsdp2 reshard") in coll
    # without resharding the backward all-gather is skipped: less sent than with it
    for n in ("3", "4"):
        assert int(coll[(n, "fsdp2 no reshard")]["send_bytes_per_rank"]) < int(
            coll[(n, "fsdp2 reshard")]["send_bytes_per_rank"])


def test_bench_parallel_bubbles(tmp_path, no_orphans):
    """The bubble table (--quick: GPipe at m = 1, 4 and 1F1B at m = 4 on 2 stages): theory as the formula gives it,
    every share between 0 and 1, and GPipe holding more saved bytes on its first stage than 1F1B at the same m."""
    out = tmp_path / "parallel.json"
    bench("bench_parallel.py", "--quick", "--only", "bubbles", "--out", str(out), timeout=600)
    rows = {(r["schedule"], r["m"]): r for r in json.loads(out.read_text())["bubbles"]}
    assert sorted(rows) == [("1f1b", 4), ("gpipe", 1), ("gpipe", 4)]
    for (kind, m), r in rows.items():
        assert r["theory"] == pytest.approx(1 / (m + 1)), r
        for key in ("measured", "replay", "p2p_wait", "other"):
            assert 0 <= r[key] < 1, (key, r)
        assert r["measured"] >= r["p2p_wait"], r  # waiting for a neighbour is idle time
        assert all(b > 0 for b in r["peak_saved_bytes"]), r
    assert rows[("gpipe", 4)]["peak_saved_bytes"][0] > rows[("1f1b", 4)]["peak_saved_bytes"][0]


@pytest.mark.slow  # default-tier budget (~30 s); the SIGKILL-and-resume path: test_elastic's bit-identical resume
def test_bench_recovery_quick(tmp_path, no_orphans):
    """--quick: one SIGKILL-and-restart of DDP (lost steps within --save-every, recovery time positive) and DDP's MFU
    against the measured CPU peak (achieved / peak)."""
    out = tmp_path / "recovery.json"
    text = bench("bench_recovery.py", "--quick", "--json", str(out), timeout=600)
    d = json.loads(out.read_text())
    (rec,) = [r for r in d["recovery"] if r["path"] == "checkpoint restart"]
    assert rec["strategy"] == "ddp" and rec["recovery_s"] > 0 and 0 <= rec["lost_steps"] <= 2, rec
    (use,) = d["mfu"]
    assert use["world"] == 2 and use["gflop_per_step"] > 0 and use["peak_gflops"] > 0, use
    assert 0 < use["mfu_pct"] < 100, use
    assert "peak:" in text


def test_bench_profiling_overlap(tmp_path, no_orphans):
    """--quick --only overlap: DDP with 0.1 MB and 1000 MB buckets, traced; overlap % a share, the exposed part of
    the communication no larger than the whole, and only the table asked for."""
    out = tmp_path / "profiling.json"
    bench("bench_profiling.py", "--quick", "--only", "overlap", "--json", str(out), timeout=600)
    d = json.loads(out.read_text())
    assert "hangs" not in d and "overhead" not in d
    assert [(r["strategy"], r["setting"]) for r in d["overlap"]] == [("ddp", "0.1 MB"), ("ddp", "1000 MB")]
    for r in d["overlap"]:
        assert r["step_ms"] > 0 and r["comm_ms"] > 0 and 0 <= r["exposed_ms"] <= r["comm_ms"] + 1e-6, r
        assert all(0 <= r[f"overlap_rank{k}"] <= 100 for k in (0, 1)), r


@pytest.mark.slow  # default-tier budget (~70 s: four launches); its EP run's checks are test_ep's trainer test
def test_bench_moe(tmp_path, no_orphans):
    png = tmp_path / "moe.png"
    d = json.loads(bench("bench_moe.py", "--steps", "3", "--json", "--plot", str(png)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the plot's counts are the records': every step's layer counts sum to the step's choices (tokens x top-k)
    assert all(sum(layer) == 8 * 64 * 2 for r in d["aux_loss"] for step in r["expert_tokens"] for layer in step)
    assert all(0 < v["active"] < v["total"] for v in d["presets"].values())
    for r in d["ep_run"]:  # measured on the run's ranks, predicted from the router counts they recorded
        assert r["all_to_all_bytes"] == r["all_to_all_predicted"] > 0
        assert r["saved_bytes"] == r["saved_predicted"] > 0
    assert [r["aux_loss_coef"] for r in d["aux_loss"]] == ["0", "default", "0.1"]
    assert all(r["imbalance_first"] >= 1 and math.isfinite(r["loss_last"]) for r in d["aux_loss"])
    # both EP ranks timed both routings; the experts alone take part of the balanced step, not all of it
    cost = d["imbalance_cost"]
    assert [r["rank"] for r in cost] == [0, 1]
    assert all(0 < r["experts_s"] < r["balanced_s"] and r["skewed_s"] > 0 for r in cost)


@pytest.mark.slow  # mutmut over one module (~20-40 s): the score is a benchmark figure, not a default-tier check
def test_bench_mutation_scores_one_module():
    """bench/bench_mutation.py on flops: one row whose counts add up (every mutant killed, surviving, not reached or
    marked equivalent), a score, and no stale mark; the fast tests do kill some."""
    out = bench("bench_mutation.py", "flops", timeout=900)
    row = next(ln for ln in out.splitlines() if ln.startswith("flops "))
    mutants, killed, survived, unreached, equivalent = map(int, row.split()[1:6])
    assert mutants == killed + survived + unreached + equivalent and killed > 0, row
    assert row.split()[6].endswith("%"), row
    assert "stale marks" not in out, out  # every mark names a mutant that exists and survives


@pytest.mark.slow  # ~30 s (a floor launch, a pool, a trainer launch); default-tier cover: tests/test_pool.py
def test_bench_pool(no_orphans):
    """One row for 2 ranks: every figure present and positive, the ratios those of the row's own columns."""
    out = bench("bench_pool.py", "--nproc", "2", timeout=600)
    row = next(ln.split() for ln in out.splitlines() if ln.split()[:1] == ["2"])
    fl, start, r_start, cell, tr, r_tr, un, r_un = map(float, row[1:])
    assert min(fl, start, cell, tr, un) > 0
    assert r_start == pytest.approx(start / fl, abs=0.01) and r_tr == pytest.approx(tr / fl, abs=0.01)
    assert r_un == pytest.approx(un / fl, abs=0.01)
    # where the time goes: the floor's and the trainer's phases add up to their wall time (no "other" left)
    lines = {ln.split(":")[0].strip(): ln for ln in out.splitlines() if " s = " in ln}
    unforked = "train --steps 1, a fresh interpreter per worker"
    for name, wall in (("floor", fl), ("train --steps 1", tr), (unforked, un)):
        parts = [float(x.split()[-1]) for x in lines[name].split(" s = ")[1].split(" + ")]
        assert "other" not in lines[name] and sum(parts) == pytest.approx(wall, abs=0.03), lines[name]
    # forked workers on CPU (the agent imported the run), an interpreter per worker under COURSEKIT_LAUNCH_FORK=0
    assert "agent imports the run" in lines["train --steps 1"] and "after the fork" in lines["train --steps 1"]
    assert "worker imports" in lines[unforked] and "fork" not in lines[unforked], lines
    assert "engines up" in lines["pool start"], lines
