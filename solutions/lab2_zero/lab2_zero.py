# ---
# jupyter:
#   coursekit:
#     call_timeout: 300
#     submission_timeout: 1800
#     autograde_timeout: 1500
#     cell_timeout: 300
#     ci_recheck: false
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 2 — ZeRO with DeepSpeed
#
# Data parallelism keeps a full copy of the model state on every GPU. ZeRO (Rajbhandari et al., 2020) partitions
# it over the N data-parallel ranks: stage 1 the fp32 master weights and optimizer states, stage 2 also the
# gradients, stage 3 also the parameters. You will run the real DeepSpeed engine (CPU + gloo here, NCCL on GPUs)
# through the course trainer and
#
# 1. predict each stage's per-rank bytes, then measure what DeepSpeed really holds,
# 2. find out why a rank's gradient partition is not exactly Ψ/N,
# 3. write a DeepSpeed config that makes a model fit a memory budget, and prove it with a run,
# 4. read a bucket sweep: fewer, larger collectives against memory held for buckets,
# 5. decide when ZeRO-Offload helps and when it starves the GPU,
# 6. launch the same loop through Hugging Face Accelerate.
#
# Everything runs on 2 CPU cores in a few minutes. **Grading** works as in Lab 1: write your answers inside the
# functions; visible tests run here, hidden tests try other inputs when your notebook is graded; only definitions
# (functions, imports, UPPER_CASE constants) are graded, and they take and return plain data.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false}
import json
import math
import tempfile
from pathlib import Path

from coursekit.course.testing import describe_figure
from coursekit.course.wire import close
from coursekit.models import count_parameters
from coursekit.memory import deepspeed as layout  # DeepSpeed's exact layout, pure Python
from coursekit.models import param_numels
from coursekit.pool import Pool
from coursekit.zero.ds_config import build_config, save_config

MODEL = "tiny-llama"
PSI = 125_248  # count_parameters("tiny-llama"): 2 layers, hidden 64, vocabulary 256
BUDGET_BYTES = 600_000  # section 3
pool = None  # the lab's live ranks (coursekit.pool), started by the first run: every DeepSpeed run below uses them


def live_ranks(n: int = 2) -> Pool:
    """The lab's pool of ``n`` live ranks (started on first use, resized when a run wants another size)."""
    global pool
    if pool is None:
        pool = Pool(n, timeout=280)
    elif pool.n != n:
        pool.resize(n)
    return pool


def train_with_config(config: dict, nproc: int = 2, steps: int = 4) -> list:
    """Run the course trainer with a DeepSpeed config dict on ``nproc`` live ranks; every rank's final record
    (bytes, losses, ...)."""
    with tempfile.TemporaryDirectory() as d:
        path = save_config(config, Path(d) / "ds.json")
        dtype = "bf16" if config.get("bf16", {}).get("enabled") else "fp32"
        records = live_ranks(nproc).train("--strategy", "deepspeed", "--ds-config", path, "--model", MODEL,
                                          "--steps", steps, "--seq", 32, "--global-batch", 8, "--dtype", dtype,
                                          "--quiet")
    return [r["final"] | {"losses": [s["loss"] for s in r["steps"]]} for r in records]


# %% [markdown]
# ## 1. Predict, then measure, each stage's bytes per rank
#
# Per parameter, Adam training keeps the weights (b bytes: 4 in fp32, 2 in bf16), their gradients (b), an fp32
# master copy of the weights and two fp32 Adam moments. What DeepSpeed 0.19 *really* holds per rank, with Ψ
# parameters on N ranks (assume Ψ divisible by 2N and, for now, that no parameter straddles two ranks' partitions):
#
# * **Stage 0** is data parallelism: nothing is partitioned. In bf16 DeepSpeed keeps an fp32 master copy of every
#   weight and, at the optimizer step, an fp32 copy of every gradient; in fp32 the weights are their own master
#   and no copy is made.
# * **Stages 1-3** partition the fp32 master weights and the Adam moments. Unlike the textbook, they do so **also in
#   fp32**: DeepSpeed clones an fp32 master partition from the weights, and at the optimizer step builds a new fp32
#   gradient partition (`flatten(grads).to(fp32)` copies), whatever the weights' dtype.
# * **Gradients**: stage 1 holds every gradient whole until the end of backward (then reduces them); stages 2
#   and 3 keep only their partition (b·Ψ/N). **Parameters**: whole in stages 0-2, a partition in stage 3.
#
# Write `zero_bytes` returning, per rank, `params`, `grads` (the most held during backward), `master`, `optimizer`
# (both moments) and `fp32_grads` (the copy at the step), in bytes.

# %% nbgrader={"grade": false, "grade_id": "zero_bytes", "locked": false, "schema_version": 3, "solution": true}
def zero_bytes(n_params: int, stage: int, world: int, dtype: str = "fp32") -> dict:
    """Per-rank bytes DeepSpeed 0.19 holds for ZeRO ``stage`` with AdamW (keys: params, grads, master, optimizer,
    fp32_grads)."""
    ### BEGIN SOLUTION
    b = {"fp32": 4, "bf16": 2}[dtype]
    P, N = n_params, world
    if stage == 0:
        copies = 4 * P if dtype == "bf16" else 0
        return {"params": b * P, "grads": b * P, "master": copies, "optimizer": 8 * P, "fp32_grads": copies}
    return {"params": b * P // (N if stage == 3 else 1), "grads": b * P // (1 if stage == 1 else N),
            "master": 4 * P // N, "optimizer": 8 * P // N, "fp32_grads": 4 * P // N}
    ### END SOLUTION


# %% [markdown]
# Now measure. `run_sweep` trains each configuration in one job on the lab's 2 ranks and reports, per rank, what the
# engine holds (read from DeepSpeed's own tensors by `coursekit.zero.held`) and the collectives of one step.

# %% nbgrader={"grade": false, "grade_id": "measure_stages", "locked": true, "schema_version": 3, "solution": false}
from coursekit.zero.sweep import run_sweep

STAGE_POINTS = [{"name": f"zero{s}", "stage": s} for s in range(4)] + [
    {"name": "zero2+offload", "stage": 2, "offload_optimizer": "cpu", "ds_optimizer": False},
    {"name": "zero3+offload", "stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "ds_optimizer": False}]

# %% nbgrader={"grade": false, "grade_id": "demo_stages", "locked": true, "schema_version": 3, "solution": false}
stage_ranks = run_sweep(STAGE_POINTS, steps=4, per_rank=True, pool=live_ranks(2))  # one list of rows per rank
_keys = ("params", "grads", "master", "optimizer", "fp32_grads")
print(f"{'config':<15}" + "".join(f"{k:>22}" for k in _keys) + f"{'buckets':>10}{'step ms':>9}")
for _r in stage_ranks[0]:
    try:
        _pred = zero_bytes(PSI, _r["stage"], 2) if "offload" not in _r["name"] else {}
    except NotImplementedError:  # not written yet: measured bytes only
        _pred = {}
    _meas = {k: _r[k + "_bytes"] for k in _keys} | ({"grads": _r["grads_peak_bytes"]} if _r["stage"] <= 1 else {})
    _cells = [f"{_meas[k]:,}" + (f" ({_pred[k]:,})" if _pred else "") for k in _keys]
    print(f"{_r['name']:<15}" + "".join(f"{c:>22}" for c in _cells) + f"{_r['buffers_bytes']:>10,}{_r['step_ms']:>9.1f}")
print("rank 0: measured (your prediction). grads: the most held during backward (stages 0-1: all of them, before "
      "the reduction; stages 2-3: the partition)")

# %% nbgrader={"grade": true, "grade_id": "zero_bytes_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# measured on 2 ranks, fp32, tiny-llama (Ψ = 125,248)
assert zero_bytes(PSI, 3, 2) == {"params": 250_496, "grads": 250_496, "master": 250_496, "optimizer": 500_992,
                                 "fp32_grads": 250_496}
assert zero_bytes(PSI, 0, 2) == {"params": 500_992, "grads": 500_992, "master": 0, "optimizer": 1_001_984,
                                 "fp32_grads": 0}
assert zero_bytes(PSI, 1, 2)["grads"] == 500_992, "stage 1 holds whole gradients until the end of backward"
print("zero_bytes: stages 0, 1 and 3 on 2 ranks match what DeepSpeed held (tiny-llama, fp32)")

# %% nbgrader={"grade": true, "grade_id": "zero_bytes_hidden", "locked": true, "points": 3, "schema_version": 3, "solution": false}
# Hidden tests compare with DeepSpeed's layout for other sizes, stages, world sizes and bf16.
### BEGIN HIDDEN TESTS
for _n in (2, 4, 8):
    _numels = [1024] * (2 * _n)  # nothing straddles a partition boundary
    for _stage in range(4):
        for _dt in ("fp32", "bf16"):
            _ref = layout.deepspeed_bytes(_numels, stage=_stage, world=_n, rank=_n - 1, dtype=_dt)
            _want = {"params": _ref["params"], "grads": _ref["grads_peak"] if _stage <= 1 else _ref["grads"],
                     "master": _ref["master"], "optimizer": _ref["optimizer"], "fp32_grads": _ref["fp32_grads"]}
            assert zero_bytes(sum(_numels), _stage, _n, _dt) == _want, f"stage {_stage}, {_n} ranks, {_dt}"
### END HIDDEN TESTS

# %% [markdown]
# ## 2. The gradient partition is not Ψ/N
#
# In the table above, rank 0's ZeRO-2 gradients exceed 4Ψ/N, and rank 1 holds another amount (printed below).
# DeepSpeed flattens the parameters (in `model.parameters()` order) into one buffer padded to a multiple of 2N
# elements; rank r owns the slice [r·P, (r+1)·P) with P = padded/N. At the end of backward it keeps, **whole**, the
# gradient of every parameter that *overlaps* its slice — a parameter straddling a boundary is kept by both
# neighbours.
#
# Write `grad_partition_bytes(numels, world, rank, dtype_bytes)`; `param_numels("tiny-llama")` lists the
# real model's parameter sizes. (Leave out one detail: the rank whose slice ends in the padding also keeps a zero
# tensor of that many elements.)

# %% nbgrader={"grade": false, "grade_id": "grad_partition_bytes", "locked": false, "schema_version": 3, "solution": true}
def grad_partition_bytes(numels: list, world: int, rank: int, dtype_bytes: int = 4) -> int:
    """Bytes of the parameters' gradients ZeRO-2 keeps on ``rank`` at the end of backward (padding aside)."""
    ### BEGIN SOLUTION
    total = sum(numels)
    padded = math.ceil(total / (2 * world)) * 2 * world
    size = padded // world
    start, end = rank * size, (rank + 1) * size
    held, offset = 0, 0
    for n in numels:
        if offset < end and offset + n > start:
            held += n
        offset += n
    return dtype_bytes * held
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "grad_partition_bytes_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert grad_partition_bytes([6, 6, 4], 2, 0) == 48 and grad_partition_bytes([6, 6, 4], 2, 1) == 40
_tiny = param_numels(MODEL)
assert [grad_partition_bytes(_tiny, 2, r) for r in (0, 1)] == [266_752, 250_624], "measured on tiny-llama, fp32"
print("grad_partition_bytes: 266,752 B on rank 0 and 250,624 B on rank 1, as DeepSpeed holds them")

# %% nbgrader={"grade": true, "grade_id": "grad_partition_bytes_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests use other layouts (padding, parameters spanning several partitions) and world sizes.
### BEGIN HIDDEN TESTS
for _numels, _n in (([7, 3, 100, 1, 1], 4), ([1000], 8), ([3, 3, 3], 2), (param_numels(MODEL), 4)):
    for _r in range(_n):
        _want = 2 * sum(_numels[i] for i in layout.partition_params(_numels, _n, _r))
        assert grad_partition_bytes(_numels, _n, _r, 2) == _want, f"{len(_numels)} tensors, {_n} ranks, rank {_r}"
### END HIDDEN TESTS

# %% [markdown]
# `coursekit memory` models this layout exactly: it knows a preset's (or a config.json's) parameter tensors in
# `parameters()` order, and reports the fullest rank unless you name one (`--dp-rank`). From a terminal:
# `coursekit memory --model tiny-llama --batch 4 --seq 32 --dtype fp32 --dp 2 --zero 2 --dp-rank 1`.

# %% nbgrader={"grade": false, "grade_id": "demo_calculator_ranks", "locked": true, "schema_version": 3, "solution": false}
from coursekit.memory import estimate

for _rank in (0, 1):
    _z2 = next(_r for _r in stage_ranks[_rank] if _r["name"] == "zero2")
    _calc = estimate(MODEL, batch=4, seq=32, dtype="fp32", dp=2, zero=2, dp_rank=_rank).categories["gradients"]
    try:
        _yours = f"{grad_partition_bytes(param_numels(MODEL), 2, _rank):,}"
    except NotImplementedError:
        _yours = "(not written yet)"
    print(f"ZeRO-2 rank {_rank}: measured {_z2['grads_bytes']:,} B of gradients, coursekit memory {_calc:,}, "
          f"yours {_yours}")

# %% [markdown]
# ## 3. Fit a budget, prove it with a run
#
# The budget: train `tiny-llama` in fp32 on 2 ranks with **at most 600,000 bytes per rank on the accelerator**
# (everything DeepSpeed keeps there: weights, gradients, master and Adam partitions, fp32 gradient copy, and its
# bucket buffers — ZeRO-3 allocates its reduce bucket, `reduce_bucket_size` elements, up front). On a CPU-only
# machine the "accelerator" is the CPU itself; `coursekit.zero.held` files each tensor where DeepSpeed's offload
# settings put it. No stage alone fits (see the table): combine a stage with ZeRO-Offload (`offload_optimizer`,
# ZeRO-3 also `offload_param`) and bucket sizes. `build_config(stage, ...)` writes a complete config (see its
# docstring), or write the dict yourself. Keep training equal to DDP: no gradient clipping. To avoid a one-minute
# compile of DeepSpeedCPUAdam, let the trainer's torch AdamW run on the host (`ds_optimizer=False`).

# %% nbgrader={"grade": false, "grade_id": "budget_config", "locked": false, "schema_version": 3, "solution": true}
def budget_config() -> dict:
    """A DeepSpeed config (dict) with which tiny-llama trains on 2 ranks within BUDGET_BYTES on the accelerator."""
    ### BEGIN SOLUTION
    return build_config(3, offload_optimizer="cpu", offload_param="cpu", ds_optimizer=False,
                        reduce_bucket_size=20_000)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "budget_config_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
_runs = train_with_config(budget_config())
for _f in _runs:
    assert _f["accelerator_bytes"] <= BUDGET_BYTES, f"{_f['accelerator_bytes']:,} B on the accelerator"
    assert _f["losses"][-1] < _f["losses"][0], "it must still train"
print(f"budget_config: at most {max(_f['accelerator_bytes'] for _f in _runs):,} B on the accelerator per rank "
      f"(budget {BUDGET_BYTES:,} B), and the loss falls")

# %% nbgrader={"grade": true, "grade_id": "budget_config_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests check that your run trains exactly like DDP (same losses, step by step).
### BEGIN HIDDEN TESTS
_ddp = live_ranks(2).train("--strategy", "ddp", "--model", MODEL, "--steps", 4, "--seq", 32, "--global-batch", 8,
                           "--quiet")[0]
_ddp_losses = [s["loss"] for s in _ddp["steps"]]
_runs = train_with_config(budget_config())
for _f in _runs:
    assert _f["accelerator_bytes"] <= BUDGET_BYTES, "over budget"
    assert all(close(a, b, abs_=1e-5, rel=0) for a, b in zip(_f["losses"], _ddp_losses)), \
        "the losses differ from DDP's: clipping, or a different optimizer?"
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Buckets: fewer, larger collectives against memory
#
# DeepSpeed reduces gradients in buckets of `reduce_bucket_size` elements; ZeRO-3 keeps that bucket allocated for
# the whole run. Larger buckets mean fewer collective calls (each call has a fixed latency) but more memory. The
# sweep below runs ZeRO-3 with four bucket sizes, DeepSpeed's prefetch defaults (`stage3_keep_params`: the whole tiny
# model is gathered once per step and kept, 2Ψ of traffic instead of 3Ψ), and ZeRO-2 with `overlap_comm` and with
# DeepSpeed's default all-reduce of buckets (`multi_rank_allreduce`). Two knobs you may expect to matter change
# nothing in counts or bytes here — look for why: ZeRO-2 with a small `allgather_bucket_size` (DeepSpeed 0.19 gathers
# the updated partitions in one `all_gather_into_tensor` whenever the backend has it, and then ignores the bucket
# size), and ZeRO-3 with `stage3_prefetch_bucket_size` (prefetch changes *when* parameters are gathered, so that on a
# GPU the gathers overlap compute, not how many bytes move). Each row has `name`, `step_ms`, `calls` (collectives per
# step), `ops` (per collective: calls, bytes) and `buffers_bytes`.

# %% nbgrader={"grade": false, "grade_id": "run_bucket_sweep", "locked": true, "schema_version": 3, "solution": false}
SWEEP_POINTS = [{"name": f"rbs={n}", "stage": 3, "reduce_bucket_size": n} for n in (5_000, 20_000, 80_000, 500_000)] + [
    {"name": "keep_params", "stage": 3, "stage3_keep_params": True},
    {"name": "z2", "stage": 2}, {"name": "z2 overlap", "stage": 2, "overlap_comm": True},
    {"name": "z2 allreduce", "stage": 2, "multi_rank_allreduce": True},
    {"name": "z2 agb=20000", "stage": 2, "allgather_bucket_size": 20_000},
    {"name": "prefetch=200000", "stage": 3, "prefetch_bucket_size": 200_000}]

# %% nbgrader={"grade": false, "grade_id": "demo_bucket_sweep", "locked": true, "schema_version": 3, "solution": false}
sweep_rows = run_sweep(SWEEP_POINTS, steps=6, pool=live_ranks(2))
for _r in sweep_rows:
    _ops = ", ".join(f"{k} {v['calls']}x {v['bytes'] / 1e3:.0f} kB" for k, v in _r["ops"].items())
    print(f"{_r['name']:<14} {_r['step_ms']:7.1f} ms  buckets {_r['buffers_bytes']:>9,} B  {_ops}")

# %% [markdown]
# Write `plot_bucket_sweep(rows)`: for the rows whose name starts with `"rbs="`, plot against the bucket size in
# elements (the number after `=`, log scale) the collectives per step (label `"calls"`) on the left axis and the step
# time in ms (label `"step ms"`) on a second y axis (`ax.twinx()`); label the axes. Then `choose_bucket(rows,
# budget_bytes)`: the name of the fastest row (lowest `step_ms`) among those whose `buffers_bytes` fit the budget
# (None if none does).

# %% nbgrader={"grade": false, "grade_id": "bucket_tradeoff", "locked": false, "schema_version": 3, "solution": true}
def plot_bucket_sweep(rows: list):
    """Calls per step and step time against ZeRO-3's reduce bucket size (a matplotlib figure)."""
    ### BEGIN SOLUTION
    import matplotlib.pyplot as plt

    pts = sorted((int(r["name"].split("=")[1]), r) for r in rows if r["name"].startswith("rbs="))
    x = [n for n, _ in pts]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["calls"] for _, r in pts], marker="o", label="calls")
    ax.set_xscale("log")
    ax.set_xlabel("reduce_bucket_size (elements)")
    ax.set_ylabel("collectives per step")
    ax2 = ax.twinx()
    ax2.plot(x, [r["step_ms"] for _, r in pts], marker="s", color="tab:red", label="step ms")
    ax2.set_ylabel("step time (ms)")
    fig.legend(loc="upper right")
    return fig
    ### END SOLUTION


def choose_bucket(rows: list, budget_bytes: int):
    """Name of the fastest row whose bucket buffers fit ``budget_bytes``; None if none fits."""
    ### BEGIN SOLUTION
    ok = [r for r in rows if r["buffers_bytes"] <= budget_bytes]
    return min(ok, key=lambda r: r["step_ms"])["name"] if ok else None
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "demo_bucket_plot", "locked": true, "schema_version": 3, "solution": false}
try:
    _fig = plot_bucket_sweep(sweep_rows)
    print("fastest within 100 kB of buckets:", choose_bucket(sweep_rows, 100_000))
except NotImplementedError:
    print("write plot_bucket_sweep and choose_bucket above")

# %% nbgrader={"grade": true, "grade_id": "bucket_tradeoff_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
_rows = [{"name": "rbs=1000", "calls": 50, "step_ms": 30.0, "buffers_bytes": 4_000, "ops": {}},
         {"name": "rbs=100000", "calls": 5, "step_ms": 20.0, "buffers_bytes": 400_000, "ops": {}},
         {"name": "z2", "calls": 4, "step_ms": 10.0, "buffers_bytes": 0, "ops": {}}]
_axes = describe_figure(plot_bucket_sweep(_rows))["axes"]
_lines = {ln["label"]: ln for ax in _axes for ln in ax["lines"]}
assert _lines["calls"]["x"] == [1000, 100000] and _lines["calls"]["y"] == [50, 5]
assert _lines["step ms"]["y"] == [30.0, 20.0], "step time on the second axis, only the rbs= rows"
assert choose_bucket(_rows, 100_000) == "z2" and choose_bucket(_rows[:2], 100_000) == "rbs=1000"
print("bucket_tradeoff: plot_bucket_sweep and choose_bucket right on three hand-made rows")

# %% nbgrader={"grade": true, "grade_id": "bucket_tradeoff_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
# Hidden tests check the choice at the budget's edge and when nothing fits.
### BEGIN HIDDEN TESTS
_rows = [{"name": "rbs=10", "calls": 9, "step_ms": 5.0, "buffers_bytes": 40, "ops": {}},
         {"name": "rbs=20", "calls": 5, "step_ms": 4.0, "buffers_bytes": 80, "ops": {}}]
assert choose_bucket(_rows, 80) == "rbs=20", "a row exactly at the budget fits"
assert choose_bucket(_rows, 39) is None, "nothing fits"
assert describe_figure(plot_bucket_sweep(list(reversed(_rows))))["axes"][0]["lines"][0]["x"] == [10, 20], \
    "sort the points by bucket size"
### END HIDDEN TESTS

# %% [markdown]
# ## 5. When does ZeRO-Offload help, and when does it starve the GPU?
#
# Offload moves the fp32 master, the Adam moments and the optimizer step to the CPU: the GPU keeps the bf16 weights,
# and gradients only in flight (stage 2 streams them to the host during backward), so a model 8× larger fits. The price, per rank and step, with Ψ parameters on N GPUs and T
# tokens per step over all ranks:
#
# * GPU compute: `6·Ψ·T / N` FLOPs at F FLOP/s;
# * PCIe: bf16 gradients down and bf16 weights back up, `4·Ψ/N` bytes at L bytes/s — overlapped with compute
#   (gradients stream out during backward);
# * CPU Adam: `Ψ/N` parameters at C parameters/s — not overlapped (the next forward needs the new weights).
#
# So `step = max(compute, transfer) + cpu`, and the GPU is busy `compute / step` of the time. Write
# `offload_step(...)` returning those seconds, `gpu_busy`, and `bound`: `"compute"` if compute ≥ transfer + cpu,
# else whichever of `"transfer"` and `"cpu"` takes longer.

# %% nbgrader={"grade": false, "grade_id": "offload_step", "locked": false, "schema_version": 3, "solution": true}
def offload_step(n_params: float, world: int, tokens: float, flops: float, link_bytes_per_s: float,
                 cpu_params_per_s: float) -> dict:
    """ZeRO-Offload step model: {"compute_s", "transfer_s", "cpu_s", "step_s", "gpu_busy", "bound"}."""
    ### BEGIN SOLUTION
    compute = 6 * n_params * tokens / world / flops
    transfer = 4 * n_params / world / link_bytes_per_s
    cpu = n_params / world / cpu_params_per_s
    step = max(compute, transfer) + cpu
    bound = "compute" if compute >= transfer + cpu else ("transfer" if transfer > cpu else "cpu")
    return {"compute_s": compute, "transfer_s": transfer, "cpu_s": cpu, "step_s": step, "gpu_busy": compute / step,
            "bound": bound}
    ### END SOLUTION


# 7B on 8 GPUs (400 TFLOP/s effective, PCIe 25 GB/s, CPU Adam 1e9 params/s per GPU's share of cores)
SMALL_BATCH = offload_step(7e9, 8, 8 * 4096, 400e12, 25e9, 1e9)
LARGE_BATCH = offload_step(7e9, 8, 8 * 4096 * 64, 400e12, 25e9, 1e9)
print(f"32k tokens/step: GPU busy {SMALL_BATCH['gpu_busy']:.0%} ({SMALL_BATCH['bound']}-bound); "
      f"2M tokens/step: {LARGE_BATCH['gpu_busy']:.0%} ({LARGE_BATCH['bound']}-bound)")

# %% nbgrader={"grade": true, "grade_id": "offload_step_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
_s = offload_step(8e9, 8, 1e4, 1e15, 1e10, 1e9)
assert close(_s["compute_s"], 0.06) and close(_s["transfer_s"], 0.4) and close(_s["cpu_s"], 1.0)
assert close(_s["step_s"], 1.4) and _s["bound"] == "cpu" and close(_s["gpu_busy"], 0.06 / 1.4)
assert SMALL_BATCH["bound"] != "compute" and LARGE_BATCH["bound"] == "compute"
print(f"offload_step: {_s['step_s']:g} s, cpu-bound; small batches starve the GPU, large ones keep it busy")

# %% nbgrader={"grade": true, "grade_id": "offload_step_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests check the other regimes and the boundary.
### BEGIN HIDDEN TESTS
_t = offload_step(1e9, 1, 1e2, 1e12, 1e9, 1e12)  # compute 0.6 s, transfer 4 s, cpu 1 ms
assert _t["bound"] == "transfer" and close(_t["step_s"], 4.0 + 1e-3)
_c = offload_step(1e9, 2, 1e6, 1e14, 1e11, 1e10)  # compute 30 s >> transfer 0.02 + cpu 0.05
assert _c["bound"] == "compute" and close(_c["step_s"], 30.05) and close(_c["gpu_busy"], 30 / 30.05)
_e = offload_step(1.0, 1, 1.0, 6.0, 4.0, 1.0)  # compute 1, transfer 1, cpu 1: a tie goes to "cpu"
assert _e["bound"] == "cpu" and close(_e["step_s"], 2.0) and close(_e["gpu_busy"], 0.5)
### END HIDDEN TESTS

# %% [markdown]
# On this machine the "GPU" and the host are the same CPU, so offload only adds copies: compare `zero2` with
# `zero2+offload` in section 1's table. On a GPU, offload is the difference between fitting and not fitting; it
# costs little when many tokens per step keep the GPU busy, and starves it when batches are small.
#
# NVMe offload (ZeRO-Infinity: optimizer states and parameters in files) also runs on this machine, but not in this
# notebook: it needs Debian's `libaio-dev` and a one-time build of DeepSpeed's `async_io` op (about 9 minutes on 2
# cores), and only tensors of at least 1 MiB per rank go to the files, so the tiny model would write nothing. Run it
# with `bench/bench_zero.py --nvme /tmp/nvme` (a 9.4M-parameter model; `coursekit memory` predicts the swap-file
# bytes exactly, see `tests/test_zero_offload.py`).
#
# ## 6. The same loop through Hugging Face Accelerate
#
# `coursekit.zero.accel_train` is the trainer's loop written with `Accelerator`: the launch config decides DDP or
# DeepSpeed. DDP on the CPU runs for real (`configs/accelerate/multi_cpu.yaml`, `ACCELERATE_USE_CPU=true`).
# Accelerate selects DeepSpeed only for GPU devices; on a CPU-only machine it would tell each process it is rank 0
# of 1 — unless the script passes the backend explicitly (`InitProcessGroupKwargs(backend="gloo")`, the `--gloo`
# flag), which `tests/test_accelerate.py` checks gives real ZeRO-2 on 2 ranks.

# %% nbgrader={"grade": false, "grade_id": "accelerate_demo", "locked": true, "schema_version": 3, "solution": false}
from coursekit.zero.accel_train import accelerate_launch
from coursekit.zero.ds_config import CONFIG_DIR

ACCELERATE_CONFIGS = CONFIG_DIR.parent / "accelerate"

# %% nbgrader={"grade": false, "grade_id": "demo_accelerate", "locked": true, "schema_version": 3, "solution": false}
_ddp = accelerate_launch(ACCELERATE_CONFIGS / "multi_cpu.yaml", ["--steps", "3"], nproc=2, cpu=True)
print("accelerate DDP:", [(r["rank"], r["distributed_type"], [round(x, 4) for x in r["losses"]]) for r in _ddp])
try:
    import torch

    _gpu = torch.cuda.is_available()
except ImportError:
    _gpu = False
if _gpu:
    _ds = accelerate_launch(ACCELERATE_CONFIGS / "deepspeed_zero2.yaml", ["--steps", "3"],
                            nproc=torch.cuda.device_count(), cpu=False)
else:
    print("No GPU: Accelerate would not select DeepSpeed on the CPU by itself; running it with --gloo instead.")
    _ds = accelerate_launch(ACCELERATE_CONFIGS / "deepspeed_zero2.yaml", ["--steps", "3", "--gloo"], nproc=2,
                            cpu=False, env={"DS_ACCELERATOR": "cpu", "COURSEKIT_DEVICE": "cpu"})
print("accelerate DeepSpeed:", [(r["rank"], r["distributed_type"], r["model_class"], r["zero_stage"]) for r in _ds])

# %% [markdown]
# The lab's live ranks stop with the notebook's kernel; to free them now:

# %% nbgrader={"grade": false, "grade_id": "close_pool", "locked": true, "schema_version": 3, "solution": false}
if pool is not None:
    pool.close()
