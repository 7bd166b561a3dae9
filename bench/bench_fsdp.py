"""FSDP2 figures: per-rank bytes measured vs predicted, collective bytes per step, step times, DCP save times.

    python bench/bench_fsdp.py                  # bytes (one process, fake process groups) + collectives (model)
    python bench/bench_fsdp.py --strategies     # + live runs on 2 and 4 processes: DDP, ZeRO-3, FSDP2 reshard
                                                #   true/false/2, HSDP 2x2, FSDP2 + compile, QLoRA
    python bench/bench_fsdp.py --dcp            # + DCP save time and loop-blocked time, sync vs thread, 2 sizes

Bytes: ``coursekit.fsdp.memcheck`` (rank 0 and the last rank of N, state_bytes and FSDPMemTracker) against
``coursekit memory --strategy fsdp2 --dp-rank R``. Collectives: ``coursekit.fsdp.predict.step_collectives``, which
tests/test_fsdp.py checks against the counted collectives of live runs. In the live rows, "measured" collectives
are the trainer's counted last step (FSDP2, ZeRO-3, QLoRA); DDP's all-reduce runs inside its C++ reducer, which the
counter does not see, so its row shows the volume model only. Speeds are machine figures, not tests.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CODE = """
import json, sys
from coursekit.fsdp.memcheck import measure
for c in json.loads(sys.argv[1]):
    print("RESULT " + json.dumps(measure(**c)), flush=True)
"""
# the same micro-batch on 2 and 4 processes: the same compiled shapes, so the 4-process compile reuses the cache
COMMON = ["--model", "tiny-llama", "--steps", "6", "--seq", "32", "--micro-batch", "2", "--dtype", "fp32",
          "--quiet"]
# a second, larger model for the checkpoint rows: ~20 M parameters, ~240 MB of DCP state with AdamW
MID = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1408,
       "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 8192,
       "max_position_embeddings": 256, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}


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
            layouts.append((f"fsdp2 reshard to 2", dict(shard=n, reshard=2)))
            layouts.append((f"hsdp 2 x {n // 2}", dict(shard=n // 2, replicate=2)))
        for name, kw in layouts:
            plan = step_collectives(shape, **kw)
            rows.append({"N": n, "layout": name, "payload_bytes": volume.payload_bytes(plan),
                         "send_bytes_per_rank": round(volume.send_bytes_per_rank(plan))})
    return rows


# -- live runs ---------------------------------------------------------------------------------------------------
def layouts(n: int):
    rows = [("ddp", "ddp", ["--count-step"]), ("zero3", "zero3", []), ("fsdp2 reshard", "fsdp2", []),
            ("fsdp2 no reshard", "fsdp2", ["--reshard-after-forward", "false"])]
    if n == 4:
        rows += [("fsdp2 reshard to 2", "fsdp2", ["--reshard-after-forward", "2"]),
                 ("hsdp 2x2", "hsdp", ["--dp-replicate", "2", "--dp-shard", "2"])]
    return rows + [("fsdp2 + compile blocks", "fsdp2", ["--compile"]),
                   ("fsdp2 + compile model", "fsdp2", ["--compile-model"])]


def predicted(strategy: str, extra: list, n: int, f: dict, rank: int):
    """(states bytes, collective payload bytes per step) from the calculator and the volume models."""
    from coursekit.comm import volume
    from coursekit.fsdp.predict import step_collectives
    from coursekit.memory import estimate
    from coursekit.memory.calculator import resolve_model

    kw = dict(micro_batch=f["micro_batch"], seq=32, dtype="fp32", precision="fp32", strategy=strategy)
    shape, N = resolve_model("tiny-llama"), f["num_params"]
    if strategy == "hsdp":
        kw.update(dp_replicate=2, dp_shard=2, dp_rank=f["coords"]["dp_shard"])
        plan = volume.payload_bytes(step_collectives(shape, shard=2, replicate=2))
    elif strategy == "fsdp2":
        r = extra[extra.index("--reshard-after-forward") + 1] if "--reshard-after-forward" in extra else "true"
        r = r == "true" if r in ("true", "false") else int(r)
        kw.update(dp_shard=n, dp_rank=rank, fsdp_reshard=r)
        plan = volume.payload_bytes(step_collectives(shape, shard=n, reshard=r))
    elif strategy == "zero3":
        kw.update(dp_replicate=n, dp_rank=rank)
        plan = volume.payload_bytes(volume.zero(3, N, n))
    else:  # DDP: every gradient once, and the module buffers it broadcasts before each step's first forward
        from coursekit.models import build_model

        kw.update(dp_replicate=n)
        buffers = sum(b.numel() * b.element_size() for b in build_model("tiny-llama", device="meta").buffers())
        plan = volume.payload_bytes(volume.ddp(N, n, buffer_bytes=buffers))
    c = estimate("tiny-llama", **kw).categories
    return c["parameters"] + c["gradients"] + c["master_weights"] + c["optimizer_states"], plan


def states(f: dict) -> int:
    return sum(f.get(k, 0) for k in ("params_bytes", "grads_bytes", "master_bytes", "optimizer_bytes"))


def sent(f: dict) -> int | None:
    """Payload bytes of the counted step: the strategy's own count (FSDP2, ZeRO), else --count-step's (DDP)."""
    calls = (f.get("collectives") or {}).get("calls")
    if calls is None:
        return f.get("comm_bytes")
    return sum(c["bytes"] * c.get("count", 1) for c in calls)


def steady_ms(rec: dict) -> float:
    return 1000 * statistics.median(s["step_time_s"] for s in rec["steps"][1:])


def show(row: dict) -> dict:
    print("  " + "  ".join(f"{x}={y}" for x, y in row.items()), flush=True)
    return row


def strategy_rows(nprocs, cache: str, only=None) -> list[dict]:
    from coursekit.launch import launch

    rows = []
    print("== strategies", flush=True)
    for n in nprocs:
        for name, strategy, extra in layouts(n):
            if only and not any(o in name for o in only):
                continue
            try:
                res = launch("coursekit.train", ["--strategy", strategy, *COMMON, *extra], nproc=n, timeout=900,
                             stream=False, env={"TORCHINDUCTOR_CACHE_DIR": cache})
            except Exception as exc:  # a layout that does not run here is a figure too
                rows.append(show({"N": n, "layout": name, "error": str(exc).splitlines()[-1][:160]}))
                continue
            last = max(res.results, key=lambda r: r["rank"])
            r0 = min(res.results, key=lambda r: r["rank"])
            want0, plan = predicted(strategy, extra, n, r0["final"], r0["rank"])
            want_last, _ = predicted(strategy, extra, n, last["final"], last["rank"])
            rows.append(show({"N": n, "layout": name, "first_step_s": round(r0["steps"][0]["step_time_s"], 2),
                         "step_ms": round(steady_ms(r0), 1),
                         "states_B rank0 meas/pred": f"{states(r0['final']):,}/{want0:,}",
                         "states_B last meas/pred": f"{states(last['final']):,}/{want_last:,}",
                         "coll_B/step meas/pred": f"{sent(r0['final']) if sent(r0['final']) is not None else '-'}"
                                                   f"/{plan:,}"}))
        if not only or any(o in "qlora" for o in only):
            try:
                rows += qlora_rows(n)
            except Exception as exc:
                rows.append(show({"N": n, "layout": "qlora", "error": str(exc).splitlines()[-1][:160]}))
    return rows




def qlora_rows(n: int) -> list[dict]:
    from coursekit.fsdp.qlora import predicted_bytes
    from coursekit.launch import launch
    from coursekit.memory.calculator import resolve_model

    res = launch("coursekit.fsdp.qlora_run", ["--steps", "6", "--batch", str(8 // n)], nproc=n, timeout=900,
                 stream=False)
    out = []
    for rank, r in list(enumerate(sorted(res.results, key=lambda r: r["rank"])))[:: max(1, n - 1)]:
        q = predicted_bytes(resolve_model("tiny-llama"), shard=n, rank=rank)
        *blocks, root = q["unit_gather_bytes"]  # all-gather: blocks in forward and again in backward, the root once
        plan = 2 * sum(blocks) + root + sum(q["unit_reduce_bytes"])
        k, h = r["kinds"], r["held"]
        got = sum(k.values()) + h["grads_bytes"] + h["optimizer_bytes"]
        want = q["nf4_base"] + q["rest"] + q["adapters"] + q["adapter_grads"] + q["adapter_optimizer"]
        out.append(show({"N": n, "layout": f"qlora r=8 (rank {rank})", "first_step_s": round(r["times"][0], 2),
                    "step_ms": round(1000 * statistics.median(r["times"][1:]), 1),
                    "states_B meas/pred": f"{got:,}/{want:,}", "coll_B/step meas/pred": f"{r['sent']:,}/{plan:,}",
                    "loss first/last": f"{r['losses'][0]:.3f}/{r['losses'][-1]:.3f}"}))
    return out


# -- checkpoints -------------------------------------------------------------------------------------------------
SAVE = '''
import sys, time, tempfile, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from coursekit.dist import session
from coursekit.launch import report
from coursekit.models import blocks, build_model
from coursekit.parallel.api import adamw
from coursekit.parallel.loss import cross_entropy
with session(seed=0) as info:
    m = build_model(sys.argv[1], seed=0)
    for b in blocks(m):
        fully_shard(b)
    fully_shard(m)
    opt = adamw(m.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (2, 33))
    cross_entropy(m(input_ids=x[:, :-1]).logits, x[:, 1:]).backward()
    opt.step()
    group = dist.new_group(backend="gloo")
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for k in range(3):
            sd = dict(zip(("model", "optim"), get_state_dict(m, opt)))
            dist.barrier(); t = time.perf_counter()
            dcp.save(sd, checkpoint_id=f"{d}/sync-{k}")
            sync = time.perf_counter() - t
            dist.barrier(); t = time.perf_counter()
            fut = dcp.async_save(sd, checkpoint_id=f"{d}/async-{k}", process_group=group)
            ret = time.perf_counter() - t
            getattr(fut, "upload_completion", fut).result()
            done = time.perf_counter() - t
            for key, v in (("sync_s", sync), ("async_return_s", ret), ("async_done_s", done)):
                out.setdefault(key, []).append(v)
    report(out)
'''


def dcp_rows() -> list[dict]:
    from coursekit.launch import launch, launch_code

    rows = []
    print("== dcp", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        mid = Path(tmp) / "mid.json"
        mid.write_text(json.dumps(MID))
        for label, model in (("tiny-llama (125 k params)", "tiny-llama"), ("mid llama (20 M params)", str(mid))):
            try:
                t = launch_code(SAVE, [model], nproc=2, timeout=900, stream=False).results[0]
            except Exception as exc:
                rows.append(show({"model": label, "error": str(exc).splitlines()[-1][:160]}))
                continue
            row = {"model": label, "dcp.save s (sync)": _ms(t["sync_s"]),
                   "async_save returns s": _ms(t["async_return_s"]), "async_save done s": _ms(t["async_done_s"])}
            for mode in ("none", "thread"):  # the trainer: what one save blocks the loop, under training
                with tempfile.TemporaryDirectory(dir=tmp) as d:
                    args = ["--strategy", "fsdp2", "--model", model, "--steps", "6", "--seq", "32", "--save-every",
                            "2", "--ckpt-dir", d, "--async-ckpt", mode, "--quiet"]
                    f = launch("coursekit.train", args, nproc=2, timeout=900, stream=False).results[0]["final"]
                row[f"trainer blocked ms ({'sync' if mode == 'none' else mode})"] = [
                    round(1000 * x, 1) for x in f["ckpt_blocked_each_s"]]
            rows.append(show(row))
    return rows


def _ms(xs) -> str:
    return "/".join(f"{x:.3f}" for x in xs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--shards", default="2,3,4")
    ap.add_argument("--strategies", action="store_true")
    ap.add_argument("--nprocs", default="2,4")
    ap.add_argument("--only", help="comma-separated parts of layout names to run (e.g. ddp,zero3,qlora)")
    ap.add_argument("--dcp", action="store_true")
    a = ap.parse_args(argv)
    shards = [int(x) for x in a.shards.split(",")]
    for k, rows in {"bytes": bytes_table(a.model, shards), "collectives": collectives(a.model, shards)}.items():
        print(f"== {k}", flush=True)
        for r in rows:
            show(r)
    if a.strategies:  # rows print as they finish; a cold inductor cache unless TORCHINDUCTOR_CACHE_DIR is set
        with tempfile.TemporaryDirectory(prefix="bench-fsdp-inductor-") as cache:
            strategy_rows([int(x) for x in a.nprocs.split(",")], os.environ.get("TORCHINDUCTOR_CACHE_DIR", cache),
                          a.only.split(",") if a.only else None)
    if a.dcp:
        dcp_rows()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
