"""coursekit.comm.nccl: NCCL's tuning model, checked against numbers worked out by hand from tuning.cc's formulas.

Each expected value below is written from the formulas and constants (NVIDIA/nccl src/graph/tuning.cc, master
5067397) with the arithmetic shown, not taken from a run of the module.
"""
import math

import pytest

from coursekit.comm import nccl
from coursekit.plan.hardware import hardware, network
from coursekit.plan.layout import Layout
from coursekit.plan.links import Links
from coursekit.plan.steptime import Cluster

NV = 360e9  # an H100 node's ring bus bandwidth here: 450 GB/s x 0.80
US = 1e-6


def pick(choices, algo, proto):
    return next(c for c in choices if (c.algorithm, c.protocol) == (algo, proto))


def test_one_node_ring_latencies_and_bandwidths():
    cs = nccl.candidates("all_reduce", 2 ** 30, 8, 1, NV)
    assert {(c.algorithm, c.protocol) for c in cs} == {(a, p) for a in ("ring", "tree") for p in nccl.PROTOCOLS}
    # ring: 2(n-1) = 14 steps over NVLink; Simple 8.4 + 14 x 3.4 us; LL 6.6 + 14 x 0.6 us; LL128 14 + 14 x 1.9 us
    assert pick(cs, "ring", "Simple").latency_s == pytest.approx(56.0 * US)
    assert pick(cs, "ring", "LL").latency_s == pytest.approx(15.0 * US)
    assert pick(cs, "ring", "LL128").latency_s == pytest.approx(40.6 * US)
    # algorithm bandwidth = bus bandwidth x n / steps: Simple 360 x 8/14; LL128 0.92 x that; LL capped at Hopper's
    # one-node 141 GB/s (360 / 2 = 180 is above it)
    assert pick(cs, "ring", "Simple").bandwidth == pytest.approx(360e9 * 8 / 14)
    assert pick(cs, "ring", "LL128").bandwidth == pytest.approx(0.92 * 360e9 * 8 / 14)
    assert pick(cs, "ring", "LL").bandwidth == pytest.approx(141e9 * 8 / 14)
    # tree on one node: 8.4 + 2 x (7 x 4.0 + 0 x 14) us; 0.92 x 360 x 0.5, no size correction at 1 GiB (log 24)
    t = pick(cs, "tree", "Simple")
    assert t.latency_s == pytest.approx(64.4 * US)
    assert t.bandwidth == pytest.approx(0.92 * 360e9 * 0.5)


def test_the_pick_moves_from_ll_to_simple_as_messages_grow():
    small = nccl.choose("all_reduce", 1024, 8, 1, NV)
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    assert small.time_s == pytest.approx(15.0 * US + 1024 / (141e9 * 8 / 14))
    big = nccl.choose("all_reduce", 2 ** 32, 8, 1, NV)
    assert (big.algorithm, big.protocol) == ("ring", "Simple")
    assert big.time_s == pytest.approx(56.0 * US + 2 ** 32 / (360e9 * 8 / 14))
    # so the achieved bus bandwidth climbs with the size toward the link's, and never passes it
    rows = nccl.curve("all_reduce", 8, 1, NV)
    bws = [r["busbw"] for r in rows]
    assert bws == sorted(bws) and bws[-1] < 360 and bws[-1] > 0.95 * 360 and bws[0] < 1


def test_all_gather_is_ring_only_and_its_latency_grows_with_the_ranks():
    # across 192 nodes of 8: n - 1 = 1535 steps, 191 of them between nodes; LL128's intra step 1.9 us (above the
    # 1 us network overhead), its network step 4.0 us: 14 + 1344 x 1.9 + 191 x 4.0 = 3331.6 us
    cs = nccl.candidates("all_gather", 300e6, 1536, 192, NV)
    assert {c.algorithm for c in cs} == {"ring"}
    assert pick(cs, "ring", "LL128").latency_s == pytest.approx(3331.6 * US)
    # Simple: the intra step is floored by 3 x the 1 us network overhead: 3.4 us; 8.4 + 1344 x 3.4 + 191 x 14
    assert pick(cs, "ring", "Simple").latency_s == pytest.approx(7252.0 * US)
    # twice the nodes: about twice the latency (a ring, not a tree)
    wide = pick(nccl.candidates("all_gather", 300e6, 3072, 384, NV), "ring", "LL128").latency_s
    assert wide == pytest.approx((14 + 2688 * 1.9 + 383 * 4.0) * US)
    assert 1.9 < wide / pick(cs, "ring", "LL128").latency_s < 2.1


def test_many_nodes_take_the_tree_for_an_all_reduce():
    # 128 nodes of 8, 1 KiB: ring LL 6.6 + (2046 - 254) x max(0.6, 1.0) + 254 x 2.7 = 2484.4 us; tree LL
    # 6.8 + 2 x (7 x 0.6 + log2(128) x 5.0) = 85.2 us
    cs = nccl.candidates("all_reduce", 1024, 1024, 128, NV)
    assert pick(cs, "ring", "LL").latency_s == pytest.approx(2484.4 * US)
    assert pick(cs, "tree", "LL").latency_s == pytest.approx(85.2 * US)
    assert nccl.choose("all_reduce", 1024, 1024, 128, NV).algorithm == "tree"
    # the ring's Simple latency (intra step 3.4 us, above 3 x the 1 us overhead) carries the multi-node plateau
    # factor 1.4 for a large message
    simple = pick(nccl.candidates("all_reduce", 2 ** 30, 1024, 128, NV), "ring", "Simple")
    assert simple.latency_s == pytest.approx(1.4 * (8.4 + 1792 * 3.4 + 254 * 14.0) * US)


def test_tree_size_correction_applies_to_medium_messages():
    # 1 MiB: log2(2^20 / 64) = 14 -> Simple's factor 0.5
    t = pick(nccl.candidates("all_reduce", 2 ** 20, 16, 2, NV), "tree", "Simple")
    assert t.bandwidth == pytest.approx(0.92 * 360e9 * 0.5 * 0.5)


def test_ampere_off_nvlink_has_no_ll128_and_bad_input_is_refused():
    protos = {c.protocol for c in nccl.candidates("all_reduce", 2 ** 20, 8, 1, 20e9, link="pci", arch="ampere")}
    assert protos == {"LL", "Simple"}
    with pytest.raises(ValueError, match="all_to_all"):
        nccl.choose("all_to_all", 1024, 8, 1, NV)
    with pytest.raises(ValueError, match="1 to n nodes"):
        nccl.choose("all_reduce", 1024, 4, 8, NV)
    with pytest.raises(ValueError, match="arch"):
        nccl.choose("all_reduce", 1024, 8, 1, NV, arch="kepler")


def test_the_planner_prices_a_data_parallel_gather_with_the_nccl_model():
    """Links.time on an H100 cluster = the NCCL pick for the group's size, nodes and bus bandwidth: 8 x 50 GB/s
    NICs x 0.9 = 360 GB/s, the same as NVLink's 360, for 1,024 ranks on 128 nodes."""
    hw, net = hardware("H100-80GB"), network("ib-400")
    links = Links(Layout(engine="fsdp2", dp_shard=1024), Cluster(hw, net, 1024, 8))
    t = links.time("all_gather", 100e6, ("dp_shard",), 3)
    c = nccl.choose("all_gather", 100e6, 1024, 128, min(hw.intra_busbw, 8 * net.busbw))
    assert min(hw.intra_busbw, 8 * net.busbw) == pytest.approx(360e9)
    assert t == pytest.approx(3 * c.time_s)
    # 1023 ring steps make it latency-heavy: far more than the bytes alone at 360 GB/s
    assert t / 3 > 100e6 * 1023 / 1024 / 360e9 + 1e-3
    assert math.isclose(links.time("all_gather", 100e6, ("dp_shard",), 0), 0.0)
