"""ParallelDims: the pure-Python layout every tool shares (trainer, calculator, planner)."""
import re
import subprocess
import sys

import pytest

from coursekit.parallel import LayoutError, ParallelDims, check_model


def test_data_parallel_fills_what_tp_pp_cp_leave():
    d = ParallelDims(world_size=16, tp=2, pp=2, cp=2)
    assert d.degrees == {"pp": 2, "dp_replicate": 2, "dp_shard": 1, "cp": 2, "tp": 2}
    s = ParallelDims(world_size=16, tp=2, dp_flavour="shard")
    assert (s.degrees["dp_replicate"], s.degrees["dp_shard"]) == (1, 8)
    h = ParallelDims(world_size=16, dp_replicate=2, dp_flavour="hybrid")
    assert (h.degrees["dp_replicate"], h.degrees["dp_shard"]) == (2, 8)
    assert h.size("batch") == 16 and h.size("fsdp") == 8 and h.size("loss") == 16


def test_coordinates_follow_the_rank_grid_tp_fastest():
    d = ParallelDims(world_size=8, tp=2, pp=2)  # pp x dp_replicate x tp = 2 x 2 x 2
    # worked by hand: rank = ((pp * 2 + dp) * 2) + tp
    assert d.coords(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 1}
    assert d.group(5, "tp") == [4, 5] and d.group(5, "dp_replicate") == [5, 7] and d.group(5, "pp") == [1, 5]
    for r in range(8):
        assert d.rank_of(d.coords(r)) == r
    for name in ("tp", "pp", "dp_replicate", "batch", "loss"):
        gs = d.groups(name)  # a partition of the ranks, every group of the axis' size
        assert sorted(r for g in gs for r in g) == list(range(8)) and {len(g) for g in gs} == {d.size(name)}


def test_batch_coordinate_ignores_tp_and_pp():
    d = ParallelDims(world_size=8, tp=2, pp=2)
    assert [d.coord(r, "batch") for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize("kw,needle", [
    (dict(world_size=6, tp=4), "world size 6 is not divisible by tp 4"),
    (dict(world_size=8, tp=2, dp_replicate=3), "dp_replicate 3 does not divide the 4"),
    (dict(world_size=8, dp_shard=2), "dp_shard 2 needs a sharding data-parallel strategy"),
    (dict(world_size=8, tp=0), "tp must be a positive integer"),
    (dict(world_size=4, dp_flavour="zigzag"), "unknown data-parallel flavour"),
])
def test_bad_layouts_name_every_degree(kw, needle):
    with pytest.raises(LayoutError, match=needle):
        ParallelDims(**kw)


def test_model_checks_replicate_kv_heads_rather_than_refuse():
    d = ParallelDims(world_size=8, tp=8)
    check_model(d, num_layers=4, num_heads=32, num_kv_heads=4)  # 4 KV heads, each kept by 2 TP ranks
    with pytest.raises(LayoutError, match="not a multiple of the 3 key/value heads"):
        check_model(d, num_layers=4, num_heads=24, num_kv_heads=3)
    with pytest.raises(LayoutError, match="not divisible by 4"):
        check_model(ParallelDims(world_size=2, cp=2), num_layers=2, num_heads=4, seq=6)


def test_layout_imports_no_torch():
    code = "import sys, coursekit.parallel; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_every_group_of_one_rank_in_a_5d_layout_worked_by_hand():
    """16 ranks: dp_replicate 2 x dp_shard 2 x cp 2 x tp 2 (HSDP), ep 2 borrowing the loss ranks. A rank is the
    binary number (replicate, shard, cp, tp): rank 11 = 1011 is replicate 1, shard 0, cp 1, tp 1. Each axis flips one
    bit: tp {10, 11}, cp {9, 11}, dp_shard {11, 15}, dp_replicate {3, 11}; the derived groups flip several: fsdp =
    shard x cp {9, 11, 13, 15}, batch = replicate x shard {3, 7, 11, 15}, loss = all but tp (the odd ranks). EP
    splits the loss group innermost: its 8 ranks in order, pairs of neighbours share the experts ({9, 11}: 11 is
    index 5, slice 1), and every other one holds the same slice (ep_rest {3, 7, 11, 15})."""
    d = ParallelDims(world_size=16, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=2, dp_flavour="hybrid")
    assert d.coords(11) == {"pp": 0, "dp_replicate": 1, "dp_shard": 0, "cp": 1, "tp": 1}
    want = {"tp": [10, 11], "cp": [9, 11], "dp_shard": [11, 15], "dp_replicate": [3, 11], "fsdp": [9, 11, 13, 15],
            "batch": [3, 7, 11, 15], "loss": [1, 3, 5, 7, 9, 11, 13, 15], "ep": [9, 11], "ep_rest": [3, 7, 11, 15]}
    assert {n: d.group(11, n) for n in want} == want
    assert {n: d.size(n) for n in want} == {n: len(g) for n, g in want.items()}
    assert (d.coord(11, "loss"), d.coord(11, "batch"), d.coord(11, "ep"), d.coord(11, "ep_rest")) == (5, 2, 1, 2)
    assert d.rank_of(d.coords(11)) == 11 and d.degrees["dp_shard"] == 2 and d.ep == 2 and d.tp == 2
    assert str(d) == "pp=1 x dp_replicate=2 x dp_shard=2 x cp=2 x tp=2 (world 16, ep=2 over loss)"
    assert d.to_dict() == {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2, "ep": 2, "world_size": 16}
    rows = d.describe(gpus_per_node=8).splitlines()
    assert rows[0] == f"layout: {d}" and rows[1].split() == ["rank", "node", "dp_replicate", "dp_shard", "cp", "tp",
                                                               "ep", "groups"]
    r11 = rows[2 + 11].split()
    assert r11[:7] == ["11", "1", "1", "0", "1", "1", "1"]  # rank, node 1 (ranks 8-15), its coordinates
    assert "tp[10, 11]" in rows[2 + 11] and "ep[9, 11]" in rows[2 + 11]
    with pytest.raises(LayoutError, match="rank 16 outside world size 16"):
        d.coords(16)
    assert d == ParallelDims(world_size=16, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=2, dp_flavour="hybrid")
    assert d != ParallelDims(world_size=16, dp_replicate=2, dp_shard=2, cp=2, tp=2, dp_flavour="hybrid")
    assert len({d, ParallelDims(world_size=16, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=2,
                                dp_flavour="hybrid")}) == 1


@pytest.mark.parametrize("dims,kw,message", [
    (dict(world_size=4, tp=4), dict(num_layers=2, num_heads=6), "6 query heads do not split over tp 4; choose tp "
                                                                 "dividing 6"),
    (dict(world_size=4, tp=2, cp=2), dict(num_layers=2, num_heads=6, cp_impl="ulysses"),
     "Ulysses needs query heads % (tp x cp) == 0: 6 heads, tp 2 x cp 2"),
    (dict(world_size=4, tp=4), dict(num_layers=2, num_heads=8, num_kv_heads=6),
     "6 key/value heads do not split over tp 4 (nor is tp a multiple of them)"),
    (dict(world_size=4, pp=4), dict(num_layers=6, num_heads=4, virtual_stages=2),
     "6 layers cannot fill pp 4 x 2 stage(s) per rank"),
    (dict(world_size=2, cp=2), dict(num_layers=2, num_heads=4, seq=6, cp_impl="ring"),
     "sequence length 6 is not divisible by 4 (2 x cp for load-balanced ring attention)"),
    (dict(world_size=2, cp=2), dict(num_layers=2, num_heads=4, seq=7, cp_impl="ulysses"),
     "sequence length 7 is not divisible by 2 (cp)"),
    (dict(world_size=4, tp=2, cp=2), dict(num_layers=2, num_heads=4, seq=6, cp_impl="ulysses", sp=True),
     "sequence length 6 is not divisible by tp 2 x cp 2 (sequence parallelism"),
])
def test_a_model_that_does_not_split_is_refused_with_its_numbers(dims, kw, message):
    with pytest.raises(LayoutError, match="^" + re.escape(message)):
        check_model(ParallelDims(**dims), **kw)
    fixed = {**kw, "num_heads": 8, "num_kv_heads": 4, "num_layers": 16, "seq": 64}
    check_model(ParallelDims(**dims), **fixed)  # the same layout with a model that splits passes
