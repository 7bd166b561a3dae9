"""The main job and the machine report, run as a user runs them."""
import json
import subprocess
import sys


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "coursekit.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_demo_runs_single_and_ddp(no_orphans):
    out = run("demo", "--steps", "3", "--seq", "16")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.startswith(("single", "ddp"))]
    assert [(r[0], r[1]) for r in rows] == [("single", "1"), ("ddp", "2")]
    # the same global batch on 1 and 2 processes: the printed losses agree to the digits shown
    assert rows[0][2:5] == rows[1][2:5]


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


def test_help_lists_every_command():
    out = run("--help", timeout=60)
    for name in ("demo", "train", "doctor", "memory"):
        assert name in out.stdout
