"""Predicted time of one optimizer step of a layout, split into compute, exposed communication and bubble.

Pure Python. Every term is a stated model; the same constants serve every case (docs/planner.md gives the derivations).

Compute (per micro-batch, on the busiest pipeline stage: ceil(L/pp) layers plus the LM head on the last stage):
  * each GEMM of a layer (q/k/v, o, MLP in, MLP out; TP-sharded) is a roofline:
        t = max(2MNK / (peak · gemm_fraction · e(M)e(N)e(K)),  bytes(MK + KN + MN) / HBM,  kernel_floor)
    with the small-GEMM curve e(d) = d / (d + gemm_half_dim). Backward runs the two GEMMs (input and weight
    gradient) with the same three dimensions, so a GEMM's training time is 3 x its forward time.
  * attention core: flash (causal, half the s x s FLOPs; backward 2.5x forward, it recomputes QK^T) at
    attn_fraction of peak; or eager (full s x s batched GEMMs through the roofline + the score-matrix traffic).
  * element-wise kernels (norms, activation, residuals, rotary, dropout, casts, bias gradients): HBM traffic per
    token, forward + backward, as ``elementwise`` runs them: ``eager`` (default: the modeling code's own aten ops, one
    kernel each; ELEMENTWISE's coefficients of h, the query and key/value widths and the MLP width, read from
    ``coursekit.measure.elementwise``'s op-by-op counts of transformers' layers) or ``fused`` (Megatron-LM /
    Transformer Engine / Apex fused norm, bias-activation and bias-dropout-add kernels: FUSED_H passes of a hidden
    vector and FUSED_F of an MLP vector, a hand count); each TP rank does the hidden-width part whole unless
    sequence parallelism splits it; each layer at least OPS_PER_LAYER kernel floors; the loss reads/writes the
    fp32 logits LOSS_PASSES times.
  * recompute: full re-runs every layer's forward (``recompute_layers`` N: the first N layers of each model chunk,
    Megatron's block method: that share of the layers); selective re-runs the attention core; op (torchtitan's per-op
    policy, ``coursekit.memory.op_recompute``) re-runs the forward of the ops it does not keep: the GEMMs of every
    second mm (k, o and the MLP's up, or proj; a MoE block's router and experts) and the element-wise forward
    (a third of the element-wise traffic); q, v, gate, down and the attention kernel's output are kept.

Communication: bytes from ``coursekit.comm.volume`` conventions (wire bytes per rank = payload x busbw factor);
time = alpha + wire / busbw for the link of the group: NVLink when the group's ranks fit in a node (mesh order
pp, dp_replicate, dp_shard, cp, tp: tp innermost), else the network with busbw = min(NVLink, k x NIC) for k
members of the group per node; alpha grows with ring steps inside a node and tree levels across nodes.

Overlap (stated per strategy; each switch is a layout option, ``coursekit.plan.overlap``, and the prediction says
which it assumed):
  * DDP / ZeRO-1/2: one collective per bucket (DDP's 25 MiB, DeepSpeed's 5e8 elements: each pays NCCL's
    latency); the gradient reduce overlaps the backward of the last micro-batch except its last bucket
    (``grad_reduce``, on; off: all of it exposed); ZeRO-2 reduces each micro-batch during its own backward;
    ZeRO-1/2 all-gather updated parameters after the step in 5e8-element buckets (exposed; ``param_gather`` on:
    behind the next step's first forward, at least one bucket exposed).
  * FSDP2 / HSDP / ZeRO-3: the all-gather of the next unit overlaps this unit's compute; exposed: the first
    unit's gather, the last unit's reduce-scatter, and whatever communication exceeds the compute (``prefetch``,
    on; off: every gather and reduce-scatter exposed).
  * gradients go on the wire in ``grad_reduce_dtype`` (fp32; bf16 halves them).
  * TP all-reduces (or SP all-gather + reduce-scatter) are exposed; ``tp`` overlap (Megatron-Core's
    --tp-comm-overlap, torchtitan's async TP; SP only): each collective pipelined with the GEMM it feeds in tp
    chunks, exposed max(comm / tp, comm - the layer's GEMM time). A mixture of experts under TP
    (``coursekit.tp.plan``: expert TP 1, the TP ranks split the sparse block's tokens): the attention's all-reduces,
    an all-gather of the block's output (forward) and of its input's gradient (backward) (under SP neither: the
    block runs on the rank's own sequence shard, the attention does SP's all-gather + reduce-scatter), the router
    and expert GEMMs and all-to-alls over t/tp tokens, and, after backward, the block's router and expert gradients
    summed over the TP ranks (one all-reduce per tensor, exposed: ``coursekit.parallel.split.sum_partial_grads``).
  * PP: bubble (p - 1) / (v·m + p - 1) of the pipeline time; stage-to-stage sends exposed.
  * CP ring: each K/V exchange overlaps one block of attention compute, exposed only beyond it; Ulysses
    all-to-alls are exposed.
  * optimizer: memory-bound over this rank's parameter shard (OPT_BYTES per parameter).
  * FSDP2 gathers per block (forward, and again for backward), reduce-scatters per block; ZeRO-3 fetches per module
    (one parameter tensor each in these models), forward and backward, and reduce-scatters per bucket.
  * hidden is not free: compute beside a collective runs (1 + Hardware.overlap_slowdown) slower (its kernels hold SMs
    and HBM bandwidth), so each engine's hidden data-parallel and async-TP communication adds to the step what of
    the slowed compute outlasts it (``_stretch``: hidden x s / (1 + s) inside the window; window - comm / (1 + s),
    never below 0, once the collectives outlast it): ``interference_s``.

Host work beyond the eager per-op cost (hidden only behind overlap x the device compute; on a CPU all of it):
  * DTensor dispatch: a TP layer's forward + backward runs DTENSOR_OPS_TP_LAYER ops with DTensor arguments
    (DTENSOR_OPS_SP_LAYER with SP), each dtensor_op_s; a per-tensor optimizer loop over DTensor parameters (FSDP2 /
    HSDP, DDP over TP or PP) pays dtensor_opt_op_s on DTENSOR_OPT_OPS of each tensor's ops.
  * ZeRO-3's fetch / release / partition hooks: zero3_hook_s per parameter tensor per micro-batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from coursekit.flops import flops_per_step
from coursekit.plan import overlap
from coursekit.plan.hardware import HBM_FRACTION, Hardware, Network
from coursekit.plan.layout import Layout
from coursekit.plan.links import Links
from coursekit.spec.dims import DERIVED

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}

# Eager element-wise traffic of one layer, forward + backward, in elements of the activation dtype per token: the
# coefficients of h, the query width (heads x head_dim), the key/value width (kv_heads x head_dim), the dense MLP
# width f, top_k x expert_ffn and top_k x h (a mixture of experts), and a constant. Read by least squares from
# coursekit.measure.elementwise's counts (transformers 5, bf16, seq 128 x batch 2, 5-8 tiny shapes per family with
# h, f, heads, kv_heads, head_dim varied; residual < 0.2 %), bias-free: each bias adds one read of its output's
# gradient (measured: +1.00 per biased output width), and for gpt2 a dropout before each residual add (any p > 0)
# adds RESID_DROPOUT_H, HF's tanh GELU (gelu_new, a chain of eight ops) GELU_NEW_F. Llama's RMSNorm runs in fp32
# (casts up and down), rotary is five ops on q and k, SwiGLU three: eager moves ~6x what fused kernels do.
ELEMENTWISE = {  # family (another family: its arch's row): (h, q, kv, f, top_k x expert_ffn, top_k x h, constant)
    "llama": (152.19, 27.49, 25.79, 14.24, 0.0, 0.0, 3.2),
    "qwen3": (153.01, 92.68, 92.58, 14.10, 0.0, 0.0, 133.1),  # + an RMSNorm over each query and key head
    "mixtral": (159.54, 29.88, 20.77, 0.0, 17.97, 40.73, 1470.5),  # router softmax, top-k, per-expert gather/scatter
    "qwen3_moe": (154.84, 94.52, 89.91, 0.0, 18.04, 21.59, 912.0),
    "gpt2": (28.06, 0.0, 0.0, 5.0, 0.0, 0.0, 8.0),  # nn.LayerNorm and F.gelu: one aten kernel each way
}
RESID_DROPOUT_H = 24.0  # gpt2's attention and MLP output dropouts + the embedding's: mask, scale, backward
GELU_NEW_F = 41.0
# Fused kernels (Megatron-LM, Transformer Engine, Apex), by hand per layer: 2 norms (forward read + write, backward
# read x and dy, write dx: 5 passes each), 2 bias-dropout-adds (forward 2 reads + a write + the mask; backward 2.5),
# the residual branches' gradient sums (3 each), casts; the MLP's fused bias-activation (forward 2, backward 3) and
# gate product (3)
FUSED_H = 32
FUSED_F = 8
ELEMENTWISE_KERNELS = ("eager", "fused")
# Kernels (aten ops) per step, counted with a TorchDispatchMode on HF LlamaForCausalLM (transformers 5, sdpa):
# 211 per layer forward + backward (73 + 138), 79 for embedding, head and loss, 9 per parameter tensor in the
# trainer's single-tensor AdamW (no weight decay). Each costs at least kernel_floor_s: what a tiny model is made of;
# a large one never notices.
OPS_PER_LAYER = 211
OPS_OUTSIDE_LAYERS = 79
OPT_OPS_PER_TENSOR = 9
# DTensor ops (an aten op with a DTensor argument: sharding propagation and unwrap/rewrap on the host, each
# Hardware.dtensor_op_s beyond its plain cost), counted the same way (calibrate.dtensor_op_cost) with the course's
# TP plan (coursekit.tp.plan): per layer forward + backward, without / with sequence parallelism; and per DTensor
# parameter in the trainer's single-tensor AdamW step (no weight decay: 7 ops touch the parameter, gradient or
# states; torch's default decay of 0.01 would add the 8th).
DTENSOR_OPS_TP_LAYER = 94
DTENSOR_OPS_SP_LAYER = 144
DTENSOR_OPS_OUTSIDE_LAYERS = 14  # the vocab-parallel embedding and LM head (coursekit.tp.vocab), forward + backward
DTENSOR_OPT_OPS = 7
LOSS_PASSES = 6  # fp32 logits: upcast, log-softmax, its backward
# torch.compile: Inductor fuses each chain of element-wise ops (a norm with its residual add, rotary, the gate's
# activation and product) into one kernel that reads its inputs and writes its output once: about a third of eager's
# HBM passes and kernels (a stated assumption, checked only as the ratio of torchtitan's published compile / eager
# rows, bench_planner). The GEMMs and attention kernels are unchanged.
COMPILE_ELEMWISE = 1 / 3
# torchao float8 (dynamic tensorwise scaling; its autograd function saves the bf16 input and weight and casts them
# again for backward): an amax pass (read 2 B) and a cast pass (read 2 B, write 1 B) per element cast
FP8_CAST_BYTES = 5
DTYPES = ("bf16", "fp16", "fp32", "fp8")
SCORE_PASSES = 12  # eager attention: s x s scores written/read by scale, mask, softmax, dropout, fwd + bwd
OPT_BYTES = 32  # AdamW per parameter: fp32 master, m, v read + write (24), fp32 grad read (4), bf16 param (2+2)
DDP_BUCKET = 25 * 2**20  # torch DDP bucket_cap_mb default
DS_BUCKET = 5e8  # DeepSpeed reduce_bucket_size / allgather_bucket_size defaults, in elements


@dataclass(frozen=True)
class Cluster:
    hw: Hardware
    net: Network
    gpus: int
    gpus_per_node: int


@dataclass
class Prediction:
    step_time_s: float
    compute_s: float
    bubble_s: float
    exposed_s: dict
    """Exposed communication per dimension: tp, cp, pp, dp (+ fsdp gathers), in seconds per step."""
    optimizer_s: float
    host_s: float
    """Exposed host work per step beyond the eager per-op cost: DTensor dispatch of TP layers, ZeRO-3's per-module
    fetch/release hooks."""
    microbatches: int
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    links: dict = field(default_factory=dict)
    """Which link each group uses: nvlink or network."""
    overlap: dict = field(default_factory=dict)
    """The overlaps assumed (``coursekit.plan.overlap``: each that applies, on or off) and the gradient dtype."""
    run: dict = field(default_factory=dict)
    """The run settings priced: the GEMMs' dtype, torch.compile and the element-wise kernels (eager / fused)."""
    interference_s: float = 0.0
    """What the hidden communication costs the compute beside it (``Hardware.overlap_slowdown``), in the step."""
    dp_comm_s: float = 0.0
    """The data-parallel collectives' whole time per step, before any overlap (``exposed_s["dp"]`` is the part the
    step waits for): above ``compute_s`` the step is bound by them, however well they overlap."""

    def to_dict(self) -> dict:
        return {"step_time_s": self.step_time_s, "compute_s": self.compute_s, "bubble_s": self.bubble_s,
                "exposed_s": dict(self.exposed_s), "optimizer_s": self.optimizer_s, "host_s": self.host_s,
                "microbatches": self.microbatches, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "mfu": self.mfu, "hfu": self.hfu, "links": dict(self.links), "overlap": dict(self.overlap),
                "run": dict(self.run), "interference_s": self.interference_s, "dp_comm_s": self.dp_comm_s}


# -- building blocks ---------------------------------------------------------------------------------------------------
def gemm_time(M: float, K: float, N: float, hw: Hardware, dtype: str, batch: float = 1) -> float:
    """Roofline time of ``batch`` GEMMs of (M x K) @ (K x N)."""
    e = hw.gemm_fraction * math.prod(d / (d + hw.gemm_half_dim) for d in (M, K, N))
    b = DTYPE_BYTES[dtype]
    t_flop = 2 * M * K * N / (hw.peak(dtype) * e)
    t_mem = b * (M * K + K * N + M * N) / (hw.hbm_bw * HBM_FRACTION)
    return batch * max(t_flop, t_mem, hw.kernel_floor_s)


@lru_cache(maxsize=4096)
def _stage_tensors(shape, stage_layers: int) -> int:
    per_layer, first, last = shape.local_tensors()
    return stage_layers * per_layer + max(first, last)


@lru_cache(maxsize=4096)
def _flops(shape, batch: int, seq: int, recompute: str) -> float:
    return flops_per_step(shape, batch, seq, recompute=recompute)["total"]


# -- the model ---------------------------------------------------------------------------------------------------------
def predict(shape, layout: Layout, cluster: Cluster, *, seq: int, global_batch: int, dtype: str = "bf16",
            attention: str = "flash", compile: bool = False, elementwise: str = "eager") -> Prediction:
    """Predicted step time of ``layout`` for ``shape`` (a ModelShape) on ``cluster``. ``dtype`` fp8: the linear
    layers' GEMMs on the FP8 tensor cores with torchao float8's dynamic casts, the rest bf16 (MFU then counts
    against the bf16 peak); ``compile``: torch.compile's fused element-wise kernels (COMPILE_ELEMWISE); ``elementwise``:
    eager (the modeling code's aten ops) or fused (Megatron-LM / Transformer Engine kernels)."""
    hw, L = cluster.hw, layout
    gemm_dtype = dtype
    if dtype == "fp8":
        hw.peak("fp8")  # a GPU without FP8 tensor cores is refused here, by name
        dtype = "bf16"
    if attention not in ("flash", "eager"):
        raise ValueError(f"attention must be flash or eager, got {attention!r}")
    if global_batch % (L.dp * L.micro_batch):
        raise ValueError(f"global batch {global_batch} is not divisible by dp {L.dp} x micro_batch {L.micro_batch}")
    m = global_batch // (L.dp * L.micro_batch)
    if L.microbatches is not None and L.microbatches != m:
        raise ValueError(f"microbatches {L.microbatches} != global batch {global_batch} / (dp {L.dp} x micro_batch "
                         f"{L.micro_batch}) = {m}")
    act = DTYPE_BYTES[dtype]
    tp, cp, pp, v = L.tp, L.cp, L.pp, L.virtual_stages
    sp = L.sp and tp > 1
    t = L.micro_batch * seq / cp  # tokens per micro-batch on this rank
    links = Links(L, cluster)
    ov = overlap.resolve(L)
    stage_layers = math.ceil(shape.layers / pp)
    # recompute full of only the first N layers of each model chunk (Megatron's block method): that share re-runs
    rc_frac = 1.0 if L.recompute_layers is None else min(1.0, L.recompute_layers * v / stage_layers)
    layer, a_fwd, a_bwd, gemms = _layer_time(shape, L, hw, t=t, seq=seq, act=act, dtype=dtype, attention=attention,
                                             sp=sp, gemm_dtype=gemm_dtype, compiled=compile, rc_frac=rc_frac,
                                             elementwise=elementwise)
    tp_s, cp_s = _tp_cp_time(shape, L, links, t=t, seq=seq, act=act, sp=sp, a_fwd=a_fwd, a_bwd=a_bwd,
                             rc_frac=rc_frac)
    tp_slowed = 0.0  # per layer and micro-batch: what the pipelined TP collectives cost the GEMMs beside them
    if ov.get("tp"):  # each collective pipelined with its GEMM in tp chunks: the first chunk, or what the GEMMs leave
        shown = max(tp_s / tp, tp_s - hw.overlap * gemms)
        tp_slowed = _stretch(tp_s, shown, hw.overlap * gemms, hw.overlap_slowdown)
        tp_s = shown

    # one micro-batch on the busiest (last) stage
    h, V = shape.hidden, shape.vocab
    head = 3 * gemm_time(t, h, V / tp, hw, dtype) + max(LOSS_PASSES * t * V / tp * 4 / (hw.hbm_bw * HBM_FRACTION),
                                                        OPS_OUTSIDE_LAYERS * hw.kernel_floor_s)
    compute_mb = stage_layers * layer + head
    pp_s = 0.0
    if pp > 1:
        p2p_bytes = t * h * act / (tp if sp or tp > 1 else 1)  # scatter/gather over TP ranks (Narayanan §4.1)
        pp_s = links.p2p(p2p_bytes, "pp", 2 * v)

    dp_axes = DERIVED["loss"]  # dp x cp: CP ranks hold the same weights, so gradients reduce over them too
    stage_params, fsdp_mb, step_dp, host_mb, dp_comm, dp_slowed = _data_parallel(
        shape, L, hw, links, m=m, act=act, sp=sp, stage_layers=stage_layers, compute_mb=compute_mb, dp_axes=dp_axes,
        ov=ov)
    ep_s = 0.0
    if shape.is_moe and L.ep > 1:  # dispatch + combine, forward and backward: 4 all-to-alls of t·k rows per layer
        ep_s = 4 * links.time("all_to_all", t / tp * shape.top_k * h * act, ("ep",))  # TP ranks: t/tp tokens each
    mb_time = compute_mb + stage_layers * (tp_s + cp_s + ep_s) + pp_s + fsdp_mb + host_mb
    bubble = (pp - 1) / v * mb_time if pp > 1 else 0.0
    opt = _optimizer_time(shape, L, hw, stage_params=stage_params, stage_layers=stage_layers)
    loss_sync = links.time("all_reduce", 4, ("pp",) + dp_axes, 1) if hw.loss_sync else 0.0  # mesh order: pp outermost
    step_dp, dp_comm = step_dp + loss_sync, dp_comm + loss_sync
    tp_step = _moe_tp_reduce(shape, L, links, stage_layers)
    exposed_dp = m * fsdp_mb + step_dp
    # compute beside a hidden collective runs slower (its kernels hold SMs and HBM bandwidth): the hidden part of the
    # data-parallel and pipelined-TP collectives stretches the step once (a pipeline's bubble is not stretched by it)
    interference = dp_slowed + m * stage_layers * tp_slowed
    step = m * mb_time + bubble + step_dp + tp_step + opt + interference

    tokens = global_batch * seq
    gpus = L.world
    mflops = _flops(shape, global_batch, seq, "none")
    hflops = _flops(shape, global_batch, seq, L.recompute)
    if L.recompute == "full" and rc_frac < 1:  # the recomputed share of the layers' forward
        hflops = mflops + rc_frac * (hflops - mflops)
    peak = hw.peak(dtype)  # fp8: against the bf16 peak (both tensor-core kinds run; torchtitan: "not well-defined")
    exposed = {"tp": m * stage_layers * tp_s + tp_step, "cp": m * stage_layers * cp_s, "pp": m * pp_s,
               "dp": exposed_dp, **({"ep": m * stage_layers * ep_s} if L.ep > 1 else {})}
    link_kinds = {name: links.kind(axes) for name, axes in
                  (("tp", ("tp",)), ("cp", ("cp",)), ("dp", dp_axes), ("pp", ("pp",)), ("ep", ("ep",)))
                  if links.placement(axes)[0] > 1}
    return Prediction(step_time_s=step, compute_s=m * compute_mb, bubble_s=bubble, exposed_s=exposed,
                      optimizer_s=opt, host_s=m * host_mb, microbatches=m, tokens_per_s_per_gpu=tokens / step / gpus,
                      mfu=mflops / (step * gpus * peak), hfu=hflops / (step * gpus * peak), links=link_kinds,
                      overlap={**ov, "grad_reduce_dtype": L.grad_reduce_dtype},
                      run={"gemm_dtype": gemm_dtype, "compile": compile, "elementwise": elementwise},
                      interference_s=interference, dp_comm_s=dp_comm)


def _moe_tp_reduce(shape, L, links, stage_layers) -> float:
    """After backward, a token-split sparse block's router and expert gradients summed over the TP ranks: one
    fp32 all-reduce per tensor (router, experts' in and out), of this rank's part (its EP slice; under FSDP2 its
    shard: router over dp_shard x cp, expert slices over the dp_shard x cp / ep ranks holding them)."""
    if not (shape.is_moe and L.tp > 1):
        return 0.0
    router, experts = shape.experts * shape.hidden, shape.expert_params_per_layer() / L.ep
    if L.engine == "fsdp2":
        n = L.dp_shard * L.cp
        router, experts = router / n, experts / max(1, n // L.ep)
    return links.time("all_reduce", (router + experts) * 4 / 3, ("tp",), 3 * stage_layers)


def check_elementwise(elementwise: str) -> None:
    """A ValueError unless ``elementwise`` names a kind of element-wise kernels (ELEMENTWISE_KERNELS)."""
    if elementwise not in ELEMENTWISE_KERNELS:
        raise ValueError(f"elementwise must be one of {', '.join(ELEMENTWISE_KERNELS)}, got {elementwise!r}")


def elementwise_per_token(shape, *, tp: int = 1, sp: bool = False, elementwise: str = "eager") -> float:
    """Element-wise reads + writes of one layer, forward + backward, per token on one TP rank, in elements of the
    activation dtype (ELEMENTWISE's eager coefficients, or the fused hand count)."""
    check_elementwise(elementwise)
    h, d = shape.hidden, shape.head_dim
    hs = h / (tp if sp else 1)  # the hidden-width work: every TP rank does it whole unless SP splits the sequence
    moe_f = shape.moe_ffn * shape.top_k  # a token's expert width (0 for a dense model: top_k 0)
    if elementwise == "fused":
        return FUSED_H * hs + FUSED_F * (moe_f or shape.ffn) / tp
    ch, cq, ckv, cf, ckf, ckh, c0 = ELEMENTWISE.get(shape.family) or ELEMENTWISE[shape.arch]  # MoE: cf 0, no dense MLP
    q, kv, f = shape.heads * d / tp, max(1, shape.kv_heads // tp) * d, shape.ffn / tp
    if shape.is_moe:  # each routed expert's gate, up and down outputs (by the dense rule: HF's experts have no bias)
        mlp_out = shape.top_k * (2 * shape.moe_ffn + h) / tp
    else:
        mlp_out = (2 * f if shape.mlp == "swiglu" else f) + hs
    biased = (q + 2 * kv) * shape.qkv_bias + hs * shape.o_bias + mlp_out * shape.mlp_bias
    out = ch * hs + cq * q + ckv * kv + cf * f + (ckf * moe_f + ckh * shape.top_k * h) / tp + c0
    if shape.arch == "gpt2":
        out += RESID_DROPOUT_H * hs * (shape.resid_dropout > 0) + GELU_NEW_F * f * (shape.activation == "gelu_new")
    return out + biased


def _layer_time(shape, L, hw, *, t, seq, act, dtype, attention, sp, gemm_dtype=None, compiled=False,
                rc_frac=1.0, elementwise="eager") -> tuple[float, float, float, float]:
    """Compute of one layer, one micro-batch (forward, backward, recompute): (layer, attention fwd, attention bwd,
    the GEMMs' forward + backward). ``gemm_dtype`` fp8: the linear GEMMs on FP8 tensor cores plus their casts."""
    gd = gemm_dtype or dtype
    h, f, d, tp, cp = shape.hidden, shape.ffn, shape.head_dim, L.tp, L.cp
    heads = shape.heads / tp
    kv_heads = max(1, shape.kv_heads // tp) if shape.kv_heads >= tp else 1
    n_in = 2 if shape.mlp == "swiglu" else 1
    gemms = [(t, h, (heads + 2 * kv_heads) * d), (t, heads * d, h)]
    if shape.is_moe:  # the router, then the experts as one grouped GEMM over the t·k rows a balanced router sends;
        # TP's ranks split the block's tokens (t/tp each): the router's and the experts' rows below
        rows = t / tp * shape.top_k
        gemms += [(t / tp, h, shape.experts), (rows, h, 2 * shape.moe_ffn), (rows, shape.moe_ffn, h)]
    else:
        gemms += [(t, h, n_in * f / tp), (t, f / tp, h)]
    g_fwd, g_op = sum(gemm_time(*g, hw, gd) for g in gemms), 0.0
    if L.recompute == "op":  # the GEMMs the op policy recomputes: k, o; the MLP's up (proj), or router + experts
        redo = [(t, h, kv_heads * d), (t, heads * d, h)]
        redo += gemms[2:] if shape.is_moe else [(t, h, f / tp) if n_in == 2 else (t, f / tp, h)]
        g_op = sum(gemm_time(*g, hw, gd) for g in redo)
    if attention == "flash":
        fl = 4 * L.micro_batch * heads * (seq / cp) * seq * d * 0.5  # causal, load-balanced over CP ranks
        a_fwd = max(fl / (hw.peak(dtype) * hw.attn_fraction), hw.kernel_floor_s)
        a_bwd = 2.5 * a_fwd
    else:
        bmm = L.micro_batch * heads
        a_fwd = 2 * gemm_time(seq / cp, d, seq, hw, dtype, bmm)
        a_fwd += SCORE_PASSES / 2 * bmm * (seq / cp) * seq * act / (hw.hbm_bw * HBM_FRACTION)
        a_bwd = 2 * a_fwd
    elem = t * elementwise_per_token(shape, tp=tp, sp=sp, elementwise=elementwise) * act / (hw.hbm_bw * HBM_FRACTION)
    elem = max(elem, OPS_PER_LAYER * hw.kernel_floor_s) * (COMPILE_ELEMWISE if compiled else 1)
    if gd == "fp8":  # each linear's input, weight (forward, again in backward) and output gradient: amax + cast
        elem += sum(FP8_CAST_BYTES * (2 * M * K + 2 * K * N + M * N) for M, K, N in gemms) / (hw.hbm_bw * HBM_FRACTION)
    rc = {"none": 0.0, "selective": a_fwd, "full": rc_frac * (g_fwd + a_fwd + elem / 3), "op": g_op + elem / 3}[
        L.recompute]
    return 3 * g_fwd + a_fwd + a_bwd + elem + rc, a_fwd, a_bwd, 3 * g_fwd


def _tp_cp_time(shape, L, links, *, t, seq, act, sp, a_fwd, a_bwd, rc_frac=1.0) -> tuple[float, float]:
    """Exposed TP and CP communication of one layer, one micro-batch."""
    tp, cp, d, h = L.tp, L.cp, shape.head_dim, shape.hidden
    heads = shape.heads / tp
    kv_heads = max(1, shape.kv_heads // tp) if shape.kv_heads >= tp else 1
    tp_calls = 4 + (2 * rc_frac if L.recompute == "full" else 0)
    regather = 2 if sp and L.sp_style == "megatron" else 0  # Megatron's SP gathers each block input again
    tp_payload = L.micro_batch * seq / cp * h * act
    if shape.is_moe:  # attention's all-reduce; the token-split sparse block's output (backward: input grad) gathered
        n = tp_calls / 2  # (under SP the attention's all-gather + reduce-scatter; the block keeps its own tokens;
        # a partial recompute's share of the forward's pair: 4 + 2 x rc_frac calls, not rounded down)
        if sp:
            tp_s = links.time("all_gather", tp_payload, ("tp",), n) + links.time(
                "reduce_scatter", tp_payload, ("tp",), n)
        else:
            tp_s = links.time("all_reduce", tp_payload, ("tp",), n) + links.time("all_gather", tp_payload, ("tp",), n)
    elif sp:  # all-gather + reduce-scatter of the same payload instead of each all-reduce
        tp_s = links.time("all_gather", tp_payload, ("tp",), tp_calls + regather) + links.time(
            "reduce_scatter", tp_payload, ("tp",), tp_calls)
    else:
        tp_s = links.time("all_reduce", tp_payload, ("tp",), tp_calls)
    cp_s = 0.0
    if cp > 1:
        kv_bytes = 2 * t * kv_heads * d * act
        if L.cp_impl == "ring":
            ring_f = links.p2p(kv_bytes, "cp", cp - 1)
            cp_s = max(0.0, ring_f - a_fwd) + max(0.0, 2 * ring_f - a_bwd)
        else:
            q_bytes = t * heads * d * act * cp  # all-to-all send buffer of one rank (q, out; k, v below)
            cp_s = 2 * (links.time("all_to_all", 2 * q_bytes, ("cp",)) +
                        links.time("all_to_all", kv_bytes * cp, ("cp",)))
        if L.recompute == "full":
            cp_s *= 1 + 0.5 * rc_frac
    return tp_s, cp_s


def _stretch(comm: float, exposed: float, window: float, slowdown: float) -> float:
    """Step time added when ``comm`` seconds of collectives (``exposed`` of them already in the step) run beside
    ``window`` seconds of compute, which runs (1 + slowdown) slower beside them (``Hardware.overlap_slowdown``).
    While the window outlasts their hidden part, its compute falls behind by hidden x s / (1 + s); once they fill the
    window (the step already waits for them beyond it), only what of the slowed compute outlasts them:
    window - comm / (1 + s), never below 0."""
    hidden = comm - exposed
    if hidden <= 0:
        return 0.0
    if exposed > comm - window:  # exposed is what the window's edges leave (first / last), not what overflows it
        return hidden * slowdown / (1 + slowdown)
    return max(0.0, window - comm / (1 + slowdown))


def _data_parallel(shape, L, hw, links, *, m, act, sp, stage_layers, compute_mb, dp_axes, ov):
    """Data parallel: (stage parameters, exposed per micro-batch (sharded engines), exposed per step, host work per
    micro-batch left after overlap, the collectives' whole time per step before overlap, what their hidden part
    costs the compute beside it per step)."""
    tp, cp = L.tp, L.cp
    per_layer, first, last, _ = shape.local_params(tp, L.ep)
    stage_params = stage_layers * per_layer + max(first, last)
    fsdp_mb = step_dp = whole = slowed = 0.0
    s = hw.overlap_slowdown
    # host work beyond the eager per-op cost: DTensor dispatch of TP layers, ZeRO-3's hooks (below)
    host_mb = 0.0
    if tp > 1:
        host_mb = (stage_layers * (DTENSOR_OPS_SP_LAYER if sp else DTENSOR_OPS_TP_LAYER)
                   + DTENSOR_OPS_OUTSIDE_LAYERS) * hw.dtensor_op_s
    bwd_window = hw.overlap * compute_mb * 2 / 3
    pbytes, gbytes = act, overlap.GRAD_DTYPES[L.grad_reduce_dtype]  # gathers in the compute dtype
    if L.shards_params:
        shard_axes = DERIVED["fsdp"] if L.engine == "fsdp2" else DERIVED["loss"]  # FSDP2 over dp_shard x cp
        if L.engine == "fsdp2":  # one unit per block: gathered for forward and again for backward, reduced once
            n_gather, n_reduce, unit, red_unit = 2 * stage_layers, stage_layers, per_layer, per_layer
        else:  # ZeRO-3 fetches per module (one parameter tensor each here); reduces in reduce_bucket_size buckets
            tensors = _stage_tensors(shape, stage_layers)
            n_gather, unit = 2 * tensors, stage_params / tensors
            n_reduce = max(1, math.ceil(stage_params / DS_BUCKET))
            red_unit = stage_params / n_reduce
            host_mb += hw.zero3_hook_s * tensors
        gather = links.time("all_gather", unit * pbytes, shard_axes, n_gather)
        reduce = links.time("reduce_scatter", red_unit * gbytes, shard_axes, n_reduce)
        if L.engine == "fsdp2" and L.dp_replicate > 1:
            n_shard = links.placement(shard_axes)[0]
            reduce += links.time("all_reduce", unit * gbytes / n_shard, ("dp_replicate",), n_reduce)
        comm = gather + reduce
        whole = m * comm
        first_last = gather / n_gather + reduce / n_reduce  # the first unit's gather + the last unit's reduce
        fsdp_mb = max(first_last, comm - hw.overlap * compute_mb) if ov["prefetch"] else comm
        slowed = m * _stretch(comm, fsdp_mb, hw.overlap * compute_mb, s)
    elif L.dp * cp > 1:
        grad_b = stage_params * gbytes
        bucket = min(grad_b, DDP_BUCKET if L.engine == "ddp" else DS_BUCKET * gbytes)
        op = "all_reduce" if L.zero == 0 else "reduce_scatter"  # DDP and ZeRO-0 all-reduce
        n_red = math.ceil(grad_b / bucket)  # one collective per bucket: NCCL's latency paid per call
        red = links.time(op, grad_b / n_red, dp_axes, n_red)
        exposed_red = max(red / n_red, red - bwd_window) if ov["grad_reduce"] else red  # >= the last bucket
        n_red_calls = m if L.zero == 2 else 1
        slowed = n_red_calls * _stretch(red, exposed_red, bwd_window, s)
        if L.zero == 0:
            step_dp, whole = exposed_red, red
        else:  # ZeRO-1/2 all-gather the updated parameters after the step (allgather_bucket_size buckets); ZeRO-2
            # reduces every micro-batch
            n_gath = math.ceil(stage_params / DS_BUCKET)
            gath = links.time("all_gather", stage_params * pbytes / n_gath, dp_axes, n_gath)
            whole = n_red_calls * red + gath
            if ov["param_gather"]:  # bucket by bucket behind the next step's first forward: at least one bucket
                shown = max(gath / n_gath, gath - hw.overlap * compute_mb / 3)
                slowed += _stretch(gath, shown, hw.overlap * compute_mb / 3, s)
                gath = shown
            step_dp = n_red_calls * exposed_red + gath
    host_mb = max(0.0, host_mb - hw.overlap * compute_mb)  # host work hides only behind the device's compute
    return stage_params, fsdp_mb, step_dp, host_mb, whole, slowed


def _optimizer_time(shape, L, hw, *, stage_params, stage_layers) -> float:
    """The optimizer step on one rank: memory-bound over its shard, plus per-tensor host costs."""
    shard = L.dp * L.cp if (L.zero >= 1 or L.engine == "fsdp2") else 1
    if L.ep > 1 and shard > 1:  # expert slices shard over the dp·cp/ep ranks holding them
        stage_params += (L.ep - 1) * stage_layers * (shape.expert_params_per_layer() // L.ep)
    opt = stage_params / shard * OPT_BYTES / (hw.hbm_bw * HBM_FRACTION)
    opt += hw.optimizer_ops_per_tensor * _stage_tensors(shape, stage_layers) * hw.kernel_floor_s
    # torch-native sharded or composed models hold DTensor parameters (FSDP2 / HSDP; DDP over TP or PP through
    # the composable replicate); a per-tensor optimizer loop then pays DTensor dispatch on most of its ops
    if hw.optimizer_ops_per_tensor and (L.engine == "fsdp2" or (L.engine == "ddp" and (L.tp > 1 or L.pp > 1))):
        opt += DTENSOR_OPT_OPS * _stage_tensors(shape, stage_layers) * hw.dtensor_opt_op_s
    return opt
