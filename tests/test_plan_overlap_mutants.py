"""``coursekit.plan.overlap``: which overlap switch acts on which layout, as its docstring's table says, and the
messages a refusal gives. Pure Python; written against the mutation survivors of bench/bench_mutation.py
plan.overlap."""
from __future__ import annotations

import pytest

from coursekit.plan import overlap
from coursekit.plan.layout import Layout


def test_several_switches_join_with_plus():
    """'no-grad_reduce+tp' is two switches (the docstring's ``overlap=param_gather+tp``). Catches the list split on
    whitespace or on another separator (one unknown name)."""
    L = Layout(tp=2, dp_replicate=2, overlap="no-grad_reduce+tp")
    assert overlap.resolve(L) == {"grad_reduce": False, "tp": True}
    z = Layout(dp_replicate=2, engine="deepspeed", zero=1, overlap=" param_gather + no-grad_reduce ")
    assert overlap.resolve(z) == {"grad_reduce": False, "param_gather": True}


def test_param_gather_acts_on_zero_1_and_2_only():
    """The table: param_gather is for ZeRO-1/2 (engine deepspeed, zero 1 or 2); on a sharded engine it is refused as
    DDP / ZeRO-1/2's (not as a DeepSpeed stage question). Catches `and` -> `or` (DeepSpeed's ZeRO-0 or a zero stage
    alone would do) and 'param_gather' misspelt in the sharded-engine test."""
    for ok in (dict(zero=1), dict(zero=2)):
        assert overlap.applies("param_gather", Layout(dp_replicate=2, engine="deepspeed", **ok)) is None
    zero0 = Layout(dp_replicate=2, engine="deepspeed")
    assert overlap.applies("param_gather", zero0) == ("param_gather overlaps ZeRO-1/2's all-gather of updated "
                                                      "parameters: engine deepspeed, zero 1 or 2")
    for sharded in (Layout(dp_shard=2, engine="fsdp2"), Layout(dp_replicate=2, engine="deepspeed", zero=3)):
        assert overlap.applies("param_gather", sharded) == ("param_gather is for DDP and ZeRO-1/2 (a sharded "
                                                            "engine's reduce-scatter overlaps under 'prefetch')")
    assert "param_gather" not in overlap.defaults(zero0)


def test_refusals_say_what_each_switch_needs_word_for_word():
    """The messages name the engines as the docstring does (ZeRO-3, Megatron-Core, async TP). Catches their text
    changed (case, markers)."""
    assert overlap.applies("prefetch", Layout(dp_replicate=2)) == ("prefetch overlaps a sharded engine's gathers: "
                                                                   "fsdp2 / hsdp or ZeRO-3")
    assert overlap.applies("tp", Layout(tp=2, sp=False)) == ("tp overlap (Megatron-Core --tp-comm-overlap, async TP) "
                                                             "needs tp > 1 with sequence parallelism")
    with pytest.raises(ValueError) as e:
        Layout(dp_replicate=2, overlap="fast")
    assert str(e.value) == ("layout overlap 'fast': unknown; choose from grad_reduce, param_gather, prefetch, tp "
                            "(no-NAME: off)")
