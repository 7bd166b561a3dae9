"""Every DeepSpeed JSON and Accelerate YAML in configs/ is read by its own library, so a typo fails CI.

DeepSpeed: ``deepspeed.runtime.config.DeepSpeedConfig`` reads the file (duplicate keys rejected, pydantic sections
such as ``zero_optimization`` forbid unknown keys), and every top-level key must be one that DeepSpeed looked at
while parsing (DeepSpeed ignores unknown top-level keys, so ``"gradient_clippin"`` would silently do nothing).

Accelerate: ``load_config_from_file`` (unknown top-level keys and bad enum values rejected), every nested key must
be an ``accelerate launch`` argument (Accelerate copies them onto its argument namespace without checking), then
``accelerate launch``'s own command handling runs with the process launchers replaced by stubs, and the
DeepSpeed/FSDP plugin is built from the environment that launch would hand to the workers, which is where
Accelerate checks values and combinations.

The ``*_rejects_*`` tests write broken copies to a temporary folder and require the same checks to fail.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from unittest import mock

import pytest
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
DS_JSONS = sorted(CONFIGS.rglob("*.json"))
ACCEL_DIR = CONFIGS / "accelerate"
ACCEL_YAMLS = sorted(p for p in CONFIGS.rglob("*.y*ml")
                     if ACCEL_DIR in p.parents or re.search(r"^distributed_type:", p.read_text(), re.M))
EXPECTED_ACCEL = {"ddp", "multi_cpu", "deepspeed_zero2", "deepspeed_zero3", "fsdp2"}


# ---- DeepSpeed ----------------------------------------------------------------------------------------------------

class _Recording(dict):
    """A dict that remembers which keys were looked up (shared with its shallow copies)."""

    def __init__(self, *a, seen: set | None = None, **kw):
        super().__init__(*a, **kw)
        self.seen = set() if seen is None else seen

    def __getitem__(self, k):
        self.seen.add(k)
        return super().__getitem__(k)

    def get(self, k, *default):
        self.seen.add(k)
        return super().get(k, *default)

    def __contains__(self, k):
        self.seen.add(k)
        return super().__contains__(k)

    def pop(self, k, *default):
        self.seen.add(k)
        return super().pop(k, *default)

    def setdefault(self, k, default=None):
        self.seen.add(k)
        return super().setdefault(k, default)

    def __copy__(self):
        return _Recording(self, seen=self.seen)


def _drop_auto(d):
    """"auto" is filled in by the Accelerate/Transformers integration at run time: leave those to DeepSpeed's
    defaults here."""
    if isinstance(d, dict):
        return {k: _drop_auto(v) for k, v in d.items() if v != "auto"}
    return d


def check_deepspeed_json(path: Path):
    from deepspeed.runtime.config import DeepSpeedConfig

    raw = json.loads(Path(path).read_text())  # strict JSON (DeepSpeed's hjson reader would accept more)
    DeepSpeedConfig(str(path))  # DeepSpeed's own file reader: duplicate keys, types, batch-size arithmetic
    rec = _Recording(_drop_auto(raw))
    cfg = DeepSpeedConfig(rec)
    unknown = sorted(set(dict.keys(rec)) - rec.seen)
    if unknown:
        raise ValueError(f"{path}: DeepSpeed never reads the top-level key(s) {unknown} (typo?)")
    return cfg


def test_deepspeed_configs_exist():
    assert DS_JSONS, "no DeepSpeed JSON under configs/"


@pytest.mark.parametrize("path", DS_JSONS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_deepspeed_json_parses(path):
    cfg = check_deepspeed_json(path)
    m = re.search(r"zero(\d)", path.name)
    if m:  # the file name promises a ZeRO stage
        assert cfg.zero_optimization_stage == int(m.group(1))


def _ds_base() -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 2, "overlap_comm": False}}


@pytest.mark.parametrize("mutate, text, error, match", [
    (lambda d: d.update(gradient_clippin=1.0), None,                               # top-level typo
     ValueError, r"never reads the top-level key\(s\) \['gradient_clippin'\]"),
    (lambda d: d["zero_optimization"].update(overlap_com=True), None,              # typo inside a section
     ValidationError, r"DeepSpeedZeroConfig\s+overlap_com\s+Extra inputs are not permitted"),
    (lambda d: d["zero_optimization"].update(stage="two"), None,                   # wrong type
     ValidationError, r"DeepSpeedZeroConfig\s+stage\s+Input should be 0, 1, 2, 3"),
    (lambda d: d.update(bf16={"enabled": True}, fp16={"enabled": True}), None,     # contradictory
     AssertionError, "bfloat16 and fp16 modes cannot be simultaneously enabled"),
    (None, '{"train_micro_batch_size_per_gpu": 4, "train_micro_batch_size_per_gpu": 8}',  # duplicate key
     ValueError, r"Duplicate keys in DeepSpeed config: \['train_micro_batch_size_per_gpu'\]"),
    (None, '{"train_micro_batch_size_per_gpu": 4,}',                               # not JSON
     json.JSONDecodeError, "Expecting property name enclosed in double quotes"),
], ids=["top-level-typo", "section-typo", "wrong-type", "fp16-and-bf16", "duplicate-key", "trailing-comma"])
def test_deepspeed_check_rejects_a_broken_config(tmp_path, mutate, text, error, match):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_ds_base()))
    check_deepspeed_json(good)  # the unbroken base passes
    if text is None:
        d = _ds_base()
        mutate(d)
        text = json.dumps(d)
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(error, match=match):
        check_deepspeed_json(bad)


# ---- Accelerate ---------------------------------------------------------------------------------------------------

def check_accelerate_yaml(path: Path, cwd: Path = REPO) -> dict:
    """Returns {"launcher": ..., "env": ...}: what `accelerate launch --config_file PATH --num_processes 2` does."""
    import accelerate.commands.launch as launch
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    path = Path(path)
    cfg = load_config_from_file(str(path))
    parser = launch.launch_command_parser()
    known = {a.dest for a in parser._actions}
    prefixes = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}
    for section, value in vars(cfg).items():
        if isinstance(value, dict):
            for key in value:
                p = prefixes.get(section, "")
                arg = key if key.startswith(p) else p + key
                if arg not in known:
                    raise ValueError(f"{path}: {section}.{key} is not an `accelerate launch` option (typo?)")
    ds_file = (cfg.deepspeed_config or {}).get("deepspeed_config_file")
    if ds_file and not (cwd / ds_file).is_file():
        raise FileNotFoundError(f"{path}: deepspeed_config_file {ds_file} does not exist (relative to {cwd})")

    seen: dict = {}

    def deepspeed_launcher(args):
        seen.update(launcher="deepspeed", env=prepare_deepspeed_cmd_env(args)[1])

    def multi_gpu_launcher(args):
        seen.update(launcher="multi_gpu", env=prepare_multi_gpu_env(args))

    def simple_launcher(args):
        seen.update(launcher="simple", env={})

    args = parser.parse_args(["--config_file", str(path), "--num_processes", "2", "train.py"])
    old = os.getcwd()
    os.chdir(cwd)  # relative paths in the YAML are relative to where `accelerate launch` runs
    try:
        with mock.patch.object(launch, "deepspeed_launcher", deepspeed_launcher), \
                mock.patch.object(launch, "multi_gpu_launcher", multi_gpu_launcher), \
                mock.patch.object(launch, "simple_launcher", simple_launcher):
            launch.launch_command(args)
        env = {k: str(v) for k, v in seen["env"].items()}
        with mock.patch.dict(os.environ, env):
            if seen["launcher"] == "deepspeed":
                seen["plugin"] = DeepSpeedPlugin()
            elif env.get("ACCELERATE_USE_FSDP") == "true":
                seen["plugin"] = FullyShardedDataParallelPlugin()
    finally:
        os.chdir(old)
    return seen


def test_every_accelerate_flavour_has_a_yaml():
    assert {p.stem for p in ACCEL_YAMLS} >= EXPECTED_ACCEL


@pytest.mark.parametrize("path", ACCEL_YAMLS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_accelerate_yaml_parses(path):
    seen = check_accelerate_yaml(path)
    name = path.stem
    if name.startswith("deepspeed"):
        assert seen["launcher"] == "deepspeed"
        assert seen["plugin"].zero_stage == int(re.search(r"zero(\d)", name).group(1))
    elif name.startswith("fsdp2"):
        assert seen["plugin"].fsdp_version == 2
    else:
        assert seen["launcher"] == "multi_gpu"  # torchrun with N processes (on CPU too, see multi_cpu.yaml)


ACCEL_BASE = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: 'no'\nuse_cpu: false\n" \
             "debug: false\nnum_machines: 1\n"
FSDP_BASE = ACCEL_BASE.replace("MULTI_GPU", "FSDP") + "fsdp_config:\n  fsdp_version: 2\n" \
    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n" \
    "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_reshard_after_forward: true\n"
# (no mixed_precision: with a deepspeed_config_file, precision belongs in the JSON and Accelerate rejects it here)
DS_BASE = ACCEL_BASE.replace("MULTI_GPU", "DEEPSPEED").replace("mixed_precision: 'no'\n", "") + "deepspeed_config:\n" \
    "  deepspeed_config_file: ds.json\n  zero3_init_flag: false\n"


@pytest.mark.parametrize("base, old, new, error, match", [
    (ACCEL_BASE, "distributed_type:", "distributed_typ:",                         # top-level typo
     ValueError, "A `distributed_type` must be specified"),
    (ACCEL_BASE, "MULTI_GPU", "MULTI_GPUS",                                       # not a DistributedType
     ValueError, "'MULTI_GPUS' is not a valid DistributedType"),
    (FSDP_BASE, "fsdp_reshard_after_forward", "fsdp_reshard_after_forwrd",        # nested typo
     ValueError, "fsdp_config.fsdp_reshard_after_forwrd is not an `accelerate launch` option"),
    (FSDP_BASE, "SHARDED_STATE_DICT", "SHARDED_STATE_DICTT",                      # bad FSDP value
     KeyError, "SHARDED_STATE_DICTT"),
    (FSDP_BASE, "TRANSFORMER_BASED_WRAP", "TRANSFORMER_WRAP",                     # bad wrap policy
     ValueError, "Invalid auto wrap policy: TRANSFORMER_WRAP"),
    (DS_BASE, "zero3_init_flag: false", "zero3_init_flag: false\n  zero_stage: 2",  # duplicated in the JSON's place
     ValueError, r"When using `deepspeed_config_file`, the following .* will be ignored: \[.*'zero_stage'"),
    (DS_BASE, "ds.json", "missing.json",                                          # referenced file absent
     FileNotFoundError, "deepspeed_config_file missing.json does not exist"),
], ids=["top-level-typo", "bad-enum", "nested-typo", "bad-fsdp-value", "bad-wrap-policy",
        "ds-key-beside-json", "missing-ds-json"])
def test_accelerate_check_rejects_a_broken_config(tmp_path, base, old, new, error, match):
    (tmp_path / "ds.json").write_text(json.dumps(_ds_base()))
    good = tmp_path / "good.yaml"
    good.write_text(base)
    check_accelerate_yaml(good, cwd=tmp_path)  # the unbroken base passes
    assert old in base
    bad = tmp_path / "bad.yaml"
    bad.write_text(base.replace(old, new))
    with pytest.raises(error, match=match):
        check_accelerate_yaml(bad, cwd=tmp_path)
