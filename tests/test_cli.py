"""The main job and the machine report, run as a user runs them."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args, timeout=300):
    """``coursekit ARGS`` as a user runs it; on a timeout the CLI and every process it started are stopped (a
    plain subprocess.run would kill the CLI alone and orphan its torchrun job)."""
    from coursekit.launch import kill_tree

    proc = subprocess.Popen([sys.executable, "-m", "coursekit.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid, grace_s=2)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def demo_table(stdout: str, steps: int) -> dict:
    """The demo's summary table by column name (a "loss per step" column holds one number per step)."""
    lines = stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("strategy"))
    labels = re.findall(r"loss per step|first loss|final loss|tokens/s|step ms|wall s|\w+", head)
    table = {}
    for ln in lines:
        if not ln.startswith(("single ", "ddp ")):
            continue
        cells, row = ln.split(), {}
        for label in labels:
            n = steps if label == "loss per step" else 1
            row[label], cells = (cells[:n] if n > 1 else cells[0]), cells[n:]
        assert not cells, (head, ln)
        losses = [float(x) for x in row.get("loss per step", [])]
        row["first loss"] = float(row.get("first loss", losses[0] if losses else "nan"))
        row["final loss"] = float(row.get("final loss", losses[-1] if losses else "nan"))
        table[row["strategy"]] = row
    return table


@pytest.mark.slow  # default-tier budget: ~30 s; the tour (test_demo_tour_module_1_predicts_and_measures) runs the demo here
def test_demo_strategies_table_runs_single_and_ddp(no_orphans):
    steps, seq, batch = 3, 16, 8  # the demo's default global batch: 8 sequences
    out = run("demo", "--strategies", "single,ddp", "--steps", str(steps), "--seq", str(seq), timeout=540)
    assert out.returncode == 0, out.stderr[-3000:]
    t = demo_table(out.stdout, steps)
    assert sorted(t) == ["ddp", "single"] and (t["single"]["world"], t["ddp"]["world"]) == ("1", "2")
    for name, r in t.items():
        # a random-init model predicts about uniformly over tiny-llama's 256 tokens: loss ln 256 = 5.545
        assert abs(r["first loss"] - math.log(256)) < 0.25, (name, r)
        assert r["final loss"] < r["first loss"], (name, r)  # it learns
        tps, ms, wall = float(r["tokens/s"]), float(r["step ms"]), float(r["wall s"])
        assert tps > 0 and ms > 0 and wall > (steps - 1) * ms / 1000, (name, r)
        # mean tokens/s x mean step time >= the tokens of one step (global batch x seq; equal when steps are
        # alike, Jensen's inequality otherwise), less the printed rounding
        assert tps * ms / 1000 >= 0.97 * batch * seq, (name, r)
    # the same global batch on 1 and 2 processes: the printed losses agree to the digits shown
    assert (t["single"]["first loss"], t["single"]["final loss"]) == (t["ddp"]["first loss"], t["ddp"]["final loss"])


def test_demo_tour_module_1_predicts_and_measures(no_orphans):
    out = run("demo", "--module", "1", "--json", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    doc = json.loads(out.stdout[out.stdout.rindex('{"checks"'):])
    checks = doc["checks"]
    assert doc["agree"] is True and {c["module"] for c in checks} == {1} and len(checks) == 5
    states = next(c for c in checks if c["what"].startswith("model states"))
    assert states["predicted"].split()[0] == states["measured"].split()[0]  # the same byte count, printed twice
    assert "module 1:" in out.stdout  # progress while it runs


# default-tier budget: modules 2-5 take 20-60 s each (DeepSpeed, FSDP2, the 3-D layouts, traces); module 1 above
# runs the same tour machinery here, and ./setup.sh runs the whole demo on every fresh machine
@pytest.mark.slow
@pytest.mark.parametrize("module", [2, 3, 4, 5])
def test_demo_tour_of_every_other_module_agrees(module, no_orphans):
    """Each module's demo rows run their real jobs and every prediction agrees with its measurement."""
    out = run("demo", "--module", str(module), "--json", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    doc = json.loads(out.stdout[out.stdout.rindex('{"checks"'):])
    checks = doc["checks"]
    assert checks and {c["module"] for c in checks} == {module}
    assert doc["agree"] is True and all(c["agree"] for c in checks), [c for c in checks if not c["agree"]]


def test_the_tour_is_found_from_each_modules_own_folder():
    """Every course module with a lab has a tour, found from its folder's tour.py (no list to edit)."""
    from coursekit import tour
    from coursekit.course.config import Course

    labs = {json.loads((REPO / "solutions" / n / "lab.json").read_text())["module"] for n in Course(REPO).lab_names()}
    assert labs <= set(tour.TOURS), f"a lab's module has no tour: {sorted(labs - set(tour.TOURS))}"
    assert sorted(tour.TOURS) == [1, 2, 3, 4, 5]
    for m, (title, target) in tour.TOURS.items():
        mod, fn = target.split(":")
        assert title and mod.startswith("coursekit.") and mod.endswith(".tour") and fn == "checks"
        assert __import__("importlib").import_module(mod).MODULE == m


def test_demo_exits_1_when_a_check_disagrees(monkeypatch, capsys):
    from coursekit import demo, tour

    monkeypatch.setitem(tour.TOURS, 9, ("planted", "test_cli:_planted_checks"))
    assert demo.main(["--module", "9"]) == 1
    assert "DISAGREE: planted wrong number" in capsys.readouterr().out
    with __import__("pytest").raises(ValueError, match="--module 7: the tour has modules"):
        demo.main(["--module", "7"])


def _planted_checks(t):
    from coursekit.tour import Check

    return [Check(9, "planted right number", "4", "4", True), Check(9, "planted wrong number", "4", "5", False)]


def test_doctor_reports_the_machine():
    out = run("doctor", "--json", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    facts = json.loads(out.stdout)
    import torch

    assert facts["torch"] == torch.__version__
    assert facts["backends"]["gloo"] is True
    assert facts["gpus"] == ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                             if torch.cuda.is_available() else [])
    human = run("doctor", timeout=120)
    assert human.returncode == 0 and "What runs here" in human.stdout


def test_doctor_says_grading_works_only_where_the_sandbox_starts(monkeypatch):
    """nbgrader alone is not grading: `coursekit course grade` runs every submission in the OS sandbox, so doctor
    says yes only when one starts here (a real start), and otherwise names what is missing; --help is help."""
    import shutil

    from coursekit import doctor
    from coursekit.course.isolation import Isolation

    f = {"packages": {"nbgrader": "0.9"}}
    real = Isolation.detect()
    assert doctor.grading(f) == (f"yes (sandbox: {real.mechanism})" if real.on else
                                 f"no: the grading sandbox cannot start here ({real.reason}); see docs/instructors.md")
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda t, *a, **k: None if t == "bwrap" else which(t, *a, **k))
    assert doctor.grading(f).startswith("no: the grading sandbox cannot start here (bwrap not found")
    assert doctor.grading({"packages": {"nbgrader": None}}) == "no: needs nbgrader"
    out = run("doctor", "--help", timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("usage: coursekit doctor")
    assert "What runs here" not in out.stdout  # help, not the report


def test_help_lists_every_command():
    from coursekit.cli import COMMANDS

    out = run("--help", timeout=60)
    assert out.returncode == 0
    # argparse lists each sub-command on a line of its own, indented 4, with the first words of its help
    assert re.findall(r"^    ([a-z][\w-]*)\b", out.stdout, re.M) == [c.name for c in COMMANDS]
    for c in COMMANDS:
        first = " ".join(c.help.split()[:3])
        assert re.search(rf"^    {c.name}\s+{re.escape(first)}", out.stdout, re.M), (c.name, out.stdout)
