"""The parallel core's seams: layouts composed on one mesh equal the single-process run on every rank, and layouts
that cannot work are refused before anything is launched."""
import subprocess
import sys

import pytest

from parity import COMMON, assert_equal_to_single, baseline, llama_file, train


@pytest.mark.slow  # default-tier budget: ~28 s; DDP x TP runs inside the 8-process 3-D test
def test_ddp_x_tp2_on_4_processes_equals_single(no_orphans):
    res = train("ddp", 4, "--tp", "2")
    assert_equal_to_single(res, baseline())
    for rec in res.results:  # ranks 0,1 and 2,3 are TP pairs; 0,2 and 1,3 replicate each other
        f = rec["final"]
        assert f["layout"]["tp"] == 2 and f["layout"]["dp_replicate"] == 2
        assert f["coords"]["tp"] == rec["rank"] % 2 and f["coords"]["dp_replicate"] == rec["rank"] // 2
        # a TP rank holds half of every q/k/v/o/gate/up/down weight and all of the rest: less than the full model
        assert 0.5 * 4 * f["num_params"] < f["params_bytes"] < 4 * f["num_params"]


def test_two_stage_gpipe_equals_single(no_orphans):
    res = train("ddp", 2, "--pp", "2", "--grad-accum", "2")  # 2 micro-batches through 2 stages
    assert_equal_to_single(res, baseline())
    stage0, stage1 = (r["final"] for r in res.results)
    assert stage0["params_bytes"] + stage1["params_bytes"] == 4 * stage0["num_params"]  # each stage its part


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    return llama_file(tmp_path_factory.mktemp("model"), num_hidden_layers=3)


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_uneven_1f1b_pipeline_equals_single(three_layers, no_orphans):
    """3 blocks on 2 stages (2 + 1), 4 micro-batches, the 1F1B schedule."""
    res = train("ddp", 2, "--model", three_layers, "--pp", "2", "--grad-accum", "4", "--pp-schedule", "1f1b")
    assert_equal_to_single(res, baseline("--model", three_layers))


def test_stage_split_is_contiguous_and_front_loaded():
    from coursekit.pp.stage import split

    assert [list(split(3, 2, s)) for s in range(2)] == [[0, 1], [2]]
    assert [list(split(7, 3, s)) for s in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert sorted(i for s in range(4) for i in split(10, 4, s)) == list(range(10))


@pytest.mark.parametrize("args,needle", [
    (["--strategy", "ddp", "--nproc", "4", "--tp", "3"], "not divisible by tp 3"),
    (["--strategy", "ddp", "--nproc", "3", "--tp", "2"], "world size 3 is not divisible by tp 2"),
    (["--strategy", "ddp", "--tp", "8"], "4 query heads do not split over tp 8"),
    (["--strategy", "ddp", "--pp", "4"], "2 layers cannot fill pp 4"),
    (["--strategy", "ddp", "--nproc", "4", "--tp", "2", "--global-batch", "3"], "global batch 3 is not divisible"),
    (["--strategy", "ddp", "--dp-shard", "2"], "dp_shard 2 needs a sharding data-parallel strategy"),
    (["--strategy", "ddp", "--model", "tiny-gpt2", "--tp", "2"], r"--tp has no plan for tiny-gpt2 \(gpt2\)"),
    (["--strategy", "ddp", "--pp-schedule", "1f1b"], "--pp-schedule belongs to pp, which this run does not use"),
    (["--strategy", "ddp", "--profile-steps", "3:1"], "need 0 <= a < b"),
    (["--strategy", "ddp", "--cp", "-1"], "--cp must be >= 1, got -1"),  # not a --nproc error: the user gave --cp
    (["--strategy", "ddp", "--tp", "0"], "--tp must be >= 1, got 0"),
    (["--strategy", "ddp", "--seq", "0"], "--seq must be >= 1, got 0"),
])
def test_impossible_layouts_are_refused_before_launch(args, needle):
    from coursekit.train.launcher import plan

    with pytest.raises(ValueError, match=needle):
        plan(args)


def test_refusal_at_the_cli_is_one_line_and_exit_2(no_orphans):
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--strategy", "ddp", "--nproc", "3",
                          "--tp", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("error: world size 3")


def test_degrees_set_the_default_number_of_processes():
    from coursekit.train.launcher import plan

    assert plan(["--strategy", "ddp", "--tp", "2", "--pp", "2"])[2] == 4
    assert plan(["--strategy", "ddp", "--tp", "2", "--dp-replicate", "2", "--pp", "2"])[2] == 8
    assert plan(["--strategy", "single"])[2] == 1


@pytest.mark.parametrize("impl", ["ring", pytest.param("ulysses", marks=pytest.mark.slow)])  # ulysses: budget, ~15 s
def test_context_parallel_in_the_trainer_equals_single(impl, no_orphans):
    """The sequence is split over 2 ranks (zig-zag for ring, contiguous for Ulysses) with its labels and positions."""
    res = train("ddp", 2, "--cp", "2", "--cp-impl", impl, "--count-step")
    assert_equal_to_single(res, baseline())
    assert_saved_as_predicted(res, ["--cp", "2", "--cp-impl", impl], 2)
    assert [r["final"]["coords"]["cp"] for r in res.results] == [0, 1]
    # each CP rank's own loss is over its own tokens (different), their mean is the sequence's loss
    first = [r["steps"][0]["local_loss"] for r in res.results]
    assert first[0] != first[1]


def assert_saved_as_predicted(res, args, nproc):
    """The counted last step's peak of saved activations (``--count-step``) on every rank equals ``coursekit
    memory``'s bytes for that rank's pipeline stage, to the byte."""
    from coursekit.profiling.stepcount import predicted_saved

    want = predicted_saved(["--strategy", "ddp", *COMMON, *args], nproc)
    got = [(r["final"]["coords"]["pp"], r["final"]["peak_saved_bytes"]) for r in res.results]
    assert got == [(c["pp"], want[c["pp"]]) for c in (r["final"]["coords"] for r in res.results)], (got, want)


def test_3d_dp2_tp2_pp2_on_8_processes_equals_single(no_orphans):
    args = ["--tp", "2", "--pp", "2", "--grad-accum", "2"]
    res = train("ddp", 8, *args, "--count-step", timeout=600)
    assert_equal_to_single(res, baseline())
    coords = [r["final"]["coords"] for r in res.results]
    assert [(c["pp"], c["dp_replicate"], c["tp"]) for c in coords] == [
        (p, d, t) for p in range(2) for d in range(2) for t in range(2)]
    assert_saved_as_predicted(res, args, 8)  # the gathered weights' views a DTensor linear saves are not counted


@pytest.mark.slow  # default-tier budget: ~26 s; PP and CP each equal one process in this tier
def test_pipeline_x_context_parallel_equals_single(no_orphans):
    """Position ids reach every pipeline stage (a CP shard starts mid-sequence; RoPE needs the true positions)."""
    assert_equal_to_single(train("ddp", 4, "--pp", "2", "--cp", "2", "--grad-accum", "2"), baseline())


@pytest.mark.slow
def test_4d_fsdp2_tp2_pp2_cp2_on_16_ranks_equals_single(no_orphans):
    """FSDP2 x TP x PP x CP at once (16 processes: minutes on 2 cores, so the slow tier)."""
    res = train("fsdp2", 16, "--dp-shard", "2", "--tp", "2", "--pp", "2", "--cp", "2", "--grad-accum", "2",
                timeout=1200)
    assert_equal_to_single(res, baseline())


def test_layout_table_names_every_ranks_groups():
    from coursekit.parallel import ParallelDims

    text = ParallelDims(world_size=8, tp=2, pp=2).describe(gpus_per_node=4)
    rows = text.splitlines()[2:]
    assert len(rows) == 8
    assert rows[5].split()[:5] == ["5", "1", "1", "0", "1"]  # rank 5: node 1, pp 1, dp_replicate 0, tp 1
    assert "tp[4, 5]" in rows[5] and "pp[1, 5]" in rows[5] and "dp_replicate[5, 7]" in rows[5]
