"""`coursekit lab`: JupyterLab started the documented way works for instructors and learners (issue 15, item 1).

A real server on a copy of the course, started from .venv/bin/coursekit without the venv on PATH (as root here,
where JupyterLab refuses to start without --allow-root): formgrader's API lists every lab (its gradebook is created
with ``alembic``, found through PATH) and the learner's course list answers (the exchange exists).
"""
import json
import os
import stat
import subprocess
import sys

import pytest

from coursekit.course import manifest
from coursekit.course.config import Course
from lab_server import REPO, LabServer, bare_env, course_copy


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = course_copy(tmp_path_factory.mktemp("lab") / "course")
    s = LabServer(root, instructor=True, log=root.parent / "jupyter.log").wait()
    yield s
    s.stop()


def test_print_shows_path_exchange_and_allow_root(tmp_path):
    root = course_copy(tmp_path / "course")
    coursekit = os.path.join(os.path.dirname(sys.executable), "coursekit")
    r = subprocess.run([coursekit, "lab", "--root", str(root), "--print"], env=bare_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    argv, path, exchange = r.stdout.splitlines()
    bindir = os.path.dirname(sys.executable)
    assert argv.startswith(os.path.join(bindir, "jupyter") + " lab --ServerApp.root_dir=")
    assert path.split("=", 1)[1].split(os.pathsep)[0] == bindir
    assert os.access(os.path.join(bindir, "alembic"), os.X_OK)  # what nbgrader runs from PATH
    assert ("--allow-root" in argv.split()) == (os.geteuid() == 0)
    ex = exchange.split("=", 1)[1]
    assert ex == str(root / "course" / "exchange") and stat.S_IMODE(os.stat(ex).st_mode) & 0o1777 == 0o1777


def test_the_pages_lab_opens_exist(tmp_path):
    """The instructor's page is JupyterLab's root: "/lab/tree/" (an empty path) opened a "Path Not Found" dialog;
    the learner's is the labs folder, which exists in the course."""
    from coursekit.course.config import Course
    from coursekit.course.lab import command

    course = Course(course_copy(tmp_path / "course"))
    urls = {mode: [a.split("=", 1)[1] for a in command(course, [], instructor=mode)[0]
                   if a.startswith("--LabApp.default_url=")] for mode in (True, False)}
    assert urls[True] == ["/lab"]
    assert urls[False] == [f"/lab/tree/{course.labs.name}"] and course.labs.is_dir()
    assert command(course, ["--LabApp.default_url=/lab/tree/x"], instructor=True)[0].count(
        "--LabApp.default_url=/lab/tree/x") == 1  # the caller's own choice wins, once


def test_formgrader_lists_every_lab(server):
    status, body = server.get("/formgrader/api/assignments", timeout=120)
    assert status == 200, server.log_text()[-3000:]
    names = sorted(a["name"] for a in json.loads(body))
    assert names == Course(REPO).lab_names()
    assert "FileNotFoundError" not in server.log_text()
    assert (server.root / "course" / "gradebook.db").is_file()


def test_learners_assignment_list_has_an_exchange(server):
    status, body = server.get("/courses", timeout=60)
    assert status == 200
    assert json.loads(body) == {"success": True, "value": []}  # no error: the exchange exists, nothing released


def test_every_lab_has_a_manifest_and_doctor_lists_exactly_those(tmp_path):
    """Adding a lab is adding its folder and manifest: doctor and the README follow (drift test), nothing else."""
    course = Course(REPO)
    found = manifest.load(course.labs)
    assert [m.lab for m in sorted(found, key=lambda m: m.lab)] == course.lab_names()
    for m in found:
        assert (course.labs / m.lab / "lab.json").read_text() == (course.solutions / m.lab / "lab.json").read_text()
    root = course_copy(tmp_path / "course")
    (root / "labs" / "lab9_new").mkdir()
    (root / "labs" / "lab9_new" / "lab.json").write_text(json.dumps(
        {"module": 9, "title": "New things", "needs": ["package:no-such-package-x"]}))
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "coursekit"), "doctor", "--json"], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["what_runs"]
    labs = [k for k in runs if k.startswith("Lab ")]
    assert labs == [m.label for m in found] + ["Lab 9 New things"]
    assert runs["Lab 9 New things"] == "needs no-such-package-x (pip install no-such-package-x)"


def test_doctor_does_not_promise_slurm_labs_with_a_client_only():
    from coursekit.doctor import labs

    facts = {"gpus": [], "packages": {"nbgrader": "0.9"}, "deepspeed_ops": {}, "libaio": False, "compiler": None,
             "fsdp2": True, "slurm": {"sbatch": "/usr/bin/sbatch", "sinfo": None}}  # a machine with sbatch, no daemon
    rows = dict(labs(facts))
    assert rows["Slurm scripts (slurm/)"].startswith("no: Slurm client only")
    facts["slurm"]["sinfo"] = "debug up 2 idle"
    assert dict(labs(facts))["Slurm scripts (slurm/)"].startswith("yes")


def test_a_broken_manifest_is_refused_with_its_path(tmp_path):
    (tmp_path / "labx").mkdir()
    (tmp_path / "labx" / "lab.json").write_text(json.dumps({"module": 1, "title": "x", "needs": ["gpus"]}))
    with pytest.raises(ValueError, match=r"labx/lab.json: unknown needs \['gpus'\]"):
        manifest.load(tmp_path)
