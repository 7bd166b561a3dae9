# ---
# jupyter:
#   coursekit:
#     call_timeout: 240
#     submission_timeout: 1500
#     autograde_timeout: 1200
#     ci_autograde: false
#     ci_recheck: false
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 1 — Memory math and collectives
#
# How much memory does training a model take, where does it go, and how fast can GPUs exchange what they must?
# You will
#
# 1. count a model's parameters from its shape,
# 2. turn parameters into bytes of model state (the famous 16Ψ, and its variants),
# 3. write the bytes one transformer layer saves for backward,
# 4. check that formula by measuring a tiny model right here,
# 5. run the collectives benchmark on 4 processes and read its bus bandwidth,
# 6. implement ring all-reduce from send/recv and run it under torchrun,
# 7. plot the memory breakdown against sequence length,
# 8. decide, with numbers, whether Llama 3 70B trains on one node of 8 H100s.
#
# Everything runs on a laptop CPU (2 cores are enough) in a few minutes.
#
# **How this notebook is graded.** Write your answers inside the functions (replace `raise NotImplementedError()`).
# Each exercise has visible tests (run them!) and hidden tests that try other inputs when your notebook is graded.
# The grader loads the *definitions* of your cells — functions, classes, imports and UPPER_CASE constants — into a
# fresh process and calls your functions from there; other top-level code (prints, experiments) is yours to explore
# with and is not graded. Your functions take and return plain data: numbers, strings, lists, tuples, dicts (a
# matplotlib figure is graded by its data).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false}
import math

import torch
import torch.distributed as dist

from coursekit.comm.bench import format_table, run_benchmark
from coursekit.course.drivers import expected_sum
from coursekit.course.testing import describe_figure, launch_function
from coursekit.course.wire import close
from coursekit.measure import saved_activation_bytes
from coursekit.memory import estimate, preset, to_hf_config_dict
from coursekit.models import build_model, count_parameters

GiB = 2**30

# %% [markdown]
# ## 1. Count the parameters
#
# A model's *shape* is a handful of numbers. `preset(name).to_dict()` gives it for the models this course knows:
#
# | key | meaning |
# |---|---|
# | `layers` (L), `hidden` (h), `ffn` (f), `vocab` (V) | depth, model width, MLP width, vocabulary |
# | `heads` (a), `kv_heads` (k), `head_dim` (d) | query heads, key/value heads (grouped-query attention when k < a), width of one head |
# | `tied_embeddings` | the output head reuses the input embedding matrix |
#
# A Llama layer has an RMSNorm (one weight vector of h) before attention and another before the MLP; projections
# q (h → a·d), k and v (h → k·d each), o (a·d → h); a SwiGLU MLP with gate and up (h → f each) and down (f → h);
# no biases. Around the layers: the embedding (V × h), a final RMSNorm, and the output head (V × h) unless tied.
#
# Write `count_params(shape)`; the test compares it with the real `transformers` model (`count_parameters` builds it
# on PyTorch's *meta* device: exact shapes, no memory, so even 70B takes a second).

# %% nbgrader={"grade": false, "grade_id": "count_params", "locked": false, "schema_version": 3, "solution": true}
def count_params(shape: dict) -> int:
    """Parameters of a Llama-style decoder with this shape (a dict as ``preset(name).to_dict()`` returns)."""
    ### BEGIN SOLUTION
    h, L, f, V = shape["hidden"], shape["layers"], shape["ffn"], shape["vocab"]
    q = shape["heads"] * shape["head_dim"]
    kv = shape["kv_heads"] * shape["head_dim"]
    per_layer = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * f  # 2 norms, q k v o, gate up down
    head = 0 if shape["tied_embeddings"] else V * h
    return V * h + L * per_layer + h + head
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "count_params_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert count_params(preset("tiny-llama").to_dict()) == count_parameters("tiny-llama"), \
    "tiny-llama: compare your terms with [(n, p.shape) for n, p in build_model('tiny-llama').named_parameters()]"
assert count_params(preset("llama3-8b").to_dict()) == 8_030_261_248, "Llama 3 8B has 8,030,261,248 parameters"
print("count_params: tiny-llama and Llama 3 8B (8,030,261,248) match transformers")

# %% nbgrader={"grade": true, "grade_id": "count_params_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests check count_params on other models (tied embeddings, grouped-query attention, odd sizes).
### BEGIN HIDDEN TESTS
for _name in ("llama3.2-1b", "llama2-70b"):
    assert count_params(preset(_name).to_dict()) == count_parameters(_name), f"count_params is wrong for {_name}"
_odd = preset("tiny-llama").with_(hidden=96, heads=6, kv_heads=3, head_dim=16, ffn=200, vocab=300, layers=3,
                                  tied_embeddings=True)
assert count_params(_odd.to_dict()) == count_parameters(to_hf_config_dict(_odd)), \
    "count_params is wrong for a small model with tied embeddings and 2 query heads per KV head"
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Model-state bytes: 16Ψ and its variants
#
# Training with Adam keeps, per parameter, more than the parameter. With Ψ parameters and mixed precision
# (the ZeRO paper's setting): bf16 weights (2 bytes) and gradients (2), an fp32 master copy of the weights (4) and
# two fp32 Adam moments (4 + 4) — **16Ψ bytes**. The variants:
#
# | precision | weights | gradients | master weights | per optimizer state |
# |---|---|---|---|---|
# | `"16psi"` | 2 | 2 | 4 | 4 |
# | `"18psi"` | 2 | 4 (fp32 accumulation) | 4 | 4 |
# | `"20psi"` | 2 | 2 + 4 (bf16 and a persistent fp32 copy) | 4 | 4 |
# | `"fp32"` | 4 | 4 | 0 (the weights are fp32 already) | 4 |
#
# Optimizers: `"adamw"` keeps 2 states per parameter, `"sgd"` (with momentum) keeps 1.
# Return a dict with keys `parameters`, `gradients`, `master_weights`, `optimizer_states` and `total` (bytes).

# %% nbgrader={"grade": false, "grade_id": "model_state_bytes", "locked": false, "schema_version": 3, "solution": true}
def model_state_bytes(n_params: int, precision: str = "16psi", optimizer: str = "adamw") -> dict:
    """Bytes of parameters, gradients, master weights and optimizer states for ``n_params`` parameters."""
    ### BEGIN SOLUTION
    weights, grads, master = {"16psi": (2, 2, 4), "18psi": (2, 4, 4), "20psi": (2, 6, 4), "fp32": (4, 4, 0)}[precision]
    states = {"adamw": 2, "sgd": 1}[optimizer]
    out = {"parameters": weights * n_params, "gradients": grads * n_params, "master_weights": master * n_params,
           "optimizer_states": 4 * states * n_params}
    out["total"] = sum(out.values())
    return out
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "model_state_bytes_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert model_state_bytes(1_000_000) == {"parameters": 2_000_000, "gradients": 2_000_000,
                                        "master_weights": 4_000_000, "optimizer_states": 8_000_000,
                                        "total": 16_000_000}
assert model_state_bytes(7_000_000_000)["total"] == 112_000_000_000, "7B parameters: 16 bytes each"
print("model_state_bytes: 16 bytes per parameter for bf16 weights + AdamW (112 GB for 7B)")

# %% nbgrader={"grade": true, "grade_id": "model_state_bytes_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
# Hidden tests check every precision and optimizer.
### BEGIN HIDDEN TESTS
from coursekit.memory import model_state_bytes as _reference_states

for _p in ("16psi", "18psi", "20psi", "fp32"):
    for _o in ("adamw", "sgd"):
        _r = _reference_states(3_000_000_000, precision=_p, optimizer=_o, engine="ddp")
        _want = {"parameters": _r.parameters, "gradients": _r.gradients + _r.grad_copy,
                 "master_weights": _r.master_weights, "optimizer_states": _r.optimizer_states, "total": _r.resident}
        assert close(model_state_bytes(3_000_000_000, _p, _o), _want), f"wrong bytes for precision {_p}, {_o}"
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Activation bytes of one layer
#
# Backward needs tensors from the forward pass; autograd keeps them ("saved for backward"). For one Llama layer of
# `transformers`, run on a CPU with SDPA attention and no dropout, these are the saved tensors, with n = b·s tokens
# (batch b, sequence s) and P bytes per activation element (4 in fp32, 2 in bf16):
#
# | saved tensor | elements | bytes per element |
# |---|---|---|
# | attention RMSNorm: its input, upcast | n·h | 4 |
# | attention RMSNorm: 1/rms per token | n | 4 |
# | attention RMSNorm: normalised input, cast back | n·h | P |
# | attention RMSNorm: output (× weight) | n·h | P |
# | q after RoPE | n·a·d | P |
# | k after RoPE, and v | n·k·d each | P |
# | SDPA's log-sum-exp per query row | b·a·s | 4 |
# | attention output (o_proj's input) | n·a·d | P |
# | MLP RMSNorm: the same four tensors as the attention norm | | |
# | gate output (SiLU's input), SiLU output, up output, their product (down's input) | n·f each | P |
#
# Write `layer_activation_bytes(shape, batch, seq, dtype_bytes)`.

# %% nbgrader={"grade": false, "grade_id": "layer_activation_bytes", "locked": false, "schema_version": 3, "solution": true}
def layer_activation_bytes(shape: dict, batch: int, seq: int, dtype_bytes: int) -> int:
    """Bytes one Llama layer saves for backward (HF modules on CPU, SDPA, no dropout)."""
    ### BEGIN SOLUTION
    P, h, f = dtype_bytes, shape["hidden"], shape["ffn"]
    a, k, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
    n = batch * seq
    norm = 4 * n * h + 4 * n + 2 * P * n * h
    attention = P * n * a * d + 2 * P * n * k * d + 4 * batch * a * seq + P * n * a * d
    mlp = 4 * P * n * f
    return 2 * norm + attention + mlp
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_activation_bytes_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert layer_activation_bytes(preset("tiny-llama").to_dict(), 2, 64, 4) == 658_432
print("layer_activation_bytes: 658,432 B for one tiny-llama layer (batch 2, seq 64, fp32)")

# %% nbgrader={"grade": true, "grade_id": "layer_activation_bytes_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests check other models, batch sizes, sequence lengths and bf16.
### BEGIN HIDDEN TESTS
from coursekit.memory import activation_bytes as _reference_activations

for _name, _b, _s, _dt in (("llama3-8b", 1, 4096, "bf16"), ("llama2-70b", 2, 1024, "bf16"), ("tiny-llama", 3, 40, "fp32")):
    _want = _reference_activations(preset(_name), _b, _s, dtype=_dt, kernels="cpu").layer_bytes
    _got = layer_activation_bytes(preset(_name).to_dict(), _b, _s, 2 if _dt == "bf16" else 4)
    assert _got == _want, f"{_name}, batch {_b}, seq {_s}, {_dt}: off by {_got - _want:+,} bytes"
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Check it: measure a tiny model
#
# `saved_activation_bytes(model, input_ids, labels=input_ids, breakdown=True)` runs one forward pass and records
# every tensor autograd saves (each storage once); `["by_layer"]["layers.<i>"]` are the bytes layer i saved.
# Measure the **last** layer (the first one also holds RoPE's cos/sin tables, which every layer then reuses).
# Build the model with `build_model(name, dtype=..., seed=0)`, put it in training mode, and feed random token ids
# of shape (batch, seq) below the model's vocabulary size.

# %% nbgrader={"grade": false, "grade_id": "measured_layer_bytes", "locked": false, "schema_version": 3, "solution": true}
def measured_layer_bytes(model: str, batch: int, seq: int, dtype: str = "fp32") -> int:
    """Saved-for-backward bytes of the last layer of ``model``, measured on one forward pass."""
    ### BEGIN SOLUTION
    m = build_model(model, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype], seed=0)
    m.train()
    ids = torch.randint(0, m.config.vocab_size, (batch, seq))
    report = saved_activation_bytes(m, ids, labels=ids, breakdown=True)
    return report["by_layer"][f"layers.{m.config.num_hidden_layers - 1}"]
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "compare_formula", "locked": true, "schema_version": 3, "solution": false}
_formula = layer_activation_bytes(preset("tiny-llama").to_dict(), 2, 64, 4)
_measured = measured_layer_bytes("tiny-llama", 2, 64)
print(f"formula {_formula:,} B, measured {_measured:,} B, difference {_measured - _formula:+,} B")

# %% nbgrader={"grade": true, "grade_id": "measured_layer_bytes_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
_bytes = measured_layer_bytes("tiny-llama", 2, 64)
assert _bytes == 658_432, f"measured {_bytes:,} B"
print(f"measured_layer_bytes: {_bytes:,} B measured, as the formula says")

# %% nbgrader={"grade": true, "grade_id": "measured_layer_bytes_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
# Hidden tests measure other batch sizes, sequence lengths and bf16.
### BEGIN HIDDEN TESTS
_m = build_model("tiny-llama", dtype=torch.bfloat16, seed=1).train()
_ids = torch.randint(0, 256, (3, 40))
_want = saved_activation_bytes(_m, _ids, labels=_ids, breakdown=True)["by_layer"]["layers.1"]
assert measured_layer_bytes("tiny-llama", 3, 40, "bf16") == _want, "wrong for batch 3, seq 40, bf16"
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Collectives: run the benchmark, read the bus bandwidth
#
# `run_benchmark(nproc=4, ops=["all_reduce"], sizes=[...], iters=5, warmup=2)` launches coursekit's collectives
# benchmark (in the manner of nccl-tests) on 4 processes and returns one row per size with `size` (bytes),
# `time_us` (per call, slowest rank), `algbw` = size / time and `busbw` (GB/s = 1e9 bytes/s).
#
# *Bus bandwidth* rescales algbw by how many bytes each rank really puts on the wire with a ring algorithm, so
# that it compares with a link's peak whatever the number of ranks n: all-reduce moves 2(n−1)/n of the buffer per
# rank, all-gather and reduce-scatter (n−1)/n, broadcast 1.
#
# Write `bus_bandwidth` and `benchmark_all_reduce` (keep `iters` and `warmup` small: this is a CPU).

# %% nbgrader={"grade": false, "grade_id": "collectives", "locked": false, "schema_version": 3, "solution": true}
def bus_bandwidth(op: str, size_bytes: float, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth in GB/s of ``op`` moving ``size_bytes`` in ``seconds`` on ``world`` ranks."""
    ### BEGIN SOLUTION
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
              "reduce_scatter": (world - 1) / world, "broadcast": 1.0}[op]
    return size_bytes / seconds / 1e9 * factor
    ### END SOLUTION


def benchmark_all_reduce(sizes: list, nproc: int = 4) -> list:
    """The benchmark's rows for all_reduce at ``sizes`` (bytes) on ``nproc`` processes."""
    ### BEGIN SOLUTION
    return run_benchmark(nproc=nproc, ops=["all_reduce"], sizes=sizes, iters=5, warmup=2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "collectives_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert close(bus_bandwidth("all_reduce", 1e9, 1.0, 4), 1.5)
_rows = benchmark_all_reduce([2**14, 2**20])
assert [r["size"] for r in _rows] == [2**14, 2**20] and all(r["world_size"] == 4 for r in _rows)
for _r in _rows:
    assert close(bus_bandwidth("all_reduce", _r["size"], _r["time_us"] * 1e-6, 4), _r["busbw"], rel=1e-6), \
        "your bus bandwidth disagrees with the benchmark's busbw column"
print(f"collectives: all_reduce of 1 MiB on 4 processes, bus bandwidth {_rows[-1]['busbw']:.2f} GB/s, as the "
      "benchmark computes it (format_table(rows) shows them all)")

# %% nbgrader={"grade": true, "grade_id": "collectives_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
# Hidden tests check the bus bandwidth of other collectives and numbers of ranks.
### BEGIN HIDDEN TESTS
from coursekit.comm.volume import busbw_factor as _factor

for _op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
    for _n in (2, 3, 8, 64):
        assert close(bus_bandwidth(_op, 5e8, 0.25, _n), 2.0 * _factor(_op, _n), rel=1e-9), f"{_op} on {_n} ranks"
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Ring all-reduce from send and receive
#
# Cut the tensor into n chunks (`torch.tensor_split(t.view(-1), n)`; n need not divide its size). Each rank talks
# to its neighbours only: it sends to rank r+1 and receives from rank r−1 (mod n).
#
# * **Reduce-scatter**, n−1 steps: at step i rank r sends chunk (r−i) and adds what it receives into chunk
#   (r−i−1). After n−1 steps rank r holds the full sum of chunk (r+1).
# * **All-gather**, n−1 steps: at step i rank r sends chunk (r+1−i) and stores what it receives in chunk (r−i).
#
# Post each step's send and receive together (`dist.batch_isend_irecv([dist.P2POp(dist.isend, ...),
# dist.P2POp(dist.irecv, ...)])`, then `wait()` each request): if every rank first sends with a blocking `send`,
# all of them wait for a receiver. Skip empty chunks (both sides know the sizes). Each rank sends 2(n−1)/n of the
# tensor — the bus-bandwidth factor of section 5. The test runs your function on 2 processes under torchrun
# (`launch_function` writes your definitions into a script and starts it with `coursekit.launch`) and checks every
# rank's result and what it sent. Do not call `dist.all_reduce`.

# %% nbgrader={"grade": false, "grade_id": "ring_all_reduce", "locked": false, "schema_version": 3, "solution": true}
def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, with a ring of point-to-point messages; returns it."""
    ### BEGIN SOLUTION
    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return tensor
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    right, left = (r + 1) % n, (r - 1) % n

    def exchange(send, recv):
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, right))
        if recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, left))
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()

    for i in range(n - 1):  # reduce-scatter
        incoming = torch.empty_like(chunks[(r - i - 1) % n])
        exchange(chunks[(r - i) % n], incoming)
        chunks[(r - i - 1) % n] += incoming
    for i in range(n - 1):  # all-gather
        exchange(chunks[(r + 1 - i) % n], chunks[(r - i) % n])
    return tensor
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "ring_all_reduce_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false}
RING_SIZES = [8, 1000]
_res = launch_function(ring_all_reduce, "coursekit.course.drivers:all_reduce", nproc=2, sizes=RING_SIZES,
                       timeout=180)
for _rank in _res:
    for _case, _size in enumerate(RING_SIZES):
        assert close(_rank["outputs"][_case], expected_sum(_size, 2, _case), rel=1e-5, abs_=1e-5), \
            f"rank {_rank['rank']}: wrong sum for a tensor of {_size} elements"
        assert "all_reduce" not in _rank["collectives"][_case], "build it from send/recv, not dist.all_reduce"
print(f"ring_all_reduce: right sums on both ranks for {RING_SIZES} elements, with send/recv only")

# %% nbgrader={"grade": true, "grade_id": "ring_all_reduce_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests run your ring on 3 processes, with sizes n does not divide, and check the bytes each rank sends.
### BEGIN HIDDEN TESTS
_sizes = [1001, 2, 3000]
_res = launch_function(ring_all_reduce, "coursekit.course.drivers:all_reduce", nproc=3, sizes=_sizes, timeout=180)
for _rank in _res:
    for _case, _size in enumerate(_sizes):
        assert close(_rank["outputs"][_case], expected_sum(_size, 3, _case), rel=1e-5, abs_=1e-5), \
            f"3 ranks: wrong sum for a tensor of {_size} elements"
        assert set(_rank["collectives"][_case]) <= {"send", "recv"}, "only point-to-point messages, please"
    assert _rank["collectives"][2]["send"]["bytes"] == 2 * 2 * 3000 * 4 // 3, \
        "each rank should send 2(n-1)/n of the tensor"
### END HIDDEN TESTS

# %% [markdown]
# ### Live ranks: keep them between cells
#
# Every test above starts a fresh torchrun job: seconds of start-up before the first message. A *pool* keeps N ranks
# and their process group alive across cells (`coursekit.pool`, ipyparallel underneath): start it once (~2 s), then
# a cell runs on every rank in a fraction of a second, and what a cell defines stays on the ranks for the next one
# (`pool.magics()` gives a `%%ranks` cell magic). Below: 2 live ranks, an all-reduce, then your `ring_all_reduce`
# on the same ranks (until you have written it, each rank reports your `NotImplementedError`). The pool closes at
# the end of the `with` block; leave one open in your own cells while you explore.

# %% nbgrader={"grade": false, "grade_id": "demo_pool", "locked": true, "schema_version": 3, "solution": false}
from coursekit.pool import Pool, RankError


def _ring_on_rank(ring, size):
    t = torch.arange(float(size)) * (dist.get_rank() + 1)
    return ring(t)[:3].tolist()


with Pool(2) as pool:
    pool.run("x = torch.ones(3) * (rank + 1)")
    pool.run("dist.all_reduce(x); print('all_reduce:', x.tolist())")  # x is still there: [3.0, 3.0, 3.0]
    try:
        sums = pool.run(_ring_on_rank, ring_all_reduce, 10)
        print(f"your ring on the pool's 2 ranks: {sums[0]} on rank 0, {sums[1]} on rank 1 (expected [0.0, 3.0, 6.0])")
    except RankError as e:  # every failing rank's traceback is in e.failures: the last line says what
        print(f"your ring on the pool's ranks: {e.failures[min(e.failures)].strip().splitlines()[-1].rstrip(': ')}")

# %% [markdown]
# ## 7. Plot the memory breakdown against sequence length
#
# `estimate(model, batch=b, seq=s)` is coursekit's memory calculator (mixed precision, AdamW, one GPU); its
# `.categories` dict holds bytes per category. Plot, against the sequence lengths, four lines in GiB labelled
# `"parameters"` (category `parameters`), `"gradients"` (`gradients`), `"optimizer"` (`master_weights` +
# `optimizer_states`) and `"activations"` (`saved_activations`). Label both axes, add a legend, return the figure.

# %% nbgrader={"grade": false, "grade_id": "plot_memory", "locked": false, "schema_version": 3, "solution": true}
def plot_memory_vs_seq(model: str, seqs: list, batch: int = 1):
    """A matplotlib figure: memory per category (GiB) against sequence length for ``model``."""
    ### BEGIN SOLUTION
    import matplotlib.pyplot as plt

    cats = [estimate(model, batch=batch, seq=s).categories for s in seqs]
    series = {"parameters": [c["parameters"] for c in cats], "gradients": [c["gradients"] for c in cats],
              "optimizer": [c["master_weights"] + c["optimizer_states"] for c in cats],
              "activations": [c["saved_activations"] for c in cats]}
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in series.items():
        ax.plot(seqs, [v / GiB for v in values], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(f"{model}, micro-batch {batch}")
    ax.legend()
    return fig
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "show_plot", "locked": true, "schema_version": 3, "solution": false}
_fig = plot_memory_vs_seq("llama3-8b", [1024, 2048, 4096, 8192, 16384, 32768])

# %% nbgrader={"grade": true, "grade_id": "plot_memory_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
_axes = describe_figure(plot_memory_vs_seq("llama3-8b", [1024, 4096, 16384]))["axes"]
_lines = {line["label"]: line for line in _axes[0]["lines"]}
assert set(_lines) == {"parameters", "gradients", "optimizer", "activations"}, f"line labels: {sorted(_lines)}"
assert _lines["activations"]["x"] == [1024, 4096, 16384]
assert _lines["activations"]["y"][0] < _lines["activations"]["y"][1] < _lines["activations"]["y"][2]
assert close(_lines["parameters"]["y"][0], _lines["parameters"]["y"][2]), "parameters do not depend on the sequence"
assert _axes[0]["xlabel"] and _axes[0]["ylabel"], "label your axes"
print(f"plot_memory_vs_seq: 4 lines; activations grow from {_lines['activations']['y'][0]:.1f} to "
      f"{_lines['activations']['y'][2]:.1f} GiB between 1k and 16k tokens")

# %% nbgrader={"grade": true, "grade_id": "plot_memory_hidden", "locked": true, "points": 1, "schema_version": 3, "solution": false}
# Hidden tests check the plotted values for another model and batch size.
### BEGIN HIDDEN TESTS
_seqs = [512, 2048, 8192]
_lines = {line["label"]: line for line in describe_figure(plot_memory_vs_seq("llama2-7b", _seqs, 2))["axes"][0]["lines"]}
for _i, _s in enumerate(_seqs):
    _c = estimate("llama2-7b", batch=2, seq=_s).categories
    for _label, _bytes in (("parameters", _c["parameters"]), ("gradients", _c["gradients"]),
                           ("optimizer", _c["master_weights"] + _c["optimizer_states"]),
                           ("activations", _c["saved_activations"])):
        assert close(_lines[_label]["y"][_i], _bytes / GiB, rel=1e-6), f"{_label} at seq {_s} (llama2-7b, batch 2)"
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Decide: does Llama 3 70B train on one node?
#
# ZeRO shards model state over the n data-parallel GPUs: stage 1 the optimizer states (and master weights), stage 2
# also the gradients, stage 3 also the parameters. `estimate(model, batch=b, seq=s, dp=n, zero=stage,
# gpu="H100-80GB", recompute="full")` returns the per-GPU `peak_bytes` and whether it `fits` (full activation
# recomputation keeps one layer input per layer).
#
# Write `training_plan`: the smallest ZeRO stage at which training fits, with the numbers behind the decision.
# Then decide for Llama 3 70B at 4096 tokens, micro-batch 1, on one node of 8 H100-80GB and on eight such nodes.

# %% nbgrader={"grade": false, "grade_id": "training_plan", "locked": false, "schema_version": 3, "solution": true}
def training_plan(model: str, gpu: str, n_gpus: int, seq: int, micro_batch: int = 1) -> dict:
    """``{"zero": smallest fitting stage or None, "peak_gib": per-GPU peak at that stage (at stage 3 if none
    fits), "fits": bool}`` for bf16 + AdamW with full recomputation."""
    ### BEGIN SOLUTION
    for stage in range(4):
        e = estimate(model, batch=micro_batch, seq=seq, dp=n_gpus, zero=stage, gpu=gpu, recompute="full")
        if e.fits:
            return {"zero": stage, "peak_gib": e.peak_bytes / GiB, "fits": True}
    return {"zero": None, "peak_gib": e.peak_bytes / GiB, "fits": False}
    ### END SOLUTION


ONE_NODE = training_plan("llama3-70b", "H100-80GB", 8, 4096)
EIGHT_NODES = training_plan("llama3-70b", "H100-80GB", 64, 4096)
print("one node:", ONE_NODE, "\neight nodes:", EIGHT_NODES)

# %% nbgrader={"grade": true, "grade_id": "training_plan_visible", "locked": true, "points": 1, "schema_version": 3, "solution": false}
assert ONE_NODE["fits"] is False and ONE_NODE["zero"] is None, "70B's 16Ψ = 1.1 TB of state; 8 x 80 GB is 640 GB"
assert EIGHT_NODES["fits"] is True and EIGHT_NODES["zero"] == 3
assert ONE_NODE["peak_gib"] > 80 > EIGHT_NODES["peak_gib"]
print(f"training_plan: one node does not fit ({ONE_NODE['peak_gib']:.0f} GiB per GPU); eight nodes fit at ZeRO-3 "
      f"({EIGHT_NODES['peak_gib']:.0f} GiB)")

# %% nbgrader={"grade": true, "grade_id": "training_plan_hidden", "locked": true, "points": 2, "schema_version": 3, "solution": false}
# Hidden tests check other models, GPUs and cluster sizes.
### BEGIN HIDDEN TESTS
for _args in (("llama3-8b", "H100-80GB", 8, 4096, 1), ("llama3-8b", "A100-40GB", 4, 8192, 2),
              ("llama2-13b", "L4", 2, 2048, 1), ("llama2-7b", "H200", 1, 4096, 4)):
    _want = None
    for _stage in range(4):
        _e = estimate(_args[0], batch=_args[4], seq=_args[3], dp=_args[2], zero=_stage, gpu=_args[1],
                      recompute="full")
        if _e.fits:
            _want = _stage
            break
    _got = training_plan(*_args)
    assert _got["zero"] == _want and _got["fits"] == (_want is not None), f"wrong decision for {_args}"
    assert close(_got["peak_gib"], _e.peak_bytes / GiB, rel=1e-6), f"wrong peak for {_args}"
### END HIDDEN TESTS
