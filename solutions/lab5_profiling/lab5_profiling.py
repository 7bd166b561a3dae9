# ---
# jupyter:
#   coursekit:
#     ci_recheck: false
#     call_timeout: 120
#     submission_timeout: 1800
#     autograde_timeout: 1500
#     cell_timeout: 300
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 5 — Profiling: overlap, MFU, hangs, stragglers, recovery
#
# A distributed job that is slow, stuck or dead tells you why in its traces, its records and its flight recorder.
# You will run real 2-process jobs of the course trainer (CPU + gloo here, NCCL on GPUs, unchanged) and
#
# 1. compute how much communication hides behind compute from a profiler trace, and make it grow,
# 2. compute the run's MFU and name what costs the most of the gap to peak,
# 3. find the hung collective of a planted bug from every rank's flight-recorder dump,
# 4. name the straggler from the ranks' compute and wait times,
# 5. kill a rank with SIGKILL and prove the resumed run is bit-identical to an uninterrupted one.
#
# Every answer is checked against numbers: `coursekit trace`'s figures, the trainer's records, the diagnosis of
# `coursekit launch --diagnose`. **Grading** works as in Labs 1-2: write your answers inside the functions; visible
# tests run here, hidden tests try other inputs when your notebook is graded; only definitions (functions, imports,
# UPPER_CASE constants) are graded, and they take and return plain data. Seven short jobs run in all, each run
# once and kept (`coursekit.profiling.labruns`): running a cell again costs nothing. The four traced runs go on the
# lab's 2 live ranks (`coursekit.pool`); the hang and the killed run are launches of their own (they take a process
# group down).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false}
import math
import statistics

from coursekit.course.wire import close
from coursekit.flops import flops_per_step
from coursekit.pool import Pool
from coursekit.profiling import labruns
from coursekit.profiling.trace import table

# 1.2 M parameters (4.7 MB of fp32 gradients): big enough that one all-reduce takes milliseconds on gloo
MODEL_CONFIG = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 512,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_dropout": 0.0}
GLOBAL_BATCH, SEQ, STEPS = 8, 32, 6  # sequences per step over both ranks, tokens per sequence, steps per run
SMALL_BUCKET_MB, ONE_BUCKET_MB = 0.1, 1000  # ~45 buckets per backward, or a single one
PREFETCH = 2  # FSDP2 gathers the next 2 blocks ahead (section 1's last cells)
SLOW_RANK, SLOW_MS = 1, 300  # section 4: rank 1 sleeps 300 ms per step (well above a loaded machine's noise)
KILL_AT_STEP, SAVE_EVERY = 3, 2  # section 5
pool = Pool(2, timeout=240)  # the lab's 2 live ranks (coursekit.pool): the traced runs of sections 1-2 use them
labruns.on_ranks(pool)


def small_buckets():  # DDP, 0.1 MB buckets, steps 1-4 traced: {"dir", "records", "trace"} (launched once, kept)
    return labruns.ddp_traced(MODEL_CONFIG, SMALL_BUCKET_MB, steps=STEPS, seq=SEQ, global_batch=GLOBAL_BATCH)


def one_bucket():  # the same run with a single 1000 MB bucket
    return labruns.ddp_traced(MODEL_CONFIG, ONE_BUCKET_MB, steps=STEPS, seq=SEQ, global_batch=GLOBAL_BATCH)


def no_prefetch():  # FSDP2, one unit per block, steps 1-2 traced: FSDP2's own prefetch
    return labruns.fsdp_traced(MODEL_CONFIG, 0, seq=SEQ, global_batch=GLOBAL_BATCH)


def prefetch_ahead():  # the same with --prefetch PREFETCH: the next blocks gathered while this one computes
    return labruns.fsdp_traced(MODEL_CONFIG, PREFETCH, seq=SEQ, global_batch=GLOBAL_BATCH)


def hang():  # rank 1 calls all_gather where rank 0 calls all_reduce (#3), under coursekit launch --diagnose
    return labruns.planted_hang("op", rank=1, at=3)


def elastic():  # section 5's two runs (rank 1 also sleeps SLOW_MS per step: section 4's straggler runs too)
    return labruns.elastic_pair(MODEL_CONFIG, steps=STEPS, save_every=SAVE_EVERY, kill_at_step=KILL_AT_STEP,
                                kill_rank=1, extra=("--slow-rank", SLOW_RANK, "--slow-ms", SLOW_MS), seq=SEQ,
                                global_batch=GLOBAL_BATCH)


# %% [markdown]
# ## 1. How much communication hides behind compute?
#
# DDP all-reduces gradients in buckets; a bucket's all-reduce starts as soon as backward has produced all its
# gradients, while backward goes on with the earlier layers. Small buckets start early, so their transfers run
# *during* backward (hidden); one big bucket can only start when backward is over (exposed). The profiler
# records both: `aten::*` ops on the main thread (compute) and `gloo:*` collectives on gloo's own threads
# (communication). Per step, with C the union of the compute intervals, M the union of the communication
# intervals, and W the step's window (everything clipped to W):
#
#     hidden = |M ∩ C|    exposed = |M| - hidden    overlap % = 100 · hidden / |M|    idle = |W| - |M ∪ C|
#
# Compute ops nest (`aten::linear` holds `aten::mm`), intervals arrive in any order and some cross the window's
# edges: merge before you measure, or you count time twice. Write `overlap_stats(compute, comm, window)`:
# intervals are `[start, end]` pairs in µs, the results in ms with keys `compute_ms`, `comm_ms`, `hidden_ms`,
# `exposed_ms`, `overlap_pct` (None when there is no communication) and `idle_ms`.

# %% nbgrader={"grade": false, "grade_id": "overlap_stats", "locked": false, "schema_version": 3, "solution": true}
def overlap_stats(compute: list, comm: list, window: list) -> dict:
    """Compute, communication, hidden and exposed communication, overlap % and idle time of one step (ms)."""
    ### BEGIN SOLUTION
    lo, hi = window

    def union(iv):
        out = []
        for s, e in sorted((max(s, lo), min(e, hi)) for s, e in iv if e > lo and s < hi):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out

    def length(iv):
        return sum(e - s for s, e in iv)

    C, M = union(compute), union(comm)
    hidden = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for a in C for b in M)
    busy = length(union(C + M))
    return {"compute_ms": length(C) / 1e3, "comm_ms": length(M) / 1e3, "hidden_ms": hidden / 1e3,
            "exposed_ms": (length(M) - hidden) / 1e3, "overlap_pct": 100 * hidden / length(M) if M else None,
            "idle_ms": max(hi - lo - busy, 0) / 1e3}
    ### END SOLUTION


# %% [markdown]
# Two real runs: DDP on 2 processes with 0.1 MB buckets, and with one 1000 MB bucket, each traced for steps 1-4
# (`coursekit train --strategy ddp --bucket-mb B --profile-dir D --profile-steps 1:5`). `coursekit trace D` reads
# the traces (one Chrome trace per rank: open one in https://ui.perfetto.dev) and prints the table below;
# `labruns.trace_intervals(D)` gives you the same events as intervals, per rank and step.

# %% nbgrader={"grade": false, "grade_id": "demo_overlap", "locked": true, "schema_version": 3, "solution": false}
for _name, _run in (("0.1 MB buckets", small_buckets()), ("one bucket", one_bucket())):
    print(f"--- {_name}: coursekit trace {_run['dir']}")
    print(table(_run["trace"]))
    try:
        _yours = [overlap_stats(r["compute"], r["comm"], r["window"])["overlap_pct"]
                  for r in labruns.trace_intervals(_run["dir"])]
        print("yours, overlap % per rank and step:", [None if p is None else round(p, 1) for p in _yours])
    except NotImplementedError:
        print("write overlap_stats above")

# %% nbgrader={"grade": true, "grade_id": "overlap_stats_visible", "locked": true, "points": 3, "schema_version": 3, "solution": false}
_s = overlap_stats([[0, 10_000], [2_000, 5_000], [20_000, 30_000]], [[8_000, 25_000]], [0, 40_000])
assert close(_s, {"compute_ms": 20.0, "comm_ms": 17.0, "hidden_ms": 7.0, "exposed_ms": 10.0,
                  "overlap_pct": 700 / 17, "idle_ms": 10.0}), _s
_pct = {}
for _run in (small_buckets(), one_bucket()):
    _theirs = {(r["rank"], s["step"]): s for r in _run["trace"]["ranks"] for s in r["steps"]}
    _rows = labruns.trace_intervals(_run["dir"])
    assert len(_rows) == len(_theirs) == 8, "2 ranks x 4 traced steps"
    for _r in _rows:
        _mine, _ref = overlap_stats(_r["compute"], _r["comm"], _r["window"]), _theirs[(_r["rank"], _r["step"])]
        for _k in ("compute_ms", "comm_ms", "hidden_ms", "exposed_ms", "overlap_pct", "idle_ms"):
            assert close(_mine[_k], _ref[_k], rel=1e-9, abs_=1e-9), f"rank {_r['rank']} step {_r['step']}: {_k}"
        _pct.setdefault(_run["dir"], []).append(_mine["overlap_pct"])
_small, _one = (statistics.median(_pct[_run["dir"]]) for _run in (small_buckets(), one_bucket()))
assert _small > _one, "small buckets should hide more of the all-reduce than one bucket"
print(f"overlap_stats: equals coursekit trace on 16 real steps; overlap {_small:.0f} % with 0.1 MB buckets, "
      f"{_one:.0f} % with one bucket (medians)")

# %% nbgrader={"grade": true, "grade_id": "overlap_stats_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests try unsorted, touching and window-crossing intervals, and a step without communication.
### BEGIN HIDDEN TESTS
from coursekit.profiling import trace as _T

_cases = [([[50, 60], [0, 30], [10, 20]], [[25, 55], [5, 8]], [0, 100]),  # unsorted, nested
          ([[0, 5], [5, 10]], [[4, 6], [6, 12]], [0, 20]),  # touching intervals
          ([[-40, 30], [90, 150]], [[-10, 5], [95, 200]], [0, 100]),  # events crossing the window's edges
          ([[10, 20], [15, 18]], [], [0, 50]),  # no communication: overlap % is None
          ([], [[300, 400]], [0, 1000]), ([[0, 10]], [[0, 10], [0, 10]], [0, 10])]
for _c, _m, _w in _cases:
    _want = _T.overlap(_c, _m, _w)
    _got = overlap_stats(_c, _m, _w)
    for _key in ("compute_ms", "comm_ms", "hidden_ms", "exposed_ms", "idle_ms"):
        assert close(_got[_key], _want[_key], rel=1e-9, abs_=1e-12), f"{_key} for compute {_c}, comm {_m}, window {_w}"
    assert (_got["overlap_pct"] is None) == (_want["overlap_pct"] is None), "overlap % without communication"
    assert _want["overlap_pct"] is None or close(_got["overlap_pct"], _want["overlap_pct"]), f"overlap % for {_c}, {_m}"
### END HIDDEN TESTS

# %% [markdown]
# With small buckets part of the all-reduce runs under backward; with one bucket it all waits for the end of
# backward, and every millisecond of it adds to the step. FSDP2 has the same lever for its all-gathers: a block's
# parameters must be gathered before its forward (and again before its backward), and prefetching (`--prefetch N`)
# issues the next N blocks' all-gathers while the current block computes. Without it FSDP2 gathers each block when
# it is needed and the training thread waits. On a GPU the early all-gathers run on their own CUDA stream; on a CPU
# there are no streams, so the trainer issues prefetched all-gathers asynchronously and gloo's thread runs them
# beside the compute (`coursekit.fsdp.strategy`). Two more real runs, FSDP2 on 2 processes without and with
# `--prefetch 2`, traced for steps 1-2; your `overlap_stats` measures them.

# %% nbgrader={"grade": false, "grade_id": "demo_prefetch", "locked": true, "schema_version": 3, "solution": false}
for _name, _run in (("FSDP2, no prefetch", no_prefetch()), (f"FSDP2, --prefetch {PREFETCH}", prefetch_ahead())):
    print(f"--- {_name}: coursekit trace {_run['dir']}")
    print(table(_run["trace"]))

# %% nbgrader={"grade": true, "grade_id": "overlap_prefetch_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
_pct = {}
for _run in (no_prefetch(), prefetch_ahead()):
    _theirs = {(r["rank"], s["step"]): s for r in _run["trace"]["ranks"] for s in r["steps"]}
    _rows = labruns.trace_intervals(_run["dir"])
    assert len(_rows) == len(_theirs) == 4, "2 ranks x 2 traced steps"
    for _r in _rows:
        _mine = overlap_stats(_r["compute"], _r["comm"], _r["window"])
        assert close(_mine["overlap_pct"], _theirs[(_r["rank"], _r["step"])]["overlap_pct"], rel=1e-9, abs_=1e-9)
        _pct.setdefault(_run["dir"], []).append(_mine["overlap_pct"])
_none, _ahead = (statistics.median(_pct[_run["dir"]]) for _run in (no_prefetch(), prefetch_ahead()))
assert _ahead > _none, "prefetched all-gathers should hide behind compute"
print(f"overlap_prefetch: FSDP2 overlap {_none:.0f} % without prefetch, {_ahead:.0f} % with --prefetch {PREFETCH} (medians)")

# %% [markdown]
# On GPUs `coursekit trace` counts `nccl*Kernel*` kernels as communication and every other kernel as compute, with
# the same arithmetic.
#
# ## 2. MFU, and where the rest of the peak went
#
# Model FLOPs utilisation: the FLOPs the model needs per step (`coursekit.flops.flops_per_step(model, batch,
# seq)["total"]`, all ranks together) divided by the step time and by what the devices could do at peak:
#
#     MFU = model FLOPs per step / step time / (devices × peak FLOP/s)
#
# The trainer reports it in every rank's final record (`mfu`, `peak_flops`, `peak_source`). On a CPU there is no
# data-sheet peak that PyTorch reaches: the peak is **measured**, the best rate of a 512³ matmul on the threads one
# rank uses (`coursekit doctor --peak` measures and caches it). Its step time is the median `step_time_s` of every
# step but the first (warm-up; an odd number of steps here).
#
# At 100 % MFU a rank would need `ideal = model FLOPs / devices / peak` per step. A traced step splits into
# `compute + exposed + idle` (section 1), so its time minus the ideal falls into three losses:
# `slow_compute = compute_ms - ideal_ms` (compute running below peak: small matmuls, norms, softmax, the optimizer),
# `exposed_comm = exposed_ms` and `idle = idle_ms` (Python between ops, the data loader). Write
# `mfu_gap(model, global_batch, seq, steps, devices, peak_flops, trace_row)` returning `mfu`, `ideal_ms`, `losses`
# (a dict with those three keys, ms) and `dominant` (the key of the largest loss); `steps` are a record's step
# list, `trace_row` one step of `coursekit trace` (keys `time_ms`, `compute_ms`, `exposed_ms`, `idle_ms`, ...).

# %% nbgrader={"grade": false, "grade_id": "mfu_gap", "locked": false, "schema_version": 3, "solution": true}
def mfu_gap(model, global_batch: int, seq: int, steps: list, devices: int, peak_flops: float,
            trace_row: dict) -> dict:
    """MFU of a run, the step time at 100 % MFU, and the three losses of a traced step (ms)."""
    ### BEGIN SOLUTION
    flops = flops_per_step(model, global_batch, seq)["total"]
    step_s = statistics.median(s["step_time_s"] for s in (steps[1:] or steps))
    ideal_ms = 1e3 * flops / devices / peak_flops
    losses = {"slow_compute": trace_row["compute_ms"] - ideal_ms, "exposed_comm": trace_row["exposed_ms"],
              "idle": trace_row["idle_ms"]}
    return {"mfu": flops / step_s / devices / peak_flops, "ideal_ms": ideal_ms, "losses": losses,
            "dominant": max(losses, key=losses.get)}
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "demo_mfu", "locked": true, "schema_version": 3, "solution": false}
_f = small_buckets()["records"][0]["final"]
print(f"record: {_f['model_flops_per_step'] / 1e9:.2f} GFLOP per step, MFU {_f['mfu']:.2%} of "
      f"{_f['peak_flops'] / 1e9:.1f} GFLOP/s ({_f['peak_source']})")
try:
    for _rank in small_buckets()["trace"]["ranks"]:
        _g = mfu_gap(MODEL_CONFIG, GLOBAL_BATCH, SEQ, small_buckets()["records"][_rank["rank"]]["steps"], 2,
                     _f["peak_flops"], _rank["steps"][1])
        print(f"rank {_rank['rank']}, step {_rank['steps'][1]['step']}: MFU {_g['mfu']:.2%}, ideal "
              f"{_g['ideal_ms']:.2f} ms of {_rank['steps'][1]['time_ms']:.1f} ms; losses (ms) "
              + ", ".join(f"{k} {v:.1f}" for k, v in _g["losses"].items()) + f" -> {_g['dominant']}")
except NotImplementedError:
    print("write mfu_gap above")

# %% nbgrader={"grade": true, "grade_id": "mfu_gap_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
_g = mfu_gap("tiny-llama", 2, 16, [{"step_time_s": t} for t in (5.0, 0.3, 0.1, 0.2)], 2, 1e9,
            {"time_ms": 9.0, "compute_ms": 4.0, "exposed_ms": 3.0, "idle_ms": 1.0})
_want = flops_per_step("tiny-llama", 2, 16)["total"] / 0.2 / 2 / 1e9
assert close(_g["mfu"], _want), "the median of the steps after the first"
_run = small_buckets()
for _rec in _run["records"]:
    _f = _rec["final"]
    _row = next(r for r in _run["trace"]["ranks"] if r["rank"] == _rec["rank"])["steps"][1]
    _g = mfu_gap(MODEL_CONFIG, GLOBAL_BATCH, SEQ, _rec["steps"], _f["world_size"], _f["peak_flops"], _row)
    assert close(_g["mfu"], _f["mfu"], rel=1e-9), f"rank {_rec['rank']}: MFU {_g['mfu']} != the record's {_f['mfu']}"
    assert set(_g["losses"]) == {"slow_compute", "exposed_comm", "idle"}
    assert close(_g["ideal_ms"] + sum(_g["losses"].values()), _row["time_ms"], rel=1e-9), \
        "ideal + the three losses must add up to the traced step's time"
    assert _g["dominant"] == max(_g["losses"], key=_g["losses"].get)
print(f"mfu_gap: MFU equals both ranks' records ({_f['mfu']:.2%}); ideal + losses = the traced step; "
      f"dominant loss {_g['dominant']}")

# %% nbgrader={"grade": true, "grade_id": "mfu_gap_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests use another model, batch and device count, and steps where each loss dominates.
### BEGIN HIDDEN TESTS
_fl = flops_per_step("tiny-llama", 4, 16)["total"]
_st = [{"step_time_s": t} for t in (9.0, 0.30, 0.10, 0.20, 0.50, 0.40)]  # warm-up left out: median 0.30 s
_ideal = 1e3 * _fl / 4 / 2e9
for _tr, _dom in (({"time_ms": 99.0, "compute_ms": _ideal + 5, "exposed_ms": 30.0, "idle_ms": 2.0}, "exposed_comm"),
                  ({"time_ms": 99.0, "compute_ms": _ideal + 25, "exposed_ms": 20.0, "idle_ms": 21.0}, "slow_compute"),
                  ({"time_ms": 99.0, "compute_ms": _ideal + 12, "exposed_ms": 0.5, "idle_ms": 13.0}, "idle")):
    _h = mfu_gap("tiny-llama", 4, 16, _st, 4, 2e9, _tr)
    assert close(_h["mfu"], _fl / 0.30 / 4 / 2e9), "MFU: median step time without the first step, per device"
    assert close(_h["ideal_ms"], _ideal), "ideal_ms"
    assert close(_h["losses"]["slow_compute"], _tr["compute_ms"] - _ideal), "slow_compute = compute - ideal"
    assert _h["dominant"] == _dom, f"dominant loss, expected {_dom}"
### END HIDDEN TESTS

# %% [markdown]
# The measured peak is a 512³ matmul; this model's largest multiply 128 tokens per rank by a 128×512 head, far too
# small to reach it, and much of compute is not matmuls at all (norms, softmax, AdamW: the top ops of the trace
# table in section 1).
# On a GPU the same three losses exist: kernels below peak (small or memory-bound), exposed NCCL time (section 1),
# and idle streams (launch overhead, the host falling behind: CUDA graphs and `torch.compile` attack that).
#
# ## 3. Which collective hung, on which rank?
#
# A collective that one rank never joins, or joins with another op or another shape, hangs the whole job. With
# `coursekit launch --diagnose`, every rank runs with a short process-group timeout and the flight recorder on,
# and dumps its last collectives when the job stalls. The planted bug below: `coursekit.profiling.planted --case op`,
# where rank 1 calls `all_gather` at its third collective while rank 0 calls `all_reduce`.
#
# Each rank's dump lists the collectives it issued, in order: `seq` (the sequence number within the process group,
# 1, 2, ...), `op`, `input_sizes`, `dtypes`. Write `find_culprit(dumps)` (`dumps`: `[{"rank", "entries"}]`):
# the first `seq` where the ranks do not all hold the same collective (same op, input sizes and dtypes; a rank
# without that `seq` differs too). If some ranks have no entry there, it is `"missing"`: the culprits are those
# ranks and `op` is what the others wait in. Otherwise it is a `"mismatch"`: the culprits are the ranks whose
# collective differs from the most common one (on a tie, from the lowest rank's), and `op` is the lowest culprit's.
# Return `{"kind", "ranks", "seq", "op"}`, or None if every rank issued the same collectives.

# %% nbgrader={"grade": false, "grade_id": "find_culprit", "locked": false, "schema_version": 3, "solution": true}
def find_culprit(dumps: list):
    """The first collective the ranks disagree on: {"kind": "mismatch"|"missing", "ranks", "seq", "op"}, or None."""
    ### BEGIN SOLUTION
    by_rank = {d["rank"]: {e["seq"]: e for e in d["entries"]} for d in dumps}
    for seq in sorted({s for es in by_rank.values() for s in es}):
        have = {r: es[seq] for r, es in by_rank.items() if seq in es}
        sig = {r: (e["op"], e["input_sizes"], e["dtypes"]) for r, e in have.items()}
        missing = sorted(set(by_rank) - set(have))
        if missing:
            return {"kind": "missing", "ranks": missing, "seq": seq, "op": have[min(have)]["op"]}
        if len(set(map(repr, sig.values()))) > 1:
            votes = [repr(v) for v in sig.values()]
            top = max(votes.count(v) for v in votes)
            common = [v for v in votes if votes.count(v) == top]
            ref = repr(sig[min(sig)]) if len(set(common)) > 1 else common[0]
            odd = sorted(r for r, v in sig.items() if repr(v) != ref)
            return {"kind": "mismatch", "ranks": odd, "seq": seq, "op": have[odd[0]]["op"]}
    return None
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "demo_hang", "locked": true, "schema_version": 3, "solution": false}
_h = hang()
print("coursekit launch --nproc 2 --diagnose --json -m coursekit.profiling.planted --case op")
print({k: _h["diagnosis"][k] for k in ("kind", "ranks", "seq", "pg", "why", "elapsed_s")})
for _d in _h["dumps"]:
    print(f"rank {_d['rank']}:", [(e["seq"], e["op"], e["input_sizes"]) for e in _d["entries"]])
try:
    print("yours:", find_culprit(_h["dumps"]))
except NotImplementedError:
    print("write find_culprit above")

# %% nbgrader={"grade": true, "grade_id": "find_culprit_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
def _e(seq, op="all_reduce", sizes=((4,),), dtype="Float"):
    return {"seq": seq, "op": op, "input_sizes": [list(s) for s in sizes], "output_sizes": [list(s) for s in sizes],
            "dtypes": [dtype] * len(sizes), "pg": "default_pg", "state": "scheduled"}


_skip = [{"rank": 0, "entries": [_e(1), _e(2), _e(3)]}, {"rank": 1, "entries": [_e(1), _e(2)]}]
assert find_culprit(_skip) == {"kind": "missing", "ranks": [1], "seq": 3, "op": "all_reduce"}
_d = hang()["diagnosis"]
_mine = find_culprit(hang()["dumps"])
assert _mine is not None and _mine["kind"] == _d["kind"] and _mine["ranks"] == _d["ranks"], (_mine, _d["kind"])
assert _mine["seq"] == _d["seq"], f"seq {_mine['seq']}, the diagnosis says {_d['seq']}"
assert _mine["op"] == next(o["op"] for o in _d["ops"] if o["ranks"] == _mine["ranks"]), "the culprit's op"
print(f"find_culprit: rank {_mine['ranks']} issued {_mine['op']} at collective #{_mine['seq']}, as "
      f"coursekit launch --diagnose (torch's analyser on the repaired dumps) says")

# %% nbgrader={"grade": true, "grade_id": "find_culprit_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests use 4-rank dump sets: a shape and a dtype mismatch, rank 0 skipping, and a job that did not hang.
### BEGIN HIDDEN TESTS
_ev = lambda seq, op="all_reduce", sizes=((8,),), dtype="Float": dict(  # noqa: E731
    seq=seq, op=op, input_sizes=[list(x) for x in sizes], output_sizes=[list(x) for x in sizes], dtypes=[dtype],
    pg="default_pg", state="scheduled")
_set = lambda *per_rank: [{"rank": r, "entries": list(es)} for r, es in enumerate(per_rank)]  # noqa: E731


_ok = [_ev(1), _ev(2, "all_gather"), _ev(3), _ev(4), _ev(5)]
_shape = _set(_ok, _ok, _ok[:4] + [_ev(5, sizes=((4,),))], _ok)
assert find_culprit(_shape) == {"kind": "mismatch", "ranks": [2], "seq": 5, "op": "all_reduce"}, "shape mismatch"
_dtype = _set(_ok, _ok[:2] + [_ev(3, dtype="BFloat16")], _ok, _ok)
assert find_culprit(_dtype) == {"kind": "mismatch", "ranks": [1], "seq": 3, "op": "all_reduce"}, "dtype mismatch"
_first = _set(_ok[:1], _ok[:3], _ok[:3], _ok[:3])
assert find_culprit(_first) == {"kind": "missing", "ranks": [0], "seq": 2, "op": "all_gather"}, "rank 0 missing"
_two = _set(_ok[:3] + [_ev(4, "broadcast")], _ok[:4], _ok[:3] + [_ev(4, "broadcast")], _ok[:4])
assert find_culprit(_two) == {"kind": "mismatch", "ranks": [1, 3], "seq": 4, "op": "all_reduce"}, "a tie"
assert find_culprit(_set(_ok, _ok, _ok, _ok)) is None, "nothing hung"
_gaps = _set(_ok[2:], _ok[2:4], _ok[2:], _ok[2:])  # a recorder keeps the last entries only: seq need not start at 1
assert find_culprit(_gaps) == {"kind": "missing", "ranks": [1], "seq": 5, "op": "all_reduce"}, "entries from seq 3"
### END HIDDEN TESTS

# %% [markdown]
# The dumps alone cannot tell a rank that skipped a collective from one that is late (asleep, stuck in I/O): in
# both, its entry is missing. `coursekit launch --diagnose` also reads each rank's sidecar (did the rank exit, or
# was it still running when dumped, and where: its Python stack) and says `missing` or `timeout`. NCCL writes the
# same dumps by itself on a timeout (`TORCH_NCCL_DUMP_ON_TIMEOUT`); `torchfrtrace DIR` is torch's own analyser.
#
# ## 4. Who is the straggler?
#
# In synchronous training every rank's step takes the same time: the fast ranks wait for the slow one inside the
# collectives. So the straggler is not the rank with the longest step, it is the one that **waits least**. The
# trainer times every collective of every step on every rank and keeps, per rank, the median step time, wait
# (time in a collective beyond the fastest rank's time in the same collective) and compute (= step - wait), in
# its final record (`stragglers.per_rank`). Write `name_straggler(per_rank)`: the candidate is the rank with the
# smallest `wait_ms`; `gap` = the median of the other ranks' `wait_ms` minus its own; `base` = the median of the
# other ranks' `step_ms - wait_ms`. It is a straggler if `gap > max(2, 0.10 * base)`: return
# `{"rank", "slowdown_ms": gap, "slowdown_x": (base + gap) / base}`, else all three None.

# %% nbgrader={"grade": false, "grade_id": "name_straggler", "locked": false, "schema_version": 3, "solution": true}
def name_straggler(per_rank: list) -> dict:
    """The rank the others wait for, its slowdown in ms per step and as a factor; all None if there is none."""
    ### BEGIN SOLUTION
    slow = min(per_rank, key=lambda r: r["wait_ms"])
    others = [r for r in per_rank if r is not slow]
    if not others:
        return {"rank": None, "slowdown_ms": None, "slowdown_x": None}
    gap = statistics.median(r["wait_ms"] for r in others) - slow["wait_ms"]
    base = statistics.median(r["step_ms"] - r["wait_ms"] for r in others)
    if gap <= max(2.0, 0.10 * base):
        return {"rank": None, "slowdown_ms": None, "slowdown_x": None}
    return {"rank": slow["rank"], "slowdown_ms": gap, "slowdown_x": (base + gap) / base if base > 0 else None}
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "demo_straggler", "locked": true, "schema_version": 3, "solution": false}
_s = elastic()["whole"][0]["final"]["stragglers"]
for _r in _s["per_rank"]:
    print(f"rank {_r['rank']}: step {_r['step_ms']:.0f} ms, compute {_r['compute_ms']:.0f}, wait {_r['wait_ms']:.0f} "
          "(medians over steps 1-5)")
print("trainer:", _s["reason"])
try:
    print("yours:", name_straggler(_s["per_rank"]))
except NotImplementedError:
    print("write name_straggler above")

# %% nbgrader={"grade": true, "grade_id": "name_straggler_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
assert name_straggler([{"rank": 0, "step_ms": 50, "wait_ms": 30, "compute_ms": 20},
                       {"rank": 1, "step_ms": 50, "wait_ms": 1, "compute_ms": 49}]) == \
    {"rank": 1, "slowdown_ms": 29, "slowdown_x": 49 / 20}
for _rec in elastic()["whole"]:
    _s = _rec["final"]["stragglers"]
    _mine = name_straggler(_s["per_rank"])
    assert _mine["rank"] == _s["rank"] == SLOW_RANK, f"rank {_rec['rank']}'s record names rank {_s['rank']}"
    assert close(_mine["slowdown_ms"], _s["slowdown_ms"]) and close(_mine["slowdown_x"], _s["slowdown_x"])
print(f"name_straggler: rank {_mine['rank']}, ~{_mine['slowdown_ms']:.0f} ms per step (injected {SLOW_MS} ms), "
      f"{_mine['slowdown_x']:.1f}x, as the trainer's record says")

# %% nbgrader={"grade": true, "grade_id": "name_straggler_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
# Hidden tests use 4 ranks (the median matters), a job without a straggler, and the threshold.
### BEGIN HIDDEN TESTS
from coursekit.profiling.stragglers import find as _find


_pr = lambda *rows: [{"rank": i, "step_ms": s, "wait_ms": w, "compute_ms": s - w}  # noqa: E731
                      for i, (s, w) in enumerate(rows)]
for _case in (_pr((200, 10), (200, 150), (200, 20), (200, 160)),  # rank 0 waits least; others' median wait 150
              _pr((100, 3), (100, 4), (100, 2), (100, 3.5)),  # nobody waits for anybody
              _pr((60, 0), (60, 6.5), (60, 6.5)),  # gap 6.5 > 10 % of 53.5: a straggler
              _pr((60, 1.5), (60, 6.5), (60, 6.5)), _pr((80, 40), (80, 0))):  # gap 5.0 < 10 % of 53.5: none
    _ref = _find(_case)
    _want = {"rank": _ref["rank"], "slowdown_ms": _ref["slowdown_ms"], "slowdown_x": _ref.get("slowdown_x")}
    assert close(name_straggler(_case), _want), f"per-rank (step, wait) {[(r['step_ms'], r['wait_ms']) for r in _case]}"
### END HIDDEN TESTS

# %% [markdown]
# `coursekit trace` names it from profiler traces too (its `wait_ms` column and `straggler:` line), by the same rule
# on gloo's events: no clock is compared across ranks, only each rank's time in the same collective.
#
# ## 5. Kill a rank, resume, and prove nothing changed
#
# Both runs below train 6 steps with a checkpoint every 2 (`--ckpt-dir D --save-every 2`). In the second, rank 1
# SIGKILLs itself at the start of step 3 (`--kill-at-step 3 --kill-rank 1 --max-restarts 1`): no exception, no
# clean-up, as when a node dies. torchrun restarts both workers; they load the last complete checkpoint (model,
# optimizer, data position and every rank's RNG state) and go on. Write `resume_check(whole, resumed,
# kill_at_step)` (`whole`, `resumed`: every rank's record, `[{"rank", "steps": [{"step", "loss", ...}], "final":
# {"resumed_from_step", ...}}]`; `resumed` holds the restarted attempt only): `resumed_from` (the step it resumed
# at), `recomputed` (the steps the killed attempt had finished and the restarted one ran again) and `identical`:
# True only if every rank of `resumed` ran every step from `resumed_from` to the end of `whole` and each loss
# **equals** (==, not approximately) that rank's loss at the same step in `whole`.

# %% nbgrader={"grade": false, "grade_id": "resume_check", "locked": false, "schema_version": 3, "solution": true}
def resume_check(whole: list, resumed: list, kill_at_step: int) -> dict:
    """Where the restarted run resumed, the steps it recomputed, and whether its losses are bit-identical."""
    ### BEGIN SOLUTION
    start = resumed[0]["final"]["resumed_from_step"]
    ref = {r["rank"]: {s["step"]: s["loss"] for s in r["steps"]} for r in whole}
    same = len(resumed) == len(whole)
    for r in resumed:
        want = [s for s in sorted(ref[r["rank"]]) if s >= start]
        same = same and [s["step"] for s in r["steps"]] == want
        same = same and all(s["loss"] == ref[r["rank"]][s["step"]] for s in r["steps"])
    return {"resumed_from": start, "recomputed": list(range(start, kill_at_step)), "identical": bool(same)}
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "demo_resume", "locked": true, "schema_version": 3, "solution": false}
_p = elastic()
_f = elastic()["resumed"][0]["final"]
print(f"killed rank {_p['killed']['rank']} at step {_p['killed']['step']}; restart {_f['restart_count']} resumed "
      f"from step {_f['resumed_from_step']}, {_f['recovery_s']:.1f} s from the kill to the first resumed step")
print("uninterrupted:", [(s["step"], round(s["loss"], 6)) for s in _p["whole"][0]["steps"]])
print("resumed:      ", [(s["step"], round(s["loss"], 6)) for s in _p["resumed"][0]["steps"]])
try:
    print("yours:", resume_check(_p["whole"], _p["resumed"], _p["killed"]["step"]))
except NotImplementedError:
    print("write resume_check above")

# %% nbgrader={"grade": true, "grade_id": "resume_check_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
_w = [{"rank": 0, "steps": [{"step": i, "loss": 1.0 / (i + 1)} for i in range(4)], "final": {}}]
_r = [{"rank": 0, "steps": [{"step": i, "loss": 1.0 / (i + 1)} for i in (2, 3)], "final": {"resumed_from_step": 2}}]
assert resume_check(_w, _r, 3) == {"resumed_from": 2, "recomputed": [2], "identical": True}
_p = elastic()
_mine = resume_check(_p["whole"], _p["resumed"], _p["killed"]["step"])
_start = _p["resumed"][0]["final"]["resumed_from_step"]
assert _mine["resumed_from"] == _start and _mine["recomputed"] == list(range(_start, KILL_AT_STEP))
assert len(_mine["recomputed"]) <= SAVE_EVERY, "no more than --save-every steps are recomputed"
assert _mine["identical"] is True, "the resumed losses are bit-identical to the uninterrupted run's"
print(f"resume_check: resumed at step {_start}, recomputed {_mine['recomputed']}, every loss bit-identical")

# %% nbgrader={"grade": true, "grade_id": "resume_check_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests: a loss one bit off, a rank that stopped early, two ranks, and a resume at the step of the kill.
### BEGIN HIDDEN TESTS
def _recs(losses_per_rank, start=None, steps=None):
    return [{"rank": rank, "steps": [{"step": s, "loss": ls[s]} for s in (range(len(ls)) if steps is None else steps)],
             "final": {"resumed_from_step": start}} for rank, ls in enumerate(losses_per_rank)]


_L = [[2.5, 2.25, 2.125, 2.0625, 2.03125, 2.015625], [2.5, 2.25, 2.125, 2.0625, 2.03125, 2.015625]]
_W = _recs(_L)
assert resume_check(_W, _recs(_L, 2, range(2, 6)), 4) == {"resumed_from": 2, "recomputed": [2, 3], "identical": True}
assert resume_check(_W, _recs(_L, 4, range(4, 6)), 4)["recomputed"] == [], "resumed exactly at the killed step"
_off = [list(_L[0]), [*_L[1][:4], math.nextafter(_L[1][4], 3.0), _L[1][5]]]
assert resume_check(_W, _recs(_off, 2, range(2, 6)), 3)["identical"] is False, "one bit off on rank 1 is not identical"
assert resume_check(_W, _recs(_L, 2, range(2, 5)), 3)["identical"] is False, "the resumed run stopped a step early"
assert resume_check(_W, _recs(_L[:1], 2, range(2, 6)), 3)["identical"] is False, "a rank of the resumed run is missing"
### END HIDDEN TESTS

# %% [markdown]
# Bit-identical needs everything that decides a step's numbers back in place: weights, optimizer moments, the
# data position, and each rank's RNG state (dropout, sampling). Miss one and the curve drifts — slightly, which is
# why the test is `==`. Time lost: the recomputed steps plus the restart (`recovery_s`: from the kill to the first
# resumed step). `coursekit.ft` does without a restart: with torchft the surviving replicas go on after one
# heartbeat and the restarted one copies its state from a peer (`bench/bench_recovery.py` compares the two).


# %% [markdown]
# The lab's live ranks stop with the notebook's kernel; to free them now:

# %% nbgrader={"grade": false, "grade_id": "close_pool", "locked": true, "schema_version": 3, "solution": false}
labruns.on_ranks(None)
pool.close()
