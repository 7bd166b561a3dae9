"""bench/bench_mutation.py's tables for coursekit.plan (steptime, search, layout, links, hardware,
overlap): module -> fast tests, survivor kinds in words, and equivalent
mutants one by one (mutmut's name without the module's prefix -> why no input can tell it from the code). Merged
into bench_mutation's MODULES / EQUIVALENT / MARKED."""

MODULES: dict[str, list[str]] = {
    # the step-time model worked out by hand (pure Python, ~2 s); tests/test_plan.py's fast tier (searches, CLI
    # calls: 18 s a run) under each of the module's 942 mutants would take over half an hour
    "plan.steptime": ["tests/test_plan_steptime.py"],
}
EQUIVALENT: dict[str, list[str]] = {
    "plan.steptime": [
        "> 1 -> >= 1 where the degree-1 term costs 0 s anyway (sp, pp, ep, cp, dp_replicate, dp x cp)",
        "dropping a calls argument of 1 (Links.time's default): loss sync, DDP reduce, ZeRO gather",
        "kv_heads conditionals and // -> / that agree on every shape the calculator accepts; experts / ep vs //",
        "left open: _tp_cp_time's 'else 2' (kv heads) survives the tp 4 x cp 2 case, its ring hidden behind "
        "attention: a case where it is exposed would kill it"],
}
MARKED: dict[str, dict[str, str]] = {}
