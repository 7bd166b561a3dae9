"""Elastic recovery: a worker SIGKILLed mid-run, torchrun restarts the group, the run resumes from the last complete
checkpoint and its losses are bit-identical to an uninterrupted run."""
import json

import pytest

from parity import cli_ranks

ARGS = ["train", "--strategy", "ddp", "--nproc", "2", "--steps", "6", "--seq", "16", "--save-every", "2", "--json",
        "--seed", "5"]


def cli(*args, timeout=400):
    return cli_ranks(*args, timeout=timeout)


def dropout_model(tmp_path) -> str:
    """tiny-llama with attention dropout 0.1: every step draws random numbers, so a resume that did not restore each
    rank's generators would not be bit-identical (with dropout 0 it would be, restored or not)."""
    from coursekit.memory import preset
    from coursekit.memory.presets import to_hf_config_dict

    cfg = tmp_path / "tiny-llama-dropout.json"
    cfg.write_text(json.dumps(to_hf_config_dict(preset("tiny-llama").with_(attn_dropout=0.1))))
    return str(cfg)


def test_sigkilled_worker_resumes_bit_identical(tmp_path, no_orphans):
    model = ["--model", dropout_model(tmp_path)]
    whole = cli(*ARGS, *model, "--ckpt-dir", tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "step-4").mkdir()  # a checkpoint that was being written: no marker points at it
    resumed = cli(*ARGS, *model, "--ckpt-dir", tmp_path / "b", "--kill-at-step", "3", "--kill-rank", "1",
                  "--max-restarts", "1")
    full = {s["step"]: s["loss"] for s in whole[0]["steps"]}
    for rec in resumed:  # every rank of the restarted attempt
        f = rec["final"]
        assert f["restart_count"] == 1 and f["resumed_from_step"] == 2  # the last complete checkpoint before 3
        assert 3 - f["resumed_from_step"] <= 2  # no more than --save-every steps recomputed
        assert [s["step"] for s in rec["steps"]] == [2, 3, 4, 5]
        assert all(s["loss"] == full[s["step"]] for s in rec["steps"])  # bit-identical, not approximately
        assert f["param_sq_sum"] == whole[rec["rank"]]["final"]["param_sq_sum"]
        assert 0 < f["recovery_s"] < 300 and f["recovery_from"] == "kill"  # kill -> first resumed step


def test_kill_needs_restarts_and_a_checkpoint_folder():
    from coursekit.train.launcher import plan

    with pytest.raises(ValueError, match="--kill-at-step needs --max-restarts"):
        plan(["--strategy", "ddp", "--nproc", "2", "--kill-at-step", "2"])
    with pytest.raises(ValueError, match="--slow-rank 5 is not a rank of 2"):
        plan(["--strategy", "ddp", "--nproc", "2", "--slow-rank", "5", "--slow-ms", "10"])


def test_attempts_count_requeues_and_processes_started_after_a_kill(tmp_path, monkeypatch):
    """restart_count() (the trainer's "which attempt is this"): torchrun's restarts plus Slurm's requeues, and at
    least 1 in a process started after an injected kill — on several nodes torchrun counts restarts per agent, and
    the agents whose workers did not fail restart theirs at TORCHELASTIC_RESTART_COUNT=0 (seen under Slurm)."""
    import importlib
    import time
    from types import SimpleNamespace

    import coursekit.profiling.faults as F

    none = SimpleNamespace(kill_at_step=None, kill_rank=1, kill_in_save=None)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    try:
        F = importlib.reload(F)  # a fresh process: nothing noted yet
        (tmp_path / F.KILL_FILE).write_text(json.dumps({"step": 3, "rank": 1, "time": time.time() - 5}))
        assert F.restart_count() == 0
        F.maybe_kill(0, none, 0, str(tmp_path))  # the loop's first call notes the earlier attempt's kill
        assert F.restart_count() == 1
        F = importlib.reload(F)
        (tmp_path / F.KILL_FILE).write_text(json.dumps({"step": 3, "rank": 1, "time": time.time() + 5}))
        assert F.kill_in_save(none, 0, str(tmp_path)) is None and F.restart_count() == 0  # killed after our start
        monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # a job Slurm requeued twice, its torchrun at 0
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
        assert F.restart_count() == 2
    finally:
        importlib.reload(F)
