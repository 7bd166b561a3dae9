"""Run a rendered Indexed Job's pods here, as processes: the manifest's own command lines, not a re-typed copy.

For pod i of N, each container (init containers first) runs its ``command + args`` with the environment the pod
would get: its ``env`` list, the Job controller's ``JOB_COMPLETION_INDEX=i``, Kubernetes' $(VAR) expansion. Three
things differ from a cluster, and all go through env substitution only (the command line is never edited):
  * host names ending in the pod subdomain (the headless Service) resolve to 127.0.0.1;
  * the rendezvous port becomes a free local port (tests run side by side);
  * volume mount paths become folders under ``root`` (the checkpoint volume is one folder shared by all pods, as
    a ReadWriteMany claim is) and the image's working directory becomes ``workdir``.
``python`` is looked up on PATH, as in the image; put the interpreter you want first (``bin_dir``).
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from coursekit.k8s.validate import expand
from coursekit.launch import kill_tree

LOOPBACK = "127.0.0.1"


@dataclass
class PodRun:
    index: int
    returncode: int | None
    log: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _job(docs: list[dict]) -> dict:
    jobs = [d for d in docs if d.get("kind") == "Job"]
    if len(jobs) != 1:
        raise ValueError(f"expected one Job among the documents, found {len(jobs)}")
    return jobs[0]


def pod_processes(docs: list[dict], index: int, *, root: Path, workdir: Path, ports: dict[int, int],
                  bin_dir: str | None = None) -> list[tuple[list[str], dict, Path]]:
    """(argv, env, cwd) of pod ``index``'s containers in the order the kubelet starts them."""
    job = _job(docs)
    spec = job["spec"]["template"]["spec"]
    subdomain = spec.get("subdomain", "")
    mounts_root = Path(root)
    base = {"PATH": (f"{bin_dir}{os.pathsep}" if bin_dir else "") + os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", str(mounts_root)), "HOSTNAME": f"{job['metadata']['name']}-{index}"}
    out = []
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        paths = {m["mountPath"]: str(mounts_root / m["name"]) for m in c.get("volumeMounts", [])
                 if m["mountPath"] != "/dev/shm"}  # /dev/shm is this machine's own
        env: dict = {}
        for e in c.get("env", []):
            env[e["name"]] = _local(expand(str(e["value"]), env), subdomain, paths, ports)
        env["JOB_COMPLETION_INDEX"] = str(index)  # added by the Job controller (a fieldRef to the pod's index)
        argv = [expand(a, env) for a in [*c.get("command", []), *c.get("args", [])]]
        cwd = Path(workdir) if c.get("workingDir") else mounts_root
        out.append((argv, {**base, **env}, cwd))
    return out


def _local(value: str, subdomain: str, paths: dict, ports: dict[int, int]) -> str:
    host = value.split(":")[0]
    if subdomain and host.endswith("." + subdomain):  # <pod>.<service>: a name the Service's DNS answers
        return LOOPBACK + value[len(host):]
    if value.isdigit() and int(value) in ports:
        return str(ports[int(value)])
    for mount, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return local + value[len(mount.rstrip("/")):]
    return value


def run_job(docs: list[dict], *, root: Path, workdir: Path, timeout: float, bin_dir: str | None = None,
            extra_env: dict | None = None) -> list[PodRun]:
    """Start every pod of the Job at once and wait; like backoffLimit 0, one failing pod stops the others.

    Every process is killed by the end (timeout included); returns one PodRun per pod, with its combined output.
    """
    job = _job(docs)
    n = int(job["spec"]["parallelism"])
    ports = {p["containerPort"]: free_port() for c in job["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    pods = [pod_processes(docs, i, root=root, workdir=workdir, ports=ports, bin_dir=bin_dir) for i in range(n)]
    stamp = {"COURSEKIT_LAUNCHED_BY": str(os.getpid()), **(extra_env or {})}  # tests' no-orphans check finds these
    deadline = time.monotonic() + timeout
    for containers in pods:  # init containers: to completion, in order
        for argv, env, cwd in containers[:-1]:
            subprocess.run(argv, env={**env, **stamp}, cwd=cwd, check=True, timeout=max(1.0, deadline -
                                                                                          time.monotonic()))
    logs = [root / f"pod-{i}.log" for i in range(n)]
    procs: list[subprocess.Popen] = []
    try:
        for i, containers in enumerate(pods):
            argv, env, cwd = containers[-1]
            with open(logs[i], "w") as f:
                procs.append(subprocess.Popen(argv, env={**env, **stamp}, cwd=cwd, stdout=f,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
            p.wait()
    return [PodRun(i, p.returncode, logs[i].read_text(errors="replace")) for i, p in enumerate(procs)]
