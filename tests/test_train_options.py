"""Trainer options the README relies on, each run at least once and checked for what it must change (or not)."""
import json

import pytest

from parity import LOSS_ATOL, assert_equal_to_single, losses, train

OPTS = ["--data", "text", "--attention", "eager"]


@pytest.fixture(scope="module")
def runs():
    cache = {}

    def get(key, *args):
        if key not in cache:
            cache[key] = train(*args).results
        return cache[key]

    return get


def test_recompute_changes_nothing_but_memory(runs, no_orphans):
    """The same losses and weights, and less memory: the counted step's peak of saved activations (--count-step,
    coursekit.measure.peak) with --recompute full is below the plain run's (a flag that was silently ignored would
    hold the same bytes)."""
    plain = runs("plain", "single", 1, *OPTS, "--weight-decay", "0.1", "--count-step")[0]
    full = runs("full", "single", 1, *OPTS, "--weight-decay", "0.1", "--recompute", "full", "--count-step")[0]
    assert losses(full) == pytest.approx(losses(plain), abs=LOSS_ATOL)  # the same math, recomputed
    assert full["final"]["param_sq_sum"] == pytest.approx(plain["final"]["param_sq_sum"], rel=1e-6)
    saved, kept = plain["final"]["peak_saved_bytes"], full["final"]["peak_saved_bytes"]
    print(f"peak saved activations: {saved:,} B plain, {kept:,} B with --recompute full")
    assert 0 < kept < saved / 2, (saved, kept)  # 2 layers: each block keeps only its input between the passes


def test_weight_decay_shrinks_the_weights(runs, no_orphans):
    wd = runs("plain", "single", 1, *OPTS, "--weight-decay", "0.1", "--count-step")[0]
    none = runs("nowd", "single", 1, *OPTS)[0]
    assert losses(wd)[0] == losses(none)[0]  # same init, same first batch
    # AdamW's decoupled decay multiplies every weight by (1 - lr·wd) per step, on top of the same Adam update
    assert wd["final"]["param_sq_sum"] < none["final"]["param_sq_sum"]


def test_text_data_eager_attention_ddp_with_a_trace_equals_single(runs, tmp_path, no_orphans):
    base = runs("plain", "single", 1, *OPTS, "--weight-decay", "0.1", "--count-step")[0]
    res = train("ddp", 2, *OPTS, "--weight-decay", "0.1", "--recompute", "full", "--profile-dir", tmp_path,
                "--profile-steps", "1:3")
    assert_equal_to_single(res, base)
    for r in range(2):  # a Chrome trace per rank, holding exactly the two profiled steps
        events = json.loads((tmp_path / f"trace-rank{r}.json").read_text())["traceEvents"]
        steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
        assert len(steps) == 2, steps
        assert any(e.get("name", "").startswith(("gloo:", "c10d::")) for e in events)  # the all-reduces show

