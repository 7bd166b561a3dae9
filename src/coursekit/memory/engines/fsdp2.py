"""FSDP2 (``torch.distributed.fsdp.fully_shard``; HSDP with a 2-D mesh): every rank holds 1/N of everything.

N is the sharding degree: dp · cp, or the HSDP shard group · cp (``TrainConfig.shard_degree``). Sharded parameters
are kept in the master dtype (fp32 when mixed) and are the optimizer's master copy; sharded gradients are in that
dtype too. Compute uses unsharded units in the compute dtype: one per transformer block plus the embedding and the
head (torchtitan's wrapping), freed after forward unless ``reshard_after_forward=False`` (``fsdp_reshard``).
Backward reduce-scatters one unit's unsharded gradients, cast to the fp32 reduce dtype when mixed. torch's foreach
AdamW allocates about one sharded-parameter-sized temporary during the step. ``CPUOffloadPolicy`` moves the sharded
parameters, gradients and optimizer states to the CPU, and the step runs there.

Padding (exact layout, where the calculator knows every tensor's shape: no TP/PP, Llama or GPT-2): ``fully_shard``
splits each parameter on dim 0 into ceil(d0/N)-row shards and allocates every rank's shard padded to that size, so
each rank holds Σ ceil(d0/N)·rest parameter elements (the last rank's padding included), and the reduce-scatter
output that becomes the sharded gradients is padded the same way. AdamW's states are ``zeros_like`` the unpadded
local shard, so they differ by rank: rank r keeps min(ceil(d0/N), max(0, d0 - r·ceil(d0/N))) rows of each
(measured: tests/test_fsdp_memory.py, 2/3/4 ranks).

``fsdp_reshard=N`` (reshard to a smaller group): after its forward each block keeps 1/N of its gathered copy (the
rank's slice of the all-gather output, compute dtype) and backward all-gathers it over those N ranks only; the root
keeps its gathered weights either way. ``qlora``: a frozen NF4 base with LoRA adapters (``coursekit.memory.qlora``).
``detail(shape, c)`` gives both breakdowns: the units' gathered sizes and what a rank holds between forward and
backward, and QLoRA's bytes by kind.
"""
from __future__ import annotations

from coursekit.memory import qlora
from coursekit.memory.engines.base import Engine, state_result, unsharded_units
from coursekit.memory.errors import ConfigError
from coursekit.memory.states import OPTIMIZERS, PRECISION_TEXT, PRECISIONS, local_rows  # noqa: F401


class FSDP2(Engine):
    name = "fsdp2"
    hybrid_shard = True
    autocast = True  # precision fp32 + dtype bf16: fp32 shards and units, bf16 compute (no MixedPrecisionPolicy)

    def check(self, *, zero: int, offload: str, offload_params: str) -> None:
        super().check(zero=zero, offload=offload, offload_params=offload_params)
        if "nvme" in (offload, offload_params):
            raise ConfigError("FSDP2 offloads to the CPU only (CPUOffloadPolicy); NVMe offload is DeepSpeed's")

    def exact(self, shape, c) -> bool:
        # with ep > 1 the expert slices are their own units over the ep_rest ranks: the Ψ/N formula (no padding)
        return c.tp == 1 and c.pp == 1 and c.ep == 1 and shape.arch in ("llama", "gpt2")

    def states(self, shape, c, stage):
        if c.qlora:
            return self._qlora_states(shape, c)
        if not self.exact(shape, c):
            return super().states(shape, c, stage)
        N, rank = c.shard_degree, c.dp_rank if c.dp_rank is not None else 0
        dims = param_dims(shape)
        padded = sum(-(-d0 // N) * rest for d0, rest in dims)
        local = sum(local_rows(d0, N, rank) * rest for d0, rest in dims)
        st = self.formula(1, precision=c.precision, optimizer=c.optimizer, zero=c.zero, shard=1, offload=c.offload,
                          offload_params=c.offload_params, param_tensors=0)  # bytes per parameter element
        P, G, M, GC, S = PRECISIONS[c.precision]
        store, K = M or P, S * OPTIMIZERS[c.optimizer]
        shards = dict(param=store * padded, grad=store * padded, master=0.0,
                      state=K * local + self.counters(c.optimizer, len(dims)), gc=GC * local)
        temps, cpu = store * local, 0.0
        if c.offload != "none" or c.offload_params != "none":
            cpu, shards, temps = sum(shards.values()), dict.fromkeys(shards, 0.0), 0.0
        # the calculator asks units() and buckets() next, for this configuration: keep the padded unit sizes
        self._padded_units = (c, unit_sizes(shape, shard=N))
        text = st.convention + f"; FSDP2's exact layout on shard rank {rank} of {N} (dim-0 padding)"
        return state_result(shards, 0.0, temps, cpu, 0.0, text), rank

    def sharded_params(self, stage) -> int:
        return stage.shard_equivalent  # the expert slices shard over the ep_rest ranks only

    def _qlora_states(self, shape, c):
        qlora.check(shape, c)
        P, G, M, GC, S = PRECISIONS[c.precision]
        store = M or P
        q = qlora.breakdown(shape, c, store=store, compute=P, state=S * OPTIMIZERS[c.optimizer],
                            counter=self.counters(c.optimizer, 1))
        shards = dict(param=q["nf4_base"] + q["frozen_rest"] + q["adapters"], grad=q["adapter_grads"], master=0.0,
                      state=q["adapter_optimizer"], gc=GC * q["adapters"] / store)
        self._qlora = (c, q)
        text = (f"QLoRA: NF4 base (block {c.nf4_block}, scaler block {c.nf4_scaler_block}) + LoRA r={c.lora_rank} on "
                f"{len(c.lora_targets)} projections, FSDP2 shard rank {c.dp_rank or 0} of {c.shard_degree}")
        return state_result(shards, 0.0, store * q["adapter_local"], 0.0, 0.0, text), c.dp_rank or 0

    def _qlora_units(self, c):
        got = getattr(self, "_qlora", None)
        return got[1] if got is not None and got[0] is c else None

    def detail(self, shape, c) -> dict:
        out = {}
        if c.qlora:
            P, G, M, GC, S = PRECISIONS[c.precision]
            q = qlora.breakdown(shape, c, store=M or P, compute=P, state=S * OPTIMIZERS[c.optimizer],
                                counter=self.counters(c.optimizer, 1))
            out["qlora"] = {k: v for k, v in q.items()}
            gathered = q["unit_gather_bytes"]
        elif self.exact(shape, c):
            gathered = [PRECISIONS[c.precision][0] * u for u in unit_sizes(shape, shard=c.shard_degree)]
        else:
            return out
        *blocks, root = gathered
        r = c.fsdp_reshard
        kept = sum(blocks) if r is False else 0 if r is True else sum(b // r for b in blocks)
        out["fsdp_units"] = {"gathered_bytes": gathered, "reshard_after_forward": r,
                             "held_after_forward_bytes": root + kept,
                             "backward_all_gather_group": c.shard_degree if r is True else r or 0}
        return out

    def notes(self, c) -> list[str]:
        out = super().notes(c)
        if c.qlora:
            out.append("qlora: saved activations are the base model's; LoRA's own (each adapter's input and x·Aᵀ) "
                       "and the NF4 dequantization temporaries of each matmul are not modelled")
        return out

    def ranks_differ(self, c) -> bool:
        return c.tp == 1 and c.pp == 1

    def formula(self, params, *, precision, optimizer, zero, shard, offload, offload_params, param_tensors):
        P, G, M, GC, S = PRECISIONS[precision]
        K = S * OPTIMIZERS[optimizer]
        N = shard
        store = M or P
        shards = dict(param=store * params / N, grad=store * params / N, master=0.0,
                      state=K * params / N + self.counters(optimizer, param_tensors), gc=GC * params / N)
        temps = store * params / N
        cpu = 0.0
        if offload != "none" or offload_params != "none":  # CPUOffloadPolicy moves the whole sharded state
            cpu = sum(shards.values())
            shards = dict.fromkeys(shards, 0.0)
            temps = 0.0  # the step runs on the CPU
        text = f"{PRECISION_TEXT[precision]} (FSDP2: sharded fp32 params are the master copy)" if M else \
            PRECISION_TEXT[precision]
        return state_result(shards, 0.0, temps, cpu, 0.0, text)

    def _exact_units(self, c):
        got = getattr(self, "_padded_units", None)
        return got[1] if got is not None and got[0] is c else None

    def units(self, c, P, stage):
        q = self._qlora_units(c)
        exact = [P * u for u in self._exact_units(c)] if q is None and self._exact_units(c) else None
        if q is not None:
            exact = q["unit_gather_bytes"]
        if exact is None:
            return unsharded_units(P, stage, keep_all=not c.fsdp_reshard)
        *blocks, root = exact  # the trainer's wrapping: each block, then the root (embeddings, final norm, head)
        # the root keeps its gathered weights from forward into backward; backward starts in the last block, and
        # with reshard to N the blocks not yet reached still hold their 1/N post-forward slices
        r = c.fsdp_reshard
        if r is False:
            start = sum(exact)
        elif r is True or not blocks:
            start = root + (max(blocks) if blocks else 0)
        else:
            start = root + max(b + sum(x // r for x in blocks[:i]) for i, b in enumerate(blocks))
        largest = max(exact) // P if q is None else max(exact)
        return {"start": start, "end": root, "largest": largest}

    def buckets(self, c, P, params, largest_unit):
        q = self._qlora_units(c)
        if q is not None:  # bytes already: the largest unit's all-gather output, the largest adapters' reduce input
            return (max(q["unit_gather_bytes"]) + max(q["unit_reduce_bytes"]) if c.dp * c.cp > 1 else 0), 0
        reduce = 4 if PRECISIONS[c.precision][2] else P  # unsharded grads of one unit, cast to the fp32 reduce dtype
        # the all-gather output of the largest unit (compute dtype) and its reduce-scatter input (reduce dtype)
        return (P + reduce) * largest_unit if c.dp * c.cp > 1 else 0, 0

    def shards_over_dp(self, c) -> bool:
        return True


def param_dims(shape) -> list[tuple[int, int]]:
    """(dim 0, elements per dim-0 row) of every parameter tensor, in ``model.parameters()`` order (tied once).
    HF Llama's ``nn.Linear`` weights are (out, in); GPT-2's ``Conv1D`` weights are (in, out)."""
    h, f, V = shape.hidden, shape.ffn, shape.vocab
    qw, kw = shape.q_width, shape.kv_width
    norm = [(h, 1), (h, 1)] if shape.norm == "layernorm" else [(h, 1)]
    n_in = 2 if shape.mlp == "swiglu" else 1
    first = [(V, h)] + ([(shape.max_positions, h)] if shape.positions == "learned" else [])
    if shape.arch == "gpt2":  # wte, wpe; ln_1, c_attn, c_proj, ln_2, c_fc, c_proj; ln_f
        def conv(n_in_, n_out, bias):
            return [(n_in_, n_out)] + ([(n_out, 1)] if bias else [])
        layer = (norm + conv(h, qw + 2 * kw, shape.qkv_bias) + conv(qw, h, shape.qkv_bias) + norm
                 + conv(h, f, shape.mlp_bias) * n_in + conv(f, h, shape.mlp_bias))
    else:
        def lin(n_in_, n_out, bias):
            return [(n_out, n_in_)] + ([(n_out, 1)] if bias else [])
        attn = (lin(h, qw, shape.qkv_bias) + lin(h, kw, shape.qkv_bias) + lin(h, kw, shape.qkv_bias)
                + lin(qw, h, shape.o_bias) + [(shape.head_dim, 1)] * (2 * shape.qk_norm))
        E, fe = shape.experts, shape.moe_ffn
        if shape.family == "mixtral":  # router, then the 3-D experts (E, 2f, h) and (E, h, f)
            mlp = [(E, h), (E, 2 * fe * h), (E, h * fe)]
        elif shape.is_moe:
            mlp = [(E, 2 * fe * h), (E, h * fe), (E, h)]
        else:
            mlp = lin(h, f, shape.mlp_bias) * n_in + lin(f, h, shape.mlp_bias)
        layer = attn + mlp + norm + norm
    last = norm + ([] if shape.tied_embeddings else [(V, h)])
    return first + layer * shape.layers + last


def _padded(d0: int, rest: int, n: int) -> int:
    return -(-d0 // n) * n * rest


def unit_sizes(shape, *, shard: int, wrap: str = "block") -> list[int]:
    """Padded elements of every ``fully_shard`` unit's all-gather output: the blocks (one, a pair, none with
    ``wrap="root"``), then the root with whatever no block owns."""
    dims = param_dims(shape)
    first = 2 if shape.arch == "gpt2" and shape.positions == "learned" else 1
    per_layer = (len(dims) - first - (1 if shape.norm != "layernorm" else 2) - (0 if shape.tied_embeddings else 1)) \
        // shape.layers
    layers = [dims[first + i * per_layer: first + (i + 1) * per_layer] for i in range(shape.layers)]
    rest = dims[:first] + dims[first + shape.layers * per_layer:]
    group = {"block": 1, "pair": 2, "root": shape.layers}[wrap]
    units = [sum(layers[i:i + group], []) for i in range(0, shape.layers, group)]
    if wrap == "root":
        units, rest = [], dims
    return [sum(_padded(d0, r, shard) for d0, r in u) for u in units] + [sum(_padded(d0, r, shard) for d0, r in rest)]
