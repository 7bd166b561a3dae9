"""`coursekit memory --solve` answers in words, names what is missing, and never guesses a GPU (issue 15, item 8)."""
import pytest

from coursekit.memory import estimate
from coursekit.memory.cli import main
from coursekit.memory.errors import ConfigError
from coursekit.memory.gpus import gpu
from coursekit.memory.solvers import max_micro_batch, min_gpus


def test_max_batch_without_seq_names_the_option_with_an_example(capsys):
    assert main(["--model", "llama3-8b", "--zero", "3", "--dp", "8", "--gpu", "H100-80GB", "--solve", "max-batch"]) == 2
    assert "error: --solve max-batch needs --seq (e.g. --seq 4096)" in capsys.readouterr().err


@pytest.mark.parametrize("family,names", [("H100", ["H100-80GB", "H100-PCIe"]), ("a100", ["A100-40GB", "A100-80GB"])])
def test_a_family_name_is_refused_with_every_candidate(family, names, capsys):
    with pytest.raises(ConfigError, match="ambiguous GPU") as e:
        gpu(family)
    assert all(n in str(e.value) for n in names)
    assert main(["--model", "llama3-8b", "--batch", "1", "--seq", "1024", "--gpu", family]) == 2
    err = capsys.readouterr().err
    assert "ambiguous GPU" in err and all(n in err for n in names)
    assert gpu("h100-80gb").name == "H100-80GB" and gpu("H100-SXM").name == "H100-80GB"


def test_an_answer_that_fits_is_a_sentence_with_the_batch(capsys):
    args = ["--model", "llama3-8b", "--seq", "4096", "--zero", "3", "--dp", "8", "--gpu", "H100-80GB"]
    assert main(args + ["--solve", "max-batch"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    b = max_micro_batch("llama3-8b", seq=4096, zero=3, dp=8, gpu="H100-80GB")
    assert b >= 1 and first.startswith(f"solution: up to {b} sequences of 4096 tokens per micro-batch")
    assert "{" not in first


def test_nothing_fits_says_what_would(capsys):
    """8B at seq 16384 on 8 GPUs: no micro-batch, but full recomputation makes room (the count from the solver)."""
    args = ["--model", "llama3-8b", "--seq", "16384", "--zero", "3", "--dp", "8", "--gpu", "H100-80GB"]
    kw = dict(seq=16384, zero=3, dp=8, gpu="H100-80GB")
    assert max_micro_batch("llama3-8b", **kw) == 0
    full = max_micro_batch("llama3-8b", **kw, recompute="full")
    assert full >= 1
    assert main(args + ["--solve", "max-batch"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"no micro-batch fits on 8 × H100-80GB at seq 16384; with --recompute full, {full} " \
                    f"fit{'s' if full == 1 else ''}"
    assert main(args + ["--solve", "max-batch", "--json"]) == 0  # the JSON contract keeps the number
    assert '"solution": {"max_batch": 0}' in capsys.readouterr().out


def test_when_more_gpus_do_not_help_it_says_so(capsys):
    """70B at ZeRO-1: the bf16 weights alone (141 GB) are on every GPU, whatever the recomputation or the count."""
    with pytest.raises(ConfigError):
        min_gpus("llama3-70b", batch=1, seq=4096, zero=1, gpu="H100-80GB", recompute="full")
    assert main(["--model", "llama3-70b", "--seq", "4096", "--zero", "1", "--dp", "64", "--gpu", "H100-80GB",
                 "--solve", "max-batch"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "no micro-batch fits on 64 × H100-80GB at seq 4096; not even with --recompute full; more GPUs do not help "
        "this configuration")


def test_zero3_70b_on_one_node_points_to_more_gpus(capsys):
    args = ["--model", "llama3-70b", "--seq", "4096", "--zero", "3", "--dp", "8", "--gpu", "H100-80GB",
            "--recompute", "full", "--solve", "max-batch"]
    assert main(args) == 0
    first = capsys.readouterr().out.splitlines()[0]
    e = min_gpus("llama3-70b", batch=1, seq=4096, zero=3, gpu="H100-80GB", recompute="full")
    at = lambda dp: estimate("llama3-70b", batch=1, seq=4096, zero=3, dp=dp, gpu="H100-80GB",  # noqa: E731
                             recompute="full").fits
    assert at(e.config.dp) and not at(e.config.dp - 1) and e.config.dp > 8
    assert first == f"no micro-batch fits on 8 × H100-80GB at seq 4096; or {e.config.world} GPUs (--dp {e.config.dp})"
