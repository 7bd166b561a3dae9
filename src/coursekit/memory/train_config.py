"""A training configuration for the calculator: keyword-only, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, fields

from coursekit.memory.activations import ATTENTION, CP_IMPLS, DTYPE_BYTES, IMPLS, KERNELS, POSITION_IDS, RECOMPUTE
from coursekit.memory.errors import ConfigError, choice, positive_int
from coursekit.memory.gpus import GiB
from coursekit.memory import engines, pp_order
from coursekit.memory.states import OFFLOAD, OPTIMIZERS, PRECISIONS
from coursekit.memory.qlora import TARGETS as LORA_TARGETS
from coursekit.spec.run import SP_STYLES

PP_SCHEDULES = pp_order.MODELLED
PP_RUNTIMES = ("torch", "megatron")
DEFAULT_RUNTIME_BYTES = 1 * GiB
DEFAULT_BUCKET_ELEMS = 500_000_000  # DeepSpeed's reduce_bucket_size / allgather_bucket_size defaults (5e8)
DEFAULT_SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's zero_optimization.sub_group_size default (1e9)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    batch: int
    """Micro-batch: sequences per rank per forward pass (the trainer's --micro-batch)."""
    seq: int
    """Tokens per sequence."""
    dtype: str = "bf16"
    """Activation / compute dtype: bf16, fp16 or fp32."""
    precision: str | None = None
    """Model-state convention: 16psi, 18psi, 20psi, fp32 (None: 16psi for bf16/fp16, fp32 for fp32). fp32 with dtype
    bf16 is torch autocast (fp32 weights, grads and states; bf16 compute), as coursekit's trainer runs --dtype bf16."""
    optimizer: str = "adamw"
    """adamw / adam (2 states), sgd (momentum, 1), sgd-nomomentum (0), lion (1)."""
    attention: str = "sdpa"
    """Attention implementation as HF names it: sdpa or eager."""
    impl: str = "hf"
    """hf: transformers' modules as they are; fused: flash attention + fused norms."""
    kernels: str = "cuda"
    """Which kernels run the hf modules: cuda, or cpu (to compare with a CPU measurement)."""
    recompute: str = "none"
    """Activation recomputation: none, selective (attention core), full (whole layers)."""
    recompute_layers: int | None = None
    """With recompute full: only the first N layers of each pipeline stage (model chunk) are recomputed, the rest
    keep all their activations (Megatron's --recompute-method block --recompute-num-layers N); None: every layer."""
    dropout: float | None = None
    """Override every dropout rate of the model (None: the model config's rates)."""
    dp: int | None = None
    """Data-parallel degree (None: world / (tp·pp·cp), or 1)."""
    world: int | None = None
    """Total ranks; must equal dp·tp·pp·cp (give dp or world or both)."""
    zero: int = 0
    """DeepSpeed ZeRO stage 0-3 (engine deepspeed)."""
    engine: str = "deepspeed"
    """Data-parallel engine (``coursekit.memory.engines``): deepspeed (ZeRO semantics), fsdp2, ddp. The trainer's
    strategies name engine and stage together (``coursekit.memory.vocab``: zero3 = deepspeed + zero 3)."""
    fsdp_reshard: bool | int = True
    """FSDP2 reshard_after_forward: True frees each unit after its forward; False keeps all unsharded to backward; an
    int N (dividing the shard degree) keeps each block resharded over N ranks (1/N of its gathered copy, compute
    dtype) from forward to backward, where it is all-gathered over those N only (torch: N = shard degree is True)."""
    ddp_bucket_view: bool = True
    """DDP gradient_as_bucket_view (coursekit's trainer: True): each .grad is a view into the reducer's buckets, so
    gradients cost their bytes once; False (torch's default): the buckets are a second copy of all gradients."""
    hsdp_shard: int | None = None
    """HSDP: shard group size, the trainer's --dp-shard (dp = replicas x shard group); None: shard over all of dp."""
    tp: int = 1
    """Tensor-parallel degree."""
    sp: bool = False
    """Sequence parallelism over the TP group (Megatron-style)."""
    sp_style: str | None = None
    """With sp: megatron (the column-parallel linears save their input's sequence shard) or torch (torch's plan:
    the all-gathered input); None: as impl implies (fused: megatron, hf: torch)."""
    pp: int = 1
    """Pipeline-parallel degree."""
    cp: int = 1
    """Context-parallel degree (splits the sequence)."""
    aux_loss: bool = True
    """Mixture of experts: the router's load-balancing loss is computed (the trainer's default; its
    --router-aux-loss-coef 0 turns it off)."""
    ep: int = 1
    """Expert-parallel degree (mixture-of-experts models): each rank keeps experts/ep of every layer's experts; the
    ep ranks are borrowed from the dp · cp ranks (it must divide them), as the trainer's --ep does."""
    cp_impl: str = "ring"
    """Context-parallel attention (the trainer's --cp-impl): ring, or ulysses (saves the attention output twice and,
    with fewer K/V heads than cp, one replicated K/V head over the whole sequence)."""
    position_ids: str = "shared"
    """shared: RoPE tables (1, s), HF's default without position ids; per-sequence: (b, s) position ids passed in,
    as coursekit's trainer does (RoPE tables b times larger)."""
    microbatches: int | None = None
    """Micro-batches per optimizer step, the trainer's --grad-accum (under pp: the schedule's); None: pp."""
    pp_schedule: str = "gpipe"
    """The trainer's default, gpipe: every stage holds all its micro-batches; 1f1b: stage i holds min(pp - i, microbatches) micro-batches of activations; gpipe: all of them;
    interleaved-1f1b, looped-bfs and interleaved-zb: pp_virtual stages per rank; zbv and dualpipev: two in a V; held
    along the schedule's order (coursekit.memory.pp_order: warm-up + 1 chunk micro-batches for interleaved-1f1b, all
    pp_virtual·microbatches for looped-bfs; the zero-bubble schedules hold a micro-batch from its forward to its
    weight pass)."""
    pp_virtual: int | None = None
    """Stages per pipeline rank (interleaved-1f1b, looped-bfs, interleaved-zb: v of the v·pp stages; zbv, dualpipev:
    2); None: as coursekit's trainer runs the schedule (2 for those five, 1 for gpipe and 1f1b)."""
    pp_runtime: str = "torch"
    """torch: torch.distributed.pipelining as coursekit's trainer (and torchtitan) runs it: every micro-batch's ids,
    labels and receive buffer stay allocated for the whole step (measured); megatron: a micro-batch's inputs exist
    only while it is in flight (Megatron-LM, DeepSpeed's pipeline engine)."""
    offload: str = "none"
    """Optimizer-state offload: none, cpu, nvme."""
    offload_params: str = "none"
    """Parameter offload (ZeRO-3 / FSDP2): none, cpu, nvme."""
    dp_rank: int | None = None
    """Which data-parallel (sharding) rank to report: DeepSpeed ZeRO-1/2 ranks hold slightly different gradient
    bytes (see coursekit.memory.deepspeed); None: the rank holding the most."""
    gpu: str | None = None
    """GPU name for the fit check (see coursekit.memory.gpus)."""
    runtime_bytes: int = DEFAULT_RUNTIME_BYTES
    """Stated GPU runtime constant: CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers (typically 0.5-2 GiB)."""
    bucket_elems: int = DEFAULT_BUCKET_ELEMS
    """DeepSpeed reduce / all-gather bucket size in elements."""
    sub_group_size: int = DEFAULT_SUB_GROUP_SIZE
    """DeepSpeed ZeRO-3 zero_optimization.sub_group_size in elements: the optimizer step builds the fp32 gradient
    partition of one sub-group at a time (``coursekit.memory.deepspeed.zero3_sub_groups``)."""
    qlora: bool = False
    """QLoRA (engine fsdp2): a frozen 4-bit NF4 base (every block projection) with trainable LoRA adapters
    (``coursekit.memory.qlora``: NF4 data + scalers sharded, adapters, their gradients and optimizer states)."""
    lora_rank: int = 8
    """QLoRA: the adapters' rank r (lora_A is r x in, lora_B out x r)."""
    lora_targets: tuple[str, ...] = LORA_TARGETS
    """QLoRA: the projections that get adapters (all seven are quantized either way)."""
    nf4_block: int = 64
    """QLoRA: NF4 block size (elements per int8 scaler; torchao's default)."""
    nf4_scaler_block: int = 256
    """QLoRA: scalers per fp32 factor (double quantization; torchao's default)."""

    def __post_init__(self):
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        s("batch", positive_int("batch", self.batch))
        s("seq", positive_int("seq", self.seq))
        choice("dtype", self.dtype, DTYPE_BYTES)
        if self.precision is None:
            s("precision", "fp32" if self.dtype == "fp32" else "16psi")
        choice("precision", self.precision, PRECISIONS)
        if self.precision == "fp32" and self.dtype != "fp32" and not getattr(engines.REGISTRY.get(self.engine),
                                                                           "autocast", False):
            amp = " or ".join(n for n, e in engines.REGISTRY.items() if e.autocast)
            raise ConfigError(f"precision fp32 keeps fp32 weights; use dtype fp32 (or a 16/18/20psi precision); fp32 "
                              f"weights with {self.dtype} compute (torch autocast) are modelled for engine {amp}")
        choice("optimizer", self.optimizer, OPTIMIZERS)
        choice("attention", self.attention, ATTENTION)
        choice("impl", self.impl, IMPLS)
        choice("kernels", self.kernels, KERNELS)
        choice("recompute", self.recompute, RECOMPUTE)
        if self.sp_style is not None:
            choice("sp_style", self.sp_style, SP_STYLES)
        if self.recompute_layers is not None:
            s("recompute_layers", positive_int("recompute_layers", self.recompute_layers))
            if self.recompute != "full":
                raise ConfigError(f"recompute_layers needs recompute full, got recompute {self.recompute!r}")
        choice("engine", self.engine, engines.REGISTRY)
        choice("pp_schedule", self.pp_schedule, PP_SCHEDULES)
        choice("pp_runtime", self.pp_runtime, PP_RUNTIMES)
        choice("cp_impl", self.cp_impl, CP_IMPLS)
        choice("position_ids", self.position_ids, POSITION_IDS)
        choice("offload", self.offload, OFFLOAD)
        choice("offload_params", self.offload_params, OFFLOAD)
        if self.dropout is not None and (not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1):
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for k in ("tp", "pp", "cp", "ep"):
            s(k, positive_int(k, getattr(self, k)))
        if self.pp_virtual is not None:
            s("pp_virtual", positive_int("pp_virtual", self.pp_virtual))
            self._check_pp_virtual()
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ConfigError(f"zero stage must be 0, 1, 2 or 3, got {self.zero!r}")
        model_par = self.tp * self.pp * self.cp
        if self.world is not None:
            s("world", positive_int("world", self.world))
            if self.world % model_par:
                raise ConfigError(f"world ({self.world}) is not divisible by tp·pp·cp = "
                                  f"{self.tp}·{self.pp}·{self.cp} = {model_par}")
            if self.dp is not None and positive_int("dp", self.dp) * model_par != self.world:
                raise ConfigError(f"dp·tp·pp·cp = {self.dp}·{model_par} != world ({self.world})")
            s("dp", self.world // model_par)
        s("dp", positive_int("dp", 1 if self.dp is None else self.dp))
        s("world", self.dp * model_par)
        if self.hsdp_shard is not None:
            s("hsdp_shard", positive_int("hsdp_shard", self.hsdp_shard))
            if not engines.get(self.engine).hybrid_shard:
                hybrid = " or ".join(n for n, e in engines.REGISTRY.items() if e.hybrid_shard)
                raise ConfigError(f"hsdp_shard is an FSDP2 (HSDP) option; set engine {hybrid}")
            if self.dp % self.hsdp_shard:
                raise ConfigError(f"dp ({self.dp}) is not divisible by the HSDP shard group ({self.hsdp_shard})")
        if self.zero not in engines.get(self.engine).zero_stages:
            raise ConfigError(f"zero stages are DeepSpeed's; engine {self.engine!r} needs zero 0")
        if self.microbatches is not None:
            s("microbatches", positive_int("microbatches", self.microbatches))
        else:
            s("microbatches", self.pp)
        if self.seq % self.cp:
            raise ConfigError(f"seq ({self.seq}) is not divisible by cp ({self.cp})")
        if (self.dp * self.cp) % self.ep:
            raise ConfigError(f"ep ({self.ep}) does not divide the dp·cp = {self.dp * self.cp} ranks it borrows")
        if self.ep > 1 and self.engine not in ("ddp", "fsdp2"):
            raise ConfigError(f"ep is modelled with engines ddp and fsdp2 (as the trainer runs it), not {self.engine}")
        if self.sp and self.tp > 1 and (self.seq // self.cp) % self.tp:
            raise ConfigError(f"sequence parallelism needs seq/cp ({self.seq // self.cp}) divisible by tp ({self.tp})")
        if self.dp_rank is not None:
            s("dp_rank", positive_int("dp_rank", self.dp_rank, allow_zero=True))
            if self.dp_rank >= self.shard_degree:
                raise ConfigError(f"dp_rank ({self.dp_rank}) must be below the sharding degree ({self.shard_degree})")
        s("runtime_bytes", positive_int("runtime_bytes", self.runtime_bytes, allow_zero=True))
        s("bucket_elems", positive_int("bucket_elems", self.bucket_elems))
        s("sub_group_size", positive_int("sub_group_size", self.sub_group_size))
        self._check_fsdp_options(s)

    def _check_pp_virtual(self):
        one = self.pp_schedule in pp_order.SINGLE_STAGE
        if one and self.pp_virtual != 1:
            raise ConfigError(f"pp_schedule {self.pp_schedule} keeps one stage per rank (pp_virtual 1, not "
                              f"{self.pp_virtual}); interleaved-1f1b or looped-bfs keep several")
        if not one and self.pp_virtual < 2:
            raise ConfigError(f"pp_schedule {self.pp_schedule} keeps several stages per rank: pp_virtual >= 2 "
                              f"(with one, use 1f1b or gpipe)")
        if self.pp_schedule in pp_order.V_SHAPE and self.pp_virtual != 2:
            raise ConfigError(f"pp_schedule {self.pp_schedule} keeps exactly two stages per rank in a V "
                              f"(pp_virtual 2, not {self.pp_virtual})")

    def _check_fsdp_options(self, s) -> None:
        r = self.fsdp_reshard
        if not isinstance(r, bool):
            n = positive_int("fsdp_reshard", r)
            if self.engine != "fsdp2":
                raise ConfigError("fsdp_reshard N (reshard to a smaller group) is FSDP2's; set engine fsdp2")
            if self.shard_degree % n:
                raise ConfigError(f"fsdp_reshard {n} must divide the {self.shard_degree} sharding ranks")
            s("fsdp_reshard", True if n == self.shard_degree else False if n == 1 else n)  # as torch reads it
        targets = self.lora_targets
        s("lora_targets", tuple(t.strip() for t in targets.split(",")) if isinstance(targets, str) else tuple(targets))
        for k in ("lora_rank", "nf4_block", "nf4_scaler_block"):
            s(k, positive_int(k, getattr(self, k)))
        defaults = {f.name: f.default for f in fields(self)}
        lora = ("lora_rank", "lora_targets", "nf4_block", "nf4_scaler_block")
        if not self.qlora and any(getattr(self, k) != defaults[k] for k in lora):
            raise ConfigError("lora_rank, lora_targets and the nf4 block sizes are QLoRA's: set qlora")
        if self.qlora and self.engine != "fsdp2":
            raise ConfigError("qlora is modelled for engine fsdp2 (FSDP2 shards NF4 data and scalers); set engine "
                              "fsdp2 (strategy fsdp2 or hsdp)")

    @property
    def shard_degree(self) -> int:
        """Ranks that shard one model-state replica (ZeRO / FSDP2): dp (or the HSDP shard group) times cp."""
        return (self.hsdp_shard or self.dp) * self.cp

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
