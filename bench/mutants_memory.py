"""bench/bench_mutation.py's tables for the rest of coursekit.memory (engines, deepspeed, calculator, shapes,
train_config, ...): module -> fast tests, survivor kinds in words, and equivalent
mutants one by one (mutmut's name without the module's prefix -> why no input can tell it from the code). Merged
into bench_mutation's MODULES / EQUIVALENT / MARKED."""

# the calculator's pure-Python tests (no launch; test_memory_engines.py's live DDP runs and test_fsdp_memory.py's
# measured fixture are left out): each runs in well under a second, mutmut runs only those that reach the mutant
_ESTIMATE = ["tests/test_memory_states.py",
             "tests/test_memory_engines.py::test_a_new_engine_needs_only_a_module_and_a_registry_line",
             "tests/test_memory_engines.py::test_fsdp2_layout_lists_every_tensor_of_every_family",
             "tests/test_zero_config.py", "tests/test_memory_cli.py", "tests/test_memory_solvers.py",
             "tests/test_memory_answers.py", "tests/test_memory_vocab.py"]
_ENGINES = _ESTIMATE + ["tests/test_memory_engines_mutants.py"]  # hand-worked bytes of each engine (~2 s)

MODULES: dict[str, list[str]] = {
    "memory.engines.base": _ENGINES,
    "memory.engines.ddp": _ENGINES,
    "memory.engines.deepspeed": _ENGINES,
    "memory.engines.fsdp2": _ENGINES,
    "memory.engines.megatron": _ESTIMATE + ["tests/test_memory_megatron_mutants.py"],  # stages by hand
    "memory.deepspeed": _ESTIMATE + ["tests/test_memory_deepspeed_mutants.py"],  # DeepSpeed's rules by hand
    "memory.calculator": _ESTIMATE + ["tests/test_memory_calculator_mutants.py"],  # the sums, with stubs
    # the shapes by hand (no torch; the caches cleared), then the meta-device models and the calculator's users
    "memory.shapes": ["tests/test_memory_shapes_mutants.py", *_ESTIMATE, "tests/test_memory_presets.py",
                      "tests/test_memory_engines_mutants.py"],
    # torchtitan's per-op policy by hand, and measured with torch on CPU (one process), its refusals; not the launches
    # (op_recompute's own tests first: by hand, no torch; activation_bytes is cached, so they call it directly)
    "memory.op_recompute": ["tests/test_memory_op_recompute_mutants.py",
                            "tests/test_recompute_op.py::test_op_saved_bytes_equal_the_calculator_to_the_byte",
                            "tests/test_recompute_op.py::test_op_kernels_and_biases_equal_the_calculator",
                            "tests/test_recompute_op.py::test_every_second_mm_is_recomputed",
                            "tests/test_recompute_op.py::test_the_policy_counts_forward_and_recompute_apart",
                            "tests/test_recompute_op.py::test_op_is_refused_where_not_modelled",
                            "tests/test_recompute_op.py::test_flops_and_planner_accept_op",
                            "tests/test_recompute_op.py::test_memory_cli_op_and_bad_value_in_one_line",
                            "tests/test_memory_flops.py"],
    "memory.solvers": _ESTIMATE + ["tests/test_memory_solvers_mutants.py"],  # the searches, with a stub estimate
    "memory.train_config": _ESTIMATE + ["tests/test_memory_train_config_mutants.py"],  # every refusal, whole
}
EQUIVALENT: dict[str, list[str]] = {}

_SUPER_CHECK = "super().check(..., {}=None): Engine.check reads only zero (the offload targets are the subclass's)"
_DIV_ONE = "DDP's {} / 1.0 -> * 1.0: the same float for every value"
_ZEROED = ("{} += -> = : {} is 0.0 just before (set two lines above, nothing added in between), so both give the "
           "same sum")
_PER_ELEMENT = ("the per-element formula call's {}: that StateBytes is read only for its .convention, which depends "
                "on the precision alone")
_BELOW_MIN = ("a gradient fragment below the 1 MiB minimum: {}; q <= p, so q·4 < min_bytes too and the second test "
              "adds 0 either way")
_HF_DEFAULT = ("the config.json reader's {what}: where it applies (a key missing from the config), ModelShape gets "
               "None or no value, and its own default for that family is the same {value}")
MARKED: dict[str, dict[str, str]] = {
    "memory.shapes": {
        "xǁModelShapeǁ__post_init____mutmut_120": "head_dim's hidden // heads -> hidden / heads: reached only when "
                                                  "hidden % heads == 0 (refused just above otherwise), so the float "
                                                  "is whole and positive_int returns the same int",
        "xǁModelShapeǁ_post_init_moe__mutmut_88": "float('inf') -> float('INF'): float() parses infinity in any "
                                                  "case, the same number",
        "xǁModelShapeǁ_local_params__mutmut_1": "_local_params' ep=1 default -> 2: its one caller (the cached "
                                                "module function) always passes ep",
        **{f"x__moe_fields__mutmut_{i}": _HF_DEFAULT.format(what=w, value=v) for i, w, v in (
            (27, "num_experts_per_tok 2 -> None", "(top_k 2)"), (29, "num_experts_per_tok 2 -> (none)", "(top_k 2)"),
            (95, "norm_topk_prob False -> None", "(bool(None) is False)"),
            (97, "norm_topk_prob False -> (none)", "(bool(None) is False)"))},
        **{f"x__from_llama__mutmut_{i}": _HF_DEFAULT.format(what=w, value=v) for i, w, v in (
            (21, "qwen2 o_bias=False -> None (always applies)", "(o_bias None: qkv_bias and family != qwen2, False)"),
            (23, "qwen2 o_bias=False -> left out (always applies)",
             "(o_bias None: qkv_bias and family != qwen2, False)"),
            (60, "arch='llama' -> left out (always applies)", "(arch 'llama')"),
            (102, "tie_word_embeddings False -> None", "(llama: untied)"),
            (104, "tie_word_embeddings False -> (none)", "(llama: untied)"),
            (109, "hidden_act 'silu' -> None", "(llama: silu)"), (111, "hidden_act 'silu' -> (none)", "(llama: silu)"),
            (128, "attention_bias False -> None", "(qkv_bias None: False for llama, and o_bias with it)"),
            (130, "attention_bias False -> (none)", "(qkv_bias None: False for llama, and o_bias with it)"),
            (135, "mlp_bias False -> None", "(llama: no MLP bias)"),
            (137, "mlp_bias False -> (none)", "(llama: no MLP bias)"),
            (151, "attention_dropout 0.0 -> None", "(None or 0.0 is 0.0)"),
            (153, "attention_dropout 0.0 -> (none)", "(None or 0.0 is 0.0)"))},
        **{f"x__from_gpt2__mutmut_{i}": _HF_DEFAULT.format(what=w, value=v) for i, w, v in (
            (79, "tie_word_embeddings True -> None", "(gpt2: tied)"),
            (81, "tie_word_embeddings True -> (none)", "(gpt2: tied)"),
            (86, "activation_function 'gelu_new' -> None", "(gpt2: gelu_new)"),
            (88, "activation_function 'gelu_new' -> (none)", "(gpt2: gelu_new)"))},
    },
    "memory.op_recompute": {
        "x__linears__mutmut_49": "count += not biased -> -= : only count % 2 is read, and -n % 2 == n % 2 (Python's "
                                 "% of a positive modulus is never negative), so the same mms are kept",
    },
    "memory.solvers": {
        **{f"x_max_micro_batch__mutmut_{i}": f"the kwargs' filter 'batch' -> {what}: the config is built from "
           "{**kwargs, 'batch': 1}, which overrides a given batch either way" for i, what in
           ((5, "'XXbatchXX'"), (6, "'BATCH'"))},
        "x_max_micro_batch__mutmut_13": "the first config's batch 1 -> 2: every estimate replaces it (replace(cfg, "
                                        "batch=b)), no field is derived from it, and _capacity reads only its gpu",
        **{f"x_max_seq_len__mutmut_{i}": f"the kwargs' filter 'seq' -> {what}: the config is built from "
           "{**kwargs, 'seq': unit}, which overrides a given seq either way" for i, what in
           ((6, "'XXseqXX'"), (7, "'SEQ'"))},
    },
    "memory.train_config": {
        "xǁTrainConfigǁ__post_init____mutmut_76": "getattr(engine, 'autocast', False) -> default None: read as `not "
                                                  "...`, None and False both refuse",
    },
    "memory.deepspeed": {
        "x_partition_params__mutmut_2": "size // world -> / world: padded() is a multiple of 2·world, so the float is "
                                        "whole and every comparison (the indices returned) the same",
        "x_partition_params__mutmut_19": "cur < start -> cur <= start: at cur == start the first clause (start <= "
                                         "cur < end) already holds when size > 0; with size 0 every tensor is empty "
                                         "(cur + n == cur)",
        "x_deepspeed_bytes__mutmut_270": "host |= {...} -> host = {...}: host is the empty set just before",
        **{f"x_nvme_file_bytes__mutmut_{i}": _BELOW_MIN.format(what) for i, what in (
            (126, "its first test `or True`"), (130, "p·4 >= min -> p·5 >= min"), (132, "q = 0 -> q = 1"))},
    },
    "memory.engines.ddp": {
        "xǁDDPǁcheck__mutmut_2": _SUPER_CHECK.format("offload"),
        "xǁDDPǁcheck__mutmut_3": _SUPER_CHECK.format("offload_params"),
        **{f"xǁDDPǁformula__mutmut_{i}": _DIV_ONE.format(term)
           for i, term in ((20, "param"), (23, "grad"), (26, "master"), (30, "state"), (37, "gc"))},
    },
    "memory.engines.deepspeed": {
        "xǁDeepSpeedǁcheck__mutmut_2": _SUPER_CHECK.format("offload"),
        "xǁDeepSpeedǁcheck__mutmut_3": _SUPER_CHECK.format("offload_params"),
        "xǁDeepSpeedǁstates__mutmut_3": "super().states(None, c, stage): Engine.states never reads the shape",
        "xǁDeepSpeedǁformula__mutmut_132": _ZEROED.format("offload cpu's cpu", "cpu"),
        "xǁDeepSpeedǁformula__mutmut_135": _ZEROED.format("offload nvme's nvme", "nvme"),
        "xǁDeepSpeedǁformula__mutmut_137": _ZEROED.format("offload nvme's cpu", "cpu"),
        "xǁDeepSpeedǁunits__mutmut_9": "super().units(None, P, stage): Engine.units reads only the stage",
        "xǁDeepSpeedǁunits__mutmut_10": "super().units(c, None, stage): Engine.units reads only the stage",
    },
    "memory.engines.fsdp2": {
        "xǁFSDP2ǁcheck__mutmut_2": _SUPER_CHECK.format("offload"),
        "xǁFSDP2ǁcheck__mutmut_3": _SUPER_CHECK.format("offload_params"),
        "xǁFSDP2ǁstates__mutmut_10": "super().states(None, c, stage): Engine.states never reads the shape",
        **{f"xǁFSDP2ǁstates__mutmut_{i}": _PER_ELEMENT.format(what) for i, what in (
            (42, "zero=None"), (44, "offload=None"), (45, "offload_params=None"), (55, "params 1 -> 2"),
            (56, "shard 1 -> 2"), (57, "param_tensors 0 -> 1"))},
        **{f"xǁFSDP2ǁunits__mutmut_{i}": f"`max(blocks) if blocks else 0` {what}: dead, every exact layout has a block "
           "per layer (unit_sizes, qlora's unit_gather_bytes) and ModelShape refuses 0 layers"
           for i, what in ((36, "-> `if blocks or True`"), (38, "-> `else 1`"))},
        "xǁFSDP2ǁbuckets__mutmut_20": "reduce = 4 if M else P -> `if M or True`: the one precision without a master "
                                      "copy (M = 0) is fp32, whose P is 4 too",
    },
}
