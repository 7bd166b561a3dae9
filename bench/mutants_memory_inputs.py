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
    # the presets against transformers' models on the meta device (no weights), ~20 s
    "memory.presets": _ESTIMATE + ["tests/test_memory_presets.py", "tests/test_memory_presets_mutants.py"],
    # the command line in process: parser, keywords, refusals, stub solvers and estimate
    "memory.cli": _ESTIMATE + ["tests/test_memory_cli_mutants.py"],
}
EQUIVALENT: dict[str, list[str]] = {}
_MODEL = ("config's model {}: config returns only the TrainConfig of spec.calculator(), which never reads the run's "
          "model (RunSpec.calculator: the strategy's engine, the degrees, the batch, the schedule), and RunSpec "
          "checks no model name")
_DTYPE = ("_strategy's kw.get('dtype', 'bf16') default -> {}: the default only meets != 'fp32', true for every "
          "default but 'fp32'")
_WHOLE = ("{}: the tests before it (n even, n % block == 0, (n // block) % scaler_block == 0) make that quotient "
          "whole, and a whole float below 2**53 (every model's weight size) has the same remainder as the int")
_SET_AFTER = ("breakdown's initial {} -> {}: the loop never reads it and it is assigned (=, not +=) after the loop, "
              "in place (the dict keeps the key's position)")
_CLI_MODEL = ("run's spec_of(kw, model=ns.model) {}: only config_of's TrainConfig is read from that run, and "
              "RunSpec.calculator never reads the model (the model reaches the solvers and estimate by ns.model)")
_SUB_GROUP = ("positive_int's field name 'sub_group_size' -> {}: its ConfigError is a ValueError, caught on the "
              "next line and replaced by the --sub-group-size message")
MARKED: dict[str, dict[str, str]] = {
    "memory.cli": {
        "x_build_parser__mutmut_2": "ArgumentParser(allow_abbrev=False) -> None: argparse reads it as `if "
                                    "self.allow_abbrev`, None and False alike",
        **{f"x__config_kwargs__mutmut_{i}": _SUB_GROUP.format(what) for i, what in (
            (130, "None"), (134, "'XXsub_group_sizeXX'"), (135, "'SUB_GROUP_SIZE'"))},
        "x__fsdp_kwargs__mutmut_6": "--no-reshard's 'false' -> 'FALSE': the next line lowers it",
        "x_run__mutmut_21": "fp8's ns.dtype = 'bf16' -> None: spec_of drops None keywords and RunSpec's dtype "
                            "defaults to bf16 (kw.pop('dtype', 'bf16')): the same run",
        **{f"x_run__mutmut_{i}": f"need's key 'min-gpus' -> {what}: .get's default for any other --solve is the "
           "same ('batch', 'seq')" for i, what in ((41, "'XXmin-gpusXX'"), (42, "'MIN-GPUS'"))},
        **{f"x_run__mutmut_{i}": _CLI_MODEL.format(what) for i, what in ((89, "-> None"), (92, "left out"))},
    },
    "memory.presets": {
        **{f"x__{fn}__mutmut_{i}": f"_{fn}'s ModelShape(arch='llama', ...) left out: ModelShape's arch defaults to "
           "'llama'" for fn, i in (("llama", 18), ("qwen3", 23), ("mixtral", 18))},
        "x__mixtral__mutmut_29": "_mixtral's ModelShape(norm_eps=1e-5) left out: ModelShape's norm_eps defaults to "
                                 "1e-5",
        "x_to_hf_config_dict__mutmut_57": "d.pop(k, None) -> d.pop(k): every key a family drops (attention_bias, "
                                          "mlp_bias, head_dim) is in d, set a few lines above, so no KeyError",
    },
    "memory.qlora": {
        "x_check__mutmut_65": "(n // b) % sb -> (n / b) % sb: it is read only where n % b == 0 (the `or`'s first "
                              "test is False), so n / b is whole, and a whole float below 2**53 (every model's "
                              "weight size) has the same remainder as the int",
        **{f"x_check__mutmut_{i}": _WHOLE.format(what) for i, what in (
            (69, "the shard test's n // 2 -> n / 2"),
            (71, "the shard test's n // b -> n / b"), (72, "the shard test's n // b // sb -> n // b / sb"),
            (73, "the shard test's n // b // sb -> n / b // sb"))},
        **{f"x_breakdown__mutmut_{i}": _SET_AFTER.format(k, v) for i, k, v in (
            (41, "adapter_grads=0", "None"), (42, "adapter_optimizer=0", "None"), (53, "adapter_grads=0", "1"),
            (54, "adapter_optimizer=0", "1"))},
    },
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
