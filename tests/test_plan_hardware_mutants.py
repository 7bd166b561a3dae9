"""``coursekit.plan.hardware``: a preset's data-sheet figures, the alpha-beta fit of benchmark rows, and the override
file's rules (its docstrings), checked by hand. Pure Python; written against the mutation survivors of
bench/bench_mutation.py plan.hardware."""
from __future__ import annotations

import json

import pytest

from coursekit.plan.hardware import (Hardware, _gpu, collectives_from_rows, fit_alpha_beta, hardware,
                                     load_overrides, network)

GiB = 2**30


def test_a_preset_carries_the_gpu_tables_data_sheet_figures_and_its_stated_fractions():
    """H100 SXM (NVIDIA's data sheet, dense): 80 GB of HBM3 at 3.35 TB/s, 989.4 TFLOP/s bf16 / fp16, 494.7 tf32,
    66.9 fp32, 1,978.9 fp8; NVLink 4 at 900 GB/s both ways = 450 GB/s one way. Catches a field left out or None,
    the source dropped, the stated fractions (``kw``) not passed."""
    h = _gpu("H100-80GB", src="the data sheet", gemm_fraction=0.5, attn_fraction=0.25)
    assert (h.name, h.memory_bytes, h.hbm_bw, h.link_bw, h.source) == ("H100-80GB", 80 * GiB, 3.35e12, 450e9,
                                                                       "the data sheet")
    assert h.peak_flops == {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12, "fp8": 1978.9e12}
    assert (h.gemm_fraction, h.attn_fraction) == (0.5, 0.25)


def test_lookups_refuse_with_the_known_names():
    """Catches the messages emptied or their lists joined otherwise."""
    with pytest.raises(ValueError) as e:
        hardware("RTX-4090")  # in the GPU table, but no stated GEMM / attention fractions
    assert str(e.value).startswith("GPU RTX-4090 has no planner preset (no stated GEMM / attention fractions); "
                                   "known: A100-40GB, A100-80GB, H100-80GB, H100-PCIe, H200")
    assert str(e.value).endswith("MI300X (or describe one with --hardware FILE)")
    with pytest.raises(ValueError) as e:
        network("ib-999")
    assert str(e.value).startswith("unknown network 'ib-999'; known: ib-400, ib-200, ib-100, roce-400")
    assert str(e.value).endswith(" (or set it with --hardware FILE)")
    with pytest.raises(ValueError) as e:
        Hardware(name="x", memory_bytes=1, peak_flops={"bf16": 1.0, "fp32": 0.5}, hbm_bw=1, link_bw=1).peak("fp8")
    assert str(e.value) == "x has no fp8 peak; known: bf16, fp32"


def _rows(op, world, alpha, busbw, sizes, factor):
    """Benchmark rows on the line time = alpha + size x factor / busbw (nccl-tests' bus bandwidth)."""
    return [{"op": op, "size": s, "world_size": world, "time_us": 1e6 * (alpha + s * factor / busbw)} for s in sizes]


def test_the_fit_counts_wire_bytes_with_the_groups_busbw_factor_and_needs_two_rows():
    """An all-gather over 4 ranks moves (n-1)/n = 3/4 of the size per rank: rows 10 us + size x 3/4 / 2 GB/s fit
    back to (10 us, 2 GB/s), from exactly two rows too. Catches size / factor (4/3 of the size), two rows refused."""
    rows = _rows("all_gather", 4, 10e-6, 2e9, (1 << 16, 1 << 22), 3 / 4)
    a, b = fit_alpha_beta(rows, "all_gather")
    assert a == pytest.approx(10e-6, rel=1e-9) and b == pytest.approx(2e9, rel=1e-9)
    with pytest.raises(ValueError) as e:
        fit_alpha_beta(rows[:1], "all_gather")
    assert str(e.value) == "need at least two benchmark rows of all_gather, got 1"


@pytest.mark.parametrize("times", [(5.0, 5.0), (5.0, 4.0)], ids=["flat", "falling"])
def test_rows_that_do_not_grow_with_size_are_refused(times):
    """Equal times (slope exactly 0) or falling ones fit no bandwidth. Catches slope <= 0 -> < 0 (1 / 0)."""
    rows = [{"op": "all_reduce", "size": s, "world_size": 2, "time_us": t} for s, t in zip((1024, 4096), times)]
    with pytest.raises(ValueError) as e:
        fit_alpha_beta(rows, "all_reduce")
    assert str(e.value) == "benchmark rows of all_reduce do not grow with size; cannot fit a bandwidth"


def test_rows_of_one_size_only_are_refused_as_not_growing():
    """All rows at one size: no spread to fit a slope over (0, then refused). Catches the 0-spread guard dropped
    (a ZeroDivisionError) or its slope 0.0 -> 1.0 (a bandwidth of 1 B/s accepted)."""
    rows = [{"op": "all_reduce", "size": 4096, "world_size": 2, "time_us": t} for t in (5.0, 6.0)]
    with pytest.raises(ValueError, match="do not grow with size"):
        fit_alpha_beta(rows, "all_reduce")


def test_collectives_from_rows_skips_the_ring_reference_and_keeps_ops_with_two_rows():
    """coursekit.comm.bench's file ({'rows': [...]}) or its list; ring_all_reduce (the course's own ring, not a
    collective the planner prices) is skipped; an op with exactly two rows is fitted, one with one row left out; a
    mapping holding no rows measures nothing. Catches the ring name misspelt (then fitted: an unknown collective),
    >= 2 -> > 2 / >= 3, the mapping's default dropped."""
    ar = _rows("all_reduce", 2, 20e-6, 3e9, (4096, 1 << 20), 1.0)
    ring = _rows("ring_all_reduce", 2, 20e-6, 1e9, (4096, 1 << 20), 1.0)
    one = _rows("all_gather", 2, 20e-6, 3e9, (4096,), 0.5)
    got = collectives_from_rows({"rows": ar + ring + one})
    assert got == {"all_reduce": (pytest.approx(20e-6, rel=1e-9), pytest.approx(3e9, rel=1e-9))}
    assert collectives_from_rows(ar + ring) == got
    assert collectives_from_rows({}) == {}


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_override_files_in_json_or_yml_with_inter_node_rows(tmp_path):
    """JSON and .yml both read; ``collectives.inter`` rows (a path next to the file) are fitted into the network's
    measured collectives; ``gpu.peak_flops`` merges into the preset's peaks (an fp8 figure added keeps bf16); a
    YAML 1.1 string like 1.0e15 in a peak is taken as a number. Catches .yml not read as YAML, the JSON branch,
    'inter' misspelt / its rows, path or base dropped, the peak merge skipped or broken, strings left unconverted."""
    rows = _rows("all_reduce", 2, 30e-6, 2e10, (4096, 1 << 24), 1.0)
    (tmp_path / "inter.json").write_text(json.dumps(rows))
    hw0, net0 = hardware("H100-80GB"), network("ib-400")
    j = _write(tmp_path, "o.json", json.dumps({"network": {"latency_s": 5e-6}, "collectives": {"inter": "inter.json"},
                                               "gpu": {"peak_flops": {"fp8": 2e15}, "hbm_bw": 4e12}}))
    hw, net = load_overrides(j, hw0, net0)
    assert net.latency_s == 5e-6 and net.collectives["all_reduce"] == pytest.approx((30e-6, 2e10), rel=1e-9)
    assert hw.peak_flops == {**hw0.peak_flops, "fp8": 2e15} and hw.collectives == hw0.collectives
    assert hw.hbm_bw == 4e12  # the other fields given beside peak_flops are applied too
    y = _write(tmp_path, "o.yml", "gpu:\n  peak_flops:\n    bf16: 1.0e15\ncollectives:\n  inter: inter.json\n")
    hw, net = load_overrides(y, hw0, net0)
    assert hw.peak_flops["bf16"] == 1e15 and hw.peak_flops["fp32"] == hw0.peak_flops["fp32"]
    assert net.collectives["all_reduce"] == pytest.approx((30e-6, 2e10), rel=1e-9)


def test_override_files_are_refused_with_their_path_and_the_reason(tmp_path):
    """Catches each message emptied, the unknown top-level keys not checked, the path left out of the field
    messages (gpu and network), the key left out of a bad number's."""
    hw0, net0 = hardware("H100-80GB"), network("ib-400")
    missing = tmp_path / "none.yaml"
    with pytest.raises(FileNotFoundError) as e:
        load_overrides(missing, hw0, net0)
    assert str(e.value) == f"hardware file {missing} not found"
    cases = [
        ("list.json", "[1, 2]", "{}: expected a mapping with keys gpu, network, collectives"),
        ("keys.yaml", "gpu: {}\nnics: 8\n", "{}: unknown keys ['nics']; use gpu, network, collectives"),
        ("num.yaml", "gpu:\n  hbm_bw: fast\n", "{}: hbm_bw must be a number, got 'fast'"),
        ("net.yaml", "network:\n  speed: 1\n", "{}: unknown Network fields ['speed']; known: bw_per_gpu, collectives, "
                                               "fraction, latency_s, name, source"),
        ("gpu.yaml", "gpu:\n  warp: 1\n", "{}: unknown Hardware fields ['warp']; known: attn_fraction,"),
    ]
    for name, text, want in cases:
        p = _write(tmp_path, name, text)
        with pytest.raises(ValueError) as e:
            load_overrides(p, hw0, net0)
        assert str(e.value).startswith(want.format(p)), (name, str(e.value))


def test_measured_pairs_given_under_gpu_collectives_are_kept_as_pairs(tmp_path):
    """``gpu.collectives`` (a Hardware field: {op: (latency_s, busbw)}) may be written by hand: only a string is
    taken as a number (YAML 1.1's 1.0e-5), a pair stays a pair. Catches every value of a mapping field passed
    through float()."""
    p = _write(tmp_path, "pairs.yaml", "gpu:\n  collectives:\n    all_reduce: [1.0e-5, 2.0e+11]\n")
    hw, _ = load_overrides(p, hardware("H100-80GB"), network("ib-400"))
    assert hw.collectives == {"all_reduce": [1e-5, 2e11]}
