"""bench/bench_mutation.py's tables for coursekit.plan (steptime, search, layout, links, hardware,
overlap, cli, calibrate, measure): module -> fast tests, survivor kinds in words, and equivalent
mutants one by one (mutmut's name without the module's prefix -> why no input can tell it from the code). Merged
into bench_mutation's MODULES / EQUIVALENT / MARKED."""

MODULES: dict[str, list[str]] = {
    # the step-time model worked out by hand (pure Python, ~2 s); tests/test_plan.py's fast tier (searches, CLI
    # calls: 18 s a run) under each of the module's 1,223 mutants would take hours
    "plan.steptime": ["tests/test_plan_steptime.py", "tests/test_plan_steptime_mutants.py"],
    # pure-Python selections only (no search, no CLI run, no torch): each under ~5 s
    "plan.links": ["tests/test_comm_nccl.py", "tests/test_plan_steptime.py",
                   "tests/test_plan.py::test_groups_sit_on_nvlink_or_the_network_by_mesh_order",
                   "tests/test_plan.py::test_expert_parallel_all_to_alls_sit_inside_a_node_or_cross_it",
                   "tests/test_plan.py::test_ddps_gradient_all_reduce_hides_behind_backward_derived_by_hand",
                   "tests/test_plan_links_mutants.py"],
    "plan.overlap": ["tests/test_plan_steptime.py",
                     "tests/test_plan.py::test_bad_input_one_message_exit_2", "tests/test_plan_overlap_mutants.py"],
    "plan.layout": ["tests/test_plan_steptime.py", "tests/test_plan_layout_mutants.py",
                    "tests/test_plan.py::test_parse_layout_types_values_and_refuses_unknown_keys",
                    "tests/test_runspec.py::test_the_planner_layout_is_the_same_run",
                    "tests/test_runspec.py::test_the_planners_layout_takes_the_trainers_names"],
    "plan.hardware": ["tests/test_comm_nccl.py", "tests/test_plan_steptime.py",
                      "tests/test_plan.py::test_presets_cite_sources_and_cover_the_required_gpus",
                      "tests/test_plan.py::test_alpha_beta_fit_recovers_the_line_and_overrides_load",
                      "tests/test_plan.py::test_an_ambiguous_gpu_name_is_refused_with_both_names",
                      "tests/test_plan_hardware_mutants.py"],
    # tests/test_plan.py without its measured CPU runs (torch launches), subprocess calls, its slowest searches and
    # the published runs (they read bench/bench_planner.py, which mutmut's copy does not hold)
    "plan.search": ["tests/test_plan_search_mutants.py", "tests/test_plan.py", "-k",
                    "not cpu_ and not imports_no_torch and not registered_command and not 3072 and not "
                    "overlap_and_gradient_dtype and not plot_marks and not published and not gpt3_row and not "
                    "float8_speed_ups"],
    "plan.cli": ["tests/test_plan_cli_mutants.py", "tests/test_plan.py::test_bad_input_one_message_exit_2",
                 "tests/test_plan.py::test_json_lists_candidates_with_the_contract_keys",
                 "tests/test_plan.py::test_plain_output_says_why_the_best_win",
                 "tests/test_plan.py::test_layout_evaluates_one_given_layout",
                 "tests/test_plan.py::test_plot_marks_the_pareto_front"],
    # one process, no launch: the calibrations' child process and trainer runs stubbed, the DTensor calibration's
    # own work run here (a slow-tier test: three model builds, ~3-10 s; the default tier leaves it out)
    "plan.calibrate": ["tests/test_plan_calibrate_mutants.py"],
    # one process, no launch: the rates around a stubbed timer, the launching functions' arguments and answers stubbed
    "plan.measure": ["tests/test_plan_measure_mutants.py"],
}
EQUIVALENT: dict[str, list[str]] = {
    "plan.hardware": [
        "left open: _number's `isinstance(current, dict) and isinstance(v, dict)` -> `or` differs only for a "
        "mapping given to a scalar field or a scalar to a mapping field, which neither version refuses cleanly"],
}
# reasons shared by several mutants
_DEG1 = "{} -> >= 1: at degree 1 that group has one rank, where Links.time / Links.p2p return 0 s; {}"
_KV = ("kv_heads' {}: the planner prices only layouts spec.dims.check_model accepted (search._check, before every "
       "predict), which refuses kv >= tp with kv % tp != 0; so kv // tp is whole and kv == tp gives 1 either way")
_SYM = ("the op policy's MLP GEMM {}: gemm_time(M, K, N) is symmetric in K and N (2MKN FLOPs, MK + KN + MN bytes, "
        "e(K)e(N)), so (t, h, f/tp) and (t, f/tp, h) cost the same")
_AXES_ALL = ("Links.deg's getattr(layout, a, 1) default {}: Layout has a field for every axis of AXES (pp, "
             "dp_replicate, dp_shard, cp, tp), so the default is never read")
_LV = ("the cross-node alpha's lv = 2 for an all-reduce {}: an all-reduce never reaches this branch (unmeasured it is "
       "priced by NCCL's model, nccl.TUNED; measured, it takes the measured alpha)")
MARKED: dict[str, dict[str, str]] = {
    "plan.cli": {
        "x_build_parser__mutmut_2": "allow_abbrev=False -> None: argparse only tests `if self.allow_abbrev`, both falsy "
                                    "(no abbreviation taken either way)",
        **{f"x_build_parser__mutmut_{i}": f"{flag}'s default=None dropped: argparse's default for an option is None"
           for i, flag in ((207, "--plot"), (223, "--ep"), (235, "--layout"), (249, "--hardware"), (265, "--overlap"),
                           (284, "--grad-reduce-dtype"))},
        "x_plot__mutmut_5": "FigureCanvasAgg(fig) -> FigureCanvasAgg(None): the figure keeps its own FigureCanvasBase, "
                            "whose print_figure draws a .png through Agg as well (the same bytes, matplotlib 3.11)",
        **{f"x_plot__mutmut_{i}": f"the fitting points' color='C0' {what}: scatter's default is the axes' next cycle "
           "colour, C0 for this first artist of a new axes (the same file)" for i, what in ((12, "-> None"),
                                                                                          (14, "dropped"))},
        **{f"x_plot__mutmut_{i}": f"ax.grid(True, ...) {what}: with line properties given (alpha) matplotlib's grid "
           "takes visible None as True" for i, what in ((93, "-> grid(None, ...)"), (96, "-> visible left out"))},
        "x_plot__mutmut_101": "grid's which='both' -> 'BOTH': Axis.grid lower-cases it first",
    },
    "plan.calibrate": {
        **{f"x__dtensor_calibration__mutmut_{i}": f"the 1-rank group's backend 'gloo' {what}: the calibration's "
           "mesh is init_device_mesh('cpu'), whose collectives (none on one rank) run on the group's CPU backend, "
           "gloo either way (torch 2.13)" for i, what in (
               (3, "-> None (torch's default: cpu:gloo, plus nccl for CUDA tensors where built)"),
               (7, "left out (the same default)"), (12, "-> 'GLOO' (Backend() lower-cases the name)"))},
        **{f"x__dtensor_calibration__mutmut_{i}": f"apply_lm(model, mesh, 1, 0)'s {what}: CALIBRATION_MODEL has 2 "
           "query and 2 K/V heads, so kv >= tp for tp 1 and 2 (K/V split, no replication: the rank is read only to "
           "replicate K/V heads when kv < tp) and num_key_value_groups (2 // tp) // max(2 // tp, 1) is 1 for both"
           for i, what in ((66, "rank 0 -> None"), (71, "tp 1 -> 2"), (72, "rank 0 -> 1"))},
        "x__dtensor_calibration__mutmut_78": "AdamW's lr 1e-3 -> 1.001: the rate scales the update's values only; "
                                             "the optimizer runs the same ops (counted) on the same shapes (timed)",
        **{f"x__dtensor_calibration__mutmut_{i}": f"the step's use_cache=False {what}: coursekit.models.build_model "
           "sets the config's use_cache False, which the forward reads when it is not given" for i, what in (
               (80, "-> None"), (82, "left out"))},
    },
    "plan.measure": {
        **{f"x_host_hardware__mutmut_{i}": f"the half dimension's bisection {what}: the root (a half dimension well "
           "inside [0, 1e5]) is bracketed either way and 100 halvings of a 1e5-wide bracket (1e5 / 2^100 ~ 8e-26) "
           "end on it to the last bits: the same h, float rounding apart" for i, what in (
               (35, "upper bound 1e5 -> 100001"), (37, "100 steps -> 101"),
               (52, "test f(h) > ratio -> >=: they differ only where f(h) equals the ratio exactly, the root itself"))},
    },
    "plan.links": {
        **{f"xǁLinksǁ__init____mutmut_{i}": _AXES_ALL.format(what) for i, what in ((4, "-> None"), (7, "dropped"),
                                                                                   (8, "-> 2"))},
        "xǁLinksǁ_placement__mutmut_23": "ep_rest's host // ep -> host / ep: Layout refuses an ep that does not divide "
                                        "dp x cp, so the quotient is whole (the same number, as a float)",
        "xǁLinksǁ_placement__mutmut_40": "k's stride >= g -> False: for stride >= g, g // stride <= 1, so "
                                        "max(1, min(n, g // stride)) is 1 as well",
        "xǁLinksǁ_placement__mutmut_43": "k's stride >= g -> stride > g: at stride == g, max(1, min(n, g // g)) is 1 too",
        **{f"xǁLinksǁtime__mutmut_{i}": f"the alpha-beta branch's ring_steps(op, {w}) -> ring_steps(None, {w}): only "
           "ops outside nccl.TUNED and unmeasured reach it (all-to-all), for which ring_steps counts n - 1 as for None"
           for i, w in ((45, "n"), (61, "k"))},
        **{f"xǁLinksǁtime__mutmut_{i}": _LV.format(what) for i, what in (
            (50, "-> never"), (52, "-> 3"), (54, "(name misspelt)"), (55, "(name upper-cased)"))},
    },
    "plan.layout": {
        "xǁLayoutǁfrom_spec__mutmut_52": "spec.batch(dims) -> spec.batch(None): batch then builds spec.dims() again, "
                                         "the same mesh (a frozen spec; only slower)",
    },
    "plan.search": {
        **{f"x_{f}__mutmut_{i}": f"{f}'s default {what}: the GPU table and network presets are looked up "
           "case-insensitively (spec.gpus, hardware.network), the same preset" for f, i, what in (
               ("make_cluster", 2, "gpu 'H100-80GB' -> 'h100-80gb'"), ("make_cluster", 4, "network 'ib-400' -> 'IB-400'"),
               ("evaluate", 3, "gpu 'H100-80GB' -> 'h100-80gb'"), ("evaluate", 5, "network 'ib-400' -> 'IB-400'"),
               ("plan", 3, "gpu 'H100-80GB' -> 'h100-80gb'"), ("plan", 5, "network 'ib-400' -> 'IB-400'"))},
        "x_plan__mutmut_134": "a refused stub's skipped.add(key) -> add(None): the key leaves out only cp_impl, so the "
                              "one later stub of a key is the ulysses one after its ring stub; a refusal of the ring "
                              "stub's smallest configuration does not depend on cp_impl (the calculator's only "
                              "cp_impl checks are Ulysses', memory.activations._check), so evaluating the ulysses "
                              "stub raises the same and skips it as well",
        "x_make_cluster__mutmut_16": "gpus % per_node and gpus > per_node -> >=: at gpus == per_node the remainder is 0",
        "x_pareto__mutmut_4": "float('inf') -> float('INF'): float() reads infinity in any case",
        "x__divisors__mutmut_7": "range(1, n + 1) -> range(1, n + 2): n % (n + 1) is n, never 0 for n >= 1",
        **{f"x__check__mutmut_{i}": f"_check's cp_impl given when cp > 1 -> {what}: at cp 1 check_model's Ulysses "
           "test is heads % tp (refused just before it already) and its sequence test needs cp > 1"
           for i, what in ((18, "always"), (19, "cp >= 1"))},
        "xǁ_Evaluatorǁ__init____mutmut_1": "compile's default False -> True: both callers (evaluate, plan) pass it",
        "x_layouts_of__mutmut_13": "seq // cp < 1024 -> seq / cp < 1024: for a whole bound N, floor(x) < N iff x < N",
        "x_layouts_of__mutmut_16": "seq % (2 x cp) -> seq % (2 / cp): the layouts it lets through are refused by _check "
                                   "(check_model: ring attention needs seq % 2cp, Ulysses seq % cp) before they are "
                                   "yielded",
        **{f"x_layouts_of__mutmut_{i}": f"the virtual stages at pp 1 {what}: Layout refuses virtual_stages > 1 "
           "without pp > 1, and the loop skips what Layout refuses" for i, what in ((54, "-> (1, 2, 4)"),
                                                                              (55, "pp >= 1"))},
        "x_layouts_of__mutmut_58": "pp x v > layers -> pp / v > layers: pp / v <= pp <= layers (the loop broke on pp > "
                                   "layers), so it never skips; what it lets through (pp x v > layers) _check refuses "
                                   "(check_model: layers < pp x virtual_stages) before it is yielded",
        **{f"xǁ_Evaluatorǁ_run__mutmut_{i}": f"the shared run's base {what}: that field feeds only the calculator's "
           "batch / recompute / microbatches keywords, which peak() overwrites with the layout's own, and RunSpec "
           "checks it against nothing else here (no global batch given: batch() returns the micro-batch as is)"
           for i, what in ((12, "microbatches B // dp -> None (grad_accum 1)"),
                           (17, "microbatches left out (the layout's own: None in a search, or what --layout gave)"),
                           (14, "micro_batch=1 left out (the first layout's micro-batch)"),
                           (18, "micro_batch=1 -> 2"),
                           (15, "recompute='none' left out (the first layout's policy; recompute_layers is None)"))},
        **{f"xǁ_Evaluatorǁpeak__mutmut_{i}": f"peak's `except LayoutError: raise ConfigError(str(exc))` {what}: dead, "
           "TrainConfig(**kw) refuses with ConfigError only (memory.train_config: choice, positive_int and its own "
           "checks); the run's LayoutError (RunSpec.calculator) comes from _run, before the try"
           for i, what in ((38, "-> ConfigError(None)"), (39, "-> ConfigError('None')"))},
        "x_plan__mutmut_137": "a stub over the capacity's skipped.add(key) -> add(None): the one later stub of a key "
                              "is the ulysses one after its ring stub (the key leaves out only cp_impl), and Ulysses "
                              "saves ring's sizes head-sharded plus the output once more (memory.activations' "
                              "docstring and _attention: q, k/v, log-sum-exp each >= ring's, one more output), so its "
                              "smallest configuration is over the capacity too and no nearer (closest keeps the first "
                              "of a tie)",
        **{f"x_plan__mutmut_{i}": f"the op-policy skip {what}: it skips less, and what it no longer skips the "
           "calculator refuses (memory.op_recompute.check: cp > 1, ep > 1, or tp > 1 on an MoE block -> ConfigError), "
           "which the micro-batch loop catches for every micro-batch: no candidate, and no closest (peak raises before "
           "it records one)" for i, what in (
               (151, "rc == 'op' -> 'XXopXX' (never)"), (152, "rc == 'op' -> 'OP' (never)"),
               (153, "'recompute' not in fixed -> a misspelt key (always)"),
               (154, "'recompute' not in fixed -> 'RECOMPUTE' (always)"),
               (155, "'recompute' not in fixed -> in fixed"), (156, "cp/ep or (tp and MoE) -> and"),
               (162, "max(cp, ep) > 1 -> > 2"), (165, "tp > 1 -> tp > 2 on an MoE model"))},
        "x_plan__mutmut_166": "the op-policy skip's continue -> break: op is the last of RECOMPUTE (and a fixed "
                              "recompute is a one-item list), so nothing follows it in the loop",
        "x_plan__mutmut_188": "a ConfigError's continue -> break in the micro-batch loop: the calculator's refusals "
                              "there do not depend on the micro-batch (recompute, kernel, degrees: fixed in the loop), "
                              "except dualpipev's micro-batches >= 2 pp (pp_order), and m = B / (dp x mb) only falls "
                              "as the micro-batch grows; RoundsError, the one that does not, is caught just before",
        "xǁ_Evaluatorǁpeak__mutmut_32": "peak's precision '16psi' for a 16-bit dtype -> None: TrainConfig takes None "
                                        "as its default, 16psi for a 16-bit dtype (memory.train_config), and the run's "
                                        "own (ddp's fp32 autocast) is overridden either way",
        "x_layouts_of__mutmut_60": "pp x v > layers: continue -> break: v runs 1, 2, 4 upward, so once pp x v is over "
                                   "the layers every later v is too",
        "x_layouts_of__mutmut_86": "a refused layout's continue -> break in the ep loop: there only Layout's ep rule "
                                   "(no EP with DeepSpeed) refuses, for every ep > 1 alike, and ep 1 comes first",
        "x__check__mutmut_22": "_check's sp when tp > 1 -> tp >= 1: at tp 1 SP's seq % (tp x cp) is seq % cp, which "
                               "check_model's CP test (seq % 2cp ring, seq % cp Ulysses) has refused first",
    },
    "plan.hardware": {
        **{f"x_fit_alpha_beta__mutmut_{i}": f"the slope's {what}: adds 2 x {m} x sum({d}), and that sum is 0 (the "
           "mean's definition): the same least-squares slope in exact arithmetic, float rounding apart"
           for i, what, m, d in ((40, "(x - mx) -> (x + mx)", "mx", "y - my"),
                                 (41, "(y - my) -> (y + my)", "my", "x - mx"))},
    },
    "plan.steptime": {
        "x_predict__mutmut_39": "sp = L.sp and tp >= 1: with tp 1 every use of sp is a no-op (E_H / tp with tp 1, "
                                "TP collectives over a 1-rank group cost 0, the PP send divides by tp = 1, host DTensor "
                                "work and the tp overlap need tp > 1)",
        "x_predict__mutmut_171": _DEG1.format("the PP send's pp > 1", "nothing else is computed"),
        "x_predict__mutmut_178": "the PP send's divisor (sp or tp > 1) -> True: divides by tp, and when neither holds "
                                 "tp is 1",
        "x_predict__mutmut_180": "the PP send's divisor tp > 1 -> tp >= 1: divides by tp, which is then 1",
        "x_predict__mutmut_223": _DEG1.format("the MoE all-to-all's ep > 1", "exposed_s' 'ep' key has its own ep > 1"),
        "x_predict__mutmut_252": "bubble's pp > 1 -> True: (pp - 1) / v x mb_time is 0 at pp 1",
        "x_predict__mutmut_257": "bubble's pp > 1 -> pp >= 1: (pp - 1) / v x mb_time is 0 at pp 1",
        "x_predict__mutmut_281": "the loss all-reduce's calls argument 1 dropped: Links.time's default is 1",
        "x_predict__mutmut_339": "hflops' recompute == 'full' and rc_frac < 1 -> or: rc_frac < 1 needs recompute_layers, "
                                 "which Layout accepts only with recompute full",
        "x_predict__mutmut_343": "hflops' rc_frac < 1 -> <= 1: at rc_frac 1, mflops + 1.0 x (hflops - mflops) is "
                                 "hflops exactly (full recompute adds one forward: mflops <= hflops <= 2 mflops, so "
                                 "the difference is exact by Sterbenz's lemma, and so is the sum)",
        "x_predict__mutmut_344": "hflops' rc_frac < 1 -> < 2: rc_frac is min(1.0, ...), so as <= 1 (mutmut_343)",
        "x__moe_tp_reduce__mutmut_3": _DEG1.format("the MoE TP gradient sum's tp > 1", "nothing else is computed"),
        "x__layer_time__mutmut_12": _KV.format("condition kv >= tp -> True (max(1, kv // tp) is 1 for kv < tp too)"),
        "x__layer_time__mutmut_18": _KV.format("kv // tp -> kv / tp"),
        "x__layer_time__mutmut_19": _KV.format("kv >= tp -> kv > tp"),
        "x__layer_time__mutmut_55": "g_op's initial 0.0 -> 1.0: read only under recompute op, which sets it first",
        **{f"x__layer_time__mutmut_{i}": _SYM.format(what) for i, what in (
            (67, "condition n_in == 2 -> False"), (68, "condition n_in == 2 -> True"),
            (70, "condition n_in == 2 -> != 2"), (71, "condition n_in == 2 -> == 3"))},
        "x_elementwise_per_token__mutmut_34": _KV.format("kv // tp -> kv / tp"),
        "x__tp_cp_time__mutmut_1": "rc_frac's default 1.0 -> 2.0: its one caller (predict) always passes rc_frac",
        "x__tp_cp_time__mutmut_7": _KV.format("condition kv >= tp -> True (max(1, kv // tp) is 1 for kv < tp too)"),
        "x__tp_cp_time__mutmut_13": _KV.format("kv // tp -> kv / tp"),
        "x__tp_cp_time__mutmut_14": _KV.format("kv >= tp -> kv > tp"),
        "x__tp_cp_time__mutmut_138": "cp > 1 -> cp >= 1: at cp 1 the ring's p2p sends 0 calls (cp - 1) and returns 0, "
                                     "max(0, 0 - a) is 0, Ulysses' all-to-alls over a 1-rank group cost 0",
        "x__stretch__mutmut_3": "hidden <= 0 -> < 0: at hidden 0 both branches return 0 (0 x s / (1 + s); with a "
                                "window <= 0, max(0, window - comm / (1 + s)) = 0)",
        "x__data_parallel__mutmut_100": _DEG1.format("HSDP's replica all-reduce dp_replicate > 1",
                                                    "nothing else is computed"),
        "x__data_parallel__mutmut_152": "DDP / ZeRO-1/2's dp x cp > 1 -> >= 1: at 1 every reduce and gather is over a "
                                        "1-rank group (0 s), max(0, 0 - window) is 0: step_dp stays 0",
        "x__optimizer_time__mutmut_13": "the expert slices' ep > 1 -> >= 1: at ep 1 they add (ep - 1) x ... = 0",
        "x__optimizer_time__mutmut_23": "expert params // ep -> / ep: the planner prices only MoE layouts the "
                                        "calculator accepted (memory.calculator refuses experts % ep), where "
                                        "experts x params per expert divides by ep",
    },
}
