"""Per-rank GPU memory of one training step, by category and by phase.

Phases (the three moments a step's memory peaks), per pipeline stage (the first stage holds the embedding and the
most in-flight micro-batches, the last holds the head and the loss; the worst one is reported):

- ``start_of_backward``: model states + saved activations of every in-flight micro-batch + loss temporaries (the
  two fp32 ``b·s·V`` gradient buffers of log-softmax's backward; the logits themselves are freed after the loss)
  + the unsharded FSDP/ZeRO-3 units in use + backward communication buffers + the recompute working set (one layer's
  activations under full recompute, which never coexist with the loss buffers: the larger counts). Gradients are already present when a step accumulates over several
  micro-batches.
- ``end_of_backward``: model states with all gradients, communication buffers, the last unsharded unit.
- ``optimizer_step``: model states + DeepSpeed's fp32 gradient partition + optimizer temporaries + all-gather bucket.

What differs between data-parallel engines (model states, unsharded units, communication buffers, notes) comes from
the configuration's engine (``coursekit.memory.engines``: ddp, deepspeed, fsdp2), what TP / SP / PP / CP split from
``engines.megatron``; this module only adds them up. Model states of a DeepSpeed run without TP/PP are DeepSpeed's
exact layout (``coursekit.memory.deepspeed``: padding, the gradient partition of the reported data-parallel rank,
offload staging buffers — the accelerator's one is counted with the communication buckets — and NVMe swap files);
otherwise the Ψ formulas (``coursekit.memory.states``).

Each phase adds the stated runtime constant. Not modelled: allocator fragmentation and caching slack (leave 5-10 %),
and framework extras (e.g. DeepSpeed's NVMe swap buffers in pinned CPU memory).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from coursekit.memory import engines, vocab
from coursekit.memory.engines import megatron
from coursekit.memory.activations import ActivationReport
from coursekit.memory.train_config import TrainConfig
from coursekit.memory.errors import ConfigError
from coursekit.memory.gpus import GiB, gpu as gpu_lookup
from coursekit.spec.runspec import RunSpec
from coursekit.memory.presets import PRESETS, preset
from coursekit.memory.shapes import ModelShape, from_hf_config
from coursekit.memory.states import PRECISIONS

PHASES = ("start_of_backward", "end_of_backward", "optimizer_step")
CATEGORIES = ("parameters", "gradients", "master_weights", "optimizer_states", "grad_copy", "step_grad_copy",
              "optimizer_temporaries", "saved_activations", "logits_loss", "communication_buckets",
              "unsharded_fsdp_units", "recompute_working", "runtime")


def resolve_model(model) -> ModelShape:
    """A ModelShape from a preset name, a path to an HF config.json, an HF config dict, or a ModelShape."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, dict):
        return from_hf_config(model)
    if isinstance(model, (str, Path)):
        if str(model) in PRESETS:
            return PRESETS[str(model)]
        if str(model).endswith(".json") or Path(model).is_file():
            return from_hf_config(model)
        if (Path(model) / "config.json").is_file():  # a model directory, as downloaded from the Hub
            return from_hf_config(Path(model) / "config.json")
        return preset(str(model))  # raises with the list of names
    raise ConfigError(f"model must be a preset name, a config.json path, a dict or a ModelShape, got {model!r}")


@dataclass
class Estimate:
    """One estimate. Byte counts are per GPU rank of the worst pipeline stage."""
    model: str
    num_params: int
    params_per_tp_pp_rank: int
    config: TrainConfig
    convention: str
    activations: ActivationReport
    categories: dict[str, int]
    phases: dict[str, int]
    pp_stage: int
    cpu_bytes: int
    nvme_bytes: int
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    dp_rank: int = 0  # the data-parallel rank reported (DeepSpeed ZeRO-1/2: the fullest unless config.dp_rank)
    detail: dict = field(default_factory=dict)  # the engine's own breakdown (FSDP2: units, QLoRA by kind)
    _stages_of: tuple | None = field(default=None, repr=False, compare=False)  # (shape, acts) for pp_stages

    @property
    def pp_stages(self) -> list[dict]:
        """Every pipeline stage: layers, in-flight micro-batches, saved bytes (computed when asked: the planner
        estimates thousands of layouts with up to a hundred stages and reads only the peak)."""
        if self._stages_of is None:
            return []
        shape, acts = self._stages_of
        return megatron.per_stage(shape, self.config, acts)

    @property
    def activations_bytes(self) -> int:
        """Saved-for-backward bytes of one micro-batch's forward, embedding to loss, on this TP/CP rank."""
        return self.activations.total_bytes

    @property
    def peak_bytes(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_memory_bytes is None else self.peak_bytes <= self.gpu_memory_bytes

    def to_dict(self) -> dict:
        c = self.config
        d = {"model": self.model, "num_params": self.num_params, "params_per_tp_pp_rank": self.params_per_tp_pp_rank,
             "config": c.to_dict(), "convention": self.convention,
             "activation_profile": f"{c.impl}-{c.kernels}" if c.impl == "hf" else "fused",
             "attention_kernel": self.activations.attention_kernel,
             "activations_bytes": self.activations_bytes}
        d.update({f"{k}_bytes": v for k, v in self.categories.items()})
        d.update(peak_bytes=self.peak_bytes, peak_phase=self.peak_phase, phases=dict(self.phases),
                 pp_stage=self.pp_stage, dp_rank=self.dp_rank, cpu_bytes=self.cpu_bytes, nvme_bytes=self.nvme_bytes, gpu=self.gpu,
                 gpu_memory_bytes=self.gpu_memory_bytes, fits=self.fits,
                 activation_terms={"per_layer": dict(self.activations.per_layer), "layers": self.activations.layers,
                                   "embed": dict(self.activations.embed), "shared": dict(self.activations.shared),
                                   "head": dict(self.activations.head)},
                 notes=list(self.notes), pp_stages=[dict(x) for x in self.pp_stages])
        if self.detail:
            d["detail"] = self.detail
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def table(self) -> str:
        c, g = self.config, lambda b: f"{b / GiB:10.3f}"
        lines = [f"{self.model}: {self.num_params:,} params, {self.params_per_tp_pp_rank:,} on this TP/PP rank"
                 f" (pp stage {self.pp_stage}) before ZeRO/FSDP sharding",
                 f"b={c.batch} s={c.seq} {c.dtype} {c.attention}/{self.activations.attention_kernel} impl={c.impl}"
                 f"-{c.kernels} recompute={c.recompute} | dp={c.dp} {c.engine} zero={c.zero} tp={c.tp}"
                 f"{'+sp' if c.sp else ''} pp={c.pp} cp={c.cp} | {self.convention}",
                 f"{'category':<26}{'GiB':>10}"]
        lines += [f"{k:<26}{g(v)}" for k, v in self.categories.items() if v]
        lines.append(f"{'activations (1 micro-batch)':<26}{g(self.activations_bytes)}")
        lines += [f"{'phase ' + k:<26}{g(v)}{'  <- peak' if k == self.peak_phase else ''}"
                  for k, v in self.phases.items()]
        if self.cpu_bytes or self.nvme_bytes:
            lines.append(f"{'CPU / NVMe':<26}{g(self.cpu_bytes)}{g(self.nvme_bytes)}")
        if self.gpu:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(f"{self.gpu} ({self.gpu_memory_bytes / GiB:.1f} GiB): {verdict}")
        q = self.detail.get("qlora")
        if q:
            lines.append(f"QLoRA on this rank: NF4 base {q['nf4_base']:,} B (bf16: {q['bf16_base_bytes']:,} B), frozen "
                         f"rest {q['frozen_rest']:,} B, adapters {q['adapters']:,} B + grads {q['adapter_grads']:,} B "
                         f"+ optimizer {q['adapter_optimizer']:,} B; {q['trainable_params']:,} trainable params")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def estimate(model, config: TrainConfig | None = None, **kwargs) -> Estimate:
    """Per-rank memory of training ``model`` (preset, config.json path, HF dict or ModelShape).

    Give a run description (``estimate(RunSpec(model="llama3-8b", strategy="zero3", dp_replicate=8, micro_batch=1,
    seq=8192), kernels="cpu")``: keyword arguments then set only what the run does not say, the calculator's own
    knobs), a TrainConfig, or its fields as keyword arguments: ``estimate("llama3-8b", batch=1, seq=8192, zero=3,
    dp=8)``, or the trainer's names (``micro_batch=1, strategy="zero3", dp_replicate=8``), which are read into a
    RunSpec and sized as one (``coursekit.memory.vocab``).
    """
    if isinstance(model, RunSpec):
        model, config = model.model, model
    if isinstance(config, RunSpec):
        config, kwargs = vocab.config_of(config, kwargs), {}
    shape = resolve_model(model)
    c = config if config is not None else vocab.config(kwargs)
    if config is not None and kwargs:
        raise ConfigError("give either a TrainConfig or keyword arguments, not both")
    if c.ep > 1 and not shape.is_moe:
        raise ConfigError(f"ep {c.ep} needs a mixture-of-experts model; {shape.name} ({shape.family}) is dense")
    if shape.is_moe and shape.experts % c.ep:
        raise ConfigError(f"ep ({c.ep}) does not divide the {shape.experts} experts of {shape.name}")
    if c.pp > shape.layers:
        raise ConfigError(f"pp ({c.pp}) exceeds the number of layers ({shape.layers})")
    if c.pp * megatron.virtual(c) > shape.layers:
        raise ConfigError(f"{c.pp_schedule} keeps {megatron.virtual(c)} stages per rank: pp x "
                          f"{megatron.virtual(c)} = {c.pp * megatron.virtual(c)} exceeds the {shape.layers} layers")
    if shape.positions == "learned" and c.seq > shape.max_positions:
        raise ConfigError(f"seq ({c.seq}) exceeds {shape.name}'s {shape.max_positions} learned positions")
    acts, working = megatron.activations(shape, c)
    engine = engines.get(c.engine)
    P = PRECISIONS[c.precision][0]
    best = None
    for stage in megatron.stages(shape, c):
        st, dp_rank = engine.states(shape, c, stage)
        saved = megatron.saved_bytes(acts, stage, c, shape)
        logits = megatron.logits_bytes(shape, c, stage)
        units = engine.units(c, P, stage)
        comm_bwd, comm_step = engine.buckets(c, P, stage.params, units["largest"])
        comm_bwd, comm_step = comm_bwd + st.offload_buffers, comm_step + st.offload_buffers
        cats = {"parameters": st.parameters, "gradients": st.gradients, "master_weights": st.master_weights,
                "optimizer_states": st.optimizer_states, "grad_copy": st.grad_copy,
                "step_grad_copy": st.step_grad_copy, "optimizer_temporaries": st.step_temporaries,
                "saved_activations": saved, "logits_loss": logits, "communication_buckets": max(comm_bwd, comm_step),
                "unsharded_fsdp_units": units["start"], "recompute_working": working, "runtime": c.runtime_bytes}
        states = st.parameters + st.master_weights + st.optimizer_states + st.grad_copy + c.runtime_bytes
        grads_early = st.gradients if c.microbatches > 1 else 0
        phases = {
            # the loss buffers are gone before backward recomputes the last block: they never coexist
            "start_of_backward": states + grads_early + saved + max(logits, working) + units["start"] + comm_bwd,
            "end_of_backward": states + st.gradients + units["end"] + comm_bwd,
            "optimizer_step": states + st.gradients + st.step_grad_copy + st.step_temporaries + comm_step,
        }
        cand = (max(phases.values()), stage, st, dp_rank, cats, phases)
        if best is None or cand[0] > best[0]:
            best = cand
    _, stage, st, dp_rank, cats, phases = best
    g = gpu_lookup(c.gpu) if c.gpu else None
    notes = list(acts.notes)
    if shape.positions == "rope" and c.seq > shape.max_positions:
        notes.append(f"seq {c.seq} exceeds the model's max_position_embeddings ({shape.max_positions})")
    notes += engine.notes(c)
    if c.precision == "fp32" and c.dtype != "fp32":
        notes.append(f"autocast (fp32 weights, {c.dtype} compute): model states as held; saved activations are a "
                     f"{c.dtype} model's, below autocast's (it also saves fp32 norm tensors and the {c.dtype} weight "
                     f"copies its matmuls use: 1.5x on tiny-llama, measured on CPU)")
    if c.impl == "hf" and c.kernels == "cuda":
        notes.append("hf-cuda activation profile is modelled from CUDA kernel signatures (measured profile: hf-cpu)")
    return Estimate(shape.name, shape.num_params(), stage.params, c, st.convention, acts, cats, phases, stage.index,
                    st.cpu, st.nvme, g.name if g else None, g.memory_bytes if g else None, notes, dp_rank,
                    detail=engine.detail(shape, c), _stages_of=(shape, acts))
