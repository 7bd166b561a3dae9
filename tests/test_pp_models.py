"""The pipeline models in pure Python: each rank's order of forwards and backwards (``coursekit.memory.pp_order``)
and the saved activations it holds along it; the bubble model (``coursekit.pp.bubble``).

Expected orders are worked by hand from the schedules' rules (the module docstrings, the papers); where a schedule's
order has no rule short enough to work by hand (ZB-V, DualPipeV), torch's own schedule classes are the reference
(``test_multi_stage_orders_are_torchs``, as in tests/test_pp.py), and every order must be a schedule that runs: each
chunk micro-batch once, every dependency before it, no rank waiting forever.
"""
from __future__ import annotations

import re

import pytest

from coursekit.memory import pp_order
from coursekit.memory.errors import ConfigError
from coursekit.memory.pp_order import RoundsError, order, peak, peak_held, warmup
from coursekit.spec.schedules import stages_of


@pytest.fixture(autouse=True)
def _fresh_orders():
    """``_order`` is cached per process (the planner asks for the same orders over and over): start each test with an
    empty cache, so that it checks what the code builds now, not what an earlier test left there."""
    pp_order._order.cache_clear()
    yield


F, B, I, W = "F", "B", "I", "W"


# -- one-stage schedules, by hand ------------------------------------------------------------------------------------

def test_gpipe_runs_all_forwards_then_all_backwards():
    assert order("gpipe", 2, 1, 3) == [(F, 1, 0), (F, 1, 1), (F, 1, 2), (B, 1, 0), (B, 1, 1), (B, 1, 2)]


def test_1f1b_warms_up_pp_minus_rank_forwards_then_alternates():
    # pp 2, m 3: rank 0 warms up with 2 forwards, rank 1 (the last stage) with 1, then one backward, one forward
    assert order("1f1b", 2, 0, 3) == [(F, 0, 0), (F, 0, 1), (B, 0, 0), (F, 0, 2), (B, 0, 1), (B, 0, 2)]
    assert order("1f1b", 2, 1, 3) == [(F, 1, 0), (B, 1, 0), (F, 1, 1), (B, 1, 1), (F, 1, 2), (B, 1, 2)]
    # fewer micro-batches than the warm-up: min(pp - rank, m) = 1 forward, then its backward
    assert order("1f1b", 3, 0, 1) == [(F, 0, 0), (B, 0, 0)]


def test_looped_bfs_runs_every_micro_batch_through_each_stage_then_back():
    # rank 1 of pp 2 holds stages 1 and 3 (two per rank by default); forwards stage by stage, then the backwards
    # from the last stage back, last micro-batch first (torch's LoopedBFS, tests/test_pp.py)
    assert order("looped-bfs", 2, 1, 2) == [(F, 1, 0), (F, 1, 1), (F, 3, 0), (F, 3, 1),
                                            (B, 3, 1), (B, 3, 0), (B, 1, 1), (B, 1, 0)]
    assert len(order("looped-bfs", 2, 1, 2, 3)) == 2 * 2 * 3  # 3 stages: an F and a B per stage and micro-batch


def test_interleaved_1f1b_warms_up_then_alternates_over_its_stages():
    """pp 2, m 2, v 2: one round of 2 micro-batches. Rank 0 (stages 0, 2): warm-up (v−1)·2 + 2·(pp−1−0) = 4 = all
    its v·m forwards, stage by stage; then the backwards, its last stage first. Rank 1 (stages 1, 3): warm-up
    (v−1)·2 + 0 = 2 (stage 1's), then forward and backward alternate on stage 3, then stage 1's backwards."""
    assert order("interleaved-1f1b", 2, 0, 2) == [(F, 0, 0), (F, 0, 1), (F, 2, 0), (F, 2, 1),
                                                  (B, 2, 0), (B, 2, 1), (B, 0, 0), (B, 0, 1)]
    assert order("interleaved-1f1b", 2, 1, 2) == [(F, 1, 0), (F, 1, 1), (F, 3, 0), (B, 3, 0),
                                                  (F, 3, 1), (B, 3, 1), (B, 1, 0), (B, 1, 1)]


def test_interleaved_zero_bubble_follows_each_input_pass_with_the_oldest_weight_pass():
    """ZB1P on pp 2, m 2, v 2: warm-up (v−1)·2 + 1·(pp−1−rank): 3 forwards on rank 0, 2 on rank 1; every backward an
    input pass I; after the rank's first ``rank`` I's each I is followed by the W of the oldest pending one, the rest
    at the end. Rank 0 (rank 0: from the first I on): I-W pairs. Rank 1: its first I alone, then each I with the
    previous micro-batch's W, and the last W at the end."""
    assert order("interleaved-zb", 2, 0, 2) == [(F, 0, 0), (F, 0, 1), (F, 2, 0), (F, 2, 1), (I, 2, 0), (W, 2, 0),
                                                (I, 2, 1), (W, 2, 1), (I, 0, 0), (W, 0, 0), (I, 0, 1), (W, 0, 1)]
    assert order("interleaved-zb", 2, 1, 2) == [(F, 1, 0), (F, 1, 1), (F, 3, 0), (I, 3, 0), (F, 3, 1), (I, 3, 1),
                                                (W, 3, 0), (I, 1, 0), (W, 3, 1), (I, 1, 1), (W, 1, 0), (W, 1, 1)]


def test_the_default_stages_per_rank_are_the_schedules_own():
    # v omitted: 1 for gpipe and 1f1b, 2 for the others (coursekit.spec.schedules); an F and a B (or I + W) each
    m = 4
    assert len(order("gpipe", 2, 0, m)) == 2 * m
    assert len(order("interleaved-1f1b", 2, 0, m)) == 2 * m * 2
    assert len(order("looped-bfs", 2, 0, m)) == 2 * m * 2
    assert len(order("zbv", 2, 0, m)) == 3 * m * 2
    assert order("interleaved-1f1b", 2, 0, m) == order("interleaved-1f1b", 2, 0, m, 2)


# -- every order is a schedule that runs -----------------------------------------------------------------------------

def _runs(schedule, pp, m, v=None):
    """Play every rank's order against the others: an F of stage s needs the F of s−1 (same micro-batch), a B or I
    of s its own F and the B or I of s+1 (the last stage: its F), a W its I. Returns how many actions ran; raises if
    a rank waits on something no rank will ever run."""
    orders = [order(schedule, pp, r, m, v) for r in range(pp)]
    last = max(s for o in orders for _, s, _ in o)
    done, pos = set(), [0] * pp

    def ready(kind, s, mb):
        if kind == F:
            return s == 0 or (F, s - 1, mb) in done
        if kind in (B, I):
            return (F, s, mb) in done and (s == last or (B, s + 1, mb) in done or (I, s + 1, mb) in done)
        return (I, s, mb) in done

    while any(p < len(o) for p, o in zip(pos, orders)):
        moved = False
        for r, o in enumerate(orders):
            while pos[r] < len(o) and ready(*o[pos[r]]):
                done.add(o[pos[r]])
                pos[r] += 1
                moved = True
        assert moved, (schedule, pp, m, v, [o[p] for p, o in zip(pos, orders) if p < len(o)])
    return sum(len(o) for o in orders), orders


@pytest.mark.parametrize("schedule", pp_order.MODELLED)
def test_every_order_runs_each_chunk_micro_batch_once_on_its_own_stages(schedule):
    n = 0
    for pp in (2, 3, 4):
        for m in (1, 2, 3, 4, 5, 6, 8, 9, 12):
            if schedule in ("interleaved-1f1b", "interleaved-zb") and m % max(1, m // pp):
                continue  # torch refuses these (rounds)
            if schedule == "dualpipev" and m < 2 * pp:
                continue
            ran, orders = _runs(schedule, pp, m)
            split = schedule in ("interleaved-zb", "zbv", "dualpipev")
            for r, o in enumerate(orders):
                stages = stages_of(r, pp, schedule)
                assert {s for _, s, _ in o} == set(stages), (schedule, pp, m, r)
                for s in stages:
                    for mb in range(m):
                        kinds = sorted(k for k, s_, b_ in o if (s_, b_) == (s, mb))
                        # F and B; a split backward: F, I and W; DualPipeV runs most backwards whole (B)
                        assert kinds in ([B, F], [F, I, W]) and (split or kinds == [B, F]), (schedule, pp, m, r, s, mb)
                        if not split or schedule == "dualpipev":
                            continue
                        assert kinds == [F, I, W]  # interleaved-zb and zbv split every backward
            n += ran
    assert n > 0


# -- bad schedules, named with their numbers -------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (("pipedream", 2, 0, 4), "pipeline schedule 'pipedream': the order is modelled for gpipe, 1f1b, looped-bfs, "
                             "interleaved-1f1b, interleaved-zb, zbv, dualpipev"),
    (("gpipe", 2, 0, 4, 2), "gpipe keeps one stage per rank, not 2"),
    (("1f1b", 2, 0, 4, 3), "1f1b keeps one stage per rank, not 3"),
    (("zbv", 2, 0, 4, 3), "zbv keeps exactly two stages per rank (a V), not 3"),
    (("dualpipev", 2, 0, 4, 1), "dualpipev keeps exactly two stages per rank (a V), not 1"),
    (("1f1b", 2, 2, 4), "need 0 <= rank < pp and m, v >= 1 (rank 2, pp 2, m 4, v 1)"),
    (("1f1b", 2, -1, 4), "need 0 <= rank < pp and m, v >= 1 (rank -1, pp 2, m 4, v 1)"),
    (("1f1b", 2, 0, 0), "need 0 <= rank < pp and m, v >= 1 (rank 0, pp 2, m 0, v 1)"),
    (("looped-bfs", 2, 0, 4, 0), "need 0 <= rank < pp and m, v >= 1 (rank 0, pp 2, m 4, v 0)"),
    # 2 ranks x 2 stages = 4 stages: 3 micro-batches are too few
    (("dualpipev", 2, 0, 3), "dualpipev needs at least as many micro-batches as stages (2 x pp = 4), not 3"),
])
def test_a_schedule_that_cannot_be_modelled_is_refused_with_its_numbers(args, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        order(*args)


def test_interleaving_refuses_micro_batches_that_do_not_split_into_rounds():
    # 5 micro-batches on pp 2: rounds = 5 // 2 = 2, and 5 is not a multiple of 2 (torch refuses it)
    with pytest.raises(RoundsError, match="^" + re.escape(
            "interleaved schedules need micro-batches (5) divisible by their rounds (2): torch refuses it (a multiple "
            "of pp always works)") + "$") as e:
        order("interleaved-1f1b", 2, 0, 5)
    assert isinstance(e.value, ConfigError)
    assert len(order("interleaved-1f1b", 4, 0, 3)) == 2 * 3 * 2  # m < pp: one round of 3, accepted
    assert len(order("dualpipev", 2, 0, 4)) > 0  # exactly 2 x pp micro-batches: enough


def test_warmup_of_interleaved_1f1b():
    # pp 4, m 8: 2 rounds of 4 micro-batches; rank r warms up (v−1)·4 + 2·(pp−1−r) forwards
    assert [warmup(4, r, 8, 2) for r in range(4)] == [10, 8, 6, 4]
    assert warmup(4, 0, 8, 3) == 2 * 4 + 2 * 3  # three stages per rank: two rounds' worth ahead
    assert warmup(4, 0, 8, 2, per_hop=1) == 4 + 3  # zero bubble: one forward per hop
    # pp 2, m 1 (one round of 1): 1 + 2 = 3 would exceed all v·m = 2 forwards, so all 2
    assert warmup(2, 0, 1, 2) == 2


# -- activations held along an order ---------------------------------------------------------------------------------

def test_held_activations_rise_with_forwards_and_fall_with_backwards():
    ops = [(F, 0, 0), (F, 0, 1), (B, 0, 0), (F, 0, 2), (B, 0, 1), (B, 0, 2)]  # 1F1B, rank 0 of 2, m 3
    assert peak_held(ops, lambda s: 10) == (20, 2)  # two forwards in flight at most
    # a backward frees its micro-batch but 3 bytes (a runtime buffer): 20 − 7 + 10 = 23 after the third forward
    assert peak_held(ops, lambda s: 10, lambda s: 3) == (23, 2)
    # stage-dependent sizes (stage 2: 12 each, 1 kept): the last stage's two forwards, 24, the peak
    assert peak_held([(F, 2, 0), (F, 2, 1), (B, 2, 0), (B, 2, 1)], lambda s: 10 + s, lambda s: s - 1) == (24, 2)


def test_the_peak_is_the_first_time_the_most_is_held():
    # 20 bytes once with one micro-batch of stage 0, later 20 again with two of stage 1: the first one counts
    ops = [(F, 0, 0), (B, 0, 0), (F, 1, 0), (F, 1, 1)]
    assert peak_held(ops, lambda s: 20 if s == 0 else 10) == (20, 1)


def test_an_input_pass_frees_only_the_loss_and_the_weight_pass_the_rest():
    # saved 10 + stage (stage 0: 10), loss buffers 4 + stage: F 10, I −4 → 6, F +10 → 16 (the peak, 2 in flight),
    # W frees 10 − 4 = 6 → 10
    ops = [(F, 0, 0), (I, 0, 0), (F, 0, 1), (W, 0, 0), (I, 0, 1), (W, 0, 1)]
    assert peak_held(ops, lambda s: 10 + s, loss=lambda s: 4 + s) == (16, 2)
    assert peak_held(ops, lambda s: 10 + s) == (20, 2)  # no loss buffers: an I frees nothing
    # with kept 1 as well, a W frees 10 − 1 − 4 = 5: F 10, I 6, F 16, W 11, I 7, W 2 (what stays: 2 x kept)
    assert peak_held(ops + [(F, 0, 2)], lambda s: 10 + s, lambda s: 1 + s, lambda s: 4 + s) == (16, 2)
    assert peak_held(ops + [(F, 0, 2), (F, 0, 3)], lambda s: 10 + s, lambda s: 1 + s, lambda s: 4 + s) == (22, 2)


def test_a_step_storage_is_held_once_per_stage_from_its_first_forward():
    # saved 10, step 5 + stage: F(0) 10 + 5, F(0) +10 (no second step storage), F(2) +10 +7, B frees 10 each
    ops = [(F, 0, 0), (F, 0, 1), (F, 2, 0), (B, 2, 0), (B, 0, 0), (B, 0, 1)]
    assert peak_held(ops, lambda s: 10, step=lambda s: 5 + s) == (42, 3)


def test_peak_passes_each_runtime_term_on():
    # 1F1B rank 0 of 2, m 3 (worked above): 23 with 3 bytes kept per backward, 20 without
    assert peak("1f1b", 2, 0, 3, None, lambda s: 10, lambda s: 3) == (23, 2)
    # interleaved-zb rank 1 of 2, m 2 (its order above): F F F I F ... with loss 4: 10, 20, 30, 26, 36 (4 in flight)
    assert peak("interleaved-zb", 2, 1, 2, None, lambda s: 10, loss=lambda s: 4) == (36, 4)
    # GPipe rank 1, m 2, a step storage of 5: 10 + 5 + 10
    assert peak("gpipe", 2, 1, 2, None, lambda s: 10, step=lambda s: 5) == (25, 2)


def test_peak_of_interleaved_1f1b_replays_only_the_warm_up_and_one_period():
    """pp 2, m 8, v 2: 4 rounds of 2; rank 0 warms up (v−1)·2 + 2 = 4 forwards, then forward-backward pairs. Without
    ``kept`` the held set repeats every v·2 = 4 pairs, so ``peak`` replays 4 + 2·(4 + 1) = 14 of the 32 actions
    (each asks ``saved`` once); the peak is the warm-up plus one forward, 5 chunks."""
    calls = []

    def saved(s):
        calls.append(s)
        return 10

    assert peak("interleaved-1f1b", 2, 0, 8, None, saved) == (50, 5)
    assert len(calls) == 14
    # with 1 byte kept per backward the held bytes keep growing: after the warm-up (40) each of the 12 pairs adds
    # 10 − 9 = 1, so the last pair's forward holds 40 + 11 + 10 = 61; the whole order is replayed
    assert peak("interleaved-1f1b", 2, 0, 8, None, lambda s: 10, lambda s: 1) == (61, 5)
    # other schedules are replayed whole: GPipe, 16 micro-batches, all 16 in flight at its peak
    assert peak("gpipe", 2, 0, 16, None, lambda s: 1) == (16, 16)
    # stages per rank given: LoopedBFS with 3 holds every one of its v·m = 3 x 2 chunk micro-batches at once
    assert peak("looped-bfs", 2, 0, 2, 3, lambda s: 1) == (6, 6)


def test_multi_stage_orders_are_torchs():
    """Each multi-stage schedule's order against torch's own schedule class (its
    ``_calculate_single_rank_operations``, tests/test_pp.py's reference ``_torch_order``), 2-3 ranks, 2-8
    micro-batches (DualPipeV: 2-5 ranks), the schedules' default 2 stages per rank."""
    pytest.importorskip("torch.distributed.pipelining")
    from test_pp import _torch_order

    for schedule in ("interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"):
        # DualPipeV splits its last backwards at rank-dependent places (the rank's half, its parity): ranks 0-4 too
        for pp in (2, 3) + ((4, 5) if schedule == "dualpipev" else ()):
            for m in (2, 3, 4, 6, 7, 8) if pp < 4 else (2 * pp, 2 * pp + 1):
                if schedule in ("interleaved-1f1b", "interleaved-zb") and m % max(1, m // pp):
                    continue
                if schedule == "dualpipev" and m < 2 * pp:
                    continue
                for rank in range(pp):
                    assert order(schedule, pp, rank, m) == _torch_order(schedule, pp, rank, m, 2), (schedule, pp, m)


# -- the bubble model (coursekit.pp.bubble: pure Python, timelines as tuples) ----------------------------------------

def test_bubble_theory_closed_forms():
    from coursekit.pp.bubble import theory

    assert theory(4, 8) == pytest.approx(3 / 11)  # GPipe / 1F1B on 4 stages, 8 micro-batches: (p−1)/(m+p−1)
    assert theory(4, 8, v=2) == pytest.approx(3 / 19)  # interleaved, 2 stages per rank: (p−1)/(v·m+p−1)
    assert theory(1, 5) == 0  # one stage: nothing to wait for


def _heavy_last_stage():
    """GPipe, 2 stages, 2 micro-batches; stage 0: F 1, B 2; stage 1 twice as heavy: F 2, B 4. Replayed: rank 0 F F
    in [0, 2]; rank 1 F in [1, 3], [3, 5], B in [5, 9], [9, 13]; rank 0 B in [9, 11], [13, 15]. Span 15; busy 6 and
    12: bubbles 1 − 6/15 = 0.6 and 1 − 12/15 = 0.2."""
    return {(0, "F"): 1.0, (0, "B"): 2.0, (1, "F"): 2.0, (1, "B"): 4.0}, [0.6, 0.2]


def test_ideal_with_measured_stage_costs_replays_the_schedule_with_them():
    from coursekit.pp.bubble import ideal

    cost, want = _heavy_last_stage()
    assert ideal("gpipe", 2, 2, cost=cost) == pytest.approx(want)
    # a split backward's input pass is costed as the timeline's "B". ZB1P, pp 2, m 2 (its orders above), F = I = 1,
    # W = 0: rank 0 F F in [0, 2], F F of stage 2 in [2, 4]; rank 1 stage 1 in [1, 3], F(3,0) [3, 4], I [4, 5],
    # F(3,1) [5, 6], I [6, 7]; rank 0 I(2,·) [5, 6], [7, 8]; rank 1 I(1,·) [7, 8], [8, 9]; rank 0 I(0,·) [8, 9],
    # [9, 10]. Span 10, 8 busy on each rank: 0.2
    zb = ideal("interleaved-zb", 2, 2, cost={**{(s, k): 1.0 for s in range(4) for k in "FB"},
                                             **{(s, "W"): 0.0 for s in range(4)}})
    assert zb == pytest.approx([0.2, 0.2])


def test_uneven_formula_worked_by_hand():
    from coursekit.pp.bubble import theory_uneven

    # 2 stages, m 2; CPU seconds per chunk: stage 0 F 2, B 2; stage 1 F 1, B 4 (the heaviest forward and the
    # heaviest backward on different stages, so the two spans differ); each chunk's wall time is 1 s longer
    cost, m = {(0, "F"): 2.0, (0, "B"): 2.0, (1, "F"): 1.0, (1, "B"): 4.0}, 2

    def tl(stage):  # (stage, kind, mb, start, end, cpu)
        out, t = [], 0.0
        for kind in "FB":
            for mb in range(m):
                d = cost[(stage, kind)]
                out.append((stage, kind, mb, t, t + d + 1, d))
                t += d + 1
        return out

    tls = [tl(0), tl(1)]
    # GPipe: span = Σf + (m−1)·max f + Σb + (m−1)·max b = 3 + 2 + 6 + 4 = 15; stage s: 1 − m·(f_s + b_s)/15
    assert theory_uneven(tls, None, m, "gpipe") == pytest.approx([1 - 8 / 15, 1 - 10 / 15])
    assert theory_uneven(tls, None, m) == pytest.approx([1 - 8 / 15, 1 - 10 / 15])  # GPipe and CPU by default
    # 1F1B-style: span = Σ(f + b) + (m−1)·max(f + b) = 9 + 5 = 14
    assert theory_uneven(tls, None, m, "1f1b") == pytest.approx([1 - 8 / 14, 1 - 10 / 14])
    # wall clock: F 3, B 3 and F 2, B 5: span 5 + 3 + 8 + 5 = 21; 1 − 2·6/21 and 1 − 2·7/21
    assert theory_uneven(tls, None, m, "gpipe", clock="wall") == pytest.approx([1 - 12 / 21, 1 - 14 / 21])
    # the last stage's loss, 1 s per micro-batch (as events), joins its forward: f_1 = 1 + 1 = 2, so the GPipe span
    # is Σf 4 + max f 2 + Σb 6 + max b 4 = 16; stage 0: 1 − 2·4/16, stage 1: 1 − 2·(2 + 4)/16
    loss = [[], [(1, "L", mb, 0.0, 10.0, 1.0) for mb in range(m)]]
    assert theory_uneven(tls, loss, m, "gpipe") == pytest.approx([0.5, 0.25])
    # a stage with forwards only in the timelines (its backwards not recorded): b = 0 for it, not an error
    fwd_only = [[c for c in tls[0]], [c for c in tls[1] if c[1] == "F"]]
    # b_1 = 0, so Σb = max b = b_0 = 2: span 3 + 2 + 2 + 2 = 9; stage 0: 1 − 2·4/9, stage 1: 1 − 2·1/9
    assert theory_uneven(fwd_only, None, m, "gpipe") == pytest.approx([1 - 8 / 9, 1 - 2 / 9])


def test_replay_counts_the_loss_waits_for_dependencies_and_refuses_an_impossible_order():
    from coursekit.pp.bubble import replay

    # 2 stages, 1 micro-batch, F 1 and B 2 each; the last stage's loss, 1 s, after its forward. Replayed: rank 0 F
    # [0, 1]; rank 1 F + loss [1, 3], B [3, 5]; rank 0 B [5, 7]. Span 7: bubbles 1 − 3/7 and 1 − 4/7
    st0 = [(0, "B", 0, 5.0, 7.0), (0, "F", 0, 0.0, 1.0)]  # listed out of order: replay sorts by start time
    st1 = [(1, "F", 0, 1.0, 2.0), (1, "B", 0, 3.0, 5.0)]
    assert replay([st0, st1], [[], [(1, "L", 0, 2.0, 3.0)]]) == pytest.approx([4 / 7, 3 / 7])
    assert replay([st0, st1]) == pytest.approx([1 - 3 / 6, 1 - 3 / 6])  # no loss: span 6, 3 busy each
    # CPU seconds instead of wall: forwards 0.5, backwards 1 → span 3, both busy 1.5: bubble 1/2
    cpu = [[(0, "F", 0, 0.0, 1.0, 0.5), (0, "B", 0, 5.0, 7.0, 1.0)],
           [(1, "F", 0, 1.0, 2.0, 0.5), (1, "B", 0, 3.0, 5.0, 1.0)]]
    assert replay(cpu, clock="cpu") == pytest.approx([0.5, 0.5])
    # a weight pass waits for its own input pass: stage 1's W (1 s) in [4, 5] after its B [2, 4], while rank 0's B
    # runs [4, 6]: span 6, busy 3 and 4
    zb = [[(0, "F", 0, 0.0, 1.0), (0, "B", 0, 4.0, 6.0)], [(1, "F", 0, 1.0, 2.0), (1, "B", 0, 2.0, 4.0),
                                                         (1, "W", 0, 4.0, 5.0)]]
    assert replay(zb) == pytest.approx([1 - 3 / 6, 1 - 4 / 6])
    # rank 0 runs its backward first: it needs stage 1's backward, which needs stage 0's forward: never runs
    bad = [[(0, "B", 0, 0.0, 1.0), (0, "F", 0, 1.0, 2.0)], [(1, "F", 0, 2.0, 3.0), (1, "B", 0, 3.0, 4.0)]]
    with pytest.raises(ValueError, match=r"^the timelines' chunk order is not a schedule \(a dependency never "
                                         r"ran\)$"):
        replay(bad)


def test_breakdown_splits_each_ranks_span_into_compute_waits_and_the_rest():
    from coursekit.pp.bubble import breakdown, measured

    # span [100, 110] over both ranks; rank 0 computes 1 + 3 = 4 s (CPU 2 s: stretched 2x), waits 2 s of a recv that
    # began before the span (clipped to [100, 110]) and none of one after it; rank 1 computes 4 s plus a 1 s loss
    # (an event, also compute)
    r0 = [(0, "F", 0, 100.0, 101.0, 0.5), (0, "B", 0, 107.0, 110.0, 1.5)]
    r1 = [(1, "F", 0, 102.0, 104.0, 2.0), (1, "B", 0, 105.0, 107.0, 2.0)]
    events = [[(0, "P", 0, 97.0, 102.0), (0, "P", 1, 120.0, 121.0)], [(1, "L", 0, 104.0, 105.0, 1.0)]]
    b0, b1 = breakdown([r0, r1], events)
    assert b0 == pytest.approx({"span": 10, "compute": 4, "p2p_wait": 2, "other": 4, "bubble": 0.6, "stretch": 2})
    assert b1 == pytest.approx({"span": 10, "compute": 5, "p2p_wait": 0, "other": 5, "bubble": 0.5, "stretch": 1})
    assert measured([r0, r1], events) == pytest.approx([0.6, 0.5])
    # without events the loss is not counted; chunks without CPU seconds: no stretch
    assert measured([r0, r1]) == pytest.approx([0.6, 0.6])
    assert breakdown([[c[:5] for c in r0], [c[:5] for c in r1]])[0]["stretch"] is None


def test_dualpipev_with_equal_stages_gives_every_rank_the_same_bubble():
    """DualPipeV runs some backwards whole (B) and splits the others (I then W), a different number on each rank (its
    rank's half and parity). A backward costs 2 either way (B 2, or I 1 + W 1), so every rank does the same work,
    2 stages x m micro-batches x (F 1 + backward 2) = 6·m, within one common span: the same bubble on every rank."""
    from coursekit.pp.bubble import ideal

    for p, m in ((2, 4), (3, 6), (2, 5)):
        kinds = [{k for k, _, _ in order("dualpipev", p, r, m)} for r in range(p)]
        assert all({"B", "I", "W"} <= k for k in kinds)  # whole and split backwards on each rank
        shares = ideal("dualpipev", p, m)
        assert shares == pytest.approx([shares[0]] * p) and 0 < shares[0] < 1, (p, m)


def test_uneven_formula_for_a_stage_whose_forwards_were_not_recorded():
    """As in test_uneven_formula_worked_by_hand (m 2; stage 0 F 2, B 2; stage 1 B 4), but stage 1's forwards are
    missing from the timelines: its f is 0, or with its loss (1 s per micro-batch, as events) f = 1. GPipe spans:
    without the loss Σf 2 + max f 2 + Σb 6 + max b 4 = 14; with it 3 + 2 + 6 + 4 = 15."""
    from coursekit.pp.bubble import theory_uneven

    m = 2
    st0 = [(0, "F", mb, 0.0, 2.0, 2.0) for mb in range(m)] + [(0, "B", mb, 0.0, 2.0, 2.0) for mb in range(m)]
    st1 = [(1, "B", mb, 0.0, 4.0, 4.0) for mb in range(m)]
    assert theory_uneven([st0, st1], None, m, "gpipe") == pytest.approx([1 - 2 * 4 / 14, 1 - 2 * 4 / 14])
    loss = [[], [(1, "L", mb, 0.0, 1.0, 1.0) for mb in range(m)]]
    assert theory_uneven([st0, st1], loss, m, "gpipe") == pytest.approx([1 - 2 * 4 / 15, 1 - 2 * 5 / 15])


def test_replay_adds_the_loss_to_the_last_stages_forward_only():
    """test_replay_counts_the_loss...'s zero-bubble pair with a 1 s loss after stage 1's forward: rank 0 F [0, 1];
    rank 1 F + loss [1, 3], B [3, 5], W [5, 6]; rank 0 B [5, 7]. Span 7, busy 3 and 5 (the loss counted once, in
    the forward: not again in the backward or the weight pass)."""
    from coursekit.pp.bubble import replay

    zb = [[(0, "F", 0, 0.0, 1.0), (0, "B", 0, 4.0, 6.0)],
          [(1, "F", 0, 1.0, 2.0), (1, "B", 0, 2.0, 4.0), (1, "W", 0, 4.0, 5.0)]]
    assert replay(zb, [[], [(1, "L", 0, 2.0, 3.0)]]) == pytest.approx([1 - 3 / 7, 1 - 5 / 7])
