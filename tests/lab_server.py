"""JupyterLab started the documented way (``coursekit lab``) on a copy of the course, for the tests that use it.

The copy (nbgrader_config.py, the lab sources and manifests, labs/) keeps the repository's files untouched. The
server runs from ``.venv/bin/coursekit`` with the venv's bin *not* on PATH, as a learner who did not activate the
venv starts it; it is stopped with its whole process tree (kernels, torchrun jobs).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKEN = "coursekit-test"


def course_copy(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "nbgrader_config.py", dest)
    shutil.copytree(REPO / "labs", dest / "labs")
    for lab in (REPO / "solutions").iterdir():
        if lab.is_dir():
            (dest / "solutions" / lab.name).mkdir(parents=True)
            for f in lab.iterdir():
                if f.is_file() and f.suffix in (".py", ".json"):
                    shutil.copy(f, dest / "solutions" / lab.name)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_env() -> dict:
    """The environment without the venv's bin on PATH (nothing activated)."""
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir)
    env.pop("VIRTUAL_ENV", None)
    return env


class LabServer:
    def __init__(self, root: Path, *, instructor: bool, log: Path, extra=()):
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [os.path.join(os.path.dirname(sys.executable), "coursekit"), "lab", "--root", str(root),
               *(["--instructor"] if instructor else []), "--no-browser", f"--port={self.port}",
               "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}",
               f"--LabApp.workspaces_dir={root / '.workspaces'}", "--LabApp.news_url=", *extra]
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=str(root.parent), env=bare_env(), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def get(self, path: str, timeout: float = 30) -> tuple[int, bytes]:
        sep = "&" if "?" in path else "?"
        try:
            with urllib.request.urlopen(f"{self.url}{path}{sep}token={TOKEN}", timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait(self, timeout: float = 120) -> "LabServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coursekit lab exited with {self.proc.returncode}: {self.log_text()[-2000:]}")
            try:
                if self.get("/api/status", timeout=5)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer within {timeout} s: {self.log_text()[-2000:]}")

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        from coursekit.launch import kill_tree

        if self.proc.poll() is None:
            kill_tree(self.proc.pid, grace_s=5.0)
        self.proc.wait(timeout=30)
        self.log.close()
