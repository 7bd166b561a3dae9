"""What the calculator asks of a data-parallel engine: one small protocol, one module per engine.

The calculator (``coursekit.memory.calculator``) walks the pipeline stages (``megatron``) and asks the engine of the
configuration, for each stage, five questions; it never looks at the engine's name:

- ``states(shape, c, stage)``: model-state bytes on one rank (``StateBytes``) and the data-parallel rank reported;
- ``units(c, P, stage)``: unsharded parameter units held at the start and end of backward (ZeRO-3 / FSDP2);
- ``buckets(c, P, params, largest_unit)``: communication buffers during backward and during the optimizer step;
- ``notes(c)``: what the estimate of this engine does not model, in words;
- ``shards_over_dp(c)``: whether more data-parallel ranks lower the per-rank bytes (``min_gpus`` needs it).

and validates its own options (``check``: ZeRO stage, offload targets); ``TrainConfig`` reads what it takes from
its attributes (``zero_stages``, ``hybrid_shard``).
Adding an engine is a new module here with a subclass of ``Engine`` and one line in ``engines/__init__.py``.
"""
from __future__ import annotations

from coursekit.memory.errors import ConfigError
from coursekit.memory.states import STEP_COUNTER_OPTIMIZERS, StateBytes, check_choices


class Engine:
    """Defaults are those of an engine that replicates everything (DDP); subclasses override what differs."""
    name = "base"
    zero_stages: tuple[int, ...] = (0,)
    """ZeRO stages the engine takes (DeepSpeed's 0-3; every other engine 0)."""
    hybrid_shard = False
    """Takes ``hsdp_shard`` (HSDP: shard within a group, replicate across groups)."""
    autocast = False
    """Models ``precision="fp32"`` with a 16-bit ``dtype``: fp32 weights and states, 16-bit compute (torch autocast)."""
    step_counters = True
    """The optimizer keeps torch's 4-byte fp32 ``step`` per parameter tensor (it sees every tensor)."""

    # -- validation ---------------------------------------------------------------------------------------------
    def check(self, *, zero: int, offload: str, offload_params: str) -> None:
        """Raise ConfigError for options this engine does not support (zero stage and offload targets)."""
        if zero not in self.zero_stages:
            raise ConfigError(f"zero stages are DeepSpeed's; engine {self.name!r} takes zero 0")

    def check_options(self, *, precision: str, optimizer: str, zero: int, offload: str, offload_params: str) -> None:
        """The choices every engine shares (``coursekit.memory.states``), then this engine's own ``check``."""
        check_choices(precision=precision, optimizer=optimizer, zero=zero, offload=offload,
                      offload_params=offload_params)
        self.check(zero=zero, offload=offload, offload_params=offload_params)

    # -- model states -------------------------------------------------------------------------------------------
    def state_bytes(self, params: float, *, precision: str = "16psi", optimizer: str = "adamw", zero: int = 0,
                    shard: int = 1, offload: str = "none", offload_params: str = "none",
                    param_tensors: int = 0) -> StateBytes:
        """Checked ``formula``: the Ψ-formula bytes on a rank holding ``params`` parameters."""
        self.check_options(precision=precision, optimizer=optimizer, zero=zero, offload=offload,
                           offload_params=offload_params)
        return self.formula(params, precision=precision, optimizer=optimizer, zero=zero, shard=shard, offload=offload,
                            offload_params=offload_params, param_tensors=param_tensors)

    def formula(self, params: float, *, precision: str, optimizer: str, zero: int, shard: int, offload: str,
                offload_params: str, param_tensors: int) -> StateBytes:
        """Ψ-formula bytes on a rank holding ``params`` parameters (``coursekit.memory.engines.model_state_bytes``)."""
        raise NotImplementedError

    def states(self, shape, c, stage) -> tuple[StateBytes, int]:
        """(model-state bytes of ``stage`` on one rank, the data-parallel rank they are of)."""
        st = self.state_bytes(self.sharded_params(stage), precision=c.precision, optimizer=c.optimizer, zero=c.zero,
                              shard=c.shard_degree, offload=c.offload, offload_params=c.offload_params,
                              param_tensors=stage.tensors)
        return st, c.dp_rank if c.dp_rank is not None else 0

    def sharded_params(self, stage) -> int:
        """The parameters this engine's Ψ formula divides over its shard ranks: the stage's own (a sharding engine
        with expert parallelism counts the expert slices ep times: ``Stage.shard_equivalent``)."""
        return stage.params

    def counters(self, optimizer: str, param_tensors: int) -> int:
        """Bytes of torch's per-tensor fp32 ``step`` counters (Adam/AdamW), where the optimizer sees every tensor."""
        return 4 * param_tensors if self.step_counters and optimizer in STEP_COUNTER_OPTIMIZERS else 0

    # -- working memory -----------------------------------------------------------------------------------------
    def units(self, c, P: int, stage) -> dict[str, int]:
        """Unsharded parameter units (compute dtype) held at the start / end of backward; ``largest`` in elements."""
        return {"start": 0, "end": 0, "largest": stage.largest_unit}

    def buckets(self, c, P: int, params: int, largest_unit: int) -> tuple[int, int]:
        """(backward, optimizer-step) communication buffer bytes on the GPU."""
        return 0, 0

    def shards_over_dp(self, c) -> bool:
        return False

    def detail(self, shape, c) -> dict:
        """Engine-specific breakdowns for ``Estimate.detail`` (FSDP2: unit sizes, QLoRA's bytes by kind)."""
        return {}

    def ranks_differ(self, c) -> bool:
        """Whether data-parallel ranks hold different bytes in this estimate (``dp_rank`` then matters)."""
        return False

    def notes(self, c) -> list[str]:
        if c.dp_rank is not None and not self.ranks_differ(c):
            return [f"dp_rank {c.dp_rank}: every data-parallel rank is reported alike here (ranks differ only in "
                    f"DeepSpeed ZeRO-1/2's gradient partition, modelled without TP/PP)"]
        return []


def unsharded_units(P: int, stage, *, keep_all: bool = False) -> dict[str, int]:
    """ZeRO-3 / FSDP2 units: one per layer plus the embedding and the head (torchtitan's wrapping). With reshard after
    forward, backward starts with the head unit in use and the last layer prefetched, and ends with the embedding
    unit; with ``keep_all`` (FSDP2 ``reshard_after_forward=False``) every unit stays unsharded into backward."""
    per_layer, layers, embed, head = stage.per_layer, stage.layers, stage.embed_params, stage.head_params
    if keep_all:
        start = P * (layers * per_layer + embed + head)
    else:
        start = P * ((head or per_layer) + (per_layer if layers else embed))
    return {"start": start, "end": P * (embed or per_layer), "largest": stage.largest_unit}


def state_result(shards: dict, step_copy: float, temps: float, cpu: float, nvme: float, text: str) -> StateBytes:
    """A StateBytes from float byte counts (param, grad, master, state, gc), each rounded to a whole byte."""
    r = round
    return StateBytes(r(shards["param"]), r(shards["grad"]), r(shards["master"]), r(shards["state"]), r(shards["gc"]),
                      r(step_copy), r(temps), r(cpu), r(nvme), text)
