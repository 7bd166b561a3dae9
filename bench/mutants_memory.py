"""bench/bench_mutation.py's tables for the rest of coursekit.memory (engines, deepspeed, calculator, shapes,
train_config, ...): module -> fast tests, survivor kinds in words, and equivalent
mutants one by one (mutmut's name without the module's prefix -> why no input can tell it from the code). Merged
into bench_mutation's MODULES / EQUIVALENT / MARKED."""

MODULES: dict[str, list[str]] = {}
EQUIVALENT: dict[str, list[str]] = {}
MARKED: dict[str, dict[str, str]] = {}
