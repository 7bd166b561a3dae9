"""Every nonsense value is refused before launch, with one line naming the flag (exit 2), never a traceback.

The ranges live in the options' own declarations (``field(metadata={"min": ..., "max": ..., "gt": ...})``, floats
finite), checked in one place (``coursekit.options.check_ranges``); a numeric option without a declared range fails
here, so a new option cannot forget it. A property-based fuzz (hypothesis) then throws generated argument lists at
the trainer's pre-launch plan (the launch itself is never reached: ``coursekit.train.launcher.plan`` only parses and
checks), at ``coursekit memory`` and at ``coursekit plan``: each must run or refuse cleanly.
"""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coursekit import options
from coursekit.memory import cli as memory_cli
from coursekit.plan import cli as plan_cli
from coursekit.train.launcher import plan


def _groups():
    return [*options.CORE.values(), options.LaunchOptions, *(c for c, _ in options.component_groups())]


def test_every_numeric_option_declares_its_range():
    missing = []
    for cls in _groups():
        for f in dataclasses.fields(cls):
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
            if kind.startswith(("int", "float")) and not {"min", "gt"} & set(f.metadata):
                missing.append(f"{cls.__name__}.{f.name}")
    assert not missing, f"numeric options without a declared range: {missing}"


@pytest.mark.parametrize("args,needle", [
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--seed", "99999999999999999999"], "--seed must be <= "),
    (["--slow-rank", "1", "--slow-ms", "inf"], "--slow-ms must be a finite number"),
    (["--slow-ms", "-10"], "--slow-ms must be >= 0"),
    (["--timeout", "-5"], "--timeout must be > 0"),
    (["--timeout", "nan"], "--timeout must be a finite number"),
    (["--max-restarts", "-1"], "--max-restarts must be >= 0"),
    (["--global-batch", "99999999999999999998"], "--global-batch must be <= "),
    (["--kill-in-save", "0"], "--kill-in-save must be >= 1"),
    (["--bucket-mb", "-1"], "--bucket-mb must be > 0"),
    (["--cp", "-1"], "--cp must be >= 1"),
    (["--ckpt-dir", "/dev/null"], "--ckpt-dir /dev/null is not a folder"),
    (["--profile-dir", "/dev/null/traces"], "--profile-dir /dev/null/traces: cannot write there (/dev/null is not"),
])
def test_nonsense_values_are_refused_before_launch_naming_the_flag(args, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        plan(["--strategy", "ddp", *args])


@pytest.mark.parametrize("argv,prefix", [
    (["train", "--strateg", "ddp"], "--strateg"),
    (["memory", "--model", "tiny-llama", "--micro", "1", "--seq", "8"], "--micro"),
    (["plan", "--model", "tiny-llama", "--gpus", "8", "--seq", "8", "--global-batch", "8", "--netw", "ib-400"], "--netw"),
    (["layout", "--nproc", "4", "--strat", "ddp"], "--strat"),
    (["k8s", "render", "--kind", "job", "--image", "i", "--namespace", "n", "--nodes", "1", "--gpus-per-node", "1",
      "--ou", "x"], "--ou"),
])
def test_a_prefix_of_a_flag_is_not_taken_for_the_flag(argv, prefix, capsys):
    """argparse's prefix matching is off in every CLI: ``--strateg ddp`` is refused, not run as ``--strategy``
    (a prefix that later becomes ambiguous, or a typo, would otherwise change what runs)."""
    from coursekit import cli

    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    assert f"unrecognized arguments: {prefix}" in capsys.readouterr().err


NUMBERS = st.one_of(st.integers(-(10 ** 20), 10 ** 20), st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "-0.0"]),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=4))
TRAIN_FLAGS = ["--steps", "--seq", "--micro-batch", "--global-batch", "--grad-accum", "--lr", "--seed", "--tp",
               "--pp", "--cp", "--dp-replicate", "--dp-shard", "--save-every", "--nproc", "--timeout",
               "--max-restarts", "--slow-rank", "--slow-ms", "--crash-at-step", "--bucket-mb"]
CHOICE_FLAGS = {"--strategy": ["single", "ddp", "fsdp2", "hsdp", "zero2", "nope"], "--dtype": ["fp32", "bf16", "x"],
                "--pp-schedule": ["gpipe", "1f1b", "zbv"], "--recompute": ["none", "full", "selective"]}


def _argv(draw_pairs):
    return [str(x) for pair in draw_pairs for x in pair]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(TRAIN_FLAGS), NUMBERS), max_size=4),
       st.lists(st.sampled_from(list(CHOICE_FLAGS)).flatmap(
           lambda k: st.tuples(st.just(k), st.sampled_from(CHOICE_FLAGS[k]))), max_size=2))
def test_the_trainers_pre_launch_plan_runs_or_refuses_cleanly(numbers, choices):
    argv = _argv(numbers + choices)
    try:
        plan(argv)
    except ValueError as e:
        assert "\n" not in str(e).strip() and str(e), f"{argv}: {e!r}"
    except SystemExit as e:  # argparse: a value of the wrong type or an unknown choice, usage and exit 2
        assert e.code == 2, argv


MEMORY_FLAGS = ["--micro-batch", "--seq", "--tp", "--pp", "--cp", "--dp", "--world", "--dp-replicate", "--dp-shard",
                "--grad-accum", "--pp-virtual", "--runtime-gib", "--dropout", "--dp-rank", "--reduce-bucket-size"]


FIXTURE_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]  # capsys is read out every example


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE_OK)
@given(numbers=st.lists(st.tuples(st.sampled_from(MEMORY_FLAGS), NUMBERS), max_size=4),
       model=st.sampled_from(["tiny-llama", "llama3-8b", "tiny-gpt2"]),
       extra=st.sampled_from([[], ["--strategy", "zero3"], ["--strategy", "fsdp2"], ["--pp-schedule", "1f1b"],
                              ["--solve", "max-batch", "--gpu", "H100-80GB"]]))
def test_coursekit_memory_runs_or_refuses_cleanly(numbers, model, extra, capsys):
    argv = ["--model", model, *_argv(numbers), *extra, "--json"]
    rc = memory_cli.main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), argv
    assert "Traceback" not in err
    if rc == 0:
        assert "peak_bytes" in json.loads(out)
    else:
        assert err.strip(), argv


PLAN_FLAGS = ["--gpus", "--gpus-per-node", "--seq", "--global-batch", "--top"]


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE_OK)
@given(numbers=st.lists(st.tuples(st.sampled_from(PLAN_FLAGS),
                                  st.one_of(st.integers(-5, 64), st.sampled_from(["x", "1e9"]))), max_size=3),
       extra=st.sampled_from([[], ["--layout", "tp=2"], ["--layout", "strategy=zero3,dp_replicate=8"],
                              ["--layout", "tp=0"], ["--layout", "nonsense"]]))
def test_coursekit_plan_runs_or_refuses_cleanly(numbers, extra, capsys):
    base = {"--model": "tiny-llama", "--gpus": "8", "--seq": "64", "--global-batch": "16"}
    for k, v in numbers:
        base[k] = str(v)
    argv = [x for kv in base.items() for x in kv] + extra
    try:
        rc = plan_cli.main(argv)
    except SystemExit as e:  # argparse: usage and exit 2
        rc = e.code
    err = capsys.readouterr().err
    assert rc in (0, 2), (argv, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("text", ["[1, 2, 3]", '"hello"', "3", "null"])
def test_a_model_config_that_is_not_an_object_is_refused_in_one_line(text, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    with pytest.raises(ValueError, match="not an object"):
        plan(["--strategy", "ddp", "--model", str(cfg)])
    assert memory_cli.main(["--model", str(cfg), "--micro-batch", "1", "--seq", "64"]) == 2
    assert plan_cli.main(["--model", str(cfg), "--gpus", "8", "--seq", "64", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("not an object") == 2 and "Traceback" not in err


def test_a_rerun_of_a_finished_run_is_summarised_not_divided_by_zero():
    from coursekit.train.launcher import summary_table

    final = {"strategy": "ddp", "layout": {"dp_replicate": 2, "world_size": 2}, "world_size": 2,
             "resumed_from_step": 8, "stragglers": None}
    text = summary_table([{"final": final, "steps": [], "wall_s": 3.0}])
    assert "no steps run (resumed at step 8: the run was already complete)" in text
