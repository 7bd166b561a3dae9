"""bench/gpu_check.py and the phase probe it stands on (coursekit.measure.phases).

The end-to-end test runs the reduced CPU version in a subprocess that looks like the GPU machine's Python image:
torch and transformers only — ``datasets``, ``psutil``, ``deepspeed``, ``nbgrader`` … cannot be imported, and the
editable install of coursekit is hidden, so the script must find ``src/`` itself. A GPU-only test runs ``--quick``
on CUDA and is skipped, with its reason, everywhere else.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch  # hard dependencies: a broken install fails here, it does not skip
import transformers  # noqa: F401

from coursekit.measure import tensor_bytes
from coursekit.measure.phases import MasterAdamW, PhaseProbe, measure_step

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
BLOCKED = ("datasets", "psutil", "deepspeed", "nbgrader", "jupytext", "matplotlib", "jupyterlab")


def _gpu_image_env(tmp: Path) -> dict:
    """Environment whose sitecustomize makes this venv look like the GPU image (see module docstring)."""
    shim = tmp / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import os, sys
        _src = os.path.realpath({str(ROOT / "src")!r})
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _src]  # the editable install's .pth
        for _name in {BLOCKED!r}:
            sys.modules[_name] = None  # import raises ImportError; importlib.util.find_spec returns None
    """))
    env = dict(os.environ, PYTHONPATH=str(shim), OMP_NUM_THREADS="1")
    env.pop("COURSEKIT_DEVICE", None)
    return env


def test_shim_hides_packages_and_the_install(tmp_path):
    env = _gpu_image_env(tmp_path)
    code = ("import importlib.util as u, sys\n"
            f"assert all(u.find_spec(n) is None for n in {BLOCKED!r})\n"
            "try:\n    import coursekit\nexcept ImportError:\n    print('hidden')\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "hidden", out.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--out", str(tmp / "res")], env=_gpu_image_env(tmp),
                         cwd=tmp, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    print(f"gpu_check CPU version: {wall:.1f} s")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    res = json.loads((tmp / "res" / "gpu_check.json").read_text())
    return res, out.stdout, tmp / "res"


def test_structure_and_table(cpu_run):
    res, stdout, out = cpu_run
    for k in ("environment", "matmul", "flops", "memory", "mfu", "goals", "wall_s"):
        assert k in res, k
    env = res["environment"]
    assert env["mode"] == "cpu-reduced" and "GPU figures still to be taken" in env["note"]
    assert env["coursekit_source"] == str(ROOT / "src")
    # the trainer's step runs in-process (coursekit.parallel.api, coursekit.parallel.loss / layout: torch and pure
    # Python), but nothing that needs datasets, psutil or deepspeed: the loop, the launcher, the data, ZeRO
    assert not {"coursekit.train.loop", "coursekit.train.launcher", "coursekit.launch", "coursekit.data",
                "coursekit.zero.strategy"} & set(res["coursekit_modules"])
    table = (out / "table.txt").read_text().strip()
    assert stdout.rstrip().endswith(table) and table.startswith("GPU check [cpu-reduced]")  # printed last
    assert table.splitlines()[-1].startswith("Goals:")
    assert res["matmul"]["bf16_flops"] > 0


def test_flops_formula_within_1pct(cpu_run):
    rows = cpu_run[0]["flops"]
    assert {(r["attention"]) for r in rows} == {"sdpa", "eager"}
    for r in rows:
        assert "counted" in r, r
        assert abs(r["error"]) <= 0.01, r
    sdpa = next(r for r in rows if r["attention"] == "sdpa")
    assert sdpa["backend"].startswith("math") and not sdpa["sdpa_backward_recompute"]
    assert sdpa["formula_terms"]["attention"] > 0  # the math path's attention matmuls are counted


def test_memory_terms(cpu_run):
    rows = [r for r in cpu_run[0]["memory"] if r["modelled"]]
    assert len(rows) >= 5 and all("phases" in r for r in rows), rows
    assert {(r["attention"], r["recompute"]) for r in rows} >= {("sdpa", "none"), ("eager", "full"),
                                                               ("eager", "none"), ("sdpa", "full")}
    for r in rows:
        t = r["terms"]
        assert r["goals"]["states_exact"], t  # parameters, gradients, master weights, AdamW states: to the byte
        assert r["goals"]["activations_1pct"], t["saved_activations"]
        # the probe itself: the level at the end of backward is exactly states + gradients + the input ids
        held = sum(t[k]["measured"] for k in ("parameters", "gradients", "master_weights", "optimizer_states"))
        assert r["phases"]["end_of_backward"]["measured"] == held + r["probe"]["inputs_bytes"]
        # the step holds the fp32 gradient copy (4 bytes per parameter) on top
        step_extra = r["phases"]["optimizer_step"]["measured"] - r["phases"]["end_of_backward"]["measured"]
        assert step_extra >= 4 * r["num_params"]
        assert r["goals"]["peak_5pct"], r["phases"]["peak"]
    amp = [r for r in cpu_run[0]["memory"] if not r["modelled"]]
    assert len(amp) == 1 and "phases" in amp[0]  # the trainer's autocast, measured but not modelled


def test_mfu_cpu(cpu_run):
    mfu = cpu_run[0]["mfu"]
    v = mfu["variants"][0]
    assert v["variant"] == "eager" and v["tokens_per_s"] > 0, v
    assert v["mfu_table"] is None and 0 < v["mfu_matmul"]  # no device-table entry for a CPU
    assert Path(v["trace"]).is_file() and v["trace_analysis"]["top"]


# --------------------------------------------------------------------------------------------- the probe itself
def test_phase_probe_cpu_levels_and_peaks():
    with PhaseProbe("cpu", baseline_bytes=1000) as p:
        a = torch.empty(1000, dtype=torch.uint8)
        t = torch.empty(5000, dtype=torch.uint8)
        del t
        p.mark("one")  # level 2000, peak 7000
        b = torch.empty(300, dtype=torch.uint8)
        del a
        p.mark("two")  # level 1300, peak 2300
    assert p.results == {"one": {"level_bytes": 2000, "peak_bytes": 7000},
                         "two": {"level_bytes": 1300, "peak_bytes": 2300}}
    del b


def test_measure_step_and_master_adamw():
    from coursekit.models import build_model

    m = build_model("tiny-llama", dtype=torch.bfloat16, seed=0).train()
    opt = MasterAdamW(m.parameters())
    ids = torch.randint(0, 256, (2, 32))
    m(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    n = sum(p.numel() for p in m.parameters())
    sb = opt.state_bytes()
    assert sb["master_bytes"] == 4 * n and sb["optimizer_bytes"] == 8 * n + 4 * len(opt.master)  # + step counters
    assert all(torch.equal(p, mm.to(p.dtype)) for p, mm in zip(opt.params, opt.master))
    base = tensor_bytes(list(m.parameters()) + [ids]) + sb["master_bytes"] + sb["optimizer_bytes"]
    r = measure_step(m, opt.step, ids, ids, baseline_bytes=base)
    ph = r["phases"]
    assert list(ph) == ["forward", "start_of_backward", "end_of_backward", "optimizer_step"]
    assert ph["end_of_backward"]["level_bytes"] == base + 2 * n  # bf16 gradients
    assert ph["optimizer_step"]["level_bytes"] == base + 2 * n  # the fp32 copies are gone again
    assert ph["optimizer_step"]["peak_bytes"] >= base + 6 * n
    assert all(p.grad is None for p in m.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: bench/gpu_check.py --quick on CUDA")
def test_gpu_quick(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path / "res")],
                         env=_gpu_image_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    res = json.loads((tmp_path / "res" / "gpu_check.json").read_text())
    assert res["environment"]["mode"] == "cuda"
    assert res["goals"]["flops_1pct"] and res["goals"]["states_exact"] and res["goals"]["activations_1pct"], \
        res["goals"]
    assert res["mfu"]["variants"][0].get("tokens_per_s"), res["mfu"]


# --------------------------------------------------------------------------------------------- CUDA-only code paths
def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_table_lookup():
    t = _bench().table_gpu
    GiB = 1 << 30
    assert t("NVIDIA H200") == "H200" and t("NVIDIA H100 80GB HBM3") == "H100-80GB"
    assert t("NVIDIA H100 PCIe") == "H100-PCIe" and t("NVIDIA H100 NVL") is None  # NVL: not in the table
    assert t("NVIDIA A100-SXM4-40GB", 40 * GiB) == "A100-40GB" and t("NVIDIA A100-SXM4-80GB", 80 * GiB) == "A100-80GB"
    assert t("NVIDIA A10G") == "A10G" and t("NVIDIA A10") == "A10" and t("NVIDIA L4") == "L4"
    assert t("NVIDIA GeForce RTX 4090") == "RTX-4090" and t("Tesla T4") is None


def test_trace_analysis_of_a_cuda_trace(tmp_path):
    """Kernel shares and GPU busy fraction from a Chrome trace shaped like a CUDA one (gaps 10 of 100 µs)."""
    ev = [{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": d} for n, ts, d in [
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 40), ("pytorch_flash::flash_fwd_kernel", 40, 20),
        ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>", 70, 10),
        ("nvjet_tst_128x256_64x4", 80, 20), ("void at::native::elementwise_kernel<direct_copy_kernel>", 85, 5)]]
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500})
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    a = _bench().analyse_trace(str(path), cuda=True)
    assert a["top"][0] == {"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "us": 40.0}
    assert a["gpu_busy_fraction"] == pytest.approx(0.9)  # 60-70 idle; 85-90 overlaps 80-100
    assert a["shares"]["matmul"] == pytest.approx(60 / 95) and a["shares"]["attention"] == pytest.approx(20 / 95)


def test_table_and_goals_for_cuda_results(cpu_run):
    """The CUDA report (device-table MFU, a compiled variant that timed out) renders from CPU results dressed up."""
    b = _bench()
    res = json.loads(json.dumps(cpu_run[0]))
    res["environment"].update(mode="cuda", device_name="NVIDIA H200", table_gpu="H200", table_bf16_flops=989.4e12)
    v = res["mfu"]["variants"][0]
    v.update(mfu_table=0.41, achieved_flops=0.41 * 989.4e12)
    res["mfu"]["variants"].append({"variant": "compiled", "error_text": "timed out after 230 s"})
    res["mfu"]["best_mfu_table"] = 0.41
    res["memory"].append({"model": "llama3.2-1b", "batch": 8, "seq": 2048, "attention": "sdpa", "recompute": "full",
                          "modelled": True, "error_text": "OutOfMemoryError: CUDA out of memory"})
    g = b.goals(res)
    assert g["mfu_45pct"] is False and g["states_exact"] is False  # a case that did not run counts as missed
    res["goals"] = g
    text = b.table(res)
    assert "41.0% (table)" in text and "timed out after 230 s" in text and "OutOfMemoryError" in text
    assert "GPU figures still to be taken" not in text
