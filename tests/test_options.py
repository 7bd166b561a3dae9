"""Typed options: the trainer's CLI is generated from dataclasses; its surface is frozen here on purpose."""
import json
import subprocess
import sys

import pytest

from coursekit import options

# torchtitan's test_no_new_cli_options: a flag added or removed must be a deliberate change of this list (and of
# the README / docs that name it), never an accident.
FROZEN = {
    "launcher": ["--nproc", "--timeout", "--json", "--max-restarts"],
    "train": ["--model", "--steps", "--seq", "--micro-batch", "--global-batch", "--grad-accum", "--microbatches",
              "--dtype", "--attention", "--lr", "--weight-decay", "--seed", "--data", "--recompute",
              "--recompute-layers", "--compile",
              "--router-aux-loss-coef"],
    "parallel": ["--strategy", "--dp-replicate", "--dp-shard", "--tp", "--pp", "--cp"],
    "ckpt": ["--ckpt-dir", "--save-every", "--async-ckpt", "--keep"],
    "profile": ["--profile-dir", "--profile-steps", "--count-step"],
    "faults": ["--crash-at-step", "--kill-at-step", "--kill-rank", "--kill-in-save", "--slow-rank",
               "--slow-ms"],
    "output": ["--quiet"],
    "ddp (only with ddp)": ["--bucket-mb"],
    "zero0-zero3, deepspeed (only with zero0-zero3, deepspeed)": ["--ds-config"],
    "pp (only with pp)": ["--pp-schedule"],
    "tp (only with tp)": ["--sp", "--sp-style"],
    "fsdp2, hsdp, fsdp1 (only with fsdp2, hsdp, fsdp1)": ["--reshard-after-forward", "--wrap", "--offload",
                                                          "--prefetch", "--compile-model"],
    "cp (only with cp)": ["--cp-impl"],
    "ep (only with ep)": ["--ep", "--capacity-factor"],
}


def _flags_by_group():
    p = options.build_parser(launcher=True)
    return {g.title: [s for a in g._group_actions for s in a.option_strings]
            for g in p._action_groups if g._group_actions and g.title != "options"}


def test_no_new_cli_options():
    assert _flags_by_group() == FROZEN


def test_every_option_has_its_docstring_as_help():
    for cls in [*options.CORE.values(), options.LaunchOptions, *(c for c, _ in options.component_groups())]:
        docs = options.field_docs(cls)
        for f in cls.__dataclass_fields__:
            assert len(docs.get(f, "")) > 10, f"{cls.__name__}.{f} has no docstring"
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    assert "Pipeline schedule" in out.stdout and "DDP gradient bucket size" in out.stdout


def test_a_flag_no_chosen_component_owns_is_refused_in_one_place():
    with pytest.raises(ValueError, match="--bucket-mb belongs to ddp, which this run does not use "
                                         r"\(--strategy zero2\)"):
        options.parse(["--strategy", "zero2", "--bucket-mb", "4"])
    with pytest.raises(ValueError, match="--ds-config belongs to zero0-zero3, deepspeed"):
        options.parse(["--strategy", "ddp", "--ds-config", "x.json"])
    assert options.parse(["--strategy", "ddp", "--bucket-mb", "4"]).of(options_ddp()).bucket_mb == 4.0
    assert options.parse(["--pp", "2", "--pp-schedule", "1f1b"]).parallel.pp == 2


def options_ddp():
    from coursekit.ddp import DDPOptions

    return DDPOptions


def test_microbatches_is_an_alias_of_grad_accum_and_argv_round_trips():
    o = options.parse(["--strategy", "ddp", "--microbatches", "4", "--compile", "--lr", "0.01"])
    assert o.train.grad_accum == 4 and o.train.compile and o.train.lr == 0.01
    again = options.parse(options.to_argv(o))
    assert again.to_dict() == o.to_dict() and again.given == o.given


def test_json_prints_every_ranks_records_and_progress_shows_in_logs(no_orphans):
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--strategy", "ddp", "--nproc", "2",
                          "--steps", "2", "--seq", "16", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout[out.stdout.index("{"):])
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert [s["step"] for s in r["steps"]] == [0, 1] and r["final"]["world_size"] == 2
        assert all(s["loss"] > 0 for s in r["steps"])
    # without --json, a log (not a terminal) gets one progress line per step, then the summary with the final loss
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--strategy", "single", "--steps", "3",
                          "--seq", "16"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    prog = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in prog] == ["1/3", "2/3", "3/3"] and all("ETA" in ln for ln in prog)
    last = float(prog[-1].split()[3])
    row = next(ln for ln in lines if ln.startswith("single"))
    assert float(row.split()[5]) == pytest.approx(last, abs=1e-4)  # the summary's final loss is the last step's
