"""``coursekit plan`` (``coursekit.plan.cli``): each refusal's one line and exit 2, what the table and the JSON say,
and which flags reach the prediction, on tiny-llama (a few ms a layout). Pure Python; written against the mutation
survivors of bench/bench_mutation.py plan.cli."""
from __future__ import annotations

import json

import pytest

from coursekit.plan.cli import main

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
    assert rc == 0 and row["summary"] == "ddp dp2 mb1" and row["run"] == {"gemm_dtype": "fp32", "compile": True}
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
