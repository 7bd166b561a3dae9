"""coursekit.comm: the volume model (pure Python) and the collective benchmark (one 2-process launch).

The counter and the ring collectives, which need live process groups, are tested in test_comm_counter.py and
test_comm_ring.py.
"""
import subprocess
import sys

import pytest

from coursekit.comm import volume
from coursekit.comm.bench import parse_sizes, plot_busbw, run_benchmark

PSI = 1_000_000


# -- volume model -----------------------------------------------------------------------------------------------------
def test_busbw_factors_are_nccl_tests_definitions():
    n = 8
    assert volume.busbw_factor("all_reduce", n) == 2 * 7 / 8
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert volume.busbw_factor(op, n) == 7 / 8
    assert volume.busbw_factor("broadcast", n) == volume.busbw_factor("reduce", n) == 1.0
    assert volume.busbw_factor("all_reduce", 1) == 0.0  # one rank moves nothing
    with pytest.raises(ValueError, match="unknown collective"):
        volume.busbw_factor("allreduce", 2)


def test_ddp_sends_two_n_minus_one_over_n_psi_bytes():
    for n in (2, 4, 8):
        plan = volume.ddp(PSI, n, grad_bytes=4)
        assert plan == [volume.Collective("all_reduce", PSI * 4, 1, n)]
        assert volume.send_bytes_per_rank(plan) == pytest.approx(2 * (n - 1) / n * PSI * 4)
    # buckets split the calls, not the bytes
    bucketed = volume.ddp(PSI, 4, bucket_bytes=[PSI, PSI, 2 * PSI], buffer_bytes=64)
    assert bucketed == [volume.Collective("all_reduce", PSI, 2, 4), volume.Collective("all_reduce", 2 * PSI, 1, 4),
                        volume.Collective("broadcast", 64, 1, 4)]
    assert volume.payload_bytes(bucketed, "all_reduce") == PSI * 4
    with pytest.raises(ValueError, match="bucket sizes sum"):
        volume.ddp(PSI, 4, bucket_bytes=[PSI])


def test_zero_and_fsdp_volumes_against_ddp():
    n, b = 64, 2
    ddp = volume.send_bytes_per_rank(volume.ddp(PSI, n, grad_bytes=b))
    z1 = volume.send_bytes_per_rank(volume.zero(1, PSI, n, param_bytes=b, grad_bytes=b))
    z2 = volume.send_bytes_per_rank(volume.zero(2, PSI, n, param_bytes=b, grad_bytes=b))
    z3 = volume.send_bytes_per_rank(volume.zero(3, PSI, n, param_bytes=b, grad_bytes=b))
    assert z1 == z2 == pytest.approx(ddp)  # ZeRO-1/2: reduce-scatter + all-gather = one all-reduce
    assert z3 == pytest.approx(1.5 * ddp)  # ZeRO-3: one more all-gather (backward)
    assert z3 == pytest.approx(3 * (n - 1) / n * PSI * b)
    assert volume.textbook_table(PSI, n, bytes_per_elem=b) == pytest.approx(
        {"ddp": ddp, "zero1": z1, "zero2": z2, "zero3": z3})
    # per micro-batch: ZeRO-2 reduce-scatters every micro-batch, ZeRO-1 once; ZeRO-3 all-gathers twice each
    assert volume.zero(1, PSI, n, micro_batches=4) == volume.zero(1, PSI, n)
    assert {c.op: c.count for c in volume.zero(2, PSI, n, micro_batches=4)} == {"reduce_scatter": 4, "all_gather": 1}
    assert {c.op: c.count for c in volume.zero(3, PSI, n, micro_batches=4)} == {"all_gather": 8, "reduce_scatter": 4}
    # FSDP units: one entry per unit size; no backward all-gather without resharding
    units = volume.fsdp([100, 100, 300], n, param_bytes=4, grad_bytes=4, reshard_after_forward=False)
    assert units == [volume.Collective("all_gather", 400, 2, n), volume.Collective("all_gather", 1200, 1, n),
                     volume.Collective("reduce_scatter", 400, 2, n), volume.Collective("reduce_scatter", 1200, 1, n)]
    with pytest.raises(ValueError, match="stage"):
        volume.zero(4, PSI, n)
    # engines that all-reduce gradients (DeepSpeed's default bucketing) pay DDP's gradient traffic plus a gather
    z1_ar = volume.send_bytes_per_rank(volume.zero(1, PSI, n, param_bytes=b, grad_bytes=b, grad_op="all_reduce"))
    assert z1_ar == pytest.approx(1.5 * ddp)


def test_fsdp_plan_resharded_to_k_ranks_synced_once_and_replicated():
    """FSDP2 as the trainer runs it, worked by hand: units of 100 and 300 elements on 4 shard ranks, bf16 gathers
    (2 B), fp32 reduce (4 B), 3 micro-batches, reshard to 2 ranks, one gradient sync per step, 2 HSDP replicas."""
    plan = volume.fsdp([100, 300], 4, param_bytes=2, grad_bytes=4, micro_batches=3, reshard_after_forward=2,
                       reduce_per_micro_batch=False, replicate=2)
    C = volume.Collective
    assert set(plan) == {C("all_gather", 200, 3, 4), C("all_gather", 600, 3, 4),  # forward, over the 4
                         C("all_gather", 200, 3, 2), C("all_gather", 600, 3, 2),  # backward, from the 1/2 slices
                         C("reduce_scatter", 400, 1, 4), C("reduce_scatter", 1200, 1, 4),  # once per step
                         C("all_reduce", 100, 1, 2), C("all_reduce", 300, 1, 2)}  # each 1/4 shard over 2 replicas
    assert len(plan) == 8
    # every micro-batch reduces when the engine syncs each one (ZeRO-3's way), replicas too
    each = volume.fsdp([100], 4, micro_batches=3, replicate=2)
    assert set(each) == {C("all_gather", 400, 6, 4), C("reduce_scatter", 400, 3, 4), C("all_reduce", 100, 3, 2)}
    # K = world is resharding over all ranks, K = 1 is keeping the gathered copy (torch reads them so)
    assert volume.fsdp([100], 4, reshard_after_forward=4) == volume.fsdp([100], 4, reshard_after_forward=True)
    assert volume.fsdp([100], 4, reshard_after_forward=1) == volume.fsdp([100], 4, reshard_after_forward=False)
    for bad in (3, 0, -2, 2.0):
        with pytest.raises(ValueError, match="reshard_after_forward"):
            volume.fsdp([100], 4, reshard_after_forward=bad)


def test_tensor_parallel_volume_per_layer():
    tokens, h, tp = 8 * 2048, 4096, 8
    plan = volume.tensor_parallel(32, tokens, h, tp, act_bytes=2)
    assert plan == [volume.Collective("all_reduce", tokens * h * 2, 4 * 32, tp)]
    sp = volume.tensor_parallel(32, tokens, h, tp, act_bytes=2, sequence_parallel=True)
    assert {c.op for c in sp} == {"all_gather", "reduce_scatter"}
    # sequence parallelism moves the same bytes on the wire (all-reduce = reduce-scatter + all-gather)
    assert volume.send_bytes_per_rank(sp) == pytest.approx(volume.send_bytes_per_rank(plan))


def test_volume_needs_no_torch():
    code = "import sys, coursekit.comm, coursekit.comm.volume; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- benchmark --------------------------------------------------------------------------------------------------------
def test_sizes_parse_like_nccl_tests():
    assert parse_sizes("1K..8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K..64M", 4) == [2**10 * 4**i for i in range(9)]
    assert parse_sizes("1K,1M,64") == [1024, 2**20, 64]
    with pytest.raises(ValueError, match="bad size"):
        parse_sizes("1X")


N2_FACTORS = {"all_reduce": 1.0, "ring_all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5,
              "all_to_all": 0.5, "broadcast": 1.0}


def test_benchmark_rows_follow_nccl_tests_definitions(tmp_path, no_orphans):
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "ring_all_reduce"]
    rows = run_benchmark(nproc=2, ops=ops, sizes="4K,1M", iters=3, warmup=1, timeout=120)
    assert [(r["op"], r["size"]) for r in rows] == [(op, s) for op in ops for s in (4096, 2**20)]
    for r in rows:
        assert r["world_size"] == 2 and r["backend"] == "gloo" and r["count"] * 4 == r["size"]
        assert r["time_us"] >= r["time_us_avg"] > 0  # the slowest rank's time is reported
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
        # nccl-tests' bus-bandwidth factors worked out for n = 2 (doc/PERFORMANCE.md: 2(n-1)/n, (n-1)/n, 1);
        # test_comm_counter checks that the benchmark issues the collective and bytes it names
        assert r["busbw"] == pytest.approx(r["algbw"] * N2_FACTORS[r["op"]])
    png = plot_busbw(rows, tmp_path / "busbw.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_benchmark_rejects_bad_input_before_launching():
    with pytest.raises(ValueError, match="unknown ops"):
        run_benchmark(nproc=2, ops=["allreduce"])
    from coursekit.comm.bench import main

    assert main(["--ops", "all_reduce", "--sizes", "1Q"]) == 2


def _calls(plan) -> dict:
    return {(c.op, c.bytes, c.group_size): c.count for c in plan}


def test_context_parallel_volumes_written_out_by_hand():
    """Ulysses and Ring Attention per layer and micro-batch, counted on paper for b 2, s 64, 8 heads, 2 K/V heads,
    d 16, bf16, over C ranks. Ulysses: q and out are b·(s/C)·8·16 elements, k and v b·(s/C)·max(2, C)·16; 4
    all-to-alls forward, 4 backward. Ring: the K/V block 2·b·2·(s/C)·16 elements goes round C-1 times forward and
    C-1 times backward, plus C-1 fp32 dK/dV blocks; every send has its receive."""
    b, s, a, kv, d = 2, 64, 8, 2, 16
    for C in (2, 4):
        n = b * s // C * d * 2  # bytes of one head's slice of this rank's rows
        u = volume.ulysses_attention(b, s, a, kv, d, C, layers=3, micro_batches=2)
        assert _calls(u) == {("all_to_all", n * a, C): 4 * 3 * 2, ("all_to_all", n * max(kv, C), C): 4 * 3 * 2}
        fwd = volume.ulysses_attention(b, s, a, kv, d, C, backward=False)
        assert _calls(fwd) == {("all_to_all", n * a, C): 2, ("all_to_all", n * max(kv, C), C): 2}
        block = 2 * b * kv * (s // C) * d
        r = volume.ring_attention(b, s, kv, d, C, layers=3)
        assert _calls(r) == {("send", block * 2, C): 2 * 3 * (C - 1), ("recv", block * 2, C): 2 * 3 * (C - 1),
                             ("send", block * 4, C): 3 * (C - 1), ("recv", block * 4, C): 3 * (C - 1)}
        assert _calls(volume.ring_attention(b, s, kv, d, C, backward=False)) == {
            ("send", block * 2, C): C - 1, ("recv", block * 2, C): C - 1}
    assert volume.ulysses_attention(b, s, a, kv, d, 1) == [] and volume.ring_attention(b, s, kv, d, 1) == []
    for bad in (dict(seq=63), dict(batch=0), dict(kv_heads=0), dict(head_dim=0), dict(cp=0)):
        args = dict(batch=b, seq=s, kv_heads=kv, head_dim=d, cp=2) | bad
        with pytest.raises(ValueError, match="need positive sizes and seq divisible by cp"):
            volume.ring_attention(**args)
        with pytest.raises(ValueError, match="need positive sizes and seq divisible by cp"):
            volume.ulysses_attention(heads=a, **args)
    with pytest.raises(ValueError, match="need positive sizes"):
        volume.ring_attention(b, s, kv, d, 2, layers=0)
    with pytest.raises(ValueError, match="need positive sizes"):
        volume.ulysses_attention(b, s, a, kv, d, 2, micro_batches=0)


def test_expert_parallel_volumes_written_out_by_hand():
    """Two EP ranks, 4 experts (rank 0 holds experts 0-1, rank 1 experts 2-3). Rank 0's router sent 3, 1, 2, 4
    (token, choice) pairs to experts 0..3, rank 1's 5, 0, 1, 1: rank 0 sends 3+1 = 4 rows to itself and 2+4 = 6 to
    rank 1, rank 1 sends 5 to rank 0 and 2 to itself. Rank 0's dispatch input is its 10 rows, its combine input
    the 9 rows it computed (4 + 5); hidden 8, fp32; plus one all-to-all of 4 int64 counts; backward twice more."""
    counts = [[3, 1, 2, 4], [5, 0, 1, 1]]
    send, recv = volume.expert_rows(counts, 2)
    assert send == [[4, 6], [5, 2]] and recv == [[4, 5], [6, 2]]
    plan = volume.moe_all_to_all(send[0], recv[0], hidden=8, experts=4, ep=2)
    assert _calls(plan) == {("all_to_all", 4 * 8, 2): 1, ("all_to_all", 10 * 8 * 4, 2): 2,
                            ("all_to_all", 9 * 8 * 4, 2): 2}
    fwd = volume.moe_all_to_all(send[1], recv[1], hidden=8, experts=4, ep=2, act_bytes=2, backward=False)
    assert _calls(fwd) == {("all_to_all", 4 * 8, 2): 1, ("all_to_all", 7 * 8 * 2, 2): 1, ("all_to_all", 8 * 8 * 2, 2): 1}
    assert volume.moe_all_to_all([5], [5], hidden=8, experts=4, ep=1) == []
    # two layers; in the second, rank 0's router gives 5, 0, 1, 1 and rank 1's 3, 1, 2, 4: rank 0 sends 5 + 2 = 7
    # rows and its experts (0-1) compute 5 + 4 = 9
    group = [[counts[0], counts[1]], [counts[1], counts[0]]]
    plan, rows = volume.moe_step(group, 0, hidden=8, experts=4)
    assert rows == [9, 9]
    assert _calls(plan) == {("all_to_all", 32, 2): 2, ("all_to_all", 10 * 32, 2): 2, ("all_to_all", 9 * 32, 2): 4,
                            ("all_to_all", 7 * 32, 2): 2}
    for bad in ([[1, 2, 3, 4]], [[1, 2, 3], [1, 2, 3]], [[1, 2, 3, 4], [1, 2]]):
        with pytest.raises(ValueError, match="one count per expert for each of the 2 EP ranks"):
            volume.expert_rows(bad, 2)
