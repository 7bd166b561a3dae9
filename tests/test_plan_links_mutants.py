"""``coursekit.plan.links`` worked out by hand: where a group sits (its placement in the mesh order) and what its
all-to-alls, sends and bus bandwidth cost (the module docstring's rules), on a toy node with round figures. Pure
Python; written against the mutation survivors of bench/bench_mutation.py plan.links.

Toy figures: NVLink 100 GB/s one way x link_fraction 0.8 = 80 GB/s ring bus bandwidth, 8 us fixed cost + 1 us per
ring step inside a node; a 10 GB/s NIC per GPU x 0.9 = 9 GB/s, 12 us per tree level across nodes."""
from __future__ import annotations

from dataclasses import replace

import pytest

from coursekit.comm import nccl
from coursekit.plan.hardware import Hardware, Network
from coursekit.plan.layout import Layout
from coursekit.plan.links import Links
from coursekit.plan.steptime import Cluster

HW = Hardware(name="toy", memory_bytes=10**12, peak_flops={"bf16": 1e12}, hbm_bw=1e12, link_bw=100e9,
              link_latency_s=8e-6, hop_latency_s=1e-6)
NET = Network(name="toy-net", bw_per_gpu=10e9, latency_s=12e-6)
INTRA, NIC = 80e9, 9e9


def links(layout, gpus, per_node=8, hw=HW, net=NET):
    return Links(layout, Cluster(hw, net, gpus, per_node))


def test_bus_bandwidth_is_nvlinks_inside_a_node_else_capped_by_the_nics():
    """Catches the node test inverted, always true, always false, or == 2."""
    li = links(Layout(), 8)
    assert li.busbw(8, 1) == pytest.approx(INTRA)  # one node: NVLink's 80 GB/s, not 8 NICs' 72
    assert li.busbw(2, 2) == pytest.approx(2 * NIC)  # 2 members per node: 2 x 9 = 18 GB/s < 80
    assert li.busbw(16, 4) == pytest.approx(INTRA)  # 16 x 9 = 144 GB/s: NVLink's 80 is the lower


def test_an_all_to_all_inside_a_node_is_alpha_plus_hops_and_nvlink_bandwidth():
    """tp 4 in one node: 8 us + 3 ring steps x 1 us, and 1 MB x (n-1)/n = 750 kB at 80 GB/s (9.375 us): 20.375 us a
    call. Catches the node's bandwidth taken from the NICs (4 x 9 = 36 GB/s), the hop term subtracted or divided."""
    li = links(Layout(tp=4), 8)
    assert li.placement(("tp",)) == (4, 4, 1)
    assert li.time("all_to_all", 1e6, ("tp",), 2) == pytest.approx(2 * (11e-6 + 750e3 / INTRA), rel=1e-12)


def test_an_all_to_all_across_nodes_pays_a_tree_level_per_doubling_of_nodes():
    """dp 16 strided by tp 2 on 8-GPU nodes: 4 members per node on 4 nodes; 8 us + (4 - 1) hops + 1 x 12 us x
    log2(4) = 35 us, and 1.6 MB x 15/16 = 1.5 MB at min(80, 4 x 9) = 36 GB/s. A measured in-node all-to-all does not
    apply across nodes. Catches: the measured figures of the node used for the network, an all-to-all charged 2 tree
    passes (as an all-reduce), the in-node formula used across nodes, signs and products of the alpha terms."""
    hw = replace(HW, collectives={"all_to_all": (1e-3, 1e9)})
    li = links(Layout(tp=2, dp_replicate=16), 32, hw=hw)
    assert li.placement(("dp_replicate",)) == (16, 4, 4)
    assert li.time("all_to_all", 1.6e6, ("dp_replicate",)) == pytest.approx(35e-6 + 1.5e6 / 36e9, rel=1e-12)
    # 2 nodes (tp 4, dp 4 on 16 GPUs: 2 members per node): 8 + 1 hop + 12 x log2(2) = 21 us; 1.2 MB x 3/4 = 0.9 MB
    # at min(80, 2 x 9) = 18 GB/s
    two = links(Layout(tp=4, dp_replicate=4), 16, hw=hw)
    assert two.placement(("dp_replicate",)) == (4, 2, 2)
    assert two.time("all_to_all", 1.2e6, ("dp_replicate",)) == pytest.approx(21e-6 + 0.9e6 / 18e9, rel=1e-12)
    # inside the node the measured all-to-all replaces the formula: 1 ms + 750 kB / 1 GB/s
    assert links(Layout(tp=4), 8, hw=hw).time("all_to_all", 1e6, ("tp",)) == pytest.approx(1e-3 + 750e-6,
                                                                                          rel=1e-12)


def test_nccl_is_asked_with_the_gpus_link_class_generation_and_in_node_bandwidth():
    """Links.nccl hands NCCL's model (coursekit.comm.nccl, checked by hand in tests/test_comm_nccl.py) the group's
    size, nodes, NVLink's 80 GB/s inside a node (not 8 NICs' 72) and the GPU's own link class and generation (an
    Ampere part on PCIe: no LL128, PCIe step latencies). Catches the link, the arch or the node count dropped."""
    hw = replace(HW, nccl_link="pci", nccl_arch="ampere")
    li = links(Layout(dp_replicate=8), 8, hw=hw)
    for nbytes in (4096, 4 << 20, 64e6):  # latency-bound, medium, bandwidth-bound
        want = nccl.choose("all_reduce", nbytes, 8, 1, INTRA, link="pci", arch="ampere")
        assert li.nccl("all_reduce", nbytes, ("dp_replicate",)) == want
        assert li.time("all_reduce", nbytes, ("dp_replicate",), 3) == pytest.approx(3 * want.time_s, rel=1e-12)
    # NCCL enables LL128 on Ampere only over NVLink: at 4 MiB (where a Hopper part takes LL128) this one takes Simple
    assert li.nccl("all_reduce", 4 << 20, ("dp_replicate",)).protocol == "Simple"
    hopper = links(Layout(dp_replicate=8), 8, hw=replace(HW, nccl_link="pci"))
    assert hopper.nccl("all_reduce", 4 << 20, ("dp_replicate",)).protocol == "LL128"
    # the defaults (NVLink, Hopper) price the small call differently, so the test above tells them apart
    assert nccl.choose("all_reduce", 4096, 8, 1, INTRA).time_s != nccl.choose(
        "all_reduce", 4096, 8, 1, INTRA, link="pci", arch="ampere").time_s
    assert nccl.choose("all_reduce", 64e6, 8, 1, 72e9, link="pci", arch="ampere").time_s != nccl.choose(
        "all_reduce", 64e6, 8, 1, INTRA, link="pci", arch="ampere").time_s


def test_sends_to_a_neighbour():
    """A degree-1 axis has no neighbour (0 s, whatever the calls); 0 calls cost 0; one call by default. Across
    nodes a measured send replaces the NIC's latency and bandwidth. Catches `or` -> `and`, 0.0 -> 1.0, the default
    of 2 calls, the measured send ignored (`or` -> `and`, its key misspelt)."""
    li = links(Layout(pp=2), 2)
    assert li.p2p(1e6, "cp", 3) == 0.0  # cp 1
    assert li.p2p(1e6, "pp", 0) == 0.0
    assert li.p2p(1e6, "pp") == pytest.approx(8e-6 + 1e6 / INTRA, rel=1e-12)  # one send over NVLink
    far = links(Layout(pp=2), 2, per_node=1)  # one GPU per node: the stages sit on two nodes
    assert far.kind(("pp",)) == "network"
    assert far.p2p(1e6, "pp", 2) == pytest.approx(2 * (12e-6 + 1e6 / NIC), rel=1e-12)
    measured = links(Layout(pp=2), 2, per_node=1, net=replace(NET, collectives={"send": (5e-6, 20e9)}))
    assert measured.p2p(1e6, "pp", 2) == pytest.approx(2 * (5e-6 + 1e6 / 20e9), rel=1e-12)


def test_placements_of_expert_groups_single_ranks_and_a_stride_that_does_not_divide_the_node():
    """ep: the innermost ep of the dp x cp ranks, just outside tp (stride tp); ep_rest: the dp x cp / ep ranks holding
    the same slice (stride tp x ep). A group of one rank has one member in one node. Members per node are whole:
    tp 3 on 8-GPU nodes leaves room for 8 // 3 = 2 of a dp group's members per node. Catches dp x cp -> dp / cp in
    ep_rest's host, max(1, ...) -> max(2, ...) and 8 / 3 members."""
    li = links(Layout(tp=2, cp=2, dp_shard=2, ep=2, engine="fsdp2"), 8)
    assert li.placement(("ep",)) == (2, 2, 1)
    assert li.placement(("ep_rest",)) == (2, 2, 1)  # 4 host ranks / ep 2, stride 4: 8 // 4 = 2 per node
    assert links(Layout(tp=2, dp_shard=4, ep=4, engine="fsdp2"), 8).placement(("ep_rest",)) == (1, 1, 1)
    assert links(Layout(tp=2), 2).placement(("cp",)) == (1, 1, 1)
    assert links(Layout(tp=3, dp_replicate=8), 24).placement(("dp_replicate", "dp_shard", "cp")) == (8, 2, 4)


def test_a_group_that_does_not_fill_its_last_node_spans_it():
    """FSDP over 12 ranks on 8-GPU nodes (dp_shard 12 x pp 2 on 24 GPUs): 8 members per node, so 2 nodes, not
    12 // 8 = 1 (which priced the group on NVLink); its all-gather crosses the network at min(NVLink 80, 8 NICs x 9)
    = 72 GB/s, and NCCL's ring over 2 nodes has 11 steps of which 1 crosses: Simple's latency 8.4 + 10 x 3.4 + 14
    = 56.4 us (tuning.cc's base, NVLink and network step latencies)."""
    li = links(Layout(dp_shard=12, pp=2, engine="fsdp2"), 24)
    assert li.placement(("dp_shard",)) == (12, 8, 2) and li.kind(("dp_shard",)) == "network"
    assert li.nccl("all_gather", 64e6, ("dp_shard",)) == nccl.choose("all_gather", 64e6, 12, 2, 8 * NIC)
    simple = [c for c in nccl.candidates("all_gather", 64e6, 12, 2, 8 * NIC) if c.protocol == "Simple"][0]
    assert simple.latency_s == pytest.approx(56.4e-6)
