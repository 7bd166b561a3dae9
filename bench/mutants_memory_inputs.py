"""bench/bench_mutation.py's tables for coursekit.memory's inputs and answers (qlora, answers, vocab, presets, cli):
module -> fast tests, survivor kinds in words, and equivalent mutants one by one (mutmut's name without the module's
prefix -> why no input can tell it from the code). Merged into bench_mutation's MODULES / EQUIVALENT / MARKED."""

# the calculator's pure-Python tests (a copy of bench/mutants_memory.py's list, not an import: each area file stands
# alone): no launch, each runs in well under a second, mutmut runs only those that reach the mutant
_ESTIMATE = ["tests/test_memory_states.py",
             "tests/test_memory_engines.py::test_a_new_engine_needs_only_a_module_and_a_registry_line",
             "tests/test_memory_engines.py::test_fsdp2_layout_lists_every_tensor_of_every_family",
             "tests/test_zero_config.py", "tests/test_memory_cli.py", "tests/test_memory_solvers.py",
             "tests/test_memory_answers.py", "tests/test_memory_vocab.py"]

MODULES: dict[str, list[str]] = {
    "memory.answers": _ESTIMATE + ["tests/test_memory_answers_mutants.py"],  # each sentence, stub solvers
    "memory.vocab": _ESTIMATE,
}
EQUIVALENT: dict[str, list[str]] = {}
MARKED: dict[str, dict[str, str]] = {}
