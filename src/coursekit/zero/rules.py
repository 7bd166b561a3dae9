"""What the DeepSpeed strategies refuse before launch, torch-free (``coursekit.parallel.rules``): what they support,
and a config that is missing, breaks DeepSpeed's schema or names another stage. ``strategy.py`` inherits it."""
from __future__ import annotations

import os

from coursekit.parallel.rules import Rules
from coursekit.spec import registry
from coursekit.zero import ZeROOptions
from coursekit.zero import ds_config as zc


class ZeRO(Rules):
    name = "deepspeed"
    stage: int | None = None  # the registry entry's (coursekit.spec.registry); None: the stage written in --ds-config

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.stage = registry.STRATEGIES[cls.name].zero  # a stage is written once, in the strategy's entry
    supports = {"checkpoint": False, "compile": False, "tp": False, "pp": False, "cp": False}
    why_not = {"checkpoint": "DeepSpeed writes its own checkpoints (engine.save_checkpoint), which the course does "
                             "not use",
               "compile": "DeepSpeed wraps the module; use its engine.compile() in your own script",
               "tp": "DeepSpeed's ZeRO runs over the whole world here; combine ZeRO-style sharding with TP through "
                     "FSDP2", "pp": "use DeepSpeed's own PipelineModule", "cp": "use DeepSpeed-Ulysses directly"}

    @classmethod
    def check(cls, opts, dims) -> None:
        super().check(opts, dims)
        cls._config(opts.of(ZeROOptions).ds_config)

    @classmethod
    def _config(cls, ds_config: str | None) -> tuple[str | None, dict]:
        """(path or None, raw config) for this stage; refuses a missing file or a config of another stage."""
        if cls.stage is None and not ds_config:
            raise ValueError("--strategy deepspeed takes its stage from a config: pass --ds-config FILE.json")
        path = ds_config or zc.default_path(cls.stage)
        path = str(path) if ds_config or os.path.exists(path) else None
        raw = zc.load_config(path) if path else zc.build_config(cls.stage)
        if ds_config:  # a user's config: DeepSpeed's own schema, before launching (the shipped ones have a test)
            zc.check_schema(raw, f"--ds-config {ds_config}")
        got = raw.get("zero_optimization", {}).get("stage")
        if cls.stage is not None and got is not None and int(got) != cls.stage:
            raise ValueError(f"strategy zero{cls.stage} was given a config with zero_optimization.stage {got}; "
                             f"use --strategy zero{got} or --strategy deepspeed")
        return path, raw


class Zero0(ZeRO):
    name = "zero0"


class Zero1(ZeRO):
    name = "zero1"


class Zero2(ZeRO):
    name = "zero2"


class Zero3(ZeRO):
    name = "zero3"
