"""The reference trainer, CS336-style: distributed runs equal the single-process run step by step."""
import subprocess
import sys

import pytest

from coursekit.launch import LaunchError, launch

from parity import LOSS_ATOL, assert_equal_to_single, baseline, losses, train


@pytest.fixture(scope="module")
def single():
    return baseline()


@pytest.mark.parametrize("nproc,grad_accum", [(2, 1), pytest.param(4, 1, marks=pytest.mark.slow), (2, 2)])  # 4: budget
def test_ddp_equals_single_step_by_step(single, nproc, grad_accum, no_orphans):
    """Also --count-step (the last step's collectives and peak saved activations, coursekit.profiling.stepcount):
    counting changes no loss; DDP all-reduces every fp32 gradient once per step (the volume model), whatever the
    accumulation; the peak of saved activations is one micro-batch's, as the calculator says (the trainer passes
    per-sequence position ids)."""
    from coursekit.comm import volume
    from coursekit.memory import activation_bytes, preset
    from coursekit.models import build_model

    buffers = sum(b.numel() * b.element_size() for b in build_model("tiny-llama", device="meta").buffers())
    res = train("ddp", nproc, "--grad-accum", str(grad_accum), "--count-step")
    assert_equal_to_single(res, single, nproc)  # every rank, not only rank 0
    for rec in res.results:
        f = rec["final"]
        assert f["micro_batch"] * grad_accum * nproc == 8
        assert held_states(rec) == predicted_states(nproc)  # DDP replicates: every rank holds the full 16Ψ
        # the gradient buckets, and the buffers (rotary inv_freq) DDP broadcasts before the step's first forward
        plan = volume.ddp(f["num_params"], nproc, grad_bytes=4, buffer_bytes=buffers)
        assert {op: v["bytes"] for op, v in f["comm"].items()} == {
            op: volume.payload_bytes(plan, op) for op in ("all_reduce", "broadcast")}, f["comm"]
        assert f["comm"]["broadcast"]["calls"] == 1 and f["comm_bytes"] == volume.payload_bytes(plan)
        acts = activation_bytes(preset("tiny-llama"), f["micro_batch"], f["seq"], dtype="fp32", attention="sdpa",
                                impl="hf", kernels="cpu", position_ids="per-sequence").total_bytes
        assert f["peak_saved_bytes"] == acts, (f["peak_saved_bytes"], acts)
        # each rank's own loss differs (its own rows) and their mean is the reported loss: measured before the
        # all-reduce, not true by construction
        assert rec["steps"][0]["local_loss"] != rec["steps"][0]["loss"]
    for step in range(len(single["steps"])):
        mean = sum(r["steps"][step]["local_loss"] for r in res.results) / nproc
        assert mean == pytest.approx(losses(single)[step], abs=LOSS_ATOL)


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


@pytest.mark.slow  # default-tier budget: ~24 s; resume from a checkpoint runs in test_elastic (SIGKILL) and test_slurm's requeue (a crash)
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
    (["train", "--strategy", "nope"], "--strategy: invalid choice: 'nope'"),
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


def test_preset_tensor_counts_match_the_real_models():
    """The calculator's per-tensor optimizer state needs the tensor count; check it on the meta device."""
    from coursekit.memory import PRESETS, preset
    from coursekit.models import build_model

    for name in sorted(PRESETS):
        assert preset(name).num_param_tensors() == len(list(build_model(name, device="meta").parameters())), name


def test_the_worker_imports_the_model_it_builds_before_freezing_the_imports():
    """A worker imports its model's transformers modules ahead (``loop.prepare``: ``models.model_class``, the class
    ``build_model`` builds), without the collector, then freezes them; bad input is left to the run's checks."""
    import subprocess
    import sys

    code = """import sys
from coursekit.models import build_model, model_class
from coursekit.options import parse
from coursekit.train.loop import prepare
gpt2 = "transformers.models.gpt2.modeling_gpt2"
prepare(parse(["--model", "no-such-model.json"]))
assert gpt2 not in sys.modules
prepare(parse(["--model", "tiny-gpt2"]))
assert gpt2 in sys.modules
for name in ("tiny-llama", "tiny-gpt2", "tiny-qwen3", "tiny-mixtral", "tiny-qwen3-moe"):
    assert type(build_model(name, device="meta")) is model_class(name), name
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
