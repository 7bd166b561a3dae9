"""Module 5 figures (printed, not asserted): overlap % per strategy and bucket size, time from a planted hang to
its diagnosis, profiler overhead per step.

    .venv/bin/python bench/bench_profiling.py [--quick] [--only overlap,hangs,overhead] [--json FILE]

  * overlap: 2-rank runs of the trainer (a 1.2 M-parameter Llama, steps 1-3 traced), ``coursekit trace`` totals
    per rank: DDP with 0.1 / 1 / 25 / 1000 MB buckets, ZeRO-2 (DeepSpeed) with overlap_comm off and on, FSDP2
    with its own prefetch and with --prefetch 2 (on CPU the prefetched all-gathers run on gloo's thread).
    --quick: DDP 0.1 and 1000 MB only.
  * hang -> diagnosis: each planted case (``coursekit.profiling.planted``, 3 s group timeout): seconds from the
    moment the waiting rank issued the bad collective (its flight-recorder entry's creation time) to the printed
    diagnosis, and the whole command's wall time. --quick: op and sleep only.
  * profiler overhead: the same DDP run with and without ``--profile-dir``: mean step time of steps 1-3.
On a shared 2-core CPU machine every figure moves with the load: the load average is printed with them.
"""
import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("COURSEKIT_DEVICE", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_trace import MODEL  # noqa: E402  (the model the overlap tests use)

from coursekit.launch import launch  # noqa: E402
from coursekit.profiling import hangs  # noqa: E402
from coursekit.profiling import trace as T  # noqa: E402


def train(tmp: Path, strategy: str, extra, profile: bool) -> dict:
    cfg = tmp / "model.json"
    cfg.write_text(json.dumps(MODEL))
    out = tmp / f"{strategy}-{'-'.join(extra) or 'default'}-{int(profile)}"
    args = ["--strategy", strategy, "--model", cfg, "--steps", "4", "--quiet", *extra]
    if profile:
        args += ["--profile-steps", "1:4", "--profile-dir", out]
    res = launch("coursekit.train", args, nproc=2, timeout=900, stream=False)
    step_s = [s["step_time_s"] for s in res.results[0]["steps"][1:4]]
    return {"dir": out, "step_ms": 1e3 * sum(step_s) / len(step_s)}


def zero2_config(tmp: Path, overlap: bool) -> Path:
    src = Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / "zero2.json"
    cfg = json.loads(src.read_text())
    cfg["zero_optimization"]["overlap_comm"] = overlap
    path = tmp / f"zero2-overlap{int(overlap)}.json"
    path.write_text(json.dumps(cfg))
    return path


def overlap_rows(tmp: Path, quick: bool) -> list[dict]:
    runs = [("ddp", ["--bucket-mb", mb]) for mb in (("0.1", "1000") if quick else ("0.1", "1", "25", "1000"))]
    if not quick:
        runs += [("zero2", ["--ds-config", str(zero2_config(tmp, ov))]) for ov in (False, True)]
        runs += [("fsdp2", ["--prefetch", n]) for n in ("0", "2")]
    rows = []
    for strategy, extra in runs:
        r = train(tmp, strategy, extra, profile=True)
        res = T.analyse(r["dir"])
        label = {"ddp": f"{extra[1]} MB", "fsdp2": f"prefetch {extra[1]}"}.get(strategy) or Path(extra[1]).stem
        rows.append({"strategy": strategy, "setting": label, "step_ms": r["step_ms"],
                     **{f"overlap_rank{x['rank']}": x["total"]["overlap_pct"] for x in res["ranks"]},
                     "comm_ms": sum(x["total"]["comm_ms"] for x in res["ranks"]) / len(res["ranks"]),
                     "exposed_ms": sum(x["total"]["exposed_ms"] for x in res["ranks"]) / len(res["ranks"])})
        print(f"  {strategy:6} {label:18} overlap % (rank 0, 1): {rows[-1].get('overlap_rank0', 0):5.1f} "
              f"{rows[-1].get('overlap_rank1', 0):5.1f}   comm {rows[-1]['comm_ms']:7.1f} ms  exposed "
              f"{rows[-1]['exposed_ms']:7.1f} ms  (3 steps)", flush=True)
    return rows


def hang_rows(tmp: Path, quick: bool) -> list[dict]:
    rows = []
    for case in ("op", "sleep") if quick else ("op", "shape", "skip", "sleep"):
        folder = tmp / f"fr-{case}"
        t0 = time.time()
        d = hangs.run("coursekit.profiling.planted", ["--case", case], nproc=2, timeout=300, pg_timeout_s=3.0,
                      folder=folder, stream=False)
        done = time.time()
        issued = []  # when the waiting rank(s) issued collective #3: the start of the hang
        for f in folder.glob("fr_trace_*.pkl"):
            issued += [e["time_created_ns"] / 1e9 for e in pickle.loads(f.read_bytes())["entries"]
                       if e["collective_seq_id"] == 3]
        rows.append({"case": case, "kind": d["kind"], "ranks": d["ranks"], "seq": d["seq"],
                     "hang_to_diagnosis_s": done - min(issued) if issued else None, "wall_s": done - t0})
        h = rows[-1]["hang_to_diagnosis_s"]
        print(f"  {case:6} -> {d['kind']:8} ranks {d['ranks']} seq {d['seq']}: hang -> diagnosis "
              f"{'-' if h is None else f'{h:5.1f}'} s, whole command {rows[-1]['wall_s']:5.1f} s", flush=True)
    return rows


def overhead_rows(tmp: Path, repeats: int = 2) -> list[dict]:
    """Runs alternate off/on ``repeats`` times; the fastest of each is kept (the load of a shared machine moves)."""
    times = {False: [], True: []}
    for _ in range(repeats):
        for prof in (False, True):
            times[prof].append(train(tmp, "ddp", ["--bucket-mb", "1"], profile=prof)["step_ms"])
    off, on = min(times[False]), min(times[True])
    print(f"  ddp 1 MB: step {off:6.1f} ms without the profiler, {on:6.1f} ms with it "
          f"({100 * (on - off) / off:+.0f} %; fastest of {repeats} runs each: off {times[False]}, on {times[True]})",
          flush=True)
    return [{"step_ms_off": off, "step_ms_on": on, "overhead_pct": 100 * (on - off) / off}]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer runs (about 2 minutes on an idle 2-core machine)")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--only", default="overlap,hangs,overhead", help="a comma list of the tables to run")
    a = p.parse_args(argv)
    only = set(a.only.split(","))
    if only - {"overlap", "hangs", "overhead"}:
        p.error(f"--only: unknown table(s) {', '.join(sorted(only - {'overlap', 'hangs', 'overhead'}))}")
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.1f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-profiling-") as d:
        tmp = Path(d)
        res = {"load_start": load}
        if "overlap" in only:
            print("overlap (coursekit trace, totals over steps 1-3)")
            res["overlap"] = overlap_rows(tmp, a.quick)
        if "hangs" in only:
            print("planted hangs (coursekit launch --diagnose)")
            res["hangs"] = hang_rows(tmp, a.quick)
        if "overhead" in only:
            print("profiler overhead")
            res["overhead"] = overhead_rows(tmp, 1 if a.quick else 2)
    res["load_end"] = os.getloadavg()[0]
    print(f"load average at the end: {res['load_end']:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
