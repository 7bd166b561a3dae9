"""QLoRA under FSDP2, per rank (pure Python): a frozen 4-bit NF4 base with trainable LoRA adapters, sharded by
``fully_shard`` per block then the root (``coursekit.fsdp.qlora`` builds it; the ``fsdp2`` engine asks this module).

    coursekit memory --model llama3-8b --micro-batch 1 --seq 2048 --strategy fsdp2 --dp-shard 8 --qlora --lora-rank 16

What one rank of N holds (measured on 2 gloo ranks in tests/test_fsdp_qlora.py):

- NF4 base, every q/k/v/o/gate/up/down weight of n elements (torchao ``NF4Tensor``; FSDP2 shards each inner tensor
  on dim 0, so each must split evenly over N): 4-bit data n/2 bytes, int8 block scalers n/block, fp32 scaler factors
  4·n/(block·scaler_block), all divided by N, plus a replicated fp32 mean and 16-entry NF4 table (68 bytes);
- the unquantized rest (embeddings, norms, head, biases; Qwen3's q/k head norms; Qwen2's o_proj has no bias):
  frozen, in the master dtype, FSDP2's padded dim-0 shards (dense models only: an MoE layer's experts are refused);
- LoRA adapters on the targeted projections: lora_A (r, in) and lora_B (out, r), padded dim-0 shards, with their
  gradients (same layout) and AdamW states (``zeros_like`` the unpadded local rows, plus one fp32 step each).

Gathered units: a block's all-gather output is its NF4 data + scalers + factors whole, its adapters and its norms
(the gathered NF4Tensor shares the rank's mean and table); only the adapters' gradients are reduce-scattered.
"""
from __future__ import annotations

from coursekit.memory.errors import ConfigError

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NF4_TABLES = 4 + 16 * 4  # replicated per quantized weight: the fp32 scaler mean and the 16-value NF4 code book


def projections(shape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each Llama block projection."""
    h, f, qw, kw = shape.hidden, shape.ffn, shape.q_width, shape.kv_width
    return {"q_proj": (h, qw), "k_proj": (h, kw), "v_proj": (h, kw), "o_proj": (qw, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


def lora_params(shape, r: int, targets=TARGETS) -> int:
    """Trainable adapter parameters: r·(in + out) per targeted projection per layer."""
    p = projections(shape)
    return shape.layers * sum(r * (p[t][0] + p[t][1]) for t in targets)


def nf4_pieces(n: int, block: int, scaler_block: int) -> tuple[int, int, int]:
    """Bytes of the 4-bit data, int8 block scalers and fp32 scaler factors of an n-element NF4 weight."""
    return n // 2, n // block, 4 * (n // block // scaler_block)


def check(shape, c) -> None:
    """Refuse what torchao's NF4Tensor or this model refuses, with the reason."""
    if shape.arch != "llama":
        raise ConfigError(f"qlora is modelled for Llama-style projections ({', '.join(TARGETS)}), not {shape.arch}")
    if shape.experts:
        raise ConfigError(f"qlora is modelled for dense blocks (one gate/up/down MLP), not {shape.experts} experts: "
                          "an MoE layer's experts are other tensors (fused per layer, not nn.Linear)")
    if c.tp > 1 or c.pp > 1:
        raise ConfigError("qlora is modelled for FSDP2 / HSDP without tp or pp")
    if c.offload != "none" or c.offload_params != "none":
        raise ConfigError("qlora with CPU offload is not modelled")
    if not isinstance(c.fsdp_reshard, bool):
        raise ConfigError("qlora with reshard to N ranks: torch 2.13's FSDP2 refuses it (a post-forward reshard "
                          "needs one all-gather output per parameter; an NF4Tensor gathers three: data, scalers, "
                          "factors)")
    bad = [t for t in c.lora_targets if t not in TARGETS]
    if bad or not c.lora_targets:
        raise ConfigError(f"lora targets must be among {', '.join(TARGETS)}, got {', '.join(c.lora_targets) or '-'}")
    N, b, sb = c.shard_degree, c.nf4_block, c.nf4_scaler_block
    for name, (i, o) in projections(shape).items():
        n = i * o
        if n % 2:
            raise ConfigError(f"NF4 packs two 4-bit codes a byte: {name} ({o}x{i} = {n} elements) must have an even "
                              "number of elements (torchao's NF4Tensor refuses an odd one)")
        if n % b or (n // b) % sb:
            raise ConfigError(f"NF4 block sizes must divide {name} ({o}x{i} = {n} elements): need n % block == 0 and "
                              f"(n / block) % scaler_block == 0 (block {b}, scaler_block {sb}; "
                              f"coursekit.fsdp.qlora's tiny models use 32 / 8)")
        if any(x % N for x in (n // 2, n // b, n // b // sb)):
            raise ConfigError(f"FSDP2 shards each NF4 inner tensor of {name} evenly over {N} ranks: its "
                              f"{n // 2} data bytes, {n // b} scalers and {n // b // sb} factors must all divide by {N}")


def unit_dims(shape, c):
    """Per ``fully_shard`` unit (each block, then the root): (NF4 weight sizes, adapter dims, frozen dims), dims as
    (dim 0, elements per dim-0 row) in the master dtype."""
    h, V, r = shape.hidden, shape.vocab, c.lora_rank
    p = projections(shape)
    bias = {"q_proj": shape.qkv_bias, "k_proj": shape.qkv_bias, "v_proj": shape.qkv_bias, "o_proj": shape.o_bias,
            "gate_proj": shape.mlp_bias, "up_proj": shape.mlp_bias, "down_proj": shape.mlp_bias}
    weights = [i * o for i, o in p.values()]
    adapters = [d for t in c.lora_targets for d in ((r, p[t][0]), (p[t][1], r))]
    qk_norms = [(shape.head_dim, 1)] * 2 if shape.qk_norm else []  # qwen3's RMSNorm over each q and k head
    frozen = [(p[t][1], 1) for t in TARGETS if bias[t]] + qk_norms + [(h, 1), (h, 1)]  # biases, norms, two RMSNorms
    root = [(V, h), (h, 1)] + ([] if shape.tied_embeddings else [(V, h)])
    return [(weights, adapters, frozen)] * shape.layers + [([], [], root)]


def breakdown(shape, c, *, store: int, compute: int, state: int, counter: int) -> dict:
    """One rank's bytes by kind, its gathered and reduced units, the trainable count. ``store``: bytes of a sharded
    element (the master dtype), ``compute``: of a gathered one, ``state``: optimizer-state bytes per trainable
    element, ``counter``: per trainable tensor (AdamW's fp32 step)."""
    from coursekit.memory.states import local_rows

    N, rank = c.shard_degree, c.dp_rank if c.dp_rank is not None else 0
    padded = lambda dims: sum(-(-d0 // N) * rest for d0, rest in dims)  # noqa: E731 - rows every rank allocates
    full = lambda dims: sum(-(-d0 // N) * N * rest for d0, rest in dims)  # noqa: E731 - the all-gather output
    local = lambda dims: sum(local_rows(d0, N, rank) * rest for d0, rest in dims)  # noqa: E731
    out = dict(nf4_base=0, frozen_rest=0, adapters=0, adapter_grads=0, adapter_optimizer=0, adapter_local=0)
    gathered, reduced = [], []
    for weights, adapters, frozen in unit_dims(shape, c):
        nf4 = sum(sum(nf4_pieces(n, c.nf4_block, c.nf4_scaler_block)) for n in weights)
        out["nf4_base"] += nf4 // N + NF4_TABLES * len(weights)
        out["frozen_rest"] += store * padded(frozen)
        out["adapters"] += store * padded(adapters)
        out["adapter_local"] += local(adapters)
        gathered.append(nf4 + compute * (full(adapters) + full(frozen)))
        reduced.append(4 * full(adapters))  # FSDP2 reduces in fp32 (MixedPrecisionPolicy's reduce dtype)
    out["adapter_grads"] = out["adapters"]
    n_tensors = 2 * len(c.lora_targets) * shape.layers
    out["adapter_optimizer"] = state * out["adapter_local"] + counter * n_tensors
    out["trainable_params"] = lora_params(shape, c.lora_rank, c.lora_targets)
    out["bf16_base_bytes"] = 2 * sum(sum(w) for w, _, _ in unit_dims(shape, c)) // N  # the same weights in bf16
    out["unit_gather_bytes"], out["unit_reduce_bytes"] = gathered, reduced
    return out
