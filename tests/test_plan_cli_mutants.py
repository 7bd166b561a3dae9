"""``coursekit plan`` (``coursekit.plan.cli``): each refusal's one line and exit 2, what the table and the JSON say,
and which flags reach the prediction, on tiny-llama (a few ms a layout). Pure Python; written against the mutation
survivors of bench/bench_mutation.py plan.cli."""
from __future__ import annotations

import json
import warnings
from dataclasses import fields

import pytest

from coursekit.plan.cli import main
from coursekit.plan.hardware import hardware, network

BASE = ["--model", "tiny-llama", "--gpus", "2", "--seq", "64", "--global-batch", "4"]


def _run(capsys, *argv):
    rc = main([*BASE, *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv, message", [
    (["--top", "-1"], "--top must be >= 0, got -1"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be >= 1, got 0"),
    (["--ep", "0"], "--ep must be >= 1, got 0"),
    (["--layout", "overlap=no-grad_reduce", "--overlap", "grad_reduce"],
     "--overlap grad_reduce and --layout overlap=no-grad_reduce disagree; give one"),
    (["--layout", "grad_reduce_dtype=fp32", "--grad-reduce-dtype", "bf16"],
     "--grad-reduce-dtype bf16 and --layout grad_reduce_dtype=fp32 disagree; give one"),
    (["--layout", "ep=2", "--ep", "1"], "--ep 1 and --layout ep=2 disagree; give one"),
    (["--hardware", "no-such-file.yaml"], "hardware file no-such-file.yaml not found"),
])
def test_bad_input_is_one_error_line_and_exit_2(capsys, argv, message):
    """Catches each check's bound or message changed and the flag's name not spelt with dashes."""
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == "" and err == f"error: {message}\n"


def test_zero_sized_arguments_are_refused_by_name(capsys):
    rc = main(["--model", "tiny-llama", "--gpus", "0", "--seq", "64", "--global-batch", "4"])
    assert rc == 2 and capsys.readouterr().err == "error: --gpus must be >= 1, got 0\n"
    rc = main(["--model", "tiny-llama", "--gpus", "2", "--seq", "0", "--global-batch", "4"])
    assert rc == 2 and capsys.readouterr().err == "error: --seq must be >= 1, got 0\n"
    rc = main(["--model", "tiny-llama", "--gpus", "2", "--seq", "64", "--global-batch", "0"])
    assert rc == 2 and capsys.readouterr().err == "error: --global-batch must be >= 1, got 0\n"


def test_one_layouts_table_says_what_was_assumed(capsys):
    """The first line names the model, GPUs, node size, network, seq and batch; one layout given: no 'best N shown';
    each row its short name, fit, then why / assumed lines (the overlaps on, the gradient dtype). Catches the lines'
    words and the flags not reaching the layout (--overlap, --grad-reduce-dtype, --ep)."""
    rc, out, _ = _run(capsys, "--layout", "dp_replicate=2")
    lines = out.splitlines()
    assert rc == 0
    assert lines[0] == "tiny-llama on 2 x H100-80GB (8 per node, ib-400), seq 64, global batch 4: 1 candidate(s)"
    assert lines[1].split() == ["#", "layout", "fits", "GiB", "step", "s", "tok/s/GPU", "MFU"]
    assert lines[2] == "-" * len(lines[1])
    assert lines[3].startswith(" 1 ddp dp2 mb1 ") and lines[3].split()[4] == "yes"
    assert lines[4].startswith("   why: ") and lines[4].endswith(" of 76.0 GiB")  # 80 GiB less 5 %
    assert lines[5] == "   assumed: overlap grad_reduce; gradients reduced in fp32"
    assert len(lines) == 6
    rc, out, _ = _run(capsys, "--layout", "dp_replicate=2", "--overlap", "no-grad_reduce", "--grad-reduce-dtype",
                      "bf16", "--ep", "1", "--compile")
    lines = out.splitlines()
    assert lines[3].startswith(" 1 ddp dp2 mb1 overlap:no-grad_reduce grad-bf16 ")
    assert lines[5] == "   assumed: overlap none; gradients reduced in bf16"
    assert lines[6].startswith("   unchecked: torch.compile: only its element-wise fusion is modelled")


def test_json_carries_the_run_settings_the_flags_name(capsys):
    """--dtype, --compile and --attention reach the prediction: the trainer's sdpa is the flash kernel, eager keeps
    and moves the score matrix (slower). Catches the flags dropped on the way and the kernel map."""
    rc, out, _ = _run(capsys, "--layout", "dp_replicate=2", "--json", "--dtype", "fp32", "--compile")
    (row,) = json.loads(out)
    assert rc == 0 and row["summary"] == "ddp dp2 mb1" and row["run"] == {"gemm_dtype": "fp32", "compile": True,
                                                                          "elementwise": "eager"}
    _, fused, _ = _run(capsys, "--layout", "dp_replicate=2", "--json", "--elementwise", "fused")
    assert json.loads(fused)[0]["run"]["elementwise"] == "fused"
    _, flash, _ = _run(capsys, "--layout", "dp_replicate=2", "--json", "--attention", "sdpa")
    _, eager, _ = _run(capsys, "--layout", "dp_replicate=2", "--json", "--attention", "eager")
    assert json.loads(eager)[0]["step_time_s"] > json.loads(flash)[0]["step_time_s"]


def test_a_search_shows_the_best_few_or_with_json_top_0_every_candidate(capsys):
    """Catches --top not cutting the rows, the 'best N shown' count, keep_unfit not set for --json --top 0."""
    rc, out, _ = _run(capsys, "--top", "2")
    lines = out.splitlines()
    assert rc == 0 and lines[0].endswith(", best 2 shown")
    assert [ln[:3] for ln in lines if ln[:3] in (" 1 ", " 2 ", " 3 ")] == [" 1 ", " 2 "]
    _, out, _ = _run(capsys, "--json", "--top", "2")
    assert len(json.loads(out)) == 2
    _, every, _ = _run(capsys, "--json", "--top", "0")
    n = int(lines[0].split(": ")[1].split()[0])  # the candidates the plain search counted
    assert len(json.loads(every)) >= n >= 2


def test_a_layout_that_does_not_fit_says_no_and_the_files_figures_reach_the_prediction(capsys, tmp_path):
    """A --hardware file's GPU (1 GiB, named) and network replace the presets in the first line and in the fit: the
    row says NO with its peak in GiB above the 0.95 GiB capacity. Catches 'NO' changed, bytes x GiB, the file's hw or
    net dropped on the way to the search."""
    f = tmp_path / "hw.yaml"
    f.write_text(f"gpu:\n  name: tiny-gpu\n  memory_bytes: {2**30}\nnetwork:\n  name: tiny-net\n")
    rc, out, _ = _run(capsys, "--layout", "dp_replicate=2", "--hardware", str(f))
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith("tiny-llama on 2 x tiny-gpu (8 per node, tiny-net), ")
    row = lines[3].split()
    assert row[4] == "NO" and float(row[5]) > 0.95  # GiB column
    assert lines[4].endswith(" of 0.9 GiB")  # 1 GiB less 5 %, one decimal


def test_the_assumed_and_unchecked_lines_join_their_items(capsys):
    """Two overlaps on (ZeRO-1: grad_reduce by default, param_gather asked) and two unchecked regimes (compile, fp8).
    Catches their separators changed."""
    rc, out, _ = _run(capsys, "--layout", "dp_replicate=2,strategy=zero1", "--overlap", "param_gather", "--compile",
                      "--dtype", "fp8")
    lines = out.splitlines()
    assert lines[5] == "   assumed: overlap grad_reduce, param_gather; gradients reduced in fp32"
    assert lines[6].startswith("   unchecked: torch.compile: ") and "; fp8: checked on torchtitan's" in lines[6]


def test_node_size_and_ep_reach_the_search_and_json_is_indented_by_one(capsys):
    """--gpus-per-node 1 puts the 2 data-parallel ranks on two nodes (links: network); --ep 2 keeps only EP 2 layouts of
    an MoE model. Catches the node size or the ep filter dropped, and json's indent changed."""
    _, out, _ = _run(capsys, "--layout", "dp_replicate=2", "--gpus-per-node", "1", "--json")
    assert out.startswith('[\n {\n  "layout": {\n   "dp_replicate": 2,')
    assert json.loads(out)[0]["links"] == {"dp": "network"}
    rc = main(["--model", "tiny-mixtral", "--gpus", "2", "--seq", "64", "--global-batch", "4", "--ep", "2", "--json",
               "--top", "0"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and rows and {r["layout"]["ep"] for r in rows} == {2}


def test_the_plot_is_memory_against_step_time_with_the_front_and_the_capacity(monkeypatch, tmp_path):
    """plot(): fitting candidates in C0, the others grey, the Pareto front (coursekit.plan.search.pareto) as a red
    line, the capacity as a dotted line, a log time axis, labelled axes and legend. Catches each artist or style
    dropped or changed (the figure is inspected as saved)."""
    from matplotlib.figure import Figure

    from coursekit.plan.cli import plot
    from coursekit.plan.search import Candidate
    from test_plan_search_mutants import _pred

    GB = 2**30
    cands = [Candidate(None, _pred(step=t), m * GB, 10 * GB) for t, m in ((1.0, 8), (2.0, 4), (3.0, 6), (0.5, 12))]
    saved = {}
    monkeypatch.setattr(Figure, "savefig", lambda self, path, dpi: saved.update(fig=self, path=path, dpi=dpi))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "First parameter to grid() is false, but line properties"
        assert plot(cands, str(tmp_path / "p.png")) == str(tmp_path / "p.png")
    fig = saved["fig"]
    assert saved["dpi"] == 120 and tuple(fig.get_size_inches()) == (7, 4.5)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted step time (s)", "peak memory per GPU (GiB)")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fits", "does not fit", "Pareto front",
                                                                   "GPU memory less slack"]
    fit, unfit = ax.collections
    assert fit.get_offsets().tolist() == [[1.0, 8.0], [2.0, 4.0], [3.0, 6.0]]
    assert unfit.get_offsets().tolist() == [[0.5, 12.0]]
    assert tuple(fit.get_facecolor()[0]) == pytest.approx((0.12156862745098039, 0.4666666666666667,
                                                           0.7058823529411765, 1.0))  # C0: #1f77b4
    assert tuple(unfit.get_facecolor()[0][:3]) == pytest.approx((0.7, 0.7, 0.7))
    front, cap = ax.lines
    assert list(front.get_xdata()) == [2.0, 1.0] and list(front.get_ydata()) == [4.0, 8.0]  # by memory
    assert front.get_color() == "C3" and front.get_marker() == "o" and front.get_linestyle() == "-"
    assert list(cap.get_ydata()) == [10.0, 10.0] and cap.get_linestyle() == ":" and cap.get_color() == "k"
    # the sizes: points of 8 and 6 (pt^2), the front's markers 4, the capacity line 1 pt, the legend's 8 pt text
    assert list(fit.get_sizes()) == [8] and list(unfit.get_sizes()) == [6]
    assert front.get_markersize() == 4 and cap.get_linewidth() == 1
    assert {t.get_fontsize() for t in ax.get_legend().get_texts()} == {8}
    # a faint grid on the major ticks of both axes and the minor ticks of the log time axis
    for ticks in (ax.xaxis.get_major_ticks(), ax.yaxis.get_major_ticks(), ax.xaxis.get_minor_ticks()):
        assert ticks and all(t.gridline.get_visible() and t.gridline.get_alpha() == 0.3 for t in ticks)


def test_a_plot_of_one_candidate_draws_its_capacity(monkeypatch, tmp_path):
    """The capacity line is the first (here the only) candidate's. Catches it read from another candidate."""
    from matplotlib.figure import Figure

    from coursekit.plan.cli import plot
    from coursekit.plan.search import Candidate
    from test_plan_search_mutants import _pred

    saved = {}
    monkeypatch.setattr(Figure, "savefig", lambda self, path, dpi: saved.update(fig=self))
    plot([Candidate(None, _pred(step=1.0), 3 * 2**30, 4 * 2**30)], str(tmp_path / "one.png"))
    _front, cap = saved["fig"].axes[0].lines
    assert list(cap.get_ydata()) == [4.0, 4.0]


# -- the parser: what --help documents, and each claim of it held to the code ----------------------------------------
# option -> (default, type, required, choices, metavar, help), as coursekit plan --help lists them
OPTIONS = {
    "--model": (None, None, True, None, None, "preset name or path to an HF config.json"),
    "--gpus": (None, int, True, None, None, "GPUs in the job"),
    "--gpus-per-node": (8, int, False, None, None, "GPUs per node (NVLink domain)"),
    "--gpu": ("H100-80GB", None, False, None, None, "GPU preset (see coursekit.plan.hardware)"),
    "--seq": (None, int, True, None, None, "tokens per sequence"),
    "--global-batch": (None, int, True, None, None, "sequences per optimizer step"),
    "--network": ("ib-400", None, False, None, None,
                  "inter-node network preset: ib-400, ib-200, roce-200, ..."),
    "--dtype": ("bf16", None, False, ("bf16", "fp16", "fp32", "fp8"), None,
                "compute dtype; fp8: the linear layers on FP8 tensor cores (torchao float8), the rest bf16"),
    "--compile": (False, None, False, None, None, "torch.compile: fused element-wise kernels"),
    "--elementwise": ("eager", None, False, ("eager", "fused"), None,
                      "element-wise kernels: eager (the modeling code's own aten ops, as the course's trainer and "
                      "torchtitan run them; default) or fused (Megatron-LM / Transformer Engine / Apex kernels)"),
    "--attention": ("sdpa", None, False, ("sdpa", "eager"), None,
                    "attention implementation, the trainer's names: sdpa (on a GPU its flash kernel: no score matrix "
                    "kept; default) or eager (scores kept and moved through HBM)"),
    "--top": (5, int, False, None, None, "how many to show (0: every candidate, with --json)"),
    "--json": (False, None, False, None, None, "print candidates as a JSON list"),
    "--plot": (None, None, False, None, "FILE.png", "memory vs predicted step time, Pareto front"),
    "--ep": (None, int, False, None, None, "MoE models: search only layouts with this expert-parallel degree "
             "(default: every one dividing the experts and the dp x cp ranks)"),
    "--layout": (None, None, False, None, None, "evaluate one layout: k=v,... (keys: dp_replicate, dp_shard, tp, pp, "
                 "cp, micro_batch, recompute, zero, engine, pp_schedule, microbatches, virtual_stages, cp_impl, sp, "
                 "overlap, grad_reduce_dtype; or the trainer's names: strategy=zero3, grad_accum, pp_virtual)"),
    "--hardware": (None, None, False, None, "FILE",
                   "YAML/JSON overrides (gpu, network, collectives: coursekit.comm.bench rows)"),
    "--overlap": (None, None, False, None, "NAMES", "communication overlapped beyond each engine's defaults, "
                  "'+'-joined, no-NAME for off: grad_reduce, param_gather (Megatron --overlap-param-gather), prefetch, "
                  "tp (--tp-comm-overlap / async TP); set on every layout it applies to"),
    "--grad-reduce-dtype": (None, None, False, ("fp32", "bf16"), None,
                            "gradients on the wire (default fp32; bf16: Megatron --grad-reduce-in-bf16)"),
}


def test_the_parsers_options_are_what_its_help_documents():
    """Every option (and only these, besides -h) with its default, type, required-ness, choices, metavar and help
    text: the help is the command's documentation. Catches a default, a type, a required flag or a help text
    changed or dropped."""
    from coursekit.plan.cli import build_parser

    p = build_parser()
    got = {a.option_strings[0]: (a.default, a.type, a.required, None if a.choices is None else tuple(a.choices),
                                 a.metavar, a.help) for a in p._actions if a.option_strings[0] != "-h"}
    assert got == OPTIONS
    assert {a.option_strings[0]: a.const for a in p._actions if a.nargs == 0 and a.dest != "help"} == {
        "--compile": True, "--json": True}  # store_true flags
    assert p.prog == "coursekit plan" and p.format_usage().startswith("usage: coursekit plan [-h] --model MODEL ")
    assert p.description == "coursekit plan: the fastest layout that fits, with the reasoning shown."


def test_the_helps_claims_hold():
    """What the help names exists: the default GPU and the listed networks are presets, the --layout keys are the
    planner's (parse_layout takes each, and the trainer's names listed), the --overlap names are the modelled ones,
    fp32 is the layout's default gradient dtype. Catches the help drifting from the code."""
    from coursekit.plan import overlap
    from coursekit.plan.layout import Layout, parse_layout

    assert hardware(OPTIONS["--gpu"][0]).name == "H100-80GB"
    for name in ("ib-400", "ib-200", "roce-200"):
        assert network(name).name == name
    keys = OPTIONS["--layout"][5].split("keys: ")[1].split(";")[0].split(", ")
    assert set(keys) <= {f.name for f in fields(Layout)}
    parse_layout("strategy=zero3,grad_accum=2,pp_virtual=2")  # the trainer's names
    names = OPTIONS["--overlap"][5].split("no-NAME for off: ")[1].split(";")[0]
    assert [w.split(" (")[0] for w in names.split(", ")] == list(overlap.OVERLAPS)
    assert Layout().grad_reduce_dtype == "fp32"


@pytest.mark.parametrize("flag", ["--model", "--gpus", "--seq", "--global-batch"])
def test_each_required_flag_is_required_and_no_flag_is_abbreviated(capsys, flag):
    """Without one of the four required flags argparse stops (exit 2) and names it; an abbreviation (--gpus-per) is
    not taken for --gpus-per-node. Catches required dropped and allow_abbrev switched on."""
    argv = dict(zip(BASE[::2], BASE[1::2]))
    del argv[flag]
    with pytest.raises(SystemExit) as e:
        main([x for kv in argv.items() for x in kv])
    assert e.value.code == 2 and f"the following arguments are required: {flag}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*BASE, "--gpus-per", "1"])
    assert e.value.code == 2 and "unrecognized arguments: --gpus-per 1" in capsys.readouterr().err


def _tight(tmp_path):
    """A GPU of 1,132,000,000 bytes (capacity 95 %: 1,075,400,000): tiny-llama's smallest layouts on 2 GPUs fit, its
    larger micro-batches do not, so a search meets both."""
    f = tmp_path / "tight.yaml"
    f.write_text("gpu:\n  name: tight-gpu\n  memory_bytes: 1132000000\n")
    return str(f)


def test_unfit_candidates_are_kept_for_json_top_0_and_the_plot_only(capsys, tmp_path, monkeypatch):
    """plan(keep_unfit=...) is asked for the candidates that do not fit only where they are shown: --json --top 0
    (every candidate) and --plot (memory against time); the plain table, --json --top N and --top 0 without --json
    count fitting ones only. Catches keep_unfit's `or` / `and`, its top == 0 test and the plot's flag not counted."""
    import coursekit.plan.cli as cli

    hw = _tight(tmp_path)
    _, every, _ = _run(capsys, "--hardware", hw, "--json", "--top", "0")
    rows = json.loads(every)
    fit = [r for r in rows if r["fits"]]
    assert fit and len(fit) < len(rows) and all(r["fits"] for r in rows[:len(fit)])  # fitting first, then the rest
    for argv in (["--top", "0"], ["--top", "1"]):
        rc, out, _ = _run(capsys, "--hardware", hw, *argv)
        assert rc == 0 and out.splitlines()[0].split(": ")[1].startswith(f"{len(fit)} candidate(s), best ")
    _, top1, _ = _run(capsys, "--hardware", hw, "--json", "--top", "1")
    assert len(json.loads(top1)) == 1
    plotted = {}
    monkeypatch.setattr(cli, "plot", lambda cands, path: plotted.update(n=len(cands), path=path))
    rc, out, _ = _run(capsys, "--hardware", hw, "--plot", str(tmp_path / "p.png"), "--top", "1")
    assert rc == 0 and plotted == {"n": len(rows), "path": str(tmp_path / "p.png")}
    assert out.splitlines()[0].endswith(f": {len(rows)} candidate(s), best 1 shown")
    assert out.splitlines()[-1] == f"plot: {tmp_path / 'p.png'}"


def test_the_tables_gib_column_and_the_files_network_reach_the_prediction(capsys, tmp_path):
    """The GiB column is the peak in GiB (bytes / 2^30, one decimal), as the JSON's peak_bytes; a --hardware file's
    network (1 MB/s NICs) prices a 2-node DDP's gradient all-reduce: more than 10 x the step on the ib-400 preset.
    Catches bytes x GiB, the file's network not handed to the search."""
    _, out, _ = _run(capsys, "--layout", "dp_replicate=2")
    _, js, _ = _run(capsys, "--layout", "dp_replicate=2", "--json")
    peak = json.loads(js)[0]["peak_bytes"]
    assert out.splitlines()[3].split()[5] == f"{peak / 2**30:.1f}"
    f = tmp_path / "slow.yaml"
    f.write_text("network:\n  name: slow-net\n  bw_per_gpu: 1.0e6\n")
    fast = json.loads(_run(capsys, "--layout", "dp_replicate=2", "--gpus-per-node", "1", "--json")[1])[0]
    slow = json.loads(_run(capsys, "--layout", "dp_replicate=2", "--gpus-per-node", "1", "--json", "--hardware",
                           str(f))[1])[0]
    assert slow["step_time_s"] > 10 * fast["step_time_s"]
