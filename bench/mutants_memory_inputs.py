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
    "memory.vocab": _ESTIMATE + ["tests/test_memory_vocab_mutants.py"],  # every refusal whole, what the run carries
    # the fsdp2 engine's QLoRA bytes by hand (~2 s) and the module's own refusals and pieces
    "memory.qlora": _ESTIMATE + ["tests/test_memory_engines_mutants.py", "tests/test_memory_qlora_mutants.py"],
}
EQUIVALENT: dict[str, list[str]] = {}
_MODEL = ("config's model {}: config returns only the TrainConfig of spec.calculator(), which never reads the run's "
          "model (RunSpec.calculator: the strategy's engine, the degrees, the batch, the schedule), and RunSpec "
          "checks no model name")
_DTYPE = ("_strategy's kw.get('dtype', 'bf16') default -> {}: the default only meets != 'fp32', true for every "
          "default but 'fp32'")
MARKED: dict[str, dict[str, str]] = {
    "memory.vocab": {
        **{f"x_config__mutmut_{i}": _MODEL.format(what) for i, what in (
            (1, "default 'tiny-llama' -> 'XXtiny-llamaXX'"), (2, "default 'tiny-llama' -> 'TINY-LLAMA'"),
            (5, "passed as None"), (7, "left out (spec_of's default)"))},
        "x__strategy__mutmut_39": "(zero or 0) not in stages -> (zero or 1): registry.zero_stages is [0, 1, 2, 3] "
                                  "for deepspeed and [] for every other engine (where `stages and` is False), so 0 "
                                  "and 1 are both in it or the test is not made",
        **{f"x__strategy__mutmut_{i}": _DTYPE.format(what) for i, what in (
            (56, "None"), (58, "left out (None)"), (61, "'XXbf16XX'"), (62, "'BF16'"))},
    },
}
