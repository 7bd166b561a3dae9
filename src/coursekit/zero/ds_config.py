"""DeepSpeed ZeRO configs: build one from a few arguments (notebooks), load a learner's JSON, finish it for a run.

    cfg = build_config(2, offload_optimizer="cpu")        # a dict, ready for deepspeed.initialize(config=cfg)
    save_config(cfg, "my_zero2.json")                     # then: coursekit train --strategy deepspeed --ds-config ...

Defaults of DeepSpeed 0.19 that change results or held bytes, made explicit here and in ``configs/deepspeed/``:

* ``gradient_clipping`` defaults to **1.0**: we write 0.0, so a ZeRO run matches DDP step by step.
* ``reduce_bucket_size`` defaults to 5e8 *elements*: ZeRO-3 allocates that bucket up front (2 GB in fp32 per rank,
  even for a 115k-parameter model). We write 5e5 elements (a few buckets for the course's tiny models).
* ``stage3_param_persistence_threshold`` (1e5 elements): smaller parameters are never partitioned — that is every
  parameter of a tiny model. We write 0, so ZeRO-3 partitions everything, as the memory formula assumes.
* ``stage3_prefetch_bucket_size`` / ``stage3_max_live_parameters`` / ``stage3_max_reuse_distance``: with the defaults
  a tiny model is gathered once per step and kept through backward (2Ψ, not the paper's 3Ψ). We write 0 for all
  three: each parameter is gathered for forward, released, gathered again for backward (the paper's ZeRO-3).
* ``use_multi_rank_bucket_allreduce`` (True): ZeRO-1/2 then *all-reduce* each gradient bucket and keep their slice
  (DDP's 2Ψ, plus the Ψ all-gather = 3Ψ). False makes them ``reduce`` each slice to its owner: the paper's
  reduce-scatter, 2Ψ in all. We write False (the bucket sweep shows both).

Which keys the trainer owns (``finalize``): the batch keys (from ``--micro-batch/--global-batch/--grad-accum``, so
every strategy sees the same data) and the precision block (from ``--dtype``). Everything else comes from the JSON.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from coursekit.spec.run import ADAMW as _ADAMW

STAGES = (0, 1, 2, 3)
OFFLOAD = ("none", "cpu", "nvme")
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs" / "deepspeed"  # the repository's configs/ (checkout)

# the trainer's AdamW (strategies/base.py), for configs that let DeepSpeed build its own optimizer
ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "betas": list(_ADAMW["betas"]), "eps": _ADAMW["eps"],
                                     "weight_decay": 0.0}}


def build_config(stage: int, *, micro_batch: int = 4, grad_accum: int = 1, dtype: str = "fp32",
                 offload_optimizer: str = "none", offload_param: str = "none", nvme_path: str | None = None,
                 ds_optimizer: bool | None = None, reduce_bucket_size: int = 500_000,
                 allgather_bucket_size: int = 500_000, prefetch_bucket_size: int = 0, overlap_comm: bool = False,
                 multi_rank_allreduce: bool = False, stage3_keep_params: bool = False,
                 nvme_buffer_size: int = 1 << 22) -> dict:
    """A complete DeepSpeed config dict for ZeRO ``stage`` (0-3).

    ``offload_optimizer``: "none" | "cpu" | "nvme" (fp32 master, optimizer states and the step on the CPU; NVMe
    keeps master and states in files under ``nvme_path``). ``offload_param``: the same for ZeRO-3's parameters.
    ``ds_optimizer``: put an ``optimizer`` block (the trainer's AdamW hyper-parameters) in the config so DeepSpeed
    builds its own optimizer — DeepSpeedCPUAdam under offload (a C++ op compiled once, ~60 s on 2 cores). Default:
    only when offloading. Without it the trainer passes its torch AdamW (``zero_force_ds_cpu_optimizer`` is then
    False so offload accepts it). Bucket sizes are in elements, as in DeepSpeed. ``stage3_keep_params`` restores
    DeepSpeed's prefetch/persistence defaults (params gathered once per step and kept; see the module docstring).
    ``nvme_buffer_size``: elements per NVMe parameter swap buffer (16 of them, in pinned host memory); it must hold
    the largest parameter. DeepSpeed's default, 1e8, would pin 16 x 200 MB per rank in bf16.
    """
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
    for name, v in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if v not in OFFLOAD:
            raise ValueError(f"{name} must be one of {OFFLOAD}, got {v!r}")
    if offload_optimizer != "none" and stage == 0:
        raise ValueError("optimizer offload needs ZeRO stage 1, 2 or 3 (stage 0 has no partitioned optimizer)")
    if offload_param != "none" and stage != 3:
        raise ValueError(f"parameter offload needs ZeRO stage 3 (parameters must be partitioned), not stage {stage}")
    if "nvme" in (offload_optimizer, offload_param) and not nvme_path:
        raise ValueError("NVMe offload needs nvme_path (a folder on a local disk)")
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, got {dtype!r}")
    zero: dict = {"stage": stage}
    if stage:
        zero |= {"contiguous_gradients": True, "overlap_comm": bool(overlap_comm),
                 "reduce_bucket_size": int(reduce_bucket_size), "allgather_bucket_size": int(allgather_bucket_size)}
    if stage in (1, 2):
        zero["use_multi_rank_bucket_allreduce"] = bool(multi_rank_allreduce)
    if stage == 3 and not stage3_keep_params:
        zero |= {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": int(prefetch_bucket_size),
                 "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}
    elif stage == 3:
        zero["stage3_prefetch_bucket_size"] = int(prefetch_bucket_size) or 50_000_000
    if offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": offload_optimizer, "pin_memory": False}
        if offload_optimizer == "nvme":
            zero["offload_optimizer"] |= {"nvme_path": str(nvme_path), "buffer_count": 4}
    if offload_param != "none":
        zero["offload_param"] = {"device": offload_param, "pin_memory": False}
        if offload_param == "nvme":
            zero["offload_param"] |= {"nvme_path": str(nvme_path), "buffer_count": 16,
                                      "buffer_size": int(nvme_buffer_size)}
    cfg = {
        "train_micro_batch_size_per_gpu": int(micro_batch),
        "gradient_accumulation_steps": int(grad_accum),
        "gradient_clipping": 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if ds_optimizer is None:
        ds_optimizer = offload_optimizer != "none"
    if ds_optimizer:
        cfg["optimizer"] = copy.deepcopy(ADAMW)
    elif offload_optimizer != "none":
        cfg["zero_force_ds_cpu_optimizer"] = False
    if "nvme" in (offload_optimizer, offload_param):
        # DeepSpeed's async I/O engine (libaio); small blocks and a short queue suit a laptop-class disk
        cfg["aio"] = {"block_size": 1_048_576, "queue_depth": 8, "single_submit": False, "overlap_events": True}
    return cfg


def stage_of(cfg: dict) -> int:
    return int(cfg.get("zero_optimization", {}).get("stage", 0))


def default_path(stage: int) -> Path:
    return CONFIG_DIR / f"zero{stage}.json"


def load_config(path) -> dict:
    """A DeepSpeed JSON as a dict (clear errors for a missing file or invalid JSON)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such DeepSpeed config: {path}")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a DeepSpeed config is a JSON object, got {type(cfg).__name__}")
    return cfg


def check_schema(cfg: dict, where: str) -> None:
    """DeepSpeed's own schema for the sections it validates with pydantic (``zero_optimization``: stages 0-3, no
    unknown or misspelt keys; ``bf16``): a ValueError naming the first bad field, before anything launches. Imports
    DeepSpeed's config modules only (seconds), so it runs for a user's ``--ds-config``; the shipped configs are
    checked by tests/test_configs.py."""
    import torch

    if os.environ.get("COURSEKIT_DEVICE") == "cpu" or not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no CUDA probing (and no CPU op build) for a schema check
    from pydantic import ValidationError
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    for key, model in (("zero_optimization", DeepSpeedZeroConfig), ("bf16", DeepSpeedBF16Config)):
        section = cfg.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ValueError(f"{where}: {key} must be a JSON object, got {type(section).__name__}")
        try:
            model(**section)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(x) for x in (key, *err.get("loc", ())))
            raise ValueError(f"{where}: {field}: {err.get('msg')} (DeepSpeed's schema), got "
                             f"{err.get('input')!r}") from None


def save_config(cfg: dict, path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(cfg, indent=2) + "\n")
    return p


def finalize(cfg: dict, *, micro_batch: int, grad_accum: int, world: int, dtype: str,
             stage: int | None = None) -> tuple[dict, list[str]]:
    """The config a run uses: the trainer's batch and precision written in, DeepSpeed defaults that change results
    made explicit. Returns (config, notes) — one note per value the trainer replaced."""
    cfg = copy.deepcopy(cfg)
    notes = []
    zero = cfg.setdefault("zero_optimization", {})
    if stage is not None:
        if "stage" in zero and int(zero["stage"]) != stage:
            raise ValueError(f"strategy zero{stage} was given a config with zero_optimization.stage "
                             f"{zero['stage']}; use --strategy zero{zero['stage']} or --strategy deepspeed")
        zero["stage"] = stage
    if stage_of(cfg) not in STAGES:
        raise ValueError(f"zero_optimization.stage must be one of {STAGES}, got {zero.get('stage')!r}")
    want = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
            "train_batch_size": micro_batch * grad_accum * world}
    for k, v in want.items():
        if k in cfg and cfg[k] != v:
            notes.append(f"{k}: config {cfg[k]} -> {v} (the trainer's batch flags decide the data)")
        cfg[k] = v
    if cfg.get("fp16", {}).get("enabled"):
        raise ValueError("fp16 is not supported by the course trainer (no loss scaling); use bf16")
    wants_bf16 = bool(cfg.get("bf16", {}).get("enabled"))
    if wants_bf16 and dtype != "bf16":
        raise ValueError("the config enables bf16 but the trainer runs --dtype fp32; pass --dtype bf16")
    cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": dtype == "bf16"}
    if "gradient_clipping" not in cfg:
        notes.append("gradient_clipping: not set -> 0.0 (DeepSpeed's default 1.0 would clip, unlike DDP)")
        cfg["gradient_clipping"] = 0.0
    if "optimizer" in cfg:
        params = cfg["optimizer"].get("params", {})
        notes.append(f"optimizer: the config's {cfg['optimizer'].get('type')} block decides (lr {params.get('lr')}, "
                     f"weight_decay {params.get('weight_decay')}); --lr / --weight-decay are not used")
    accum = (cfg.get("data_types") or {}).get("grad_accum_dtype")
    unmodelled = [k for k in ("round_robin_gradients", "parameter_alignment") if zero.get(k)] + (
        [f"data_types.grad_accum_dtype {accum}"] if accum and dtype == "bf16" and accum != "bf16" else [])
    if unmodelled:
        notes.append(f"{', '.join(unmodelled)}: a gradient layout `coursekit memory` does not model "
                     f"(it assumes DeepSpeed's defaults)")
    cfg.setdefault("steps_per_print", 1_000_000_000)
    return cfg, notes


def offload_devices(cfg: dict) -> dict:
    """{"optimizer": none|cpu|nvme, "param": none|cpu|nvme} as the config asks."""
    zero = cfg.get("zero_optimization", {})
    dev = {}
    for what in ("optimizer", "param"):
        block = zero.get(f"offload_{what}") or {}
        dev[what] = str(block.get("device", "none") or "none")
    return dev


# The files in configs/deepspeed/, generated from build_config (tests/test_zero_config.py keeps them in sync):
#   python -m coursekit.zero.ds_config configs/deepspeed
NVME_PATH = "/tmp/coursekit-nvme"
STANDARD = {
    "zero0": dict(stage=0),
    "zero1": dict(stage=1),
    "zero2": dict(stage=2),
    "zero3": dict(stage=3),
    "zero2_offload_cpu": dict(stage=2, offload_optimizer="cpu"),
    "zero3_offload_cpu": dict(stage=3, offload_optimizer="cpu", offload_param="cpu"),
    "zero3_offload_nvme": dict(stage=3, offload_optimizer="nvme", offload_param="nvme", nvme_path=NVME_PATH,
                               dtype="bf16"),
}


def main(argv=None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    out = Path(argv[0] if argv else CONFIG_DIR)
    for name, kw in STANDARD.items():
        print(save_config(build_config(**kw), out / f"{name}.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
