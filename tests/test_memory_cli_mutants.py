"""``coursekit memory``'s command line (``coursekit.memory.cli``) in process: the parser's options, defaults and help
as documented, each flag's way into the calculator's keywords (every one given a value of its own), every refusal
word for word, and what ``run`` hands the solvers and the estimate (stubs here, so the placeholders and the figures
printed are checked by hand). Where bench/bench_mutation.py found no test (tests/test_memory_cli.py runs the real
command). Pure Python, well under a second."""
from __future__ import annotations

import io
import json
import re
import sys
from types import SimpleNamespace

import pytest

from coursekit.memory import cli
from coursekit.memory.activations import ATTENTION, CP_IMPLS, IMPLS, KERNELS, POSITION_IDS, RECOMPUTE
from coursekit.memory.engines import REGISTRY as ENGINES
from coursekit.memory.errors import ConfigError
from coursekit.memory.gpus import GPUS, GiB
from coursekit.memory.states import OFFLOAD, OPTIMIZERS, PRECISIONS
from coursekit.memory.train_config import PP_SCHEDULES
from coursekit.spec import registry
from coursekit.spec.run import SP_STYLES


def whole(message):
    return "^" + re.escape(message) + "$"


def parse(*argv):
    return cli.build_parser().parse_args(list(argv))


# --- the parser ----------------------------------------------------------------------------------------------------

def test_parser_defaults():
    assert vars(parse()) == {
        "model": None, "batch": None, "seq": None, "dtype": "bf16", "compile": False, "precision": None,
        "optimizer": "adamw", "attention": "sdpa", "impl": "hf", "kernels": "cuda", "recompute": "none",
        "recompute_layers": None, "dropout": None, "strategy": None, "dp_replicate": None, "dp_shard": None,
        "dp": None, "world": None, "zero": None, "engine": None, "reshard_after_forward": "true", "no_reshard": False,
        "qlora": False, "lora_rank": None, "lora_targets": None, "nf4_block": None, "nf4_scaler_block": None,
        "hsdp_shard": None, "no_bucket_view": False, "tp": 1, "sp": False, "sp_style": None, "pp": 1, "cp": 1,
        "ep": 1, "router_aux_loss_coef": None, "cp_impl": "ring", "position_ids": "shared", "microbatches": None,
        "pp_schedule": "gpipe", "pp_virtual": None, "pp_runtime": "torch", "offload": "none",
        "offload_params": "none", "reduce_bucket_size": None, "sub_group_size": None, "dp_rank": None, "gpu": None,
        "runtime_gib": None, "solve": None, "json": False, "list_models": False, "list_gpus": False}


def test_parser_names_types_and_choices():
    p = cli.build_parser()
    assert (p.prog, p.description) == ("coursekit memory", "Exact per-rank training memory.")
    acts = {a.dest: a for a in p._actions}
    assert acts["batch"].option_strings == ["--micro-batch", "--batch"]  # the trainer's name first
    assert acts["microbatches"].option_strings == ["--grad-accum", "--microbatches"]
    choices = {"dtype": ["fp32", "bf16", "fp16", "fp8"], "precision": list(PRECISIONS),
               "optimizer": list(OPTIMIZERS), "attention": list(ATTENTION), "impl": list(IMPLS),
               "kernels": list(KERNELS), "recompute": list(RECOMPUTE), "strategy": list(registry.STRATEGIES),
               "zero": [0, 1, 2, 3], "engine": list(ENGINES), "sp_style": list(SP_STYLES), "cp_impl": list(CP_IMPLS),
               "position_ids": list(POSITION_IDS), "pp_schedule": list(PP_SCHEDULES),
               "pp_runtime": ["torch", "megatron"], "offload": list(OFFLOAD), "offload_params": list(OFFLOAD),
               "solve": ["max-batch", "max-seq", "min-gpus"]}
    assert {d: list(a.choices) for d, a in acts.items() if a.choices is not None} == choices
    ints = {"batch", "seq", "recompute_layers", "dp_replicate", "dp_shard", "dp", "world", "zero", "lora_rank",
            "nf4_block", "nf4_scaler_block", "hsdp_shard", "tp", "pp", "cp", "ep", "microbatches", "pp_virtual",
            "reduce_bucket_size", "dp_rank"}
    assert {d for d, a in acts.items() if a.type is int} == ints
    assert {d for d, a in acts.items() if a.type is float} == {"dropout", "router_aux_loss_coef", "runtime_gib"}
    flags = {"compile", "no_reshard", "qlora", "no_bucket_view", "sp", "json", "list_models", "list_gpus"}
    assert {d for d, a in acts.items() if a.nargs == 0 and d != "help"} == flags


def test_parser_help_texts():
    want = {
        "model": "preset name or path to an HF config.json (llama / mistral / gpt2)",
        "batch": "sequences per rank per micro-batch (alias --batch)",
        "seq": "sequence length in tokens",
        "dtype": "compute dtype; fp8 (torchao float8 on the linear layers) is sized as bf16, which it holds (note)",
        "compile": "torch.compile: sized as eager (note), as coursekit plan --compile",
        "precision": "model-state convention (default: 16psi, or fp32 for fp32)",
        "impl": "hf modules as they are, or fused kernels",
        "kernels": "device whose kernels run the hf modules",
        "recompute_layers": "with --recompute full: only the first N layers of each pipeline stage (Megatron's "
                            "--recompute-num-layers, block method); default: all",
        "dropout": "override the model's dropout rates",
        "strategy": "the trainer's strategy: sets --engine (and --zero for zeroK); fsdp1 is not modelled (says why)",
        "dp_replicate": "data-parallel replicas (DDP, ZeRO; HSDP across groups); default: fill",
        "dp_shard": "data-parallel ranks that shard (FSDP2; HSDP's shard group); default: fill",
        "dp": "all data-parallel ranks, dp-replicate x dp-shard",
        "world": "total ranks (= dp·tp·pp·cp)",
        "zero": "DeepSpeed ZeRO stage (default 0)",
        "engine": "data-parallel engine (default deepspeed; or set by --strategy)",
        "reshard_after_forward": "FSDP2 (the trainer's flag): true, false, or N ranks to reshard to",
        "no_reshard": "the older spelling of --reshard-after-forward false",
        "qlora": "FSDP2: frozen NF4 base + LoRA adapters (coursekit.memory.qlora)",
        "lora_rank": "QLoRA adapter rank (default 8)",
        "lora_targets": "QLoRA: comma-separated projections with adapters (default: all seven)",
        "nf4_block": "QLoRA NF4 block size (default 64)",
        "nf4_scaler_block": "QLoRA scalers per fp32 factor (default 256)",
        "hsdp_shard": "HSDP shard-group size (engine fsdp2): the same as --dp-shard",
        "no_bucket_view": "DDP gradient_as_bucket_view=False (torch's default)",
        "sp": "sequence parallelism over the TP group",
        "sp_style": "with --sp: torch's plan (the column-parallel linears save the all-gathered input) or megatron "
                    "(they save the sequence shard); default: as --impl implies",
        "ep": "expert-parallel degree (MoE models; borrowed from the dp x cp ranks)",
        "router_aux_loss_coef": "MoE: the load-balancing loss's weight; 0: not computed (default: the model config's)",
        "cp_impl": "context-parallel attention (the trainer's --cp-impl)",
        "position_ids": "RoPE tables: shared (1, s), or per-sequence (b, s) position ids as coursekit's trainer passes",
        "microbatches": "micro-batches per optimizer step, under pp the schedule's (default: pp; alias "
                        "--microbatches)",
        "pp_schedule": "what a stage holds at its peak follows the schedule's order (coursekit.memory.pp_order); "
                       "default gpipe, as coursekit train",
        "pp_virtual": "stages per rank for interleaved-1f1b / looped-bfs / interleaved-zb (default 2, as the trainer; "
                      "zbv and dualpipev: exactly 2, in a V)",
        "pp_runtime": "torch: torch.distributed.pipelining keeps every micro-batch's inputs for the step; megatron: "
                      "in flight only",
        "offload": "optimizer-state offload",
        "offload_params": "parameter offload (ZeRO-3 / FSDP2)",
        "reduce_bucket_size": "DeepSpeed reduce_bucket_size in elements (default 5e8, DeepSpeed's)",
        "sub_group_size": "DeepSpeed ZeRO-3 sub_group_size in elements (20000, 1e9): the optimizer step builds the "
                          "fp32 gradients one sub-group at a time (default 1e9, DeepSpeed's)",
        "dp_rank": "data-parallel rank to report (DeepSpeed ZeRO-1/2 ranks differ; default: fullest)",
        "gpu": "one of: " + ", ".join(GPUS),
        "runtime_gib": "GPU runtime constant in GiB (default 1)",
        "solve": "find the largest batch / sequence, or the fewest GPUs (needs --gpu)",
        "json": "print one JSON object",
    }
    got = {a.dest: a.help for a in cli.build_parser()._actions if a.help is not None and a.dest != "help"}
    assert got == want


def test_parser_refuses_abbreviations_and_both_reshard_spellings(capsys):
    assert cli.main(["--mod", "tiny-llama", "--batch", "1", "--seq", "8"]) == 2  # no prefix matching
    assert "unrecognized arguments: --mod" in capsys.readouterr().err
    assert cli.main(["--no-reshard", "--reshard-after-forward", "2"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


# --- the keywords --------------------------------------------------------------------------------------------------

PLAIN = dict(batch=None, seq=None, dtype="bf16", precision=None, optimizer="adamw", attention="sdpa", impl="hf",
             kernels="cuda", recompute="none", recompute_layers=None, dropout=None, dp=None, world=None,
             ddp_bucket_view=True, hsdp_shard=None, tp=1, sp=False, sp_style=None, pp=1, cp=1, ep=1, cp_impl="ring",
             position_ids="shared", microbatches=None, pp_schedule="gpipe", pp_virtual=None, pp_runtime="torch",
             offload="none", offload_params="none", dp_rank=None, gpu=None, strategy=None, dp_replicate=None,
             dp_shard=None, fsdp_reshard=True)


def test_config_kwargs_of_the_defaults():
    """Nothing given: TrainConfig's and the run's fields as the parser defaults them; no zero, engine, qlora or the
    optional knobs (the calculator's own defaults apply)."""
    assert cli._config_kwargs(parse("--model", "m")) == PLAIN


def test_config_kwargs_each_flag_to_its_field():
    argv = ["--micro-batch", "2", "--seq", "64", "--dtype", "fp16", "--precision", "18psi", "--optimizer", "sgd",
            "--attention", "eager", "--impl", "fused", "--kernels", "cpu", "--recompute", "full",
            "--recompute-layers", "3", "--dropout", "0.25", "--strategy", "zero2", "--dp-replicate", "5",
            "--dp-shard", "6", "--dp", "7", "--world", "9", "--zero", "2", "--engine", "deepspeed", "--hsdp-shard",
            "10", "--no-bucket-view", "--tp", "11", "--sp", "--sp-style", "megatron", "--pp", "12", "--cp", "13",
            "--ep", "14", "--cp-impl", "ulysses", "--position-ids", "per-sequence", "--grad-accum", "15",
            "--pp-schedule", "1f1b", "--pp-virtual", "16", "--pp-runtime", "megatron", "--offload", "cpu",
            "--offload-params", "nvme", "--dp-rank", "17", "--gpu", "H200", "--reshard-after-forward", "false",
            "--qlora", "--lora-rank", "4", "--lora-targets", "q_proj,v_proj", "--nf4-block", "32",
            "--nf4-scaler-block", "8", "--reduce-bucket-size", "1000", "--sub-group-size", "20000",
            "--router-aux-loss-coef", "0.01", "--runtime-gib", "0.5"]
    assert cli._config_kwargs(parse(*argv)) == dict(
        batch=2, seq=64, dtype="fp16", precision="18psi", optimizer="sgd", attention="eager", impl="fused",
        kernels="cpu", recompute="full", recompute_layers=3, dropout=0.25, dp=7, world=9, ddp_bucket_view=False,
        hsdp_shard=10, tp=11, sp=True, sp_style="megatron", pp=12, cp=13, ep=14, cp_impl="ulysses",
        position_ids="per-sequence", microbatches=15, pp_schedule="1f1b", pp_virtual=16, pp_runtime="megatron",
        offload="cpu", offload_params="nvme", dp_rank=17, gpu="H200", strategy="zero2", dp_replicate=5, dp_shard=6,
        zero=2, engine="deepspeed", fsdp_reshard=False, qlora=True, lora_rank=4, lora_targets="q_proj,v_proj",
        nf4_block=32, nf4_scaler_block=8, bucket_elems=1000, sub_group_size=20000, aux_loss=True,
        runtime_bytes=GiB // 2)


def test_zero_and_engine_only_when_given():
    assert cli._config_kwargs(parse("--zero", "0")) == {**PLAIN, "zero": 0}  # 0 is given, not absent
    assert cli._config_kwargs(parse("--engine", "fsdp2")) == {**PLAIN, "engine": "fsdp2"}


@pytest.mark.parametrize("value,want", [("true", True), ("false", False), (" True ", True), ("FALSE", False),
                                        ("4", 4), ("1", 1)])
def test_reshard_after_forward_values(value, want):
    assert cli._fsdp_kwargs(parse("--reshard-after-forward", value)) == {"fsdp_reshard": want}


def test_no_reshard_is_false_and_qlora_knobs_only_when_given():
    assert cli._fsdp_kwargs(parse("--no-reshard")) == {"fsdp_reshard": False}
    assert cli._fsdp_kwargs(parse("--qlora")) == {"fsdp_reshard": True, "qlora": True}
    assert cli._fsdp_kwargs(parse("--nf4-block", "16")) == {"fsdp_reshard": True, "nf4_block": 16}


@pytest.mark.parametrize("value", ["maybe", "-1", "2.5", ""])
def test_reshard_after_forward_refuses_anything_else(value):
    with pytest.raises(ConfigError, match=whole("--reshard-after-forward takes true, false or a number of ranks, "
                                                f"got {value!r}")):
        cli._fsdp_kwargs(parse("--reshard-after-forward", value))


@pytest.mark.parametrize("text,want", [("20000", 20000), ("1e9", 10 ** 9), ("5e2", 500), ("1000000000", 10 ** 9),
                                       ("9007199254740993", 2 ** 53 + 1)])  # digits are read exactly, not as a float
def test_sub_group_size_as_deepspeeds_json_writes_it(text, want):
    got = cli._config_kwargs(parse("--sub-group-size", text))["sub_group_size"]
    assert got == want and type(got) is int


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "abc", "inf", "nan", "1e400", "2.5e0"])
def test_sub_group_size_refused(text):
    with pytest.raises(ConfigError, match=whole("--sub-group-size takes a whole number of elements > 0 (20000, 1e9), "
                                                f"got {text!r}")):
        cli._config_kwargs(parse("--sub-group-size", text))


def test_router_aux_loss_coef():
    assert cli._config_kwargs(parse("--router-aux-loss-coef", "0"))["aux_loss"] is False  # 0: not computed
    assert cli._config_kwargs(parse("--router-aux-loss-coef", "0.001"))["aux_loss"] is True
    for v in ("-0.5", "inf", "nan"):
        with pytest.raises(ConfigError, match=whole(f"--router-aux-loss-coef must be a finite number >= 0, got "
                                                    f"{float(v)}")):
            cli._config_kwargs(parse("--router-aux-loss-coef", v))


def test_runtime_gib():
    assert cli._config_kwargs(parse("--runtime-gib", "0"))["runtime_bytes"] == 0
    assert cli._config_kwargs(parse("--runtime-gib", "2"))["runtime_bytes"] == 2 * 1024 ** 3
    assert cli._config_kwargs(parse("--runtime-gib", "0.25"))["runtime_bytes"] == 256 * 1024 ** 2
    for v in ("-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=whole(f"--runtime-gib must be a finite number >= 0, got {float(v)}")):
            cli._config_kwargs(parse("--runtime-gib", v))


# --- run: lists and refusals ---------------------------------------------------------------------------------------

def test_list_models(capsys):
    rows = cli.run(parse("--list-models", "--json"))
    assert list(rows) == sorted(rows)
    # GPT-2 small's published count with its tied head; tiny-llama by hand: embedding and head 256·64 each, 2 blocks
    # of q, o 64·64, k, v 64·32, gate, up, down 64·176 and two norms of 64, the final norm 64
    assert rows["gpt2"] == 124_439_808
    assert rows["tiny-llama"] == 2 * 256 * 64 + 2 * (2 * 4096 + 2 * 2048 + 3 * 64 * 176 + 2 * 64) + 64
    text = cli.run(parse("--list-models")).splitlines()
    assert len(text) == len(rows)
    assert "gpt2" + " " * 10 + " " * 7 + "124,439,808 params" in text  # name in 14 columns, the count in 18


def test_list_gpus():
    rows = cli.run(parse("--list-gpus", "--json"))
    assert list(rows) == list(GPUS) and rows["H200"] == 141 * GiB and rows["A100-40GB"] == 40 * GiB
    text = cli.run(parse("--list-gpus")).splitlines()
    assert text[list(GPUS).index("H200")] == "H200" + " " * 8 + "     141 GiB"  # 12 columns, then 8 for the GiB


@pytest.mark.parametrize("argv,message", [
    ([], "--model is required (a preset name or a config.json path; see --list-models)"),
    (["--model", "m", "--batch", "1"], "--seq is required (e.g. --seq 4096)"),
    (["--model", "m", "--seq", "8"], "--batch is required (e.g. --batch 1)"),
    (["--model", "m", "--solve", "max-batch"], "--solve max-batch needs --seq (e.g. --seq 4096)"),
    (["--model", "m", "--solve", "max-seq"], "--solve max-seq needs --batch (e.g. --batch 1)"),
    (["--model", "m", "--solve", "min-gpus", "--seq", "8"], "--solve min-gpus needs --batch (e.g. --batch 1)"),
    (["--model", "m", "--solve", "min-gpus", "--batch", "1"], "--solve min-gpus needs --seq (e.g. --seq 4096)"),
    (["--model", "m", "--solve", "max-batch", "--seq", "8"], "--solve needs --gpu"),
    (["--model", "m", "--solve", "min-gpus", "--seq", "8", "--batch", "1", "--gpu", "H200", "--dp-rank", "0"],
     "--dp-rank does not combine with --solve min-gpus (it sizes for the fullest rank)"),
])
def test_run_refuses_with_the_reason(argv, message):
    with pytest.raises(ConfigError, match=whole(message)):
        cli.run(parse(*argv))


def test_main_prints_the_error_and_returns_2(capsys):
    assert cli.main(["--model", "m", "--batch", "1"]) == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "error: --seq is required (e.g. --seq 4096)\n")
    assert cli.main(["--tp", "x"]) == 2  # argparse's own refusal: its exit status
    assert cli.main(["--help"]) == 0


# --- run: what the solvers and the estimate are handed (stubs) -----------------------------------------------------

class Est:
    """A stand-in estimate: 1.5 GiB peak of an 80 GiB GPU; its JSON and table say who it is."""

    def __init__(self, model, c):
        self.model, self.config, self.notes = model, c, []
        self.peak_bytes, self.gpu_memory_bytes = 3 * GiB // 2, 80 * GiB

    def to_dict(self):
        return {"model": self.model, "batch": self.config.batch, "seq": self.config.seq, "dp": self.config.dp,
                "notes": self.notes}

    def table(self):
        return "TABLE"


@pytest.fixture
def stubs(monkeypatch):
    calls = SimpleNamespace(solver=[], estimate=[], answer={})

    def solver(name):
        def f(model, **kw):
            calls.solver.append((name, model, kw))
            return calls.answer[name]
        return f

    def estimate(model, c):
        calls.estimate.append((model, c))
        return Est(model, c)

    for name in ("max_micro_batch", "max_seq_len", "min_gpus"):
        monkeypatch.setattr(cli, name, solver(name))
    monkeypatch.setattr(cli, "estimate", estimate)
    return calls


BASE = ["--model", "llama3-8b", "--gpu", "H100-80GB", "--zero", "3", "--dp", "8"]


def test_plain_run_sizes_the_given_config(stubs, capsys):
    assert cli.main(BASE + ["--batch", "2", "--seq", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"model": "llama3-8b", "batch": 2, "seq": 512, "dp": 8,
                                                   "notes": []}
    (model, c), = stubs.estimate
    assert (model, c.batch, c.seq, c.zero, c.dp, c.gpu, c.engine) == ("llama3-8b", 2, 512, 3, 8, "H100-80GB",
                                                                      "deepspeed")
    assert stubs.solver == []
    assert cli.main(BASE + ["--batch", "2", "--seq", "512"]) == 0
    assert capsys.readouterr().out == "TABLE\n"  # no --solve: no sentence above the table


def test_max_batch_solves_from_a_placeholder_and_sizes_the_answer(stubs, capsys):
    stubs.answer["max_micro_batch"] = 3
    assert cli.main(BASE + ["--seq", "512", "--solve", "max-batch", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"model": "llama3-8b", "batch": 3, "seq": 512, "dp": 8,
                                                   "notes": [], "solution": {"max_batch": 3}}
    (name, model, kw), = stubs.solver
    assert (name, model, kw["batch"], kw["seq"], kw["zero"], kw["dp"]) == ("max_micro_batch", "llama3-8b", 1, 512, 3,
                                                                          8)
    # the sentence (coursekit.memory.answers) above the table, from the estimate at the answer
    assert cli.main(BASE + ["--seq", "512", "--solve", "max-batch"]) == 0
    assert capsys.readouterr().out == (
        "solution: up to 3 sequences of 512 tokens per micro-batch fit on each GPU of 8 × H100-80GB (peak 1.5 of 80 "
        "GiB at micro-batch 3)\nTABLE\n")


def test_max_batch_of_zero_is_sized_at_one(stubs, capsys):
    stubs.answer["max_micro_batch"] = 0
    assert cli.main(BASE + ["--seq", "512", "--batch", "7", "--solve", "max-batch", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["solution"] == {"max_batch": 0} and d["batch"] == 1  # the batch given is replaced, 0 shown at 1
    assert stubs.solver[0][2]["batch"] == 1


def test_max_seq_solves_from_the_smallest_sequence(stubs, capsys):
    stubs.answer["max_seq_len"] = 4096
    assert cli.main(BASE[:4] + ["--batch", "2", "--solve", "max-seq", "--cp", "2", "--tp", "4", "--sp", "--dp", "1",
                                "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["solution"] == {"max_seq": 4096} and (d["batch"], d["seq"]) == (2, 4096)
    (name, model, kw), = stubs.solver
    assert (name, model, kw["batch"], kw["cp"], kw["tp"], kw["sp"]) == ("max_seq_len", "llama3-8b", 2, 2, 4, True)
    assert kw["seq"] == 2 * 4  # cp · tp: one token per rank of the sequence's split
    stubs.solver.clear()
    assert cli.main(BASE[:4] + ["--batch", "2", "--solve", "max-seq", "--cp", "2", "--tp", "4", "--dp", "1",
                                "--json"]) == 0
    capsys.readouterr()
    assert stubs.solver[0][2]["seq"] == 2  # without sp the tp ranks hold the whole sequence: cp alone
    stubs.answer["max_seq_len"] = 0
    assert cli.main(BASE + ["--batch", "2", "--solve", "max-seq", "--cp", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["solution"] == {"max_seq": 0} and d["seq"] == 2  # nothing fits: sized at cp tokens


def test_min_gpus_sizes_the_fewest(stubs, capsys):
    stubs.answer["min_gpus"] = SimpleNamespace(config=SimpleNamespace(world=32, dp=16))
    assert cli.main(["--model", "llama3-8b", "--gpu", "H100-80GB", "--zero", "3", "--batch", "1", "--seq", "512",
                     "--tp", "2", "--solve", "min-gpus", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["solution"] == {"min_gpus": 32, "dp": 16} and d["dp"] == 16
    (name, model, kw), = stubs.solver
    assert (name, model, kw["batch"], kw["seq"], kw["tp"], kw["zero"], kw["gpu"]) == (
        "min_gpus", "llama3-8b", 1, 512, 2, 3, "H100-80GB")
    (model, c), = stubs.estimate
    assert (c.dp, c.tp, c.world) == (16, 2, 32)  # the world follows dp (none given): dp · tp
    assert cli.main(["--model", "llama3-8b", "--gpu", "H100-80GB", "--zero", "3", "--batch", "1", "--seq", "512",
                     "--tp", "2", "--solve", "min-gpus"]) == 0
    assert capsys.readouterr().out == ("solution: 32 GPUs of H100-80GB (--dp 16) are the fewest that fit (peak 1.5 of "
                                       "80 GiB)\nTABLE\n")


def test_dp_rank_combines_with_max_batch(stubs, capsys):
    stubs.answer["max_micro_batch"] = 2
    assert cli.main(BASE + ["--seq", "512", "--solve", "max-batch", "--dp-rank", "1", "--json"]) == 0
    assert stubs.solver[0][2]["dp_rank"] == 1


def test_fp8_and_compile_notes_in_order(stubs, capsys):
    assert cli.main(BASE + ["--batch", "1", "--seq", "8", "--dtype", "fp8", "--compile", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["notes"] == [cli.FP8_NOTE, cli.COMPILE_NOTE]
    assert stubs.estimate[0][1].dtype == "bf16"  # fp8 is sized as bf16
    assert cli.FP8_NOTE == ("fp8: sized as bf16 (torchao float8 keeps bf16 weights and saves each linear's bf16 "
                            "input and weight for backward; its fp8 copies are transient)")
    assert cli.COMPILE_NOTE == ("--compile: sized as eager (Inductor may save fewer activations: torchtitan measured "
                                "82.4 -> 77.0 GiB on Llama 3.1 8B; not modelled)")
    assert cli.main(BASE + ["--batch", "1", "--seq", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []


def test_a_closed_pipe_is_no_error(stubs, monkeypatch):
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(BASE + ["--batch", "1", "--seq", "8", "--json"]) == 0
    assert not isinstance(sys.stdout, Closed)  # silenced for the interpreter's flush at exit
    assert sys.stdout.writable() and sys.stdout.write("later output, dropped") == 21  # not a read-only stand-in
    sys.stdout.close()
