"""FSDP2 figures: per-rank bytes measured vs predicted, collective bytes per step, DCP loop-blocked time.

    python bench/bench_fsdp.py                  # bytes (one process, fake process groups) + collectives (model)
    python bench/bench_fsdp.py --dcp            # + two 2-rank trainer runs: sync vs thread-async checkpoints

Bytes: ``coursekit.fsdp.memcheck`` (rank 0 and the last rank of N, state_bytes and FSDPMemTracker) against
``coursekit memory --strategy fsdp2 --dp-rank R``. Collectives: ``coursekit.fsdp.predict.step_collectives``, which
tests/test_fsdp.py checks against the counted collectives of live runs. Speeds are machine figures, not tests.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CODE = """
import json, sys
from coursekit.fsdp.memcheck import measure
for c in json.loads(sys.argv[1]):
    print("RESULT " + json.dumps(measure(**c)), flush=True)
"""


def bytes_table(model: str, shards) -> list[dict]:
    from coursekit.memory import estimate

    cases = [dict(model=model, shard=n, rank=r, reshard=rs) for n in shards for r in sorted({0, n - 1})
             for rs in (True, False)]
    out = subprocess.run([sys.executable, "-c", CODE, json.dumps(cases)], capture_output=True, text=True,
                         timeout=900, check=True)
    rows = []
    for line in out.stdout.splitlines():
        if not line.startswith("RESULT "):
            continue
        m = json.loads(line[7:])
        e = estimate(model, micro_batch=2, seq=32, dtype="fp32", precision="fp32", strategy="fsdp2",
                     dp_shard=m["shard"], dp_rank=m["rank"], fsdp_reshard=m["reshard"])
        h = m["held"]
        got = h["params_bytes"] + h["grads_bytes"] + h["optimizer_bytes"]
        want = e.categories["parameters"] + e.categories["gradients"] + e.categories["optimizer_states"]
        rows.append({"N": m["shard"], "rank": m["rank"], "reshard": m["reshard"], "states_measured": got,
                     "states_predicted": want, "units_measured": m["peak_backward"]["unsharded_param"],
                     "units_predicted": e.categories["unsharded_fsdp_units"]})
    return rows


def collectives(model: str, shards) -> list[dict]:
    from coursekit.comm import volume
    from coursekit.fsdp.predict import step_collectives
    from coursekit.memory.calculator import resolve_model

    shape, rows = resolve_model(model), []
    for n in shards:
        layouts = [("fsdp2 reshard", dict(shard=n)), ("fsdp2 no reshard", dict(shard=n, reshard=False))]
        if n >= 4 and n % 2 == 0:
            layouts.append((f"hsdp 2 x {n // 2}", dict(shard=n // 2, replicate=2)))
        for name, kw in layouts:
            plan = step_collectives(shape, **kw)
            rows.append({"N": n, "layout": name, "payload_bytes": volume.payload_bytes(plan),
                         "send_bytes_per_rank": round(volume.send_bytes_per_rank(plan))})
    return rows


def dcp_blocked() -> list[dict]:
    from coursekit.launch import launch

    rows = []
    for mode in ("none", "thread"):
        with tempfile.TemporaryDirectory() as d:
            res = launch("coursekit.train", ["--strategy", "fsdp2", "--model", "tiny-llama", "--steps", "6",
                                             "--save-every", "2", "--ckpt-dir", d, "--async-ckpt", mode, "--quiet"],
                         nproc=2, timeout=600, stream=False)
        f = res.results[0]["final"]
        rows.append({"async": mode, "saves": f["ckpt_saves"], "blocked_ms_each": [round(1000 * x, 1) for x in
                                                                                  f["ckpt_blocked_each_s"]]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--shards", default="2,3,4")
    ap.add_argument("--dcp", action="store_true")
    a = ap.parse_args(argv)
    shards = [int(x) for x in a.shards.split(",")]
    out = {"bytes": bytes_table(a.model, shards), "collectives": collectives(a.model, shards)}
    if a.dcp:
        out["dcp"] = dcp_blocked()
    for k, rows in out.items():
        print(f"== {k}")
        for r in rows:
            print("  " + "  ".join(f"{x}={y}" for x, y in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
