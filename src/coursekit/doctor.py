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


def labs(f: dict) -> list[tuple[str, str]]:
    gpu = bool(f["gpus"])
    where = "GPU (NCCL)" if gpu else "CPU (gloo), 2+ processes"
    ops = f.get("deepspeed_ops", {})
    return [
        ("Lab 1 memory + collectives", where),
        ("Lab 2 DeepSpeed ZeRO", where if f["packages"]["deepspeed"] else "needs deepspeed"),
        ("Lab 2 CPU offload (DeepSpeedCPUAdam)", "yes" if ops.get("CPUAdam") else "needs a C++ compiler"),
        ("Lab 2 NVMe offload", "yes" if ops.get("AsyncIO") and f["libaio"] else "needs libaio-dev"),
        ("Lab 3 FSDP2", where if f["fsdp2"] else "needs torch >= 2.6"),
        ("Lab 4 TP/PP/CP", where),
        ("Lab 5 profiling", where),
        ("Slurm labs", "yes" if f["slurm"]["sbatch"] else "no Slurm client (scripts/slurm-local.sh starts one)"),
        ("Grading (nbgrader)", "yes" if f["packages"]["nbgrader"] else "needs nbgrader"),
    ]


def main(argv=None) -> int:
    argv = list(argv or [])
    f = facts()
    if "--json" in argv:
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
        ("Slurm", f["slurm"]["sinfo"] or ("client only" if f["slurm"]["sbatch"] else "none")),
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
