"""MFU and HFU (coursekit.profiling.mfu): the peak table refuses what it does not know, the CPU peak is measured
and cached, and the trainer's model FLOPs per step equal coursekit.flops and FlopCounterMode for the same run."""
import json
import subprocess
import sys

import pytest

from coursekit.profiling import mfu

ARGS = ["--nproc", "1", "--strategy", "single", "--steps", "3", "--seq", "16", "--global-batch", "4",
        "--attention", "eager", "--recompute", "full", "--json"]


def test_gpu_peaks_are_dense_data_sheet_figures_and_unknown_devices_are_refused():
    h100 = mfu.gpu_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert h100["flops"] == 989.4e12 and "dense" in h100["source"]  # not the 1,979 TFLOP/s 2:4-sparsity figure
    assert mfu.gpu_peak("NVIDIA H100 PCIe", "bf16")["flops"] == 756.5e12
    assert mfu.gpu_peak("NVIDIA A100-SXM4-40GB", "fp32")["flops"] == 19.5e12
    unknown = mfu.gpu_peak("NVIDIA GeForce GTX 1080", "bf16")
    assert unknown["flops"] is None and "refused" in unknown["source"]
    u = mfu.utilisation({"model_flops": 1e9, "hw_flops": 1.5e9}, step_time_s=0.5, devices=2, peak=unknown)
    assert u["mfu"] is None and u["hfu"] is None and u["achieved_flops_per_device"] == 1e9


def test_cpu_peak_is_measured_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSEKIT_CACHE_DIR", str(tmp_path))
    first = mfu.cpu_peak("fp32")
    cache = json.loads((tmp_path / "peak.json").read_text())
    assert list(cache.values()) == [first["flops"]] and first["flops"] > 1e8 and "measured" in first["source"]
    assert mfu.cpu_peak("fp32")["flops"] == first["flops"]  # read from the cache, not measured again


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    env = dict(__import__("os").environ, COURSEKIT_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", *ARGS], capture_output=True, text=True,
                         timeout=400, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout[out.stdout.index("{"):])["ranks"][0]


def test_trainer_flops_equal_the_calculator_and_flop_counter(run):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from coursekit.flops import flops_per_step
    from coursekit.models import build_model

    f = run["final"]
    assert f["model_flops_per_step"] == flops_per_step("tiny-llama", 4, 16)["total"]
    model = build_model("tiny-llama", attention="eager", seed=0)
    ids = torch.randint(0, 256, (4, 16))
    with FlopCounterMode(display=False) as fc:
        model(input_ids=ids).logits.sum().backward()
    assert fc.get_total_flops() == f["model_flops_per_step"]
    # --recompute full: every block's forward runs again -> hardware FLOPs = model FLOPs + the recomputed forward,
    # counted here by torch (the forward's FLOPs minus the head's matmul, 2·b·s·h·V), not by coursekit.flops
    from coursekit.memory import preset

    with FlopCounterMode(display=False) as fwd:
        model(input_ids=ids)
    shape = preset("tiny-llama")
    extra = fwd.get_total_flops() - 2 * 4 * 16 * shape.hidden * shape.vocab
    assert extra > 0 and f["hw_flops_per_step"] == f["model_flops_per_step"] + extra


def test_trainer_mfu_is_model_flops_over_step_time_and_peak(run):
    f, steps = run["final"], run["steps"]
    times = sorted(s["step_time_s"] for s in steps[1:])
    med = times[len(times) // 2]
    assert f["achieved_flops_per_device"] == pytest.approx(f["model_flops_per_step"] / med)
    assert f["mfu"] == pytest.approx(f["achieved_flops_per_device"] / f["peak_flops"])
    assert 0 < f["mfu"] < 1 and f["hfu"] > f["mfu"]  # recomputation is work the hardware did
    assert f["hfu"] / f["mfu"] == pytest.approx(f["hw_flops_per_step"] / f["model_flops_per_step"])
    assert "measured" in f["peak_source"]  # on CPU the peak is a measured matmul rate, never a guess
