"""Run a rendered job's pods here, as processes: the manifest's own command lines, not a re-typed copy.

For pod i of N, each container (init containers first) runs its ``command + args`` with the environment the pod
would get: its ``env`` list, then what the controller adds (Job: ``JOB_COMPLETION_INDEX=i``; PyTorchJob: the
training-operator's ``PET_*`` variables, as its pkg/controller.v1/pytorch/elastic.go and envvar.go at v1.9.0 build
them), with Kubernetes' $(VAR) expansion. What differs from a cluster goes through env values only (the command line
is never edited):
  * names the Services answer (``<pod>.<service>`` for the Job; ``<job>-worker-<i>`` for the PyTorchJob) → 127.0.0.1;
  * the rendezvous port → a free local port (tests run side by side);
  * volume mount paths → folders under ``root`` (the checkpoint volume is one folder shared by all pods, as a
    ReadWriteMany claim is), and the image's working directory → ``workdir``.
``python`` is looked up on PATH, as in the image; put the interpreter you want first (``bin_dir``).
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from coursekit.k8s.validate import expand
from coursekit.launch import kill_tree, stamped_env

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


def _workload(docs: list[dict]):
    """(pods, pod template, controller env of pod i, 'is this a name a Service answers?')."""
    found = [d for d in docs if d.get("kind") in ("Job", "PyTorchJob")]
    if len(found) != 1:
        raise ValueError(f"expected one Job or PyTorchJob among the documents, found {len(found)}")
    d = found[0]
    name, spec = d["metadata"]["name"], d["spec"]
    if d["kind"] == "Job":
        sub = spec["template"]["spec"].get("subdomain", "")
        return (int(spec["parallelism"]), spec["template"], lambda i: {"JOB_COMPLETION_INDEX": str(i)},
                lambda host: bool(sub) and host.endswith("." + sub))
    worker, ep = spec["pytorchReplicaSpecs"]["Worker"], spec["elasticPolicy"]
    tmpl = worker["template"]
    port = ep.get("rdzvPort") or [p["containerPort"] for p in tmpl["spec"]["containers"][0]["ports"]
                                  if p["name"] == "pytorchjob-port"][0]
    operator = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": str(spec["nprocPerNode"]),
                "PET_RDZV_ENDPOINT": f"{ep.get('rdzvHost') or name + '-worker-0'}:{port}",
                "PET_RDZV_BACKEND": ep.get("rdzvBackend", "c10d"),
                "PET_NNODES": f"{ep['minReplicas']}:{ep['maxReplicas']}", "PET_MAX_RESTARTS": str(ep["maxRestarts"])}
    return (int(worker["replicas"]), tmpl, lambda i: dict(operator),
            lambda host: re.fullmatch(rf"{re.escape(name)}-worker-\d+", host) is not None)


def pod_processes(docs: list[dict], index: int, *, root: Path, workdir: Path, ports: dict[int, int],
                  bin_dir: str | None = None) -> list[tuple[list[str], dict, Path]]:
    """(argv, env, cwd) of pod ``index``'s containers in the order the kubelet starts them."""
    _, tmpl, controller_env, is_service = _workload(docs)
    spec = tmpl["spec"]
    base = {"PATH": (f"{bin_dir}{os.pathsep}" if bin_dir else "") + os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", str(root))}
    out = []
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        paths = {m["mountPath"]: str(Path(root) / m["name"]) for m in c.get("volumeMounts", [])
                 if m["mountPath"] != "/dev/shm"}  # /dev/shm is this machine's own

        def local(value: str) -> str:
            return _local(value, is_service, paths, ports)

        env: dict = {}
        for e in c.get("env", []):
            env[e["name"]] = local(expand(str(e["value"]), env))
        for k, v in controller_env(index).items():  # appended after the container's own list, as the controllers do
            env[k] = local(v)
        argv = [expand(a, env) for a in [*c.get("command", []), *c.get("args", [])]]
        out.append((argv, {**base, **env}, Path(workdir) if c.get("workingDir") else Path(root)))
    return out


def _local(value: str, is_service, paths: dict, ports: dict[int, int]) -> str:
    m = re.fullmatch(r"([A-Za-z0-9.-]+):(\d+)", value)
    if m and is_service(m.group(1)):  # host:port
        return f"{LOOPBACK}:{ports.get(int(m.group(2)), m.group(2))}"
    if is_service(value):
        return LOOPBACK
    if value.isdigit() and int(value) in ports:
        return str(ports[int(value)])
    for mount, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return local + value[len(mount.rstrip("/")):]
    return value


def run_pods(docs: list[dict], *, root: Path, workdir: Path, timeout: float, bin_dir: str | None = None,
             extra_env: dict | None = None) -> list[PodRun]:
    """Start every pod at once and wait for all; a failing pod stops the others (the job has failed).

    Every process is killed by the end (timeout included); returns one PodRun per pod, with its combined output.
    """
    n, tmpl, _, _ = _workload(docs)
    ports = {p["containerPort"]: free_port() for c in tmpl["spec"]["containers"] for p in c.get("ports", [])}
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    pods = [pod_processes(docs, i, root=root, workdir=workdir, ports=ports, bin_dir=bin_dir) for i in range(n)]
    stamp = {**stamped_env({}), **(extra_env or {})}  # tests' no-orphans check finds these
    deadline = time.monotonic() + timeout
    for containers in pods:  # init containers: to completion, in order
        for argv, env, cwd in containers[:-1]:
            subprocess.run(argv, env={**env, **stamp}, cwd=cwd, check=True,
                           timeout=max(1.0, deadline - time.monotonic()))
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
