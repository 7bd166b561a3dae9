"""ZeRO-Offload with DeepSpeed's own ops. Slow tier: `scripts/test.sh --slow`, or
`.venv/bin/python -m pytest -m slow tests/test_zero_offload.py` (about 2 minutes once the ops are built).

* CPU offload with **DeepSpeedCPUAdam** (the config's ``optimizer`` block): the op is compiled with the machine's
  C++ compiler the first time (63 s wall on an idle 2-core machine, ~3 min when the cores are busy), then loaded
  from ~/.cache/torch_extensions. The default tier covers CPU offload with torch's AdamW (no build).
* **NVMe offload** (ZeRO-Infinity) of optimizer states and parameters to a local folder: needs Debian's
  ``libaio-dev`` and DeepSpeed's ``async_io`` op (a one-time build of several minutes on 2 cores). Only tensors of
  at least 1 MiB per rank go to the files, so it uses wider models than the course's tiny one; the swap files'
  bytes equal ``coursekit memory``'s prediction exactly (I/O alignment included).
"""
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from coursekit.launch import launch
from coursekit.memory import estimate
from coursekit.memory import deepspeed as layout
from coursekit.models import param_numels
from coursekit.zero.ds_config import CONFIG_DIR, build_config, save_config

pytestmark = pytest.mark.slow

COMMON = ["--model", "tiny-llama", "--steps", "4", "--seq", "32", "--global-batch", "8", "--quiet", "--seed", "3"]
LOSS_ATOL = 1e-5  # DeepSpeedCPUAdam computes AdamW in fp32 like torch's, in another order (see test_zero.py)


def _train(*args, nproc=2, timeout=600):
    return launch("coursekit.train", [*args, *COMMON], nproc=nproc, timeout=timeout, stream=False).results


@pytest.fixture(scope="module")
def ddp():
    return [s["loss"] for s in _train("--strategy", "ddp")[0]["steps"]]


def _cpu_adam_cached() -> bool:
    return any(Path.home().glob(".cache/torch_extensions/*/cpu_adam/cpu_adam.so"))


@pytest.mark.parametrize("name,stage", [("zero2_offload_cpu", 2), ("zero3_offload_cpu", 3)])
def test_cpu_offload_with_deepspeed_cpu_adam(ddp, name, stage, no_orphans, capsys):
    cached = _cpu_adam_cached()
    if not cached and not shutil.which(os.environ.get("CXX", "c++")):
        pytest.skip("DeepSpeedCPUAdam is compiled on first use and no C++ compiler is installed (apt-get install g++)")
    t0 = time.monotonic()
    recs = _train("--strategy", "deepspeed", "--ds-config", CONFIG_DIR / f"{name}.json")
    with capsys.disabled():
        print(f"\n[{name}] {time.monotonic() - t0:.0f} s{'' if cached else ' including the DeepSpeedCPUAdam build'}")
    numels = param_numels("tiny-llama")
    for rank, rec in enumerate(recs):
        f = rec["final"]
        assert [s["loss"] for s in rec["steps"]] == pytest.approx(ddp, abs=LOSS_ATOL)
        assert f["ds_config"]["optimizer"]["type"] == "AdamW"  # DeepSpeed built its own: DeepSpeedCPUAdam
        want = layout.deepspeed_bytes(numels, stage=stage, world=2, rank=rank, **{
            "offload_optimizer": "cpu", "offload_param": "cpu" if stage == 3 else "none"})
        assert f["tiers"] == want["tiers"]
        calc = estimate("tiny-llama", batch=f["micro_batch"], seq=32, dtype="fp32", dp=2, zero=stage, dp_rank=rank,
                        offload="cpu", offload_params="cpu" if stage == 3 else "none", microbatches=1)
        assert f["cpu_bytes"] == calc.cpu_bytes, f"rank {rank}: host bytes, measured vs `coursekit memory`"
        # what left the accelerator: fp32 master, Adam states and the fp32 gradient partition (16Ψ/N in fp32)
        assert {"master", "optimizer", "fp32_grads"} <= set(f["tiers"]["cpu"])
        assert not {"master", "optimizer", "fp32_grads"} & set(f["tiers"].get("accelerator", {}))


WIDE = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 4096, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_dropout": 0.0}
# sizes that are not multiples of DeepSpeed's 1 KiB I/O alignment: files rounded up (parameters, optimizer) and
# down (gradient partitions, whose remainders stay in host memory)
ODD = WIDE | {"hidden_size": 528, "intermediate_size": 1100, "vocab_size": 4001}


def _aio_status() -> str | None:
    """None when DeepSpeed's async_io op can be built here, else why not."""
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder
    except ImportError as e:  # pragma: no cover
        return f"DeepSpeed has no AsyncIOBuilder: {e}"
    if not AsyncIOBuilder().is_compatible(verbose=False):
        return "DeepSpeed's async_io op cannot be built: install Debian's libaio-dev (apt-get install libaio-dev)"
    return None


@pytest.mark.parametrize("shape", [WIDE, ODD], ids=["aligned", "unaligned"])
def test_nvme_offload_writes_what_coursekit_memory_predicts(shape, tmp_path, no_orphans):
    why = _aio_status()  # (not under capsys: DeepSpeed's compile probe needs a real stderr file descriptor)
    if why:
        pytest.skip(why)
    model = tmp_path / "config.json"
    model.write_text(json.dumps(shape))
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    # parameter offload to NVMe needs bf16 weights, a buffer that holds the largest parameter, and >= 16 buffers
    cfg = build_config(3, dtype="bf16", offload_optimizer="nvme", offload_param="nvme", nvme_path=str(nvme),
                       nvme_buffer_size=4096 * 528)
    path = save_config(cfg, tmp_path / "nvme.json")
    t0 = time.monotonic()
    recs = launch("coursekit.train", ["--strategy", "deepspeed", "--ds-config", path, "--model", model, "--dtype",
                                      "bf16", "--steps", "3", "--seq", "32", "--global-batch", "4", "--quiet"],
                  nproc=2, timeout=1500, stream=False).results
    print(f"\n[nvme] {time.monotonic() - t0:.0f} s (includes the async_io build if it was not cached)")
    calc = estimate(model, batch=2, seq=32, dp=2, zero=3, offload="nvme", offload_params="nvme")
    assert calc.nvme_bytes > 0
    for rank, rec in enumerate(recs):
        f = rec["final"]
        losses = [s["loss"] for s in rec["steps"]]
        assert losses[-1] < losses[0], "NVMe-offloaded training must still train"
        # every byte of the swap files: parameter partitions, fp32 master + Adam moments, gradient partitions
        assert f["nvme_bytes"] == calc.nvme_bytes, f"rank {rank}: {f['nvme_bytes']} bytes under {nvme}"
        # the accelerator keeps only the bf16 gradient partition and the reduce bucket
        assert set(f["tiers"]["accelerator"]) == {"grads", "buffers"}, f["tiers"]
        assert f["tiers"]["accelerator"]["grads"] == calc.categories["gradients"]
        assert calc.categories["parameters"] == calc.categories["master_weights"] == 0
        # the host: the step's working set (swapped-in partitions) and DeepSpeed's pinned swap buffers
        assert {"params", "master", "fp32_grads", "buffers"} <= set(f["tiers"]["cpu"])
