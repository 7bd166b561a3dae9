"""One vocabulary for a run: `coursekit train`, `coursekit memory`, `coursekit plan` and `coursekit layout` name a
knob the same way, offer the same choices (from coursekit.spec.run) and default alike.

Every flag two of the four CLIs share is compared. Where they still differ, the difference is written down below
with its reason; a new divergence (a copied choice list that drifts, a default changed in one tool) fails.
"""
from __future__ import annotations

import argparse

import pytest

from coursekit import layout_cli, options
from coursekit.memory import cli as memory_cli
from coursekit.plan import cli as plan_cli
from coursekit.spec import run

# flag -> reason. "subset": the trainer runs fewer choices than the calculator models; "default": defaults differ.
KNOWN = {
    ("--dtype", "subset"): "the trainer runs fp32 or bf16 autocast; the calculator and planner also model fp16",
    ("--dtype", "default"): "the trainer's default is fp32 (CPU labs), the calculator's and planner's bf16 (GPUs)",
    ("--recompute", "subset"): "selective recompute is modelled (calculator, planner) but not run by the trainer",
    ("--strategy", "default"): "trainer single (1 process), layout ddp (it shows N ranks), calculator none "
                               "(--engine/--zero given instead)",
    ("--seq", "default"): "the trainer has a small default (64); the calculator and planner require it",
    ("--model", "default"): "the trainer has a tiny default model; the calculator and planner require one",
    ("--grad-accum", "default"): "trainer 1; calculator None (= pp, the pipeline's micro-batches)",
    ("--microbatches", "default"): "the alias of --grad-accum, as above",
    ("--offload", "subset"): "the trainer offloads to CPU (FSDP2's CPUOffloadPolicy); the calculator also models "
                             "DeepSpeed's NVMe (ZeRO-Infinity)",
    ("--gpus-per-node", "default"): "the planner assumes 8-GPU nodes; layout shows no nodes unless asked",
    ("--gpu", "default"): "the planner prices an H100 by default; the calculator checks a fit only when asked",
    ("--ep", "default"): "the planner's --ep filters its search (None: every degree); the others' is the run's (1)",
    ("--sp-style", "default"): "the trainer runs torch's plan; the calculator's default follows --impl (fused: "
                               "Megatron's profile, hf: torch's)",
}


def _flags(parser: argparse.ArgumentParser, defaults: dict | None = None) -> dict:
    out = {}
    for a in parser._actions:
        for name in a.option_strings:
            if not name.startswith("--") or name == "--help":
                continue
            default = defaults.get(a.dest) if defaults is not None else a.default
            choices = tuple(a.choices) if a.choices is not None else None
            out[name] = (choices, default)
    return out


def _trainer_defaults() -> dict:
    opts = options.build({})
    out = {}
    for group in opts._groups.values():
        out.update(vars(group))
    out.update(vars(options.LaunchOptions()))
    return out


CLIS = {
    "train": lambda: _flags(options.build_parser(launcher=True), _trainer_defaults()),
    "memory": lambda: _flags(memory_cli.build_parser()),
    "plan": lambda: _flags(plan_cli.build_parser()),
    "layout": lambda: _flags(layout_cli.parser()),
}


@pytest.fixture(scope="module")
def flags():
    return {name: make() for name, make in CLIS.items()}


def test_shared_flags_have_one_set_of_choices_and_one_default(flags):
    shared = sorted({f for fl in flags.values() for f in fl if sum(f in fl for fl in flags.values()) > 1})
    assert {"--strategy", "--tp", "--pp", "--cp", "--dp-replicate", "--dp-shard", "--seq", "--dtype"} <= set(shared)
    problems = []
    for f in shared:
        seen = {cli: fl[f] for cli, fl in flags.items() if f in fl}
        choice_sets = {cli: set(c) for cli, (c, _) in seen.items() if c is not None}
        if len({frozenset(c) for c in choice_sets.values()}) > 1:
            nested = all(a <= b or b <= a for a in choice_sets.values() for b in choice_sets.values())
            if not (nested and (f, "subset") in KNOWN):
                problems.append(f"{f}: choices differ {choice_sets}")
        if len({repr(d) for _, d in seen.values()}) > 1 and (f, "default") not in KNOWN:
            problems.append(f"{f}: defaults differ { {cli: d for cli, (_, d) in seen.items()} }")
    assert not problems, "\n".join(problems)


def test_known_differences_are_still_real(flags):
    """A difference written down above that has been fixed must leave the list (it would hide a regression)."""
    stale = []
    for (f, kind), _ in KNOWN.items():
        seen = {cli: fl[f] for cli, fl in flags.items() if f in fl}
        if kind == "subset":
            real = len({frozenset(c) for c, _ in seen.values() if c is not None}) > 1
        else:
            real = len({repr(d) for _, d in seen.values()}) > 1
        if not real:
            stale.append((f, kind))
    assert not stale, f"these differences are gone, remove them from KNOWN: {stale}"


def test_choices_come_from_the_run_description(flags):
    t, m = flags["train"], flags["memory"]
    assert set(t["--strategy"][0]) == set(m["--strategy"][0]) == set(flags["layout"]["--strategy"][0]) == set(
        run.STRATEGIES)
    assert set(t["--pp-schedule"][0]) == set(m["--pp-schedule"][0]) == set(run.PP_SCHEDULES)
    assert set(t["--cp-impl"][0]) == set(m["--cp-impl"][0]) == set(run.CP_IMPLS)
    assert set(m["--recompute"][0]) == set(run.RECOMPUTE) and set(t["--recompute"][0]) == set(run.TRAINER_RECOMPUTE)


def test_every_strategy_is_modelled_or_refused_with_its_reason():
    from coursekit.memory.errors import ConfigError
    from coursekit.memory import estimate
    from coursekit.spec import registry

    for name, e in registry.STRATEGIES.items():
        world = dict(dp_shard=2) if e.flavour == "shard" else dict(dp_replicate=1, dp_shard=2) if \
            e.flavour == "hybrid" else dict(dp_replicate=1 if e.world == "one" else 2)
        if e.engine:
            assert estimate("tiny-llama", micro_batch=1, seq=64, strategy=name, **world).config.engine == e.engine
        else:
            with pytest.raises(ConfigError, match=f"strategy '{name}' is not modelled: .*{e.unmodelled[:20]}"):
                estimate("tiny-llama", micro_batch=1, seq=64, strategy=name, **world)
