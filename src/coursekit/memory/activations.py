"""Saved-for-backward activation bytes of one micro-batch, tensor by tensor, per implementation profile.

Every term below is one tensor (or one storage) that autograd keeps for backward, named after what it is. The terms
were read off ``transformers`` 5.x's Llama and GPT-2 modules and checked with ``coursekit.measure.activations`` (the
tests do this for a grid of shapes, dtypes and kernels, within 1 %). Each storage is counted once: a norm output read
by q, k and v is one term; GPT-2's q, k, v are views of one ``c_attn`` output, so a kernel that saves them pins
the whole ``b·s·3h`` buffer.

Profiles (``impl`` × ``kernels``):

- ``hf`` + ``cpu``  — HF modules as they are, run on CPU (what this course measures on a laptop).
- ``hf`` + ``cuda`` — HF modules on CUDA. Differs from CPU where the kernels do: dropout saves a 1-byte bool mask
  (CPU: a noise tensor in the activation dtype); SDPA with dropout stays on the flash kernel (CPU: falls back to the
  math path, which upcasts to fp32 and saves q, k, v, scores and masks); LayerNorm keeps fp32 mean/rstd (CPU: the
  activation dtype); fp32 SDPA runs the memory-efficient kernel (log-sum-exp padded to 32 rows), or the math path
  when grouped-query attention needs it. The CUDA profile is modelled from the kernels' signatures, not measured
  here (no GPU on the course machine).
- ``hf`` + ``meta`` — what a meta-device measurement records (exact shapes of a 70B graph in seconds): like CPU,
  except that SDPA always takes the math path and LayerNorm statistics are fp32.
- ``fused`` — flash attention (q, k, v, output, fp32 log-sum-exp; K/V at their own head count) and fused norms
  (save the input and fp32 statistics only), CUDA dropout masks; the MLP and loss stay as HF writes them.

Recompute: ``selective`` checkpoints the attention core (QKᵀ, softmax, dropout, ·V): only its inputs q, k, v and its
output stay; ``full`` checkpoints whole layers: one ``b·s·h`` input per layer stays; ``op`` (torchtitan's per-op
selective checkpoint) keeps each layer's input and the outputs of every second matmul
(``coursekit.memory.op_recompute``).
Parallelism: TP splits heads and FFN width (K/V heads: max(1, k/t)); sequence parallelism (``sp``) also splits the
residual-stream tensors (norms, dropout masks) over TP ranks; CP splits the sequence. ``cp_impl``: ring attention
keeps q, k, v, output and log-sum-exp of its own s/C rows (the flash terms at s/C, ``coursekit.cp.ring``);
Ulysses (``coursekit.cp.ulysses``) saves the same sizes head-sharded over the full sequence, *plus* the output once
more (SDPA's head-sharded output and o_proj's sequence-sharded input are two storages), and with fewer K/V heads
than C each rank keeps one replicated K/V head over all s tokens (b·s·d per tensor instead of b·(s/C)·k·d).
``position_ids``: ``shared`` — HF's default when the caller passes none, RoPE tables of shape (1, s); ``per-sequence``
— the caller passes (b, s) position ids (coursekit's trainer always does: a CP shard or a pipeline micro-batch needs
its own), and the cos/sin tables are b times larger.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from coursekit.memory import op_recompute
from coursekit.memory.errors import ConfigError, choice
from coursekit.memory.shapes import ModelShape
from coursekit.spec.run import ATTENTION, CP_IMPLS, RECOMPUTE  # noqa: F401 (the run description's choices)

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
IMPLS = ("hf", "fused")
KERNELS = ("cuda", "cpu", "meta")
POSITION_IDS = ("shared", "per-sequence")
# Tensors of the FFN width an activation function saves, not counting its output (which the next linear saves).
# silu/gelu/gelu_pytorch_tanh save their input; relu saves only its output; quick_gelu: x and sigmoid(1.702x);
# HF's gelu_new (0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))) saves x, tanh(...), 0.5·x and 1 + tanh(...).
ACTIVATION_SAVES = {"silu": 1, "swish": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "relu": 0, "quick_gelu": 2,
                    "gelu_new": 4}


@dataclass(frozen=True)
class ActivationReport:
    """Terms (name -> bytes) of one micro-batch. A pipeline stage holds its layers' terms, ``shared`` (RoPE
    tables, which every stage computes for itself), ``embed`` on the first stage and ``head`` on the last."""
    per_layer: dict[str, int]
    embed: dict[str, int]
    shared: dict[str, int]
    head: dict[str, int]
    layers: int
    attention_kernel: str
    notes: tuple[str, ...] = field(default=())
    recompute_layers: int | None = None
    """Full recompute of only the first N layers of each stage: the others hold ``plain_layer_bytes`` each, and a
    stage with such a layer keeps ``plain_shared`` (the RoPE tables its rotary saves) in place of ``shared``."""
    plain_layer_bytes: int = 0
    plain_shared: dict = field(default_factory=dict)

    @property
    def layer_bytes(self) -> int:
        return sum(self.per_layer.values())

    def layers_bytes(self, layers: int) -> int:
        """Saved bytes of ``layers`` consecutive layers of one stage (the first ``recompute_layers`` recomputed)."""
        if self.recompute_layers is None:
            return layers * self.layer_bytes
        n = min(layers, self.recompute_layers)
        return n * self.layer_bytes + (layers - n) * self.plain_layer_bytes

    def shared_bytes(self, layers: int) -> int:
        """The shared tables a stage of ``layers`` layers keeps."""
        whole = self.recompute_layers is not None and layers > self.recompute_layers
        return sum((self.plain_shared if whole else self.shared).values())

    @property
    def model(self) -> dict[str, int]:
        """Terms held once per model: embedding, shared tables, final norm and loss."""
        return {**self.embed, **self.shared, **self.head}

    @property
    def total_bytes(self) -> int:
        """Saved bytes of the whole model's forward, embedding to loss (each storage once)."""
        return (self.layers_bytes(self.layers) + sum(self.embed.values()) + self.shared_bytes(self.layers)
                + sum(self.head.values()))

    def stage_bytes(self, layers: int, first: bool, last: bool) -> int:
        """Saved bytes of one micro-batch on a pipeline stage holding ``layers`` layers."""
        return (self.layers_bytes(layers) + self.shared_bytes(layers) + (sum(self.embed.values()) if first else 0)
                + (sum(self.head.values()) if last else 0))


def attention_kernel(shape: ModelShape, *, dtype: str, attention: str, impl: str, kernels: str,
                     dropout: float) -> str:
    """Which attention implementation runs: eager | flash | efficient | math."""
    if impl == "fused":
        if attention == "eager":
            raise ConfigError("impl 'fused' means flash attention; use attention 'sdpa' (or impl 'hf' for eager)")
        return "flash"
    if attention == "eager":
        return "eager"
    if kernels == "meta":  # the meta device has no fused SDPA: always the (fp32-upcast) math path
        return "math"
    if kernels == "cpu":  # CPU SDPA: flash kernel unless dropout is on, then the math path
        return "math" if dropout > 0 else "flash"
    if dtype != "fp32" and shape.head_dim <= 256:
        return "flash"
    return "efficient" if shape.kv_heads == shape.heads else "math"


@lru_cache(maxsize=8192)  # a pure function of hashable inputs; grids and solvers repeat the same activations
def activation_bytes(shape: ModelShape, batch: int, seq: int, *, dtype: str = "bf16", attention: str = "sdpa",
                     impl: str = "hf", kernels: str = "cuda", recompute: str = "none", dropout: float | None = None,
                     tp: int = 1, sp: bool = False, cp: int = 1, cp_impl: str = "ring",
                     position_ids: str = "shared", ep: int = 1, expert_rows: int | None = None,
                     aux_loss: bool = False, sp_style: str | None = None) -> ActivationReport:
    """Saved activation bytes of one micro-batch of ``batch`` sequences of ``seq`` tokens, on one TP/CP rank.

    ``dropout`` overrides the shape's dropout rates (all of them) when given. A mixture of experts: ``ep`` 1 runs
    transformers' grouped_mm experts, ``ep`` > 1 ``coursekit.ep.dispatch``; ``expert_rows`` is the (token, choice)
    rows one layer's experts on this rank receive (default: a balanced router, tokens x top_k); ``aux_loss``: the
    router's load-balancing loss is computed (transformers' ``load_balancing_loss_func``). The report is
    cached and shared: treat it as read-only. ``sp_style`` (with ``sp``): which column-parallel linears save their
    input's sequence shard: megatron (Megatron-LM; ``coursekit.tp.megatron_sp``) or torch (torch's plan: the
    all-gathered input); None: as ``impl`` implies (fused: megatron, hf: torch).
    """
    sp, kernel, (p_attn, p_resid, p_embd) = _check(shape, seq, dtype=dtype, attention=attention, impl=impl,
                                                   kernels=kernels, recompute=recompute, dropout=dropout, tp=tp,
                                                   sp=sp, cp=cp, cp_impl=cp_impl, position_ids=position_ids)
    ulysses = cp > 1 and cp_impl == "ulysses"
    P = DTYPE_BYTES[dtype]  # activation dtype bytes
    cuda = impl == "fused" or kernels == "cuda"
    mask = 1 if cuda else P  # dropout mask: CUDA bool, CPU noise tensor in the activation dtype
    stat = 4 if (cuda or kernels == "meta" or dtype == "fp32") else P  # LayerNorm mean/rstd: CPU keeps the dtype
    h, d, f, V = shape.hidden, shape.head_dim, shape.ffn // tp, shape.vocab
    a, k = shape.heads // tp, max(1, shape.kv_heads // tp)
    s = seq // cp
    n = batch * s  # tokens of this rank inside attention / MLP
    n_res = n // tp if sp else n  # tokens of residual-stream tensors (norms, dropout masks)
    megatron = sp_style == "megatron" or (sp_style is None and impl == "fused")
    n_lin = n_res if sp and megatron else n  # saved input of a column-parallel linear (Megatron keeps the shard)
    ss = batch * a * s * s  # elements of one attention score matrix (causal is still stored dense)
    norm = lambda prefix: _norm(shape, prefix, impl=impl, P=P, stat=stat, h=h, n_res=n_res, n_lin=n_lin)  # noqa: E731

    t: dict[str, int] = {}
    if recompute == "full":
        t["layer_input(checkpoint)"] = P * n_res * h
    elif recompute == "op":  # torchtitan's per-op policy: coursekit.memory.op_recompute
        op_recompute.check(shape, tp=tp, cp=cp, ep=ep)
        t.update(op_recompute.layer_terms(shape, kernel, P=P, n=n, n_res=n_res, sp=sp, a=a, k=k, d=d, h=h, f=f,
                                          batch=batch, s=s, p_attn=p_attn, cuda=cuda, rng_state=_RNG_STATE))
    else:
        t.update(norm("attn_norm"))
        t.update(_attention(shape, kernel, recompute, P=P, n=n, a=a, k=k, d=d, h=h, tp=tp, ss=ss, batch=batch, s=s,
                            mask=mask, p_attn=p_attn, cuda=cuda, ulysses=cp if ulysses else 0))
        if p_resid > 0:
            t["attn_resid_dropout.mask"] = mask * n_res * h
        if shape.qk_norm:
            t.update(_qk_norm(impl=impl, P=P, n=n, a=a, k=k, d=d))
        t.update(norm("mlp_norm"))
        if shape.is_moe:  # TP's ranks split the sparse block's tokens (coursekit.tp.plan.token_split)
            n_moe = n // tp
            if tp > 1:  # what the router and experts save: the norm output's slice (a copy), or under SP the
                # norm's output itself, this rank's n/tp tokens either way
                t["mlp_norm.output"] = P * n_moe * h
            rows = n_moe * shape.top_k if expert_rows is None else expert_rows
            t.update(_moe(shape, P=P, n=n_moe, ep=ep, rows=rows))
        else:
            t.update(_mlp(shape, P=P, n=n, f=f))
        if p_resid > 0:
            t["mlp_dropout.mask"] = mask * n_res * h

    e: dict[str, int] = {"input_ids(int64)": 8 * batch * s}  # saved by the embedding backward
    if tp > 1 and impl == "hf":  # coursekit.tp.vocab: the ids this rank's rows do not hold, zeroed by masked_fill
        e["embedding.vocab_mask(bool)"] = batch * s
    sh: dict[str, int] = {}
    if shape.positions == "learned":
        e["position_ids(int64)"] = 8 * s  # shape (1, s)
    elif recompute not in ("full", "op"):
        # (1, s, d) each, or (b, s, d) from per-sequence position ids; shared by all layers (checkpoints hold them
        # otherwise)
        sh["rope_cos_sin"] = 2 * (batch if position_ids == "per-sequence" else 1) * s * d * P
    if recompute == "full" and kernel == "eager" and shape.arch == "gpt2":
        sh["causal_mask(checkpoint_arg)"] = P * batch * s * s  # GPT-2 hands its (b, 1, s, s) mask positionally
    if p_embd > 0:
        e["embedding_dropout.mask"] = mask * n_res * h
    # the trainer's SP (coursekit.tp.plan) all-gathers the last block's output: its final norm sees all n tokens;
    # Megatron's (fused) keeps the final norm sequence-parallel
    hd = (norm("final_norm") if impl == "fused" else
          _norm(shape, "final_norm", impl=impl, P=P, stat=stat, h=h, n_res=n, n_lin=n)) | _loss(batch, s, V // tp if impl == "fused" and V % tp == 0 else V)
    if shape.is_moe and aux_loss:  # softmax over every layer's router logits at once; the per-expert token shares
        hd |= {"moe.aux_loss.softmax": P * shape.layers * n * shape.experts,  # one per layer, n x E each
               "moe.aux_loss.tokens_per_expert_fp32": 4 * shape.experts}
    notes = ("SDPA runs its math path: q, k, v, scores and masks saved in fp32",) if kernel == "math" else ()
    nz = lambda dct: {k_: v for k_, v in dct.items() if v}  # noqa: E731
    return ActivationReport(nz(t), nz(e), nz(sh), nz(hd), shape.layers, kernel, notes)


def _check(shape, seq: int, *, dtype, attention, impl, kernels, recompute, dropout, tp, sp, cp, cp_impl,
           position_ids):
    """Refuse what is not modelled (ConfigError); returns (sp as it applies, the attention kernel, the dropout rates
    (attention, residual, embedding))."""
    if shape.is_moe and seq // cp % tp:
        raise ConfigError(f"tp ({tp}) splits a mixture-of-experts block's tokens: seq/cp ({seq // cp}) must be "
                          "divisible by it")
    choice("dtype", dtype, DTYPE_BYTES)
    choice("attention", attention, ATTENTION)
    choice("impl", impl, IMPLS)
    choice("kernels", kernels, KERNELS)
    choice("recompute", recompute, RECOMPUTE)
    choice("cp_impl", cp_impl, CP_IMPLS)
    choice("position_ids", position_ids, POSITION_IDS)
    if seq % cp:
        raise ConfigError(f"seq ({seq}) must be divisible by cp ({cp})")
    if shape.heads % tp or shape.ffn % tp or (shape.kv_heads % tp and tp % shape.kv_heads):
        raise ConfigError(f"tp ({tp}) must divide heads ({shape.heads}) and ffn ({shape.ffn}), and divide or be "
                          f"a multiple of kv_heads ({shape.kv_heads})")
    if sp and tp == 1:
        sp = False  # pragma: no mutate (equivalent: at tp 1, sp only divides token counts by tp = 1)
    if sp and seq // cp % tp:
        raise ConfigError(f"sequence parallelism needs seq/cp ({seq // cp}) divisible by tp ({tp})")
    p_attn = shape.attn_dropout if dropout is None else dropout
    p_resid = shape.resid_dropout if dropout is None else dropout
    p_embd = shape.embd_dropout if dropout is None else dropout
    if shape.arch == "llama":
        p_resid = p_embd = 0.0  # Llama has attention dropout only
    kernel = attention_kernel(shape, dtype=dtype, attention=attention, impl=impl, kernels=kernels, dropout=p_attn)
    if cp > 1 and kernel in ("eager", "math"):
        raise ConfigError("context parallelism needs a flash-style attention kernel (sdpa on CUDA, or fused)")
    if cp > 1 and cp_impl == "ulysses":
        a_, k_ = shape.heads // tp, max(1, shape.kv_heads // tp)
        if a_ % cp or (k_ % cp and cp % k_):
            raise ConfigError(f"Ulysses splits heads: cp ({cp}) must divide the query heads per TP rank ({a_}), and "
                              f"divide or be a multiple of their K/V heads ({k_})")
        if recompute == "selective":
            raise ConfigError("selective recompute with cp_impl ulysses is not modelled (the checkpoint boundary "
                              "against the all-to-alls decides what stays)")
    if shape.activation not in ACTIVATION_SAVES:
        raise ConfigError(f"unknown activation {shape.activation!r}; known: {', '.join(ACTIVATION_SAVES)}")
    return sp, kernel, (p_attn, p_resid, p_embd)


def _norm(shape, prefix: str, *, impl, P, stat, h, n_res, n_lin) -> dict[str, int]:
    """What one norm saves: its input (and statistics); its output saved by the next linear (``n_lin`` tokens)."""
    if impl == "fused":  # fused kernel: input + fp32 statistics; the output is saved by the next linear
        stats = 4 * n_res * (2 if shape.norm == "layernorm" else 1)
        return {f"{prefix}.input": P * n_res * h, f"{prefix}.stats_fp32": stats, f"{prefix}.output": P * n_lin * h}
    if shape.norm == "rmsnorm":  # HF LlamaRMSNorm in Python: x.float(), x·rsqrt(mean(x²)), weight·that.to(dtype)
        return {f"{prefix}.input_fp32": 4 * n_res * h, f"{prefix}.rsqrt_fp32": 4 * n_res,
                f"{prefix}.normalized": P * n_res * h, f"{prefix}.output": P * n_lin * h}
    return {f"{prefix}.input": P * n_res * h, f"{prefix}.mean_rstd": 2 * stat * n_res,  # nn.LayerNorm
            f"{prefix}.output": P * n_lin * h}


def _mlp(shape, *, P, n, f) -> dict[str, int]:
    """What the MLP saves on one TP rank (``f``: its FFN slice)."""
    saves = ACTIVATION_SAVES.get(shape.activation, 1)  # pragma: no mutate (equivalent: _check refuses others)
    if shape.mlp == "swiglu":  # act(gate(x)) * up(x) -> down
        return {"mlp.activation_saved": saves * P * n * f,  # the gate output (and any act internals)
                "mlp.act_out": P * n * f,  # saved by the multiply
                "mlp.up_out": P * n * f,  # saved by the multiply
                "mlp.product(down_input)": P * n * f}
    return {"mlp.activation_saved": saves * P * n * f, "mlp.act_out(proj_input)": P * n * f}  # fc -> act -> proj


def _qk_norm(*, impl, P, n, a, k, d) -> dict[str, int]:
    """Qwen3's RMSNorm over each query and key head (``n`` tokens, ``a`` / ``k`` heads of ``d`` on this rank); its
    output goes to RoPE, which saves only cos and sin."""
    if impl == "fused":
        return {"attn.q_norm.input": P * n * a * d, "attn.q_norm.rstd_fp32": 4 * n * a,
                "attn.k_norm.input": P * n * k * d, "attn.k_norm.rstd_fp32": 4 * n * k}
    return {"attn.q_norm.input_fp32": 4 * n * a * d, "attn.q_norm.rsqrt_fp32": 4 * n * a,
            "attn.q_norm.normalized": P * n * a * d, "attn.k_norm.input_fp32": 4 * n * k * d,
            "attn.k_norm.rsqrt_fp32": 4 * n * k, "attn.k_norm.normalized": P * n * k * d}


def _moe(shape, *, P, n, ep, rows) -> dict[str, int]:
    """A sparse MLP block on one rank: the router (its input is the norm output, counted there) and the experts over
    ``S = n·top_k`` (token, choice) rows, of which this rank's experts compute ``rows``.

    Router (fp32 probabilities, as transformers computes them): softmax output, top-k ids, and with renormalised
    weights (Mixtral; Qwen3-MoE's norm_topk_prob) the sum and the divided weights. The weights enter the experts in
    the router's dtype: fp32 (Mixtral keeps it), the activation dtype (Qwen3-MoE casts back).
    """
    E, f, h, S = shape.experts, shape.moe_ffn, shape.hidden, n * shape.top_k
    W = 4 if shape.family == "mixtral" else P
    t = {"moe.router.softmax_fp32": 4 * n * E, "moe.router.topk_ids(int64)": 8 * S}
    if shape.norm_topk:
        t |= {"moe.router.topk_sum_fp32": 4 * n, "moe.router.topk_weights_fp32": 4 * S}
    expert = {"moe.experts.gate_up_out": P * rows * 2 * f,  # silu's input is a view of it; so is up
              "moe.experts.act_out": P * rows * f, "moe.experts.product(down_input)": P * rows * f}
    if ep == 1:  # transformers' grouped_mm_experts_forward: sort, gather, two grouped GEMMs, weight, unsort, sum
        return t | expert | {
            "moe.sort.perm(int64)": 8 * S, "moe.sort.token_of_row(int64)": 8 * S, "moe.offsets(int32)": 4 * E,
            "moe.experts.rows_in": P * S * h, "moe.weights_sorted": W * S, "moe.experts.down_out": P * S * h,
            "moe.unsort.inverse(int64)": 8 * S}
    # coursekit.ep.dispatch: token ids, the received rows regrouped by expert, results back, weighted, added
    return t | expert | {
        "moe.dispatch.token_of_row(int64)": 8 * S, "moe.dispatch.order(int64)": 8 * S,
        "moe.dispatch.rows_sent": P * S * h,  # the all-to-all's input, held by its autograd node
        "moe.experts.by_expert(int64)": 8 * rows, "moe.experts.rows_in": P * rows * h,
        "moe.experts.unsort(int64)": 8 * rows, "moe.combine.rows_back": P * S * h, "moe.weights_sorted": W * S}


def _loss(batch: int, s: int, v_loc: int) -> dict[str, int]:
    """The loss's saved tensors (``v_loc``: the vocabulary on this rank: fused runs a vocab-parallel cross-entropy)."""
    # shift_labels = pad(labels)[..., 1:].contiguous(): a copy, except for one sequence, where the slice is already
    # contiguous and pins the padded (1, s+1) buffer
    return {"loss.log_softmax_fp32": 4 * batch * s * v_loc,  # HF upcasts logits to fp32; log_softmax saves its output
            "loss.labels(int64)": 8 * (s + 1) if batch == 1 else 8 * batch * s, "loss.total_weight": 4}


# the philox seed and offset a CUDA kernel returns for its backward (torch's meta registrations of the kernels):
# flash a (2,) uint64 RNG state and a () uint64 offset, memory-efficient two int64 scalars
_RNG_STATE = {"flash": 24, "efficient": 16}


def _attention(shape, kernel, recompute, *, P, n, a, k, d, h, tp, ss, batch, s, mask, p_attn, cuda,
               ulysses=0) -> dict[str, int]:
    """The attention block between the norm output and o_proj's saved input (``ulysses``: its degree C, or 0)."""
    t: dict[str, int] = {}
    if ulysses and kernel in ("flash", "efficient"):  # the local kernel sees a/C heads of all S = s·C tokens
        C, S = ulysses, s * ulysses
        kv = batch * S * d * max(1, k // C)  # K/V elements: k/C heads, or one replicated head when k < C
        rows = S if kernel == "flash" else -(-S // 32) * 32
        t = {"attn.q_heads(ulysses)": P * n * a * d, "attn.k_heads(ulysses)": P * kv,
             "attn.v_heads(ulysses)": P * kv, "attn.logsumexp_fp32": 4 * batch * (a // C) * rows,
             "attn.out_heads(ulysses)": P * n * a * d,  # SDPA's output, before the all-to-all back
             "attn.core_out(o_proj_input)": P * n * a * d}
        if cuda and p_attn > 0:
            t["attn.rng_state"] = _RNG_STATE[kernel]
        return t
    fused_qkv = shape.arch == "gpt2"  # q, k, v are views of one c_attn output
    # Tensors entering the attention core as the model hands them over:
    if fused_qkv:
        core_inputs = {"attn.qkv_out(c_attn)": P * n * (a + 2 * k) * d}
    else:  # q, k after RoPE (new tensors); v is a view of v_proj's output
        core_inputs = {"attn.q_rope": P * n * a * d, "attn.k_rope": P * n * k * d, "attn.v": P * n * k * d}
    out = {"attn.core_out(o_proj_input)": P * n * a * d}
    if recompute == "selective":
        return {**core_inputs, **out}
    if kernel in ("flash", "efficient"):
        t.update(core_inputs)
        rows = s if kernel == "flash" else -(-s // 32) * 32  # mem-efficient pads log-sum-exp rows to 32
        t["attn.logsumexp_fp32"] = 4 * batch * a * rows
        if cuda and p_attn > 0:
            t["attn.rng_state"] = _RNG_STATE[kernel]  # philox seed + offset
    elif kernel == "eager":
        # matmul copies q and kᵀ (K repeated to all heads for GQA) into contiguous (b·a, s, d) operands
        # (b·a, s, d) operands: the repeat for GQA (1 < k < a) copies; with one KV head (MQA) it is a stride-0 view,
        # and for one sequence matmul's reshape of that view is a view too: k and v then pin only their k·d storage
        kv_view = not fused_qkv and k == 1 and a > 1 and batch == 1
        kv_bytes = P * n * (k if kv_view else a) * d
        t["attn.q_matmul"] = P * n * a * d
        t["attn.k_matmul"] = kv_bytes
        if shape.arch == "llama":  # softmax(dtype=float32), then .to(dtype)
            t["attn.softmax_fp32"] = 4 * ss
            if P != 4 or p_attn > 0:
                t["attn.probs"] = P * ss  # the cast probs, or dropout's output, feed ·V
        else:  # GPT-2: softmax in the activation dtype
            t["attn.softmax"] = P * ss
            if p_attn > 0:
                t["attn.probs_dropped"] = P * ss
        if p_attn > 0:
            t["attn.dropout_mask"] = mask * ss
        t["attn.v_matmul"] = kv_bytes
    else:  # SDPA math path: fp32 (CPU upcasts reduced precision), K/V repeated to all heads
        t["attn.q_scaled_fp32"] = 4 * n * a * d
        t["attn.k_scaled_fp32"] = 4 * n * a * d
        t["attn.softmax_fp32"] = 4 * ss
        if p_attn > 0:
            t["attn.dropout_mask"] = (4 if not cuda else 1) * ss
            t["attn.probs_dropped_fp32"] = 4 * ss
        t["attn.v_fp32"] = 4 * n * a * d
        if fused_qkv and P == 4 and batch == 1:  # fp32, one sequence: v's reshape is a view pinning c_attn's output
            t["attn.v_fp32"] = 4 * n * (a + 2 * k) * d
    t.update(out)
    return t
