"""``coursekit memory``: per-rank training memory as a table or one JSON object.

    coursekit memory --model llama3-8b --micro-batch 1 --seq 8192 --strategy zero3 --dp-replicate 8 --gpu H100-80GB
    coursekit memory --model llama3-8b --batch 1 --seq 8192 --dp 8 --zero 3 --gpu H100-80GB   # the same, older names
    coursekit memory --model path/to/config.json --batch 4 --seq 2048 --recompute full --json
    coursekit memory --model llama3-70b --seq 4096 --zero 3 --gpu H100-80GB --solve max-batch --json

JSON contract: one object with ``activations_bytes`` (saved-for-backward bytes of one micro-batch's forward through
the whole model, embedding to loss, each storage once, parameters and buffers excluded; on one TP/CP rank), one
``<category>_bytes`` field per state category, ``peak_bytes``, ``peak_phase`` and ``phases``; with ``--solve`` also
``solution``. Errors print ``error: ...`` on stderr and return 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import fields

from coursekit.memory import answers, vocab
from coursekit.memory.activations import ATTENTION, CP_IMPLS, DTYPE_BYTES, IMPLS, KERNELS, POSITION_IDS, RECOMPUTE
from coursekit.memory.calculator import estimate
from coursekit.memory.train_config import PP_SCHEDULES, TrainConfig
from coursekit.memory.errors import ConfigError, positive_int
from coursekit.memory.gpus import GPUS, GiB
from coursekit.memory.presets import PRESETS
from coursekit.memory.solvers import max_micro_batch, max_seq_len, min_gpus
from coursekit.memory.engines import REGISTRY as ENGINES
from coursekit.memory.states import OFFLOAD, OPTIMIZERS, PRECISIONS
from coursekit.spec import registry
from coursekit.spec.run import SP_STYLES

SOLVE = ("max-batch", "max-seq", "min-gpus")


FP8_NOTE = ("fp8: sized as bf16 (torchao float8 keeps bf16 weights and saves each linear's bf16 input and weight for "
            "backward; its fp8 copies are transient)")
COMPILE_NOTE = ("--compile: sized as eager (Inductor may save fewer activations: torchtitan measured 82.4 -> 77.0 GiB "
                "on Llama 3.1 8B; not modelled)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="coursekit memory", description="Exact per-rank training memory.")
    a = p.add_argument
    a("--model", help="preset name or path to an HF config.json (llama / mistral / gpt2)")
    a("--micro-batch", "--batch", dest="batch", type=int, help="sequences per rank per micro-batch (alias --batch)")
    a("--seq", type=int, help="sequence length in tokens")
    a("--dtype", default="bf16", choices=[*DTYPE_BYTES, "fp8"],
      help="compute dtype; fp8 (torchao float8 on the linear layers) is sized as bf16, which it holds (note)")
    a("--compile", action="store_true", help="torch.compile: sized as eager (note), as coursekit plan --compile")
    a("--precision", choices=list(PRECISIONS), help="model-state convention (default: 16psi, or fp32 for fp32)")
    a("--optimizer", default="adamw", choices=list(OPTIMIZERS))
    a("--attention", default="sdpa", choices=list(ATTENTION))
    a("--impl", default="hf", choices=list(IMPLS), help="hf modules as they are, or fused kernels")
    a("--kernels", default="cuda", choices=list(KERNELS), help="device whose kernels run the hf modules")
    a("--recompute", default="none", choices=list(RECOMPUTE))
    a("--recompute-layers", type=int, help="with --recompute full: only the first N layers of each pipeline stage "
      "(Megatron's --recompute-num-layers, block method); default: all")
    a("--dropout", type=float, help="override the model's dropout rates")
    a("--strategy", choices=list(registry.STRATEGIES),
      help="the trainer's strategy: sets --engine (and --zero for zeroK); fsdp1 is not modelled (says why)")
    a("--dp-replicate", type=int, help="data-parallel replicas (DDP, ZeRO; HSDP across groups); default: fill")
    a("--dp-shard", type=int, help="data-parallel ranks that shard (FSDP2; HSDP's shard group); default: fill")
    a("--dp", type=int, help="all data-parallel ranks, dp-replicate x dp-shard")
    a("--world", type=int, help="total ranks (= dp·tp·pp·cp)")
    a("--zero", type=int, choices=[0, 1, 2, 3], help="DeepSpeed ZeRO stage (default 0)")
    a("--engine", choices=list(ENGINES), help="data-parallel engine (default deepspeed; or set by --strategy)")
    reshard = p.add_mutually_exclusive_group()
    reshard.add_argument("--reshard-after-forward", default="true",
                         help="FSDP2 (the trainer's flag): true, false, or N ranks to reshard to")
    reshard.add_argument("--no-reshard", action="store_true", help="the older spelling of --reshard-after-forward false")
    a("--qlora", action="store_true", help="FSDP2: frozen NF4 base + LoRA adapters (coursekit.memory.qlora)")
    a("--lora-rank", type=int, help="QLoRA adapter rank (default 8)")
    a("--lora-targets", help="QLoRA: comma-separated projections with adapters (default: all seven)")
    a("--nf4-block", type=int, help="QLoRA NF4 block size (default 64)")
    a("--nf4-scaler-block", type=int, help="QLoRA scalers per fp32 factor (default 256)")
    a("--hsdp-shard", type=int, help="HSDP shard-group size (engine fsdp2): the same as --dp-shard")
    a("--no-bucket-view", action="store_true", help="DDP gradient_as_bucket_view=False (torch's default)")
    a("--tp", type=int, default=1)
    a("--sp", action="store_true", help="sequence parallelism over the TP group")
    a("--sp-style", choices=list(SP_STYLES), help="with --sp: torch's plan (the column-parallel linears save "
      "the all-gathered input) or megatron (they save the sequence shard); default: as --impl implies")
    a("--pp", type=int, default=1)
    a("--cp", type=int, default=1)
    a("--ep", type=int, default=1, help="expert-parallel degree (MoE models; borrowed from the dp x cp ranks)")
    a("--router-aux-loss-coef", type=float, help="MoE: the load-balancing loss's weight; 0: not computed (default: "
      "the model config's)")
    a("--cp-impl", default="ring", choices=list(CP_IMPLS), help="context-parallel attention (the trainer's --cp-impl)")
    a("--position-ids", default="shared", choices=list(POSITION_IDS),
      help="RoPE tables: shared (1, s), or per-sequence (b, s) position ids as coursekit's trainer passes")
    a("--grad-accum", "--microbatches", dest="microbatches", type=int,
      help="micro-batches per optimizer step, under pp the schedule's (default: pp; alias --microbatches)")
    a("--pp-schedule", default="gpipe", choices=list(PP_SCHEDULES),
      help="what a stage holds at its peak follows the schedule's order (coursekit.memory.pp_order); default "
           "gpipe, as coursekit train")
    a("--pp-virtual", type=int, help="stages per rank for interleaved-1f1b / looped-bfs / interleaved-zb (default 2, "
      "as the trainer; zbv and dualpipev: exactly 2, in a V)")
    a("--pp-runtime", default="torch", choices=["torch", "megatron"],
      help="torch: torch.distributed.pipelining keeps every micro-batch's inputs for the step; megatron: in flight only")
    a("--offload", default="none", choices=list(OFFLOAD), help="optimizer-state offload")
    a("--offload-params", default="none", choices=list(OFFLOAD), help="parameter offload (ZeRO-3 / FSDP2)")
    a("--reduce-bucket-size", type=int, help="DeepSpeed reduce_bucket_size in elements (default 5e8, DeepSpeed's)")
    a("--sub-group-size", help="DeepSpeed ZeRO-3 sub_group_size in elements (20000, 1e9): the optimizer step builds "
      "the fp32 gradients one sub-group at a time (default 1e9, DeepSpeed's)")
    a("--dp-rank", type=int, help="data-parallel rank to report (DeepSpeed ZeRO-1/2 ranks differ; default: fullest)")
    a("--gpu", help=f"one of: {', '.join(GPUS)}")
    a("--runtime-gib", type=float, help="GPU runtime constant in GiB (default 1)")
    a("--solve", choices=list(SOLVE), help="find the largest batch / sequence, or the fewest GPUs (needs --gpu)")
    a("--json", action="store_true", help="print one JSON object")
    a("--list-models", action="store_true")
    a("--list-gpus", action="store_true")
    return p


def _config_kwargs(ns: argparse.Namespace) -> dict:
    kw = dict(batch=ns.batch, seq=ns.seq, dtype=ns.dtype, precision=ns.precision, optimizer=ns.optimizer,
              attention=ns.attention, impl=ns.impl, kernels=ns.kernels, recompute=ns.recompute,
              recompute_layers=ns.recompute_layers, dropout=ns.dropout,
              dp=ns.dp, world=ns.world, ddp_bucket_view=not ns.no_bucket_view,
              hsdp_shard=ns.hsdp_shard, tp=ns.tp, sp=ns.sp, sp_style=ns.sp_style,
              pp=ns.pp, cp=ns.cp, ep=ns.ep, cp_impl=ns.cp_impl,
              position_ids=ns.position_ids, microbatches=ns.microbatches,
              pp_schedule=ns.pp_schedule, pp_virtual=ns.pp_virtual, pp_runtime=ns.pp_runtime, offload=ns.offload,
              offload_params=ns.offload_params, dp_rank=ns.dp_rank,
              gpu=ns.gpu, strategy=ns.strategy, dp_replicate=ns.dp_replicate, dp_shard=ns.dp_shard)
    kw.update({k: getattr(ns, k) for k in ("zero", "engine") if getattr(ns, k) is not None})
    kw.update(_fsdp_kwargs(ns))
    if ns.reduce_bucket_size is not None:
        kw["bucket_elems"] = ns.reduce_bucket_size
    if ns.sub_group_size is not None:  # an element count as DeepSpeed's JSON writes it: 20000 or 1e9
        text = ns.sub_group_size
        try:
            kw["sub_group_size"] = positive_int("sub_group_size", int(text) if text.isdigit() else float(text))
        except (ValueError, OverflowError):
            raise ConfigError(f"--sub-group-size takes a whole number of elements > 0 (20000, 1e9), got {text!r}") \
                from None
    if ns.router_aux_loss_coef is not None:
        if not math.isfinite(ns.router_aux_loss_coef) or ns.router_aux_loss_coef < 0:
            raise ConfigError(f"--router-aux-loss-coef must be a finite number >= 0, got {ns.router_aux_loss_coef}")
        kw["aux_loss"] = ns.router_aux_loss_coef > 0
    if ns.runtime_gib is not None:
        if not math.isfinite(ns.runtime_gib) or ns.runtime_gib < 0:
            raise ConfigError(f"--runtime-gib must be a finite number >= 0, got {ns.runtime_gib}")
        kw["runtime_bytes"] = int(ns.runtime_gib * GiB)
    return kw


def _fsdp_kwargs(ns: argparse.Namespace) -> dict:
    kw = {}
    r = "false" if ns.no_reshard else ns.reshard_after_forward  # argparse refuses the two together
    t = r.strip().lower()
    if t not in ("true", "false") and not t.isdigit():
        raise ConfigError(f"--reshard-after-forward takes true, false or a number of ranks, got {r!r}")
    kw["fsdp_reshard"] = t == "true" if t in ("true", "false") else int(t)
    if ns.qlora:
        kw["qlora"] = True
    for k in ("lora_rank", "lora_targets", "nf4_block", "nf4_scaler_block"):
        if getattr(ns, k) is not None:
            kw[k] = getattr(ns, k)
    return kw


def run(ns: argparse.Namespace) -> dict | str:
    if ns.list_models:
        rows = {n: s.num_params() for n, s in sorted(PRESETS.items())}
        return rows if ns.json else "\n".join(f"{n:<14}{v:>18,} params" for n, v in rows.items())
    if ns.list_gpus:
        rows = {n: g.memory_bytes for n, g in GPUS.items()}
        return rows if ns.json else "\n".join(f"{n:<12}{v / GiB:8.0f} GiB" for n, v in rows.items())
    if not ns.model:
        raise ConfigError("--model is required (a preset name or a config.json path; see --list-models)")
    notes = []
    if ns.dtype == "fp8":
        ns.dtype = "bf16"
        notes.append(FP8_NOTE)
    if ns.compile:
        notes.append(COMPILE_NOTE)
    kw = _config_kwargs(ns)
    need = {"max-batch": ("seq",), "max-seq": ("batch",), "min-gpus": ("batch", "seq")}.get(ns.solve,
                                                                                          ("batch", "seq"))
    for k in need:
        if kw[k] is None:
            raise ConfigError(answers.missing_argument(k, ns.solve))
    if ns.solve and not ns.gpu:
        raise ConfigError("--solve needs --gpu")
    if ns.solve == "min-gpus" and ns.dp_rank is not None:
        raise ConfigError("--dp-rank does not combine with --solve min-gpus (it sizes for the fullest rank)")
    if ns.solve == "max-batch":
        kw["batch"] = 1  # a placeholder: the solver varies it
    if ns.solve == "max-seq":
        kw["seq"] = ns.cp * (ns.tp if ns.sp else 1)
    # the command line read as one run (coursekit.spec.runspec.RunSpec, the trainer's names; the older ones read into
    # it), sized with the calculator's own knobs beside it
    cfg = vocab.config_of(*vocab.spec_of(kw, model=ns.model, always=True))
    kw = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    solution, given = None, dict(kw)
    if ns.solve:
        if ns.solve == "max-batch":
            b = max_micro_batch(ns.model, **kw)
            solution = {"max_batch": b}
            kw["batch"] = max(b, 1)
        elif ns.solve == "max-seq":
            s = max_seq_len(ns.model, **kw)
            solution = {"max_seq": s}
            kw["seq"] = max(s, ns.cp)
        else:
            e = min_gpus(ns.model, **kw)
            solution = {"min_gpus": e.config.world, "dp": e.config.dp}
            kw.update(dp=e.config.dp, world=None)
    e = estimate(ns.model, TrainConfig(**kw))
    e.notes.extend(notes)
    if ns.json:
        d = e.to_dict()
        if solution is not None:
            d["solution"] = solution
        return d
    text = e.table()
    if solution is not None:
        text = f"{answers.describe(ns.solve, ns.model, given, solution, e)}\n{text}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error
        return int(exc.code or 0)
    try:
        out = run(ns)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(out) if isinstance(out, dict) else out)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (silence the interpreter's flush at exit)
    return 0
