"""The reference trainer, CS336-style: distributed runs equal the single-process run step by step."""
import subprocess
import sys

import pytest

from coursekit.launch import LaunchError, launch

STEPS = 4
COMMON = ["--model", "tiny-llama", "--steps", str(STEPS), "--seq", "32", "--global-batch", "8", "--dtype", "fp32",
          "--quiet", "--seed", "3"]


def train(strategy, nproc, *extra, timeout=90):
    return launch("coursekit.train", ["--strategy", strategy, *COMMON, *extra], nproc=nproc, timeout=timeout,
                  stream=False)


@pytest.fixture(scope="module")
def single():
    return train("single", 1).results[0]


def losses(rec):
    return [s["loss"] for s in rec["steps"]]


# fp32 tolerance: DDP sums gradient shards in a different order than one process sums the whole batch, so results
# differ by float rounding only (~1e-7 relative per step, compounding through Adam); 1e-5 absolute on a loss of ~5
# and 1e-6 relative on Σw² catch any real error (a wrong averaging factor or data slice moves them by >1e-2).
LOSS_ATOL = 1e-5


@pytest.mark.parametrize("nproc,grad_accum", [(2, 1), (4, 1), (2, 2)])
def test_ddp_equals_single_step_by_step(single, nproc, grad_accum, no_orphans):
    res = train("ddp", nproc, "--grad-accum", str(grad_accum))
    assert len(res.results) == nproc
    for rank, rec in enumerate(res.results):  # every rank, not only rank 0
        assert rec["rank"] == rank and rec["final"]["world_size"] == nproc
        assert rec["final"]["micro_batch"] * grad_accum * nproc == 8
        assert losses(rec) == pytest.approx(losses(single), abs=LOSS_ATOL)
        assert rec["final"]["param_sq_sum"] == pytest.approx(single["final"]["param_sq_sum"], rel=1e-6)
        assert held_states(rec) == predicted_states(nproc)  # DDP replicates: every rank holds the full 16Ψ
    assert losses(single)[-1] < losses(single)[0]  # it really trains


def predicted_states(world, dtype="fp32"):
    """What `coursekit memory` says one rank holds (fp32 AdamW; bf16 autocast keeps fp32 weights too)."""
    from coursekit.memory import estimate

    e = estimate("tiny-llama", batch=8 // world, seq=32, dtype=dtype, precision="fp32", engine="ddp", dp=world)
    return {"params_bytes": e.to_dict()["parameters_bytes"], "grads_bytes": e.to_dict()["gradients_bytes"],
            "optimizer_bytes": e.to_dict()["optimizer_states_bytes"]}


def held_states(rec):
    return {k: rec["final"][k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")}


def test_held_state_bytes_equal_the_calculator(single):
    assert held_states(single) == predicted_states(1)  # to the byte
    n = single["final"]["num_params"]  # and the calculator's own arithmetic: 16 bytes/param + step counters
    assert held_states(single)["params_bytes"] + held_states(single)["grads_bytes"] == 8 * n


def test_resume_after_crash_equals_uninterrupted(single, tmp_path, no_orphans):
    ckpt = tmp_path / "ckpt"
    with pytest.raises(LaunchError) as e:
        train("ddp", 2, "--ckpt-dir", ckpt, "--save-every", "2", "--crash-at-step", "3")
    assert "injected failure" in e.value.traceback
    resumed = train("ddp", 2, "--ckpt-dir", ckpt, "--save-every", "2", "--crash-at-step", "3").results
    for rec in resumed:
        assert rec["final"]["resumed_from_step"] == 2
        assert [s["step"] for s in rec["steps"]] == [2, 3]
        assert losses(rec) == pytest.approx(losses(single)[2:], abs=LOSS_ATOL)


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "coursekit.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args,needle", [
    (["train", "--strategy", "nope"], "unknown strategy 'nope'"),
    (["train", "--strategy", "ddp", "--model", "gpt-17"], "unknown model 'gpt-17'"),
    (["train", "--strategy", "ddp", "--nproc", "3", "--global-batch", "8"], "not divisible"),
    (["train", "--strategy", "single", "--nproc", "2"], "runs on 1 process"),
    (["train", "--steps", "0"], "--steps must be >= 1"),
    (["nosuchcommand"], "unknown command"),
])
def test_bad_input_gives_one_clear_error(args, needle, no_orphans):
    out = cli(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_crashing_rank_fails_the_cli_cleanly(no_orphans):
    out = cli("train", "--strategy", "ddp", "--nproc", "2", "--steps", "3", "--crash-at-step", "1", timeout=180)
    assert out.returncode == 1
    assert "injected failure at step 1" in out.stderr and "failed on rank" in out.stderr


def test_cli_train_runs_through_the_launcher(no_orphans):
    out = cli("train", "--strategy", "ddp", "--nproc", "2", "--steps", "2", "--seq", "16", timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ddp" in out.stdout and "tokens/s" in out.stdout


def test_preset_tensor_counts_match_the_real_models():
    """The calculator's per-tensor optimizer state needs the tensor count; check it on the meta device."""
    from coursekit.memory import PRESETS, preset
    from coursekit.models import build_model

    for name in sorted(PRESETS):
        assert preset(name).num_param_tensors() == len(list(build_model(name, device="meta").parameters())), name
