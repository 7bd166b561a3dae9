"""ParallelDims: the pure-Python layout every tool shares (trainer, calculator, planner)."""
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
