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
    (dict(world_size=4, tp=4), dict(num_layers=2, num_heads=8, num_kv_heads=3),
     "tp 4 is not a multiple of the 3 key/value heads, so they cannot be replicated evenly"),
    (dict(world_size=4, pp=4), dict(num_layers=6, num_heads=4, virtual_stages=2),
     "6 layers cannot fill pp 4 x 2 stage(s) per rank"),
    (dict(world_size=2, cp=2), dict(num_layers=2, num_heads=4, seq=6, cp_impl="ring"),
     "sequence length 6 is not divisible by 4 (2 x cp for load-balanced ring attention)"),
    (dict(world_size=2, cp=2), dict(num_layers=2, num_heads=4, seq=7, cp_impl="ulysses"),
     "sequence length 7 is not divisible by 2 (cp)"),
    (dict(world_size=4, tp=2, cp=2), dict(num_layers=2, num_heads=4, seq=6, cp_impl="ulysses", sp=True),
     "sequence length 6 is not divisible by tp 2 x cp 2 (sequence parallelism splits each CP shard over the TP "
     "ranks)"),
])
def test_a_model_that_does_not_split_is_refused_with_its_numbers(dims, kw, message):
    with pytest.raises(LayoutError, match="^" + re.escape(message) + "$"):
        check_model(ParallelDims(**dims), **kw)
    fixed = {**kw, "num_heads": 8, "num_kv_heads": 4, "num_layers": 16, "seq": 64}
    check_model(ParallelDims(**dims), **fixed)  # the same layout with a model that splits passes


def test_the_axis_order_and_the_derived_groups_follow_the_registry():
    """AXES and DERIVED are built from the registry at import; rebuilt here: the mesh places pp 0, dp_replicate 10,
    dp_shard 20, cp 30, tp 40 (ep has no axis: it borrows); cp joins loss and fsdp, nothing joins batch."""
    from coursekit.spec.dims import _axes, _derived

    assert _axes() == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert _derived() == {"batch": ("dp_replicate", "dp_shard"), "loss": ("dp_replicate", "dp_shard", "cp"),
                          "fsdp": ("dp_shard", "cp"), "dp": ("dp_replicate", "dp_shard")}


@pytest.mark.parametrize("kw,message", [
    (dict(world_size=4, xp=2, ap=2), "unknown parallel degree(s) ap, xp; the axes are pp, dp_replicate, dp_shard, "
                                     "cp, tp"),  # sorted, then the mesh order
    (dict(world_size=0), "world_size must be a positive integer, got 0"),
    (dict(world_size=4, ep=0), "ep must be a positive integer, got 0"),
    (dict(world_size=4, dp_replicate=0), "dp_replicate must be a positive integer, got 0"),
    (dict(world_size=4, dp_shard=0, dp_flavour="shard"), "dp_shard must be a positive integer, got 0"),
    (dict(world_size=4, tp=True), "tp must be a positive integer, got True"),  # a bool is not a degree
    (dict(world_size=4, tp=2.0), "tp must be a positive integer, got 2.0"),  # nor a float, even a whole one
    (dict(world_size=4, dp_flavour="zigzag"), "unknown data-parallel flavour 'zigzag'; choose one of replicate, "
                                              "shard, hybrid"),
    # the parallelisms listed in the registry's order (tp, pp, cp), 1s included; 2 x 2 x 1 = 4 does not divide 6
    (dict(world_size=6, tp=2, pp=2), "world size 6 is not divisible by tp 2 x pp 2 x cp 1 = 4; choose degrees "
                                     "whose product divides it"),
    (dict(world_size=8, tp=2, dp_shard=3, dp_flavour="shard"), "dp_shard 3 does not divide the 4 data-parallel "
                                                               "ranks left by world 8 / (tp 2 x pp 1 x cp 1)"),
    # both data-parallel degrees given: 2 x 2 = 4 ranks, not the 8 of the world
    (dict(world_size=8, dp_replicate=2, dp_shard=2, dp_flavour="hybrid"),
     "pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 1 = 4, but the world size is 8"),
    (dict(world_size=8, dp_shard=2), "dp_shard 2 needs a sharding data-parallel strategy (fsdp2, hsdp); this one "
                                     "replicates (use --dp-replicate)"),
    # ep borrows the loss ranks: 6 replicas, and 4 does not divide 6
    (dict(world_size=6, ep=4), "ep 4 does not divide the 6 ranks it borrows (loss = dp_replicate 6 x dp_shard 1 x "
                               "cp 1); choose ep dividing 6"),
])
def test_each_bad_layout_is_refused_with_its_whole_message(kw, message):
    with pytest.raises(LayoutError, match="^" + re.escape(message) + "$"):
        ParallelDims(**kw)


def test_given_degrees_are_kept_as_given_and_filled_ones_are_whole_numbers():
    # hybrid on 8 with dp_shard 4 given: the replicas fill 8 / 4 = 2; the given values stay as given (None: filled)
    h = ParallelDims(world_size=8, dp_shard=4, dp_flavour="hybrid")
    assert (h.dp_replicate, h.dp_shard, h.dp_flavour) == (None, 4, "hybrid")
    assert h.degrees["dp_replicate"] == 2 and type(h.degrees["dp_replicate"]) is int
    r = ParallelDims(world_size=8, dp_replicate=2, dp_flavour="hybrid")  # the shard groups fill 8 / 2 = 4
    assert (r.dp_replicate, r.dp_shard) == (2, None)
    assert r.degrees["dp_shard"] == 4 and type(r.degrees["dp_shard"]) is int


def test_degree_attributes_and_lookups():
    # 8 ranks: tp 2, 4 replicas; ep 4 splits the 4 loss ranks (ep_rest: 4 / 4 = 1 holds each slice)
    d = ParallelDims(world_size=8, tp=2, ep=4)
    assert (d.degree("tp"), d.degree("ep"), d.degree("pp")) == (2, 4, 1)
    assert d.size("ep_rest") == 1 and type(d.size("ep_rest")) is int
    assert ParallelDims(world_size=16, ep=2).size("ep_rest") == 8  # 16 loss ranks / ep 2
    assert getattr(d, "nope", "absent") == "absent"  # an unknown attribute is an AttributeError, named
    with pytest.raises(AttributeError, match="^nope$"):
        d.nope
    with pytest.raises(LayoutError, match="^" + re.escape(
            "unknown mesh axis or group 'tp_rest'; axes: pp, dp_replicate, dp_shard, cp, tp; groups: batch, loss, "
            "fsdp, dp") + "$"):
        d.size("tp_rest")  # only a borrowed parallelism has a "_rest" group
    # rank_of: an axis left out is coordinate 0; tp 1 alone is rank 1 (pp 0, replica 0)
    assert d.rank_of({"tp": 1}) == 1 and d.rank_of({"dp_replicate": 3}) == 6


def test_a_layout_prints_its_degrees_and_hides_borrowed_ones_of_one():
    d = ParallelDims(world_size=2)  # ddp on 2: every degree 1 but the replicas; ep 1 is not shown
    assert repr(d) == "ParallelDims(pp=1, dp_replicate=2, dp_shard=1, cp=1, tp=1, flavour=replicate)"
    assert str(d) == "pp=1 x dp_replicate=2 x dp_shard=1 x cp=1 x tp=1 (world 2)"
    assert d.to_dict() == {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "cp": 1, "tp": 1, "world_size": 2}
    # two different layouts hash apart (a cache keyed by the layout keeps them in different buckets)
    assert hash(d) != hash(ParallelDims(world_size=2, tp=2))


def test_describe_without_nodes_and_with_nothing_enabled():
    # one rank, nothing enabled: the table still shows the replica axis; no node column without gpus_per_node
    # (rank right-aligned in 4, each coordinate in 12 after a space, then 3 spaces and the groups)
    assert ParallelDims(world_size=1).describe().splitlines() == [
        "layout: pp=1 x dp_replicate=1 x dp_shard=1 x cp=1 x tp=1 (world 1)",
        "rank  dp_replicate   groups",
        "   0            0   dp_replicate[0]"]
    # pp 2 x tp 2: rank 3 is pp 1, tp 1; its pp group is {1, 3}, its tp group {2, 3}, two spaces apart
    rows = ParallelDims(world_size=4, tp=2, pp=2).describe().splitlines()
    assert rows[1].split() == ["rank", "pp", "tp", "groups"]
    assert rows[2 + 3].endswith("   pp[1, 3]  tp[2, 3]") and rows[2 + 3].split()[:3] == ["3", "1", "1"]


def test_model_checks_pass_on_their_boundaries():
    one = ParallelDims(world_size=1)
    check_model(one, num_layers=1, num_heads=1, seq=7)  # cp 1: any sequence length (no 2 x cp split)
    check_model(ParallelDims(world_size=2, cp=2), num_layers=2, num_heads=4)  # no seq given: nothing to divide
    check_model(ParallelDims(world_size=2, tp=2), num_layers=2, num_heads=4, seq=3)  # sp off by default: 3 is fine
    check_model(ParallelDims(world_size=2, pp=2), num_layers=2, num_heads=4)  # one stage per rank by default: 2 >= 2
    check_model(ParallelDims(world_size=4, pp=4), num_layers=8, num_heads=4, virtual_stages=2)  # 8 layers, 8 stages


def test_a_second_borrowed_parallelism_is_listed_after_the_first(monkeypatch):
    """The registry holds one borrowed parallelism (ep); a course module may add another (one entry,
    docs/adding-a-parallelism.md). Each one switched on is listed in the layout's line, ", name=degree over group"
    after the other, nothing between them: 8 replicas, ep 2 and a made-up xp 4 both borrowing the loss ranks."""
    from coursekit.spec import dims as dims_module

    monkeypatch.setattr(dims_module, "BORROWED", {**dims_module.BORROWED, "xp": "loss"})
    d = ParallelDims(world_size=8, ep=2, xp=4)
    assert (d.ep, d.xp, d.size("xp_rest")) == (2, 4, 2)
    assert str(d) == "pp=1 x dp_replicate=8 x dp_shard=1 x cp=1 x tp=1 (world 8, ep=2 over loss, xp=4 over loss)"
