"""The planner against published training runs: predicted vs published throughput, the error distribution over all
of them, and where the published layout ranks among everything the planner would have tried for that model and cluster.

    python bench/bench_planner.py                 # table + error distribution; ranks the RANKED cases
    python bench/bench_planner.py --no-search     # the published layouts only (well under a minute)
    python bench/bench_planner.py --search-all    # rank every case (minutes: MoE and 8,192-GPU searches)
    python bench/bench_planner.py --json          # the rows, a JSON list (one object per case)
    python bench/bench_planner.py --summary-json  # the error distribution, one JSON object

Each case states what the publication gives and what it does not (``assumed``: what had to be assumed, and what the
planner cannot express); the same planner constants serve every case (coursekit/plan/hardware.py, steptime.py):
nothing here is tuned per case. BF16 runs, and torchtitan's torch.compile / Float8 / async-TP rows (each beside a
bf16 eager row on the same part: their ratios are printed apart; Megatron-Bridge's and NeMo's fp8 H100 tables are
not used yet). Models the presets and ``ModelShape`` cannot express are
skipped: DeepSeek-V2/V3 and Kimi K2 (multi-head latent attention), GPT-OSS (attention sinks, sliding windows),
Nemotron-H / Nemotron 3 (Mamba layers).

A published layout the memory calculator says does not fit is a failed prediction whatever its throughput error
(row ``failed``, and in the summary its |error| counts as infinite: outside every bound).

Metric: the publication's own. Megatron-LM / BLOOM report hardware TFLOP/s per GPU counting the recomputed forward
(Narayanan et al. 2021, eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh)), which is
``flops_per_step(..., recompute="full")`` with full (non-causal) attention; LLM Foundry and Llama 3 report MFU
(6N + 12·l·h·s per token, no recompute); NeMo AutoModel, torchtitan and the Megatron MoE model zoo report tokens
per second per GPU ("tokens": predicted = seq · global batch / step time / GPUs), or a step time, which gives it
exactly.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field

from coursekit.flops import flops_per_step
from coursekit.memory import ModelShape, resolve_model
from coursekit.plan import Layout, evaluate, plan


def _gpt(name, L, h, a, V, P=2048, **kw):
    """Megatron / BLOOM / MPT GPT-style shapes (LayerNorm, GELU MLP of 4h)."""
    return ModelShape(arch="gpt2", name=name, layers=L, hidden=h, heads=a, vocab=V, max_positions=P,
                      activation="gelu", **kw)


def _mpt(size, L, h, a, seq=2048):
    """LLM Foundry's MPT shapes (scripts/train/yamls/pretrain/mpt-*.yaml: vocab 50368, no biases, ALiBi, here
    learned positions of the run's length stand in for ALiBi: + seq·h parameters, as their NumParams column
    counts)."""
    return _gpt(f"mpt-{size}", L, h, a, 50368, P=seq, qkv_bias=False, mlp_bias=False)


@dataclass
class Case:
    name: str
    source: str
    model: object
    gpus: int
    gpu: str
    network: str
    seq: int
    global_batch: int
    layout: Layout
    metric: str  # "tflops" (hardware, with recompute), "mfu" or "tokens" (per second per GPU)
    published: float  # TFLOP/s per GPU, MFU as a fraction, or tokens/s per GPU
    attention: str = "flash"
    gpus_per_node: int = 8
    assumed: list = field(default_factory=list)
    dtype: str = "bf16"
    """The compute dtype: bf16, or fp8 (torchao float8 / Transformer Engine on the linear layers)."""
    compile: bool = False
    """torch.compile on (the run says so)."""
    elementwise: str = "eager"
    """Element-wise kernels: eager (the modeling code's aten ops) or fused (Megatron-LM / Transformer Engine)."""
    era: dict = field(default_factory=dict)
    """Layout knobs the publication's software did not have, held fixed when ranking (e.g. no sequence parallelism
    before Korthikanti et al. 2022)."""


METRICS = ("tflops", "mfu", "tokens")
_MEGATRON21 = dict(sp=False, recompute="full", engine="ddp", cp=1)  # Megatron-LM of 2021: no SP, full recompute
_FOUNDRY = dict(engine="fsdp2", tp=1, pp=1, cp=1)  # LLM Foundry shards with FSDP only
_GPT3 = _gpt("gpt3-175b", 96, 12288, 96, 51200)
_GPT530 = _gpt("gpt-530b", 105, 20480, 128, 51200)
_NARAYANAN = "Narayanan et al. 2021 (arXiv 2104.04473, SC21)"
_T2 = f"{_NARAYANAN}, Table 2 (PTD Parallelism vs ZeRO-3 without model parallelism)"
_SELENE = "Selene: 8 x HDR 200 Gb/s per DGX A100"
_FOUNDRY_SRC = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
_FOUNDRY_NOTE = ["FSDP FULL_SHARD as FSDP2 (one unit per block); Composer's own overlap and prefetch not modelled"]
_FOUNDRY_A100 = _FOUNDRY_NOTE + ["'1600 Gbps node-node interconnect (RoCE)': 8 x 200 Gb/s RoCE per node"]
_AUTOMODEL = ("NVIDIA-NeMo/Automodel docs/performance-summary.mdx, Pre-Training Performance, System: DGX-H100, "
              "Precision: BF16")
_ZOO = ("yanring/Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md, Performance Results (256 H100, InfiniBand "
        "8x50 GB/s), BF16")
_ZOO_NOTE = ["tokens/s per GPU from the stated step time (GBS 2048 x 4096 / (step x 256))",
             "DeepEP dispatcher and Megatron's grouped GEMMs as the planner's all-to-all and expert GEMMs",
             "sequence parallelism on (Megatron requires it for MoE with TP)",
             "routing balanced (the planner assumes it; the table does not say forced-balance or dropless)"]
_TITAN = "pytorch/torchtitan benchmarks/"
_TITAN_NOTE = ["Grand Teton H100: 96 GB HBM2e at 2.4 TB/s and a 500 W power limit, peak 'between SXM and NVL' (the "
               "source's footnote): the H100-96GB-500W preset, priced at the NVL peak (the lower bound)",
               "'backend RDMA network with 400 Gb/s per GPU' as RoCE 400",
               "seq 8192: torchtitan's llama3 train configs (the benchmark does not restate it)"]

def _titan_2024_rows() -> list:
    """torchtitan's 2024 H100 tables' compile / Float8 / async-TP rows: the same part and layout as a bf16 eager row
    beside them, so their ratios check the compile, fp8 and TP-overlap terms without the part's unknown peak."""
    src = f"{_TITAN}llama3_h100_202412_torchtitan.md"
    rows = []
    for table, gpus, eager, comp, fp8 in ((1, 8, 5762, 6667, 8532), (3, 128, 5605, 6514, 8380)):
        L = Layout(dp_shard=gpus, engine="fsdp2", micro_batch=2, recompute="op")
        for label, value, dtype in (("FSDP + torch.compile", comp, "bf16"),
                                    ("FSDP + torch.compile + Float8", fp8, "fp8")):
            rows.append(Case(f"Llama 3.1 8B, FSDP {gpus}, compile{' + Float8' if dtype == 'fp8' else ''} "
                             "(torchtitan)", f"{src}, Table {table} ({gpus} GPUs, local batch 2, global {2 * gpus}, "
                             f"selective activation checkpointing), row {label}: {value:,} tokens/s per GPU",
                             "llama3-8b", gpus, "H100-96GB-500W", "roce-400", 8192, 2 * gpus, L, "tokens", float(value),
                             assumed=_TITAN_NOTE + ["torchtitan's selective AC is its per-op policy: recompute op",
                                                    "Float8: torchao tensorwise on every linear but the output head"],
                             dtype=dtype, compile=True))
    for label, value, ov in (("2D", 829, ""), ("2D + AsyncTP", 876, "tp")):
        rows.append(Case(f"Llama 3.1 70B, FSDP 32 x TP 8, compile + Float8{' + async TP' if ov else ''} (torchtitan)",
                         f"{src}, Table 4 (256 GPUs, FSDP 32, TP 8, torch.compile + Float8, local batch 16, global "
                         f"512, full activation checkpointing), row {label}: {value} tokens/s per GPU", "llama3-70b",
                         256, "H100-96GB-500W", "roce-400", 8192, 512,
                         Layout(dp_shard=32, tp=8, engine="fsdp2", micro_batch=16, recompute="full", overlap=ov),
                         "tokens", float(value), assumed=_TITAN_NOTE + ["SP on (torchtitan's TP plan; async TP needs it)"],
                         dtype="fp8", compile=True))
    return rows


def _titan_h200_rows() -> list:
    """Trainy's Llama 3.1 8B on H200s with torchtitan (June 2025): FSDP over 4 and 8 nodes, compile + Float8 (added
    2026-12-05, after the element-wise model was read from op counts: runs the model had not seen)."""
    src = f"{_TITAN}llama3_8b_h200_2025-06_torchtitan.md (Trainy, torchtitan e7c0cae, torch 2.8.0a0)"
    return [Case(f"Llama 3.1 8B, FSDP {gpus}, H200, compile + Float8 (torchtitan, Trainy)",
                 f"{src}, Results: NUM_NODES {nodes}, TPS/GPU {value:,}, Memory {mem} GiB (the 100th iteration); "
                 "--training.local_batch_size=2 --training.compile --model.converters=float8 "
                 "--float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp "
                 "--float8.force_recompute_fp8_weight_in_bwd", "llama3-8b", gpus, "H200", "roce-400", 8192, 2 * gpus,
                 Layout(dp_shard=gpus, engine="fsdp2", micro_batch=2, recompute="op"), "tokens", float(value),
                 assumed=["8 H200 per host on NVLink; '400Gb/s (Mellanox CX-7) per GPU' RDMA as RoCE 400",
                          "llama3_8b.toml's seq 8192 and selective AC 'op' (the command does not override them)",
                          "FSDP's float8 all-gather priced as bf16 gathers (the planner gathers in the compute "
                          "dtype; they hide behind compute here either way)",
                          "torchtitan's Memory column (47.96 / 46.97 GiB) is below the calculator's (which sizes "
                          "torch.compile as eager: Inductor's recompute of element-wise ops is not modelled)"],
                 dtype="fp8", compile=True)
            for nodes, gpus, value, mem in ((4, 32, 10938, 47.96), (8, 64, 10753, 46.97))]


CASES = [
    # -- Megatron-LM (Narayanan et al. 2021), A100-80GB on Selene ---------------------------------------------------
    Case("GPT 1T (Megatron-LM)", f"{_NARAYANAN}, Table 1, row 1008B (160 heads, h 25600, 128 layers, t8 p64, 3072 "
         "GPUs, batch 3072): 163 TFLOP/s per GPU, 52 % of peak",
         _gpt("gpt-1t", 128, 25600, 160, 51200), 3072, "A100-80GB", "ib-200", 2048, 3072,
         Layout(tp=8, pp=64, dp_replicate=6, micro_batch=1, recompute="full", virtual_stages=2, sp=False),
         "tflops", 163.0, attention="eager",
         assumed=["micro-batch 1 (Table 1 does not give it)",
                  "interleaved schedule with 2 chunks per rank (Table 1 does not give the schedule)", _SELENE],
         era=_MEGATRON21),
    Case("GPT-3 175B (Megatron-LM)", f"{_T2}, PTD-P row 174.6B: model-parallel size 96 (t8 x p12), batch 1536, "
         "384 GPUs, micro-batch 1: 153 TFLOP/s per GPU",
         _GPT3, 384, "A100-80GB", "ib-200", 2048, 1536,
         Layout(tp=8, pp=12, dp_replicate=4, micro_batch=1, recompute="full", virtual_stages=2, sp=False),
         "tflops", 153.0, attention="eager",
         assumed=["Table 2 gives the model-parallel size, 96: split as t8 x p12 (TP within a DGX A100)",
                  "interleaved, 2 chunks per rank (Table 2 does not give the schedule)",
                  _SELENE], era=_MEGATRON21),
    Case("GPT-3 175B, 768 GPUs (Megatron-LM)", f"{_T2}, PTD-P row 174.6B, 768 GPUs, batch 1536, micro-batch 1: 149 "
         "TFLOP/s per GPU", _GPT3, 768, "A100-80GB", "ib-200", 2048, 1536,
         Layout(tp=8, pp=12, dp_replicate=8, micro_batch=1, recompute="full", virtual_stages=2, sp=False),
         "tflops", 149.0, attention="eager",
         assumed=["t8 x p12 for model-parallel size 96", "interleaved, 2 chunks per rank", _SELENE]),
    Case("GPT-3 175B, 1536 GPUs (Megatron-LM)", f"{_T2}, PTD-P row 174.6B, 1536 GPUs, batch 1536, micro-batch 1: "
         "141 TFLOP/s per GPU", _GPT3, 1536, "A100-80GB", "ib-200", 2048, 1536,
         Layout(tp=8, pp=12, dp_replicate=16, micro_batch=1, recompute="full", virtual_stages=2, sp=False),
         "tflops", 141.0, attention="eager",
         assumed=["t8 x p12 for model-parallel size 96", "interleaved, 2 chunks per rank", _SELENE]),
    Case("GPT-3 175B ZeRO-3, 384 GPUs (DeepSpeed)", f"{_T2}, ZeRO-3 row 174.6B, model-parallel size 1, batch 1536, "
         "384 GPUs, micro-batch 4: 144 TFLOP/s per GPU", _GPT3, 384, "A100-80GB", "ib-200", 2048, 1536,
         Layout(dp_replicate=384, engine="deepspeed", zero=3, micro_batch=4, recompute="full"),
         "tflops", 144.0, attention="eager",
         assumed=["activation recomputation (the paper's FLOP count, eq. 3, assumes it)", _SELENE]),
    Case("GPT-3 175B ZeRO-3, 1536 GPUs (DeepSpeed)", f"{_T2}, ZeRO-3 row 174.6B, 1536 GPUs, batch 1536, "
         "micro-batch 1: 44 TFLOP/s per GPU", _GPT3, 1536, "A100-80GB", "ib-200", 2048, 1536,
         Layout(dp_replicate=1536, engine="deepspeed", zero=3, micro_batch=1, recompute="full"),
         "tflops", 44.0, attention="eager",
         assumed=["activation recomputation (eq. 3 assumes it)", _SELENE]),
    Case("GPT 530B (Megatron-LM)", f"{_T2}, PTD-P row 529.6B (128 heads, h 20480, 105 layers): model-parallel size "
         "280 (t8 x p35), batch 2240, 560 GPUs, micro-batch 1: 171 TFLOP/s per GPU",
         _GPT530, 560, "A100-80GB", "ib-200", 2048, 2240,
         Layout(tp=8, pp=35, dp_replicate=2, micro_batch=1, recompute="full", sp=False),
         "tflops", 171.0, attention="eager",
         assumed=["t8 x p35 for model-parallel size 280 (Table 1's 529.6B row)",
                  "no interleaving (105 layers over 35 stages: 3 per stage)", _SELENE]),
    Case("GPT 18.4B (Megatron-LM)", f"{_NARAYANAN}, Table 1, row 18.4B (48 heads, h 6144, 40 layers, t8 p1, 256 "
         "GPUs, batch 1024): 135 TFLOP/s per GPU, 43 % of peak",
         _gpt("gpt-18b", 40, 6144, 48, 51200), 256, "A100-80GB", "ib-200", 2048, 1024,
         Layout(tp=8, dp_replicate=32, micro_batch=1, recompute="full", sp=False), "tflops", 135.0,
         attention="eager", assumed=["micro-batch 1 (Table 1 does not give it)", _SELENE]),
    Case("GPT 145.6B (Megatron-LM)", f"{_NARAYANAN}, Table 1, row 145.6B (96 heads, h 12288, 80 layers, t8 p8, "
         "1536 GPUs, batch 2304): 148 TFLOP/s per GPU, 47 % of peak",
         _gpt("gpt-146b", 80, 12288, 96, 51200), 1536, "A100-80GB", "ib-200", 2048, 2304,
         Layout(tp=8, pp=8, dp_replicate=24, micro_batch=1, recompute="full", virtual_stages=2, sp=False),
         "tflops", 148.0, attention="eager",
         assumed=["micro-batch 1 (Table 1 does not give it)", "interleaved, 2 chunks per rank", _SELENE]),
    # -- BLOOM ------------------------------------------------------------------------------------------------------
    Case("BLOOM 176B (Megatron-DeepSpeed)", "Scao et al. 2022 (BLOOM), §3.4: 156 TFLOP/s per GPU on 384 A100-80GB",
         _gpt("bloom-176b", 70, 14336, 112, 250880), 384, "A100-80GB", "opa-4x100", 2048, 2048,
         Layout(tp=4, pp=12, dp_replicate=8, engine="deepspeed", zero=1, micro_batch=2, recompute="full", sp=False),
         "tflops", 156.0, attention="eager",
         assumed=["Jean Zay: 4 x 100 Gb/s Omni-Path per node", "learned positions stand in for ALiBi (+29M params)"],
         era=dict(sp=False, recompute="full", cp=1, virtual_stages=1, engine="deepspeed")),
    # -- LLM Foundry (MPT), FSDP only -------------------------------------------------------------------------------
    Case("MPT-7B (LLM Foundry, FSDP)", f"{_FOUNDRY_SRC}, H100 80GB BF16 table: "
         "7b, seq 2048, 8 GPUs, micro-batch 6, global 48, FULL_SHARD, no checkpointing: MFU 46.44 %",
         _gpt("mpt-7b", 32, 4096, 32, 50432, qkv_bias=False, mlp_bias=False), 8, "H100-80GB", "ib-400", 2048, 48,
         Layout(dp_shard=8, engine="fsdp2", micro_batch=6), "mfu", 0.4644, era=_FOUNDRY),
    Case("MPT-70B (LLM Foundry, FSDP)", "same table: 70b, seq 2048, 64 GPUs, micro-batch 8, grad-accum 4, global "
         "2048, FULL_SHARD, activation checkpointing: MFU 42.57 %",
         _gpt("mpt-70b", 80, 8192, 64, 50432, qkv_bias=False, mlp_bias=False), 64, "H100-80GB", "ib-400", 2048,
         2048, Layout(dp_shard=64, engine="fsdp2", micro_batch=8, recompute="full"), "mfu", 0.4257,
         assumed=["MosaicML H100 nodes with 8 x 400 Gb/s InfiniBand"], era=_FOUNDRY),
    Case("MPT-70B, 32 GPUs (LLM Foundry)", f"{_FOUNDRY_SRC}, H100 80GB BF16 table: 70b, seq 2048, 32 GPUs, "
         "micro-batch 2, grad-accum 16, global 1024, FULL_SHARD, checkpointing: MFU 36.15 %",
         _mpt("70b", 80, 8192, 64), 32, "H100-80GB", "ib-400", 2048, 1024,
         Layout(dp_shard=32, engine="fsdp2", micro_batch=2, recompute="full"), "mfu", 0.3615,
         assumed=_FOUNDRY_NOTE + ["8 x 400 Gb/s InfiniBand per node"]),
    Case("MPT-30B, 32 GPUs (LLM Foundry)", f"{_FOUNDRY_SRC}, H100 80GB BF16 table: 30b, seq 2048, 32 GPUs, "
         "micro-batch 14, grad-accum 3, global 1344, FULL_SHARD, checkpointing: MFU 43.92 %",
         _mpt("30b", 48, 7168, 56), 32, "H100-80GB", "ib-400", 2048, 1344,
         Layout(dp_shard=32, engine="fsdp2", micro_batch=14, recompute="full"), "mfu", 0.4392,
         assumed=_FOUNDRY_NOTE + ["8 x 400 Gb/s InfiniBand per node"]),
    Case("MPT-13B, 64 GPUs (LLM Foundry)", f"{_FOUNDRY_SRC}, H100 80GB BF16 table: 13b, seq 2048, 64 GPUs, "
         "micro-batch 2, grad-accum 1, global 128, FULL_SHARD, no checkpointing: MFU 39.86 %",
         _mpt("13b", 40, 5120, 40), 64, "H100-80GB", "ib-400", 2048, 128,
         Layout(dp_shard=64, engine="fsdp2", micro_batch=2), "mfu", 0.3986,
         assumed=_FOUNDRY_NOTE + ["8 x 400 Gb/s InfiniBand per node"]),
    Case("MPT-3B, 64 GPUs (LLM Foundry)", f"{_FOUNDRY_SRC}, H100 80GB BF16 table: 3b, seq 2048, 64 GPUs, "
         "micro-batch 6, grad-accum 3, global 1152, FULL_SHARD, no checkpointing: MFU 40.8 %",
         _mpt("3b", 32, 2560, 20), 64, "H100-80GB", "ib-400", 2048, 1152,
         Layout(dp_shard=64, engine="fsdp2", micro_batch=6), "mfu", 0.408,
         assumed=_FOUNDRY_NOTE + ["8 x 400 Gb/s InfiniBand per node"]),
    Case("MPT-7B, seq 8192 (LLM Foundry)", f"{_FOUNDRY_SRC}, H100 80GB BF16 table: 7b, seq 8192, 8 GPUs, "
         "micro-batch 8, grad-accum 2, global 128, FULL_SHARD, checkpointing: MFU 37.14 %",
         _mpt("7b", 32, 4096, 32, seq=8192), 8, "H100-80GB", "ib-400", 8192, 128,
         Layout(dp_shard=8, engine="fsdp2", micro_batch=8, recompute="full"), "mfu", 0.3714, assumed=_FOUNDRY_NOTE),
    Case("MPT-7B, A100-80GB (LLM Foundry)", f"{_FOUNDRY_SRC}, A100 80GB (RoCE 1600 Gbps) table: 7b, seq 2048, 8 "
         "GPUs, micro-batch 6, grad-accum 2, global 96, amp_bf16, FULL_SHARD, no checkpointing: MFU 64.23 %",
         _mpt("7b", 32, 4096, 32), 8, "A100-80GB", "roce-200", 2048, 96,
         Layout(dp_shard=8, engine="fsdp2", micro_batch=6), "mfu", 0.6423, assumed=_FOUNDRY_NOTE),
    Case("MPT-70B, A100-80GB (LLM Foundry)", f"{_FOUNDRY_SRC}, A100 80GB (RoCE 1600 Gbps) table: 70b, seq 2048, 64 "
         "GPUs, micro-batch 8, grad-accum 4, global 2048, bf16 PURE, FULL_SHARD, checkpointing: MFU 53.33 %",
         _mpt("70b", 80, 8192, 64), 64, "A100-80GB", "roce-200", 2048, 2048,
         Layout(dp_shard=64, engine="fsdp2", micro_batch=8, recompute="full"), "mfu", 0.5333,
         assumed=_FOUNDRY_A100 + ["mixed precision PURE (bf16 reductions) priced as Megatron's 16 bytes/param"]),
    Case("MPT-7B, 128 A100-40GB (LLM Foundry)", f"{_FOUNDRY_SRC}, A100 40GB (RoCE 1600 Gbps) table: 7b, seq 2048, "
         "128 GPUs, micro-batch 18, grad-accum 1, global 2304, bf16 PURE, FULL_SHARD, checkpointing: MFU 50.14 %",
         _mpt("7b", 32, 4096, 32), 128, "A100-40GB", "roce-200", 2048, 2304,
         Layout(dp_shard=128, engine="fsdp2", micro_batch=18, recompute="full"), "mfu", 0.5014,
         assumed=_FOUNDRY_A100 + ["mixed precision PURE priced as 16 bytes/param"]),
    Case("MPT-13B, 128 A100-40GB (LLM Foundry)", f"{_FOUNDRY_SRC}, A100 40GB (RoCE 1600 Gbps) table: 13b, seq "
         "2048, 128 GPUs, micro-batch 16, grad-accum 1, global 2048, bf16 PURE, FULL_SHARD, checkpointing: MFU "
         "51.93 %", _mpt("13b", 40, 5120, 40), 128, "A100-40GB", "roce-200", 2048, 2048,
         Layout(dp_shard=128, engine="fsdp2", micro_batch=16, recompute="full"), "mfu", 0.5193,
         assumed=_FOUNDRY_A100 + ["mixed precision PURE priced as 16 bytes/param"]),
    # -- Llama 3 ----------------------------------------------------------------------------------------------------
    Case("Llama 3 405B (Meta)", "Dubey et al. 2024, Table 4: 8,192 H100, TP 8, CP 1, PP 16, DP 64, seq 8192, "
         "16M tokens per batch: 430 TFLOP/s per GPU, BF16 MFU 43 %",
         "llama3-405b", 8192, "H100-80GB", "roce-400", 8192, 2048,
         Layout(tp=8, pp=16, dp_replicate=64, engine="deepspeed", zero=1, micro_batch=1, recompute="selective",
                virtual_stages=4), "mfu", 0.43,
         assumed=["optimizer states sharded over DP (ZeRO-1)", "selective recompute",
                  "interleaved, 4 chunks per rank (126 layers / 16 stages)"]),
    Case("Llama 3 70B, FSDP + CP 2 (NeMo AutoModel)", f"{_AUTOMODEL}: Llama3 70B, 64 GPUs, GBS 128, MBS 1, GA 4, "
         "seq 8192, TP 1, PP 1, CP 2, FSDP 32, TE + fsdp2_prefetch, 18.90 s per step: 866.77 tokens/s per GPU",
         "llama3-70b", 64, "H100-80GB", "ib-400", 8192, 128,
         Layout(dp_shard=32, cp=2, engine="fsdp2", micro_batch=1, recompute="full"), "tokens", 866.77,
         assumed=["activation_checkpointing: True in its recipe (custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml)",
                  "CP as ring attention", "torch.compile on (enable_compile in the recipe)", "DGX-H100: ib-400"],
         compile=True),
    Case("Llama 3.1 8B, FSDP 8 (torchtitan)", f"{_TITAN}llama3_h100_202412_torchtitan.md, Table 1 (8 GPUs, local "
         "batch 2, global 16, selective activation checkpointing), row FSDP: 5,762 tokens/s per GPU",
         "llama3-8b", 8, "H100-96GB-500W", "roce-400", 8192, 16,
         Layout(dp_shard=8, engine="fsdp2", micro_batch=2, recompute="op"), "tokens", 5762.0,
         assumed=_TITAN_NOTE + ["torchtitan's selective AC is its per-op policy: the planner's recompute op"]),
    Case("Llama 3.1 8B, FSDP 128 (torchtitan)", f"{_TITAN}llama3_h100_202412_torchtitan.md, Table 3 (128 GPUs, "
         "local batch 2, global 256, selective activation checkpointing), row FSDP: 5,605 tokens/s per GPU",
         "llama3-8b", 128, "H100-96GB-500W", "roce-400", 8192, 256,
         Layout(dp_shard=128, engine="fsdp2", micro_batch=2, recompute="op"), "tokens", 5605.0,
         assumed=_TITAN_NOTE + ["torchtitan's selective AC is its per-op policy: the planner's recompute op"]),
    Case("Llama 3 70B, FSDP 32 x TP 8 (torchtitan)", f"{_TITAN}asyncTP_llama3_h100_2025-06_torchtitan.md, Llama3 "
         "70b on 256 H100s, FSDP=32, TP=8, torch.compile, full AC, local batch size 16, None (bfloat16), vanilla TP: "
         "597.3 tokens/s", "llama3-70b", 256, "H100-96GB-500W", "roce-400", 8192, 512,
         Layout(dp_shard=32, tp=8, engine="fsdp2", micro_batch=16, recompute="full"), "tokens", 597.3,
         assumed=_TITAN_NOTE + ["tokens/s read as per GPU (as the other torchtitan tables)",
                                "global batch 512 = 32 x 16 (no gradient accumulation)", "SP on (torchtitan's TP plan)"],
         compile=True),
    Case("Llama 3 8B, FSDP 8 x TP 8 (torchtitan)", f"{_TITAN}asyncTP_llama3_h100_2025-06_torchtitan.md, Llama3 8b "
         "on 64 H100s, FSDP=8, TP=8, torch.compile, per op SAC, local batch size 12, None (bfloat16), vanilla TP: "
         "4378 tokens/s", "llama3-8b", 64, "H100-96GB-500W", "roce-400", 8192, 96,
         Layout(dp_shard=8, tp=8, engine="fsdp2", micro_batch=12, recompute="op"), "tokens", 4378.0,
         assumed=_TITAN_NOTE + ["tokens/s read as per GPU", "global batch 96 = 8 x 12", "SP on",
                                "per-op SAC: the planner's recompute op"],
         compile=True),
    *_titan_2024_rows(),
    *_titan_h200_rows(),
    # -- mixtures of experts ----------------------------------------------------------------------------------------
    Case("Qwen3-30B-A3B, FSDP 8 x EP 8 (NeMo AutoModel)", f"{_AUTOMODEL}: Qwen3 MoE 30B, 8 GPUs, GBS 512, MBS 4, "
         "LBS 4, GA 16, seq 4096, EP 8, FSDP 8, TE + DeepEP, 21.773 s per step: 12,040 tokens/s per GPU",
         "qwen3-30b-a3b", 8, "H100-80GB", "ib-400", 4096, 512,
         Layout(dp_shard=8, ep=8, engine="fsdp2", micro_batch=4, recompute="full"), "tokens", 12040.0,
         assumed=["activation_checkpointing: true in its recipe (qwen3_moe_30b_te_deepep.yaml)",
                  "its experts are not resharded after forward (moe.reshard_after_forward: false): priced as FSDP2 "
                  "resharding every block",
                  "fake_balanced_gate: balanced routing, as the planner assumes",
                  "DeepEP and grouped-GEMM experts as the planner's all-to-all and expert GEMMs",
                  "its loss (MaskedCrossEntropy, fp32_upcast: false) keeps the logits in bf16; the calculator sizes "
                  "HF's fp32 upcast (4 + 8 bytes per logit where bf16 keeps 2 + 4: ~14 GiB more at micro-batch 4 x "
                  "4,096 x 151,936; still over 76 GiB without it)"]),
    Case("Qwen3-235B-A22B, TP 2 x EP 8 x FSDP (Megatron)", f"{_ZOO}, intra-node EP strategy: 235B, DeepEP, TP 2, "
         "CP 1, EP 8, PP 1, EDP 32, DP 128, FSDP on, MBS 4, GBS 2048, GA 4, recompute full: 17.6 s per step, 276 "
         "TFLOP/s per GPU (= 1,862 tokens/s per GPU)",
         "qwen3-235b-a22b", 256, "H100-80GB", "ib-400", 4096, 2048,
         Layout(tp=2, dp_shard=128, ep=8, engine="fsdp2", micro_batch=4, recompute="full"), "tokens",
         2048 * 4096 / (17.6 * 256), assumed=_ZOO_NOTE + ["Megatron-FSDP as FSDP2"]),
    Case("Qwen3-235B-A22B, TP 4 x EP 8 x PP 8 (Megatron)", f"{_ZOO}, intra-node EP strategy: 235B, DeepEP, TP 4, "
         "CP 1, EP 8, PP 8, EDP 4, VPP 4, DP 8, MBS 1, GBS 2048, GA 256, recompute column empty: 29.0 s per step, 167 "
         "TFLOP/s per GPU (= 1,130 tokens/s per GPU)",
         "qwen3-235b-a22b", 256, "H100-80GB", "ib-400", 4096, 2048,
         Layout(tp=4, pp=8, virtual_stages=4, dp_replicate=8, ep=8, engine="ddp", micro_batch=1),
         "tokens", 2048 * 4096 / (29.0 * 256),
         assumed=_ZOO_NOTE + ["Megatron's distributed optimizer not expressible with EP (the planner's EP runs DDP "
                              "or FSDP2): priced as DDP, more memory per GPU than the run had",
                              "94 layers over 8 x 4 chunks: the busiest stage's ceil",
                              "an empty recompute column read as no recompute"]),
]
# Which element-wise kernels each stack runs (steptime: eager = the modeling code's aten ops, as LLM Foundry's MPT
# and torchtitan's Llama run them; fused = one kernel per norm / bias-activation / bias-dropout-add), and why
_FUSED = {
    "(Megatron-LM)": "Megatron-LM's fused kernels (fused LayerNorm, bias-GeLU, bias-dropout-add, masked softmax)",
    "(DeepSpeed)": "the Megatron GPT model with its fused kernels under ZeRO-3 (the paper compares on the same model)",
    "(Megatron-DeepSpeed)": "Megatron-DeepSpeed: Megatron's fused kernels",
    "(Meta)": "fused kernels assumed (the paper does not describe its kernels)",
    "(NeMo AutoModel)": "Transformer Engine's fused kernels (TE in the recipe)",
    "(Megatron)": "Megatron-Core with Transformer Engine's fused kernels",
}
for _c in CASES:
    for _stack, _why in _FUSED.items():
        if _c.name.endswith(_stack):
            _c.elementwise = "fused"
            _c.assumed = [*_c.assumed, _why]
            break
    else:
        _c.assumed = [*_c.assumed, "eager element-wise kernels (the modeling code's own aten ops)"]

"""Cases whose published layout ``python bench/bench_planner.py`` ranks by default (``--search-all`` ranks every
case): the runs the ranking rule was set on."""
RANKED = ("GPT 1T (Megatron-LM)", "GPT-3 175B (Megatron-LM)", "BLOOM 176B (Megatron-DeepSpeed)",
          "MPT-7B (LLM Foundry, FSDP)", "MPT-70B (LLM Foundry, FSDP)", "Llama 3 405B (Meta)")
BOUNDS = (0.10, 0.25)


# (faster run, its baseline): published and predicted throughput ratios, the part's peak cancelling out
RATIOS = (("Llama 3.1 8B, FSDP 8, compile (torchtitan)", "Llama 3.1 8B, FSDP 8 (torchtitan)"),
          ("Llama 3.1 8B, FSDP 128, compile (torchtitan)", "Llama 3.1 8B, FSDP 128 (torchtitan)"),
          ("Llama 3.1 8B, FSDP 8, compile + Float8 (torchtitan)", "Llama 3.1 8B, FSDP 8, compile (torchtitan)"),
          ("Llama 3.1 8B, FSDP 128, compile + Float8 (torchtitan)", "Llama 3.1 8B, FSDP 128, compile (torchtitan)"),
          ("Llama 3.1 70B, FSDP 32 x TP 8, compile + Float8 + async TP (torchtitan)",
           "Llama 3.1 70B, FSDP 32 x TP 8, compile + Float8 (torchtitan)"))


def ratios(rows: list[dict]) -> list[dict]:
    """Speed-up of each RATIOS pair, published and predicted (throughput / throughput)."""
    by = {r["case"]: r for r in rows}
    return [{"run": a, "baseline": b, "published": by[a]["published"] / by[b]["published"],
             "predicted": by[a]["predicted"] / by[b]["predicted"]} for a, b in RATIOS if a in by and b in by]


def run_case(c: Case, search: bool = True) -> dict:
    if c.metric not in METRICS:
        raise ValueError(f"case {c.name!r}: metric {c.metric!r} is not one of {', '.join(METRICS)}")
    shape = resolve_model(c.model)
    kw = dict(gpus=c.gpus, gpus_per_node=c.gpus_per_node, gpu=c.gpu, network=c.network, seq=c.seq,
              global_batch=c.global_batch, attention=c.attention, dtype=c.dtype, compile=c.compile,
              elementwise=c.elementwise)
    cand = evaluate(shape, c.layout, **kw)
    p = cand.prediction
    if c.metric == "tflops":
        hw_flops = flops_per_step(shape, c.global_batch, c.seq, recompute=c.layout.recompute)["total"]
        predicted = hw_flops / p.step_time_s / c.gpus / 1e12
    elif c.metric == "tokens":
        predicted = c.seq * c.global_batch / p.step_time_s / c.gpus
    else:
        predicted = p.mfu
    row = {"case": c.name, "metric": c.metric, "published": c.published, "predicted": predicted,
           "error": predicted / c.published - 1, "fits": cand.fits, "failed": not cand.fits, "era": c.era,
           "peak_gib": cand.peak_bytes / 2**30, "step_time_s": p.step_time_s,
           "layout": c.layout.short() + (f" {c.dtype}" if c.dtype != "bf16" else "") + (" compile" if c.compile else "")
           + (" fused" if c.elementwise == "fused" else "")}
    if search:
        t0 = time.process_time()  # CPU seconds: on a shared machine wall time measures the neighbours
        cands = plan(shape, fixed=c.era, **kw)
        row["search_s"] = time.process_time() - t0
        row["candidates"] = len(cands)
        faster = sum(x.prediction.step_time_s < p.step_time_s for x in cands)
        row["rank"] = faster + 1
        row["rank_fraction"] = faster / len(cands)
        row["gap_to_best"] = p.step_time_s / cands[0].prediction.step_time_s - 1
        row["best"] = cands[0].layout.short()
    return row


def summarize(rows: list[dict]) -> dict:
    """The error distribution over every row: a row whose published layout does not fit counts as |error| =
    infinity (a failure, outside every bound). Statistics that land on such a row are None in JSON."""
    errs = sorted((abs(r["error"]) if r["fits"] else math.inf, r["case"]) for r in rows)
    vals = [e for e, _ in errs]
    n = len(vals)
    finite = lambda v: None if math.isinf(v) else v  # noqa: E731
    p90 = vals[max(0, math.ceil(0.9 * n) - 1)] if n else math.inf  # nearest rank
    return {"n": n, "fitting": sum(r["fits"] for r in rows),
            "not_fitting": [r["case"] for r in rows if not r["fits"]],
            "median_abs_error": finite(statistics.median(vals)) if n else None,
            "p90_abs_error": finite(p90), "worst_abs_error": finite(vals[-1]) if n else None,
            "worst_case": errs[-1][1] if n else None,
            **{f"within_{round(b * 100)}": sum(v <= b for v in vals) for b in BOUNDS},
            "failed": [name for e, name in errs if e > BOUNDS[-1]],
            "fitting_only": _spread([e for e in vals if not math.isinf(e)])}


def _spread(vals: list[float]) -> dict:
    """Median, nearest-rank 90th percentile and worst of sorted |errors| (the rows that fit)."""
    if not vals:
        return {"n": 0, "median_abs_error": None, "p90_abs_error": None, "worst_abs_error": None}
    return {"n": len(vals), "median_abs_error": statistics.median(vals),
            "p90_abs_error": vals[max(0, math.ceil(0.9 * len(vals)) - 1)], "worst_abs_error": vals[-1]}


def _pct(v) -> str:
    return "does not fit" if v is None else f"{v:.1%}"


def summary_lines(s: dict) -> list[str]:
    n = s["n"]
    lines = [f"error distribution over {n} published runs ({s['fitting']} fit; a layout that does not fit counts "
             f"as a failure, |error| infinite):",
             f"   median |error| {_pct(s['median_abs_error'])}, 90th percentile {_pct(s['p90_abs_error'])}, worst "
             f"{_pct(s['worst_abs_error'])} ({s['worst_case']})",
             "   " + ", ".join(f"within {round(b * 100)} %: {s[f'within_{round(b * 100)}']}/{n}" for b in BOUNDS)
             + f"; not fitting (failed): {len(s['not_fitting'])}/{n}"
             + (f" ({'; '.join(s['not_fitting'])})" if s["not_fitting"] else ""),
             f"   the {s['fitting_only']['n']} that fit: median |error| {_pct(s['fitting_only']['median_abs_error'])}, "
             f"90th percentile {_pct(s['fitting_only']['p90_abs_error'])}, worst "
             f"{_pct(s['fitting_only']['worst_abs_error'])}",
             f"   outside 25 % or not fitting: {'; '.join(s['failed']) or 'none'}"]
    return lines


def _unit(metric):
    return {"tflops": lambda v: f"{v:.0f} TFLOP/s", "mfu": lambda v: f"{v:.1%} MFU",
            "tokens": lambda v: f"{v:,.0f} tokens/s"}[metric]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="the rows as a JSON list")
    ap.add_argument("--summary-json", action="store_true", help="the error distribution as one JSON object")
    ap.add_argument("--markdown", action="store_true", help="the rows as docs/planner.md's table")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--no-search", action="store_true", help="only evaluate the published layouts")
    g.add_argument("--search-all", action="store_true", help="rank every case's published layout (minutes)")
    a = ap.parse_args(argv)
    rows = [run_case(c, search=not a.no_search and (a.search_all or c.name in RANKED)) for c in CASES]
    s = summarize(rows)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    if a.summary_json:
        print(json.dumps(s, indent=1))
        return 0
    if a.markdown:
        print("| case | layout | published | predicted | error | fits (peak GiB) |\n| --- | --- | ---: | ---: | ---: | --- |")
        for r in rows:
            unit = _unit(r["metric"])
            fit = f"yes ({r['peak_gib']:.1f})" if r["fits"] else f"**no ({r['peak_gib']:.1f}): failed**"
            print(f"| {r['case']} | `{r['layout']}` | {unit(r['published'])} | {unit(r['predicted'])} | "
                  f"{r['error']:+.1%} | {fit} |")
        print("\n```\n" + "\n".join(summary_lines(s)) + "\n```")
        print("\n" + "\n".join(ratio_lines(rows)))
        return 0
    for c, r in zip(CASES, rows):
        unit = _unit(r["metric"])
        print(f"{r['case']}: {r['layout']}")
        print(f"   published {unit(r['published'])}, predicted {unit(r['predicted'])} ({r['error']:+.1%}); "
              f"fits {r['fits']} ({r['peak_gib']:.1f} GiB)" + ("; FAILED: the published layout does not fit"
                                                                if r["failed"] else ""))
        if "rank" in r:
            print(f"   rank {r['rank']} of {r['candidates']} (top {r['rank_fraction']:.1%}), {r['gap_to_best']:+.1%} "
                  f"slower than the best, {r['best']}; search {r['search_s']:.2f} s CPU"
                  + (f" (held fixed: {r['era']})" if r["era"] else ""))
        print(f"   source: {c.source}" + (f"; assumed: {'; '.join(c.assumed)}" if c.assumed else ""))
    print()
    print("\n".join(summary_lines(s)))
    print("\n" + "\n".join(ratio_lines(rows)))
    return 0


def ratio_lines(rows) -> list[str]:
    out = ["speed-ups on the same part (compile over eager, Float8 over bf16, async TP over vanilla):"]
    out += [f"   {q['run']} / {q['baseline']}: published x{q['published']:.3f}, predicted x{q['predicted']:.3f}"
            for q in ratios(rows)]
    return out


if __name__ == "__main__":
    sys.exit(main())
