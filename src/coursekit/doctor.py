"""``coursekit doctor``: what this machine offers, and so which labs can run here.

Each check is a (name, value, ok) row; nothing here fails hard — a missing piece is a row that says so.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys

from coursekit.course.isolation import Isolation


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def _run(cmd: list[str], timeout: float = 10) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (out.stdout or out.stderr).strip() if out.returncode == 0 else None
    except (subprocess.TimeoutExpired, OSError):
        return None


def torch_facts() -> dict:
    import torch
    import torch.distributed as dist

    from coursekit.dist import device_kind

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return {
        "torch": torch.__version__,
        "build": f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu",
        "gpus": gpus,
        "backends": {b: getattr(dist, f"is_{b}_available")() for b in ("gloo", "nccl", "mpi")},
        "coursekit_device": device_kind(),
        "fsdp2": hasattr(__import__("torch.distributed.fsdp", fromlist=["fully_shard"]), "fully_shard"),
        "bf16": torch.cuda.is_bf16_supported() if gpus else True,
    }


def deepspeed_ops() -> dict:
    """DeepSpeed ops this machine could JIT-build (DeepSpeed's own compatibility checks, no build)."""
    if not _version("deepspeed"):
        return {}
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not _cuda() else "cuda")
    try:
        from deepspeed.accelerator import get_accelerator

        builders = get_accelerator().get_op_builder
        out = {}
        for name in ("CPUAdamBuilder", "AsyncIOBuilder", "FusedAdamBuilder", "CPUAdagradBuilder"):
            b = builders(name)
            try:
                out[name.replace("Builder", "")] = bool(b and b().is_compatible(verbose=False))
            except Exception:
                out[name.replace("Builder", "")] = False
        return out
    except Exception as e:  # report, do not crash the doctor
        return {"error": str(e).splitlines()[0][:80]}


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def facts() -> dict:
    f = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    f.update(torch_facts())
    f["packages"] = {p: _version(p) for p in ("deepspeed", "accelerate", "transformers", "datasets", "nbgrader",
                                             "jupyterlab", "matplotlib")}
    f["deepspeed_ops"] = deepspeed_ops()
    f["slurm"] = {"sbatch": shutil.which("sbatch"), "sinfo": _run(["sinfo", "-h", "-o", "%P %a %D %T"])}
    f["compiler"] = shutil.which("c++") or shutil.which("g++")
    f["libaio"] = os.path.exists("/usr/include/libaio.h")
    return f


def _course_labs() -> tuple[str, list]:
    """(where the labs were looked for, their manifests): the course around the working directory, else the
    repository this package was installed from."""
    from pathlib import Path

    from coursekit.course import manifest
    from coursekit.course.config import Course, find_root

    roots = []
    try:
        roots.append(find_root())
    except FileNotFoundError:
        pass
    repo = Path(__file__).resolve().parents[2]
    if (repo / "nbgrader_config.py").is_file():
        roots.append(repo)
    for root in roots:
        labs_dir = Course(root).labs
        found = manifest.load(labs_dir)
        if found:
            return str(labs_dir), found
    return "", []


def unmet(need: str, f: dict) -> str | None:
    """What is missing on this machine for one manifest requirement (None: it is met)."""
    ops = f.get("deepspeed_ops", {})
    if need.startswith("package:"):
        pkg = need.split(":", 1)[1]
        return None if (f["packages"].get(pkg) or _version(pkg)) else f"needs {pkg} (pip install {pkg})"
    if need.startswith("deepspeed-op:"):
        op = need.split(":", 1)[1]
        hint = "libaio-dev and a C++ compiler" if op == "AsyncIO" else "a C++ compiler"
        return None if ops.get(op) else f"needs DeepSpeed's {op} op ({hint})"
    checks = {"libaio": (f["libaio"], "needs libaio-dev (apt-get install libaio-dev)"),
              "compiler": (f["compiler"], "needs a C++ compiler"),
              "fsdp2": (f["fsdp2"], "needs torch >= 2.6 (FSDP2)"),
              "gpu": (f["gpus"], "needs a CUDA GPU"),
              "slurm": (f["slurm"]["sinfo"], "needs a Slurm controller (scripts/slurm-local.sh starts one)")}
    ok, msg = checks[need]
    return None if ok else msg


def _verdict(needs: list[str], f: dict, where: str) -> str:
    missing = [m for m in (unmet(n, f) for n in needs) if m]
    return "; ".join(missing) if missing else where


def labs(f: dict) -> list[tuple[str, str]]:
    """One row per lab that exists (from its manifest, labs/<lab>/lab.json) and per optional part of it."""
    where = "yes: GPU (NCCL)" if f["gpus"] else "yes: CPU (gloo), 2+ processes"
    folder, manifests = _course_labs()
    rows = []
    for m in manifests:
        rows.append((m.label, _verdict(m.needs, f, where)))
        rows += [(f"  {p.name}", _verdict(p.needs, f, "yes")) for p in m.parts]
    if not manifests:
        rows.append(("Labs", "none found (run from the course repository: labs/<lab>/lab.json)"))
    slurm = f["slurm"]
    if slurm["sinfo"]:
        rows.append(("Slurm scripts (slurm/)", "yes: a controller answers"))
    elif slurm["sbatch"]:
        rows.append(("Slurm scripts (slurm/)", "no: Slurm client only, no controller answers "
                                               "(scripts/slurm-local.sh starts a local one)"))
    else:
        rows.append(("Slurm scripts (slurm/)", "no Slurm client (scripts/slurm-local.sh installs and starts one)"))
    rows.append(("Grading (nbgrader)", grading(f)))
    return rows


def grading(f: dict) -> str:
    """Whether ``coursekit course grade`` can run here: nbgrader, and the OS sandbox every submission runs in (a
    real start of it, ``Isolation.detect``); without one grading refuses (docs/instructors.md)."""
    if not f["packages"].get("nbgrader"):
        return "no: needs nbgrader"
    iso = Isolation.detect()
    if not iso.on:
        return f"no: the grading sandbox cannot start here ({iso.reason}); see docs/instructors.md"
    return f"yes (sandbox: {iso.mechanism})"


def peak(refresh: bool = True) -> int:
    """``coursekit doctor --peak``: the dense peak MFU is measured against (CPU: a measured matmul rate, cached)."""
    from coursekit.dist import device_kind
    from coursekit.profiling.mfu import cpu_peak, device_peak

    dev = device_kind()
    for dtype in ("fp32", "bf16"):
        p = cpu_peak(dtype, refresh=refresh) if not dev.startswith("cuda") else device_peak(dev, dtype)
        flops = f"{p['flops'] / 1e9:,.1f} GFLOP/s" if p["flops"] else "-"
        print(f"peak {dtype} on {dev}: {flops}  ({p['source']})")
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit doctor",
                                description="What this machine offers the course: the torch build, backends, GPUs, "
                                            "DeepSpeed ops, Slurm, grading; and which labs run here.")
    p.add_argument("--json", action="store_true", help="every fact as one JSON object")
    p.add_argument("--peak", action="store_true", help="measure the dense peak that MFU is computed against")
    argv = list(argv or [])
    p.parse_args(argv)
    if "--peak" in argv:
        return peak()
    f = facts()
    if "--json" in argv:
        f["what_runs"] = dict(labs(f))
        print(json.dumps(f, indent=2))
        return 0
    rows = [
        ("python", f["python"]), ("torch", f"{f['torch']} ({f['build']})"),
        ("GPUs", ", ".join(f["gpus"]) or "none"),
        ("backends", " ".join(f"{k}={'yes' if v else 'no'}" for k, v in f["backends"].items())),
        ("device used", f"{f['coursekit_device']} (COURSEKIT_DEVICE={os.environ.get('COURSEKIT_DEVICE', 'unset')})"),
        ("FSDP2 API", "yes" if f["fsdp2"] else "no"),
        *[(k, v or "not installed") for k, v in f["packages"].items()],
        ("DeepSpeed ops", " ".join(f"{k}={'yes' if v else 'no'}" for k, v in f["deepspeed_ops"].items()) or "-"),
        ("C++ compiler", f["compiler"] or "none"), ("libaio", "yes" if f["libaio"] else "no"),
        ("Slurm", f["slurm"]["sinfo"] or ("client only (no controller answers)" if f["slurm"]["sbatch"] else "none")),
    ]
    w = max(len(k) for k, _ in rows)
    print("coursekit doctor\n")
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    print("\nWhat runs here:")
    rows = labs(f)
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    return 0
