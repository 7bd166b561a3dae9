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
