"""Step time and per-rank bytes for each ZeRO stage and offload mode on the tiny model, 2 and 4 processes: one table.

    .venv/bin/python bench/bench_zero.py                  # 2 and 4 processes, about 1 minute on 2 idle cores
    .venv/bin/python bench/bench_zero.py --nproc 2 --nvme /tmp/nvme --json bench/results/zero.json
    .venv/bin/python bench/bench_zero.py --nproc 2 --steps 3 --points zero0,zero2   # a quick look at two rows

Per rank (rank 0's row): bytes DeepSpeed holds on its accelerator (on a CPU-only machine: the CPU standing in for
the GPU), bytes moved to the host by offload, and NVMe swap-file bytes; params / grads / fp32 master / Adam states
(opt) / fp32 gradient partition at the step (fp32g) / buffers (reduce bucket, offload staging, NVMe swap buffers);
the median step time of steps 1..n-2; collectives per step (calls, payload MB). CPU offload uses DeepSpeedCPUAdam
(compiled once, ~60 s on 2 cores, cached in ~/.cache/torch_extensions). ``--nvme DIR`` adds a second table: ZeRO-3
in bf16 on a wider model (9.4M parameters, hidden 512: DeepSpeed swaps only tensors of ~1 MiB per rank or more, so
the tiny model would write nothing) with nothing / CPU / NVMe offload of optimizer and parameters — needs DeepSpeed's
async_io op (Debian's libaio-dev). ``(calc)``: what ``coursekit memory`` predicts for the same config on rank 0
(host bytes without DeepSpeed's pinned NVMe swap buffers, which it does not model; swap-file bytes exactly).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from coursekit.memory import estimate  # noqa: E402
from coursekit.zero.sweep import run_sweep  # noqa: E402

WIDE = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 4096, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_dropout": 0.0}

POINTS = [
    {"name": "zero0", "stage": 0},
    {"name": "zero1", "stage": 1},
    {"name": "zero2", "stage": 2},
    {"name": "zero3", "stage": 3},
    {"name": "zero2+opt>cpu", "stage": 2, "offload_optimizer": "cpu"},
    {"name": "zero3+opt,param>cpu", "stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
]


def predicted(r: dict, point: dict, *, model: str, global_batch: int, seq: int) -> dict:
    """`coursekit memory` for the row's config on rank 0: host bytes and NVMe swap-file bytes."""
    e = estimate(model, batch=global_batch // r["nproc"], seq=seq, dtype=point.get("dtype", "fp32"), dp=r["nproc"],
                 zero=point["stage"], offload=point.get("offload_optimizer", "none"),
                 offload_params=point.get("offload_param", "none"), dp_rank=0, microbatches=1)
    return {"calc_cpu_bytes": e.cpu_bytes, "calc_nvme_bytes": e.nvme_bytes}


def table(rows: list[dict]) -> str:
    head = (f"{'config':<22}{'N':>2} {'step ms':>8} {'accel B':>10} {'cpu B':>11} {'(calc)':>11} {'nvme B':>11} "
            f"{'(calc)':>11} {'params':>9} {'grads':>8} {'master':>8} {'opt':>9} {'fp32g':>8} {'buffers':>11} "
            f"{'calls':>6} {'MB/step':>8}")
    out = [head, "-" * len(head)]
    for r in rows:
        mb = sum(o["bytes"] for o in r["ops"].values()) / 1e6
        out.append(f"{r['name']:<22}{r['nproc']:>2} {r['step_ms']:>8.1f} {r['accelerator_bytes']:>10,} "
                   f"{r['cpu_bytes']:>11,} {r['calc_cpu_bytes']:>11,} {r['nvme_bytes']:>11,} "
                   f"{r['calc_nvme_bytes']:>11,} {r['params_bytes']:>9,} {r['grads_bytes']:>8,} "
                   f"{r['master_bytes']:>8,} {r['optimizer_bytes']:>9,} {r['fp32_grads_bytes']:>8,} "
                   f"{r['buffers_bytes']:>11,} {r['calls']:>6} {mb:>8.3f}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", default="2,4", help="comma-separated process counts")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--nvme", default=None, help="a local folder: add ZeRO-3 NVMe offload rows (needs libaio-dev)")
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument("--points", default=",".join(pt["name"] for pt in POINTS),
                   help="comma list of the tiny-model rows to run (default: all)")
    a = p.parse_args(argv)
    names = a.points.split(",")
    unknown = sorted(set(names) - {pt["name"] for pt in POINTS})
    if unknown:
        p.error(f"unknown points {unknown}; choose from {', '.join(pt['name'] for pt in POINTS)}")
    points = [pt for pt in POINTS if pt["name"] in names]
    rows = []
    for n in [int(x) for x in a.nproc.split(",")]:
        t0 = time.monotonic()
        for pt, r in zip(points, run_sweep(points, nproc=n, steps=a.steps)):
            r |= {"nproc": n, "model": "tiny-llama"}
            rows.append(r | predicted(r, pt, model="tiny-llama", global_batch=8, seq=64))
        print(f"[bench_zero] {n} processes: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print("tiny-llama (125,248 parameters), fp32, global batch 8 x 64 tokens, per rank (rank 0)")
    print(table(rows))
    if a.nvme:
        wide = Path(a.nvme) / "wide-llama.json"
        wide.parent.mkdir(parents=True, exist_ok=True)
        wide.write_text(json.dumps(WIDE))
        nvme = [{"name": "zero3", "stage": 3, "dtype": "bf16"},
                {"name": "zero3+opt,param>cpu", "stage": 3, "dtype": "bf16", "offload_optimizer": "cpu",
                 "offload_param": "cpu"},
                {"name": "zero3+opt,param>nvme", "stage": 3, "dtype": "bf16", "offload_optimizer": "nvme",
                 "offload_param": "nvme", "nvme_path": str(Path(a.nvme) / "swap")}]
        (Path(a.nvme) / "swap").mkdir(exist_ok=True)
        wide_rows = [r | {"nproc": 2, "model": "wide"} for r in
                     run_sweep(nvme, nproc=2, steps=a.steps, model=str(wide), global_batch=4, seq=32)]
        wide_rows = [r | predicted(r, pt, model=str(wide), global_batch=4, seq=32) for pt, r in zip(nvme, wide_rows)]
        print("\nwide llama (9,439,744 parameters, hidden 512), bf16, global batch 4 x 32 tokens, per rank (rank 0)")
        print(table(wide_rows))
        rows += wide_rows
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
