"""Pipeline schedules (Module 4): every built-in schedule that runs on gloo equals one process, the bubble measured
from each stage's chunk timeline, and the saved activations each stage holds at its peak."""
import json

import pytest

from coursekit.launch import launch
from parity import assert_equal_to_single, baseline, train

SCHEDULE_ARGS = ["--pp", "2", "--grad-accum", "4"]


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    """4 blocks: 2 stages per rank on 2 ranks need at least 4."""
    from coursekit.memory import preset, to_hf_config_dict

    d = to_hf_config_dict(preset("tiny-llama"))
    d["num_hidden_layers"] = 4
    path = tmp_path_factory.mktemp("model") / "llama-4-layers.json"
    path.write_text(json.dumps(d))
    return str(path)


def test_interleaved_1f1b_with_two_stages_per_rank_equals_single(four_layers, no_orphans):
    """Rank 0 holds stages 0 and 2, rank 1 stages 1 and 3 (4 micro-batches)."""
    res = train("ddp", 2, "--model", four_layers, *SCHEDULE_ARGS, "--pp-schedule", "interleaved-1f1b")
    assert_equal_to_single(res, baseline("--model", four_layers))


@pytest.mark.slow
def test_looped_bfs_equals_single(four_layers, no_orphans):
    """LoopedBFS: stages r and r+pp, every forward of one stage before the next (a minute on 2 loaded cores)."""
    res = train("ddp", 2, "--model", four_layers, *SCHEDULE_ARGS, "--pp-schedule", "looped-bfs")
    assert_equal_to_single(res, baseline("--model", four_layers))


@pytest.mark.parametrize("kind", ["interleaved-zb", "zbv", "dualpipev"])
def test_zero_bubble_schedules_are_refused_in_the_trainer_with_their_reason(kind):
    """Their split weight-gradient step fails behind the composable replicate wrap (KeyError on an AccumulateGrad
    node, seen on gloo); refused before launch rather than crashing inside the schedule."""
    from coursekit.train.launcher import plan

    with pytest.raises(ValueError, match="splits each backward into input and weight gradients"):
        plan(["--strategy", "ddp", "--pp", "2", "--grad-accum", "4", "--pp-schedule", kind])


def test_stages_per_rank_follow_the_schedules_layout():
    from coursekit.pp import stages_of

    assert [stages_of(r, 4, "interleaved-1f1b") for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [stages_of(r, 4, "zbv") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert stages_of(1, 4, "1f1b") == [1]


@pytest.mark.parametrize("args,needle", [
    (["--pp", "2", "--pp-schedule", "interleaved-1f1b"], "2 layers cannot fill pp 2 x 2 stages per rank"),
    (["--pp", "2", "--nproc", "4", "--pp-schedule", "looped-bfs"], "keeps 2 stages per rank"),
    (["--pp", "2", "--pp-schedule", "1f1b"], "needs at least pp = 2 micro-batches"),
])
def test_schedules_that_cannot_run_are_refused_before_launch(args, needle):
    from coursekit.train.launcher import plan

    with pytest.raises(ValueError, match=needle):
        plan(["--strategy", "ddp", *args])


def test_bubble_theory():
    from coursekit.pp.bubble import theory

    assert theory(2, 4) == pytest.approx(1 / 5) and theory(4, 8, v=2) == pytest.approx(3 / 19)
    assert theory(2, 1) == pytest.approx(1 / 2)


def _probe(model, kind, m, steps=2):
    res = launch("coursekit.pp.probe", ["--model", model, "--pp", "2", "--grad-accum", str(m), "--pp-schedule",
                                        kind, "--steps", str(steps), "--seq", "32", "--global-batch", str(2 * m)],
                 nproc=2, timeout=300, stream=False)
    return res.results


def test_1f1b_timeline_interleaves_forward_and_backward_chunks(four_layers, no_orphans):
    """Each stage's timed chunks: m forwards and m backwards; the last stage alternates F,B (one forward, one
    backward); the first starts backwards after p forwards at most (what bounds its activations to p micro-batches)."""
    m, p = 4, 2
    ranks = _probe(four_layers, "1f1b", m)
    for r in ranks:
        kinds = [c[1] for c in r["timeline"]]
        assert kinds.count("F") == m and kinds.count("B") == m
        assert [c[2] for c in r["timeline"] if c[1] == "F"] == list(range(m))
    last = [c[1] for c in ranks[-1]["timeline"]]
    assert last == ["F", "B"] * m
    first = [c[1] for c in ranks[0]["timeline"]]
    assert first.index("B") <= p


@pytest.mark.slow
def test_measured_bubble_follows_theory_and_gpipe_holds_more(four_layers, no_orphans):
    """GPipe at m = 1, 2, 4, 8 on 2 stages. The theory (p-1)/(m+p-1) is a lower bound of the first stage's measured
    idle share (tolerance 0.05 below it for clock granularity); above it there is no tight bound on this machine: at
    millisecond chunks send/recv and the schedule's Python overhead count as idle, and other jobs share the 2 cores
    (measured 0.68 against 0.20 at m = 4 under load). So: bounded below, and shrinking as m grows; GPipe's peak
    saved bytes exceed 1F1B's on every stage."""
    from coursekit.pp.bubble import measured, theory

    seen = []
    for m in (1, 2, 4, 8):
        ranks = _probe(four_layers, "gpipe", m)
        b = measured([r["timeline"] for r in ranks])[0]
        assert b > theory(2, m) - 0.05, (m, b)
        seen.append(b)
    assert seen[0] > seen[-1]
    gpipe, f1b = _probe(four_layers, "gpipe", 4), _probe(four_layers, "1f1b", 4)
    assert all(g["peak_saved"] > f["peak_saved"] for g, f in zip(gpipe, f1b))
