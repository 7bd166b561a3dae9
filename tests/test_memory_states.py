"""Model-state bytes against independent numbers: the ZeRO and ZeRO-Offload papers, and torch's own AdamW."""
from __future__ import annotations

import pytest

from coursekit.memory import preset, estimate, model_state_bytes

GB = 1e9  # the ZeRO paper's GB


@pytest.mark.parametrize("stage,paper_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_table(stage, paper_gb):
    """Rajbhandari et al. 2020, Table 1: Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam)."""
    st = model_state_bytes(7.5e9, precision="16psi", engine="deepspeed", zero=stage, shard=64)
    assert st.resident / GB == pytest.approx(paper_gb, abs=0.05)  # the paper rounds to 3 significant figures


def test_deepspeed_fp32_gradient_partition_at_step():
    """What the paper's formula omits: DeepSpeed builds an fp32 copy of each rank's gradient partition at the step."""
    psi, n = 7.5e9, 64
    for stage in (1, 2, 3):
        st = model_state_bytes(psi, zero=stage, shard=n)
        assert st.step_grad_copy == pytest.approx(4 * psi / n)
    assert model_state_bytes(psi, zero=2, shard=n, precision="18psi").step_grad_copy == 0  # grads already fp32
    e = estimate("llama3-8b", batch=1, seq=1024, dp=64, zero=2)
    assert e.phases["optimizer_step"] - e.phases["end_of_backward"] >= e.categories["step_grad_copy"]


def test_conventions_bytes_per_parameter():
    psi = 1e9
    for name, per_param in [("16psi", 16), ("18psi", 18), ("20psi", 20), ("fp32", 16)]:
        assert model_state_bytes(psi, precision=name, engine="ddp").resident == per_param * psi
    sgd = model_state_bytes(psi, precision="fp32", optimizer="sgd", engine="ddp")
    assert sgd.optimizer_states == 4 * psi


def test_zero_offload_paper_gpu_footprint():
    """Ren et al. 2021 (ZeRO-Offload): with gradients, optimizer states and the update on the CPU, the GPU keeps
    only the 2Ψ fp16 parameters of the model states. (On the CPU DeepSpeed holds fp32 weights, m, v and an fp32
    gradient partition.)"""
    psi = 10e9
    st = model_state_bytes(psi, zero=2, shard=1, offload="cpu")
    assert st.resident == 2 * psi
    assert st.cpu == (4 + 8 + 4) * psi
    nv = model_state_bytes(psi, zero=3, shard=4, offload="nvme", offload_params="nvme")
    assert nv.resident == 0 and nv.nvme == (2 + 12) * psi / 4 and nv.cpu == 4 * psi / 4


def test_fsdp2_and_hsdp_shard_everything():
    psi = 8e9
    st = model_state_bytes(psi, engine="fsdp2", shard=8)
    assert st.resident == 16 * psi / 8  # fp32 sharded params (the master copy) + fp32 grads + AdamW m, v
    full = estimate("llama3-8b", batch=1, seq=2048, engine="fsdp2", dp=16)
    hsdp = estimate("llama3-8b", batch=1, seq=2048, engine="fsdp2", dp=16, hsdp_shard=8)
    counters = 4 * preset("llama3-8b").num_param_tensors()  # torch keeps one fp32 step per (sharded) tensor
    assert hsdp.categories["optimizer_states"] - counters == 2 * (full.categories["optimizer_states"] - counters)
    keep = estimate("llama3-8b", batch=1, seq=2048, engine="fsdp2", dp=16, fsdp_reshard=False)
    assert keep.categories["unsharded_fsdp_units"] > full.categories["unsharded_fsdp_units"]


def test_tp_pp_split_parameters():
    shape_total = estimate("llama3-70b", batch=1, seq=1024).params_per_tp_pp_rank
    tp8 = estimate("llama3-70b", batch=1, seq=1024, tp=8).params_per_tp_pp_rank
    assert shape_total / 8 < tp8 < shape_total / 7.9  # only norms are replicated
    pp4 = estimate("llama3-70b", batch=1, seq=1024, pp=4, dp=64, zero=3, pp_schedule="1f1b")
    assert pp4.params_per_tp_pp_rank < shape_total / 3.5
    # 1F1B: the first stage (the worst once states are sharded) holds pp micro-batches of its 20 layers' activations
    one = estimate("llama3-70b", batch=1, seq=1024)
    assert pp4.pp_stage == 0
    assert pp4.categories["saved_activations"] == pytest.approx(one.activations.layer_bytes * 20 * 4, rel=0.01)
    gpipe = estimate("llama3-70b", batch=1, seq=1024, pp=4, dp=64, zero=3, microbatches=16, pp_schedule="gpipe")
    # GPipe: every stage holds all 16 micro-batches; the last stage (layers + head and loss) is then the worst
    assert gpipe.pp_stage == 3
    assert gpipe.categories["saved_activations"] == 16 * one.activations.stage_bytes(20, first=False, last=True)


def test_fp32_adamw_measured_with_torch():
    """Pure fp32 AdamW holds 16 bytes per parameter: 4 weight + 4 gradient + 8 (m, v)."""
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    psi = sum(p.numel() for p in model.parameters())
    held = sum(p.nbytes + p.grad.nbytes for p in model.parameters())
    held += sum(v.nbytes for s in opt.state.values() for k, v in s.items() if k != "step")
    assert held == model_state_bytes(psi, precision="fp32", engine="ddp").resident


@pytest.mark.parametrize("name,make", [
    ("adamw", lambda ps: __import__("torch").optim.AdamW(ps)),
    ("adam", lambda ps: __import__("torch").optim.Adam(ps)),
    ("sgd", lambda ps: __import__("torch").optim.SGD(ps, lr=0.1, momentum=0.9)),
    ("sgd-nomomentum", lambda ps: __import__("torch").optim.SGD(ps, lr=0.1)),
])
def test_optimizer_states_and_step_counters_measured_with_torch(name, make):
    """Each optimizer's states as torch holds them after one step, every tensor counted (``step`` included): Adam and
    AdamW keep exp_avg and exp_avg_sq (2 x 4 B per fp32 parameter) plus a 0-d fp32 ``step`` per tensor (4 B); SGD
    with momentum one momentum_buffer (4 B, no step); SGD without momentum nothing."""
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 16))  # 4 tensors
    opt = make(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    psi = sum(p.numel() for p in model.parameters())
    held = sum(v.nbytes for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    st = model_state_bytes(psi, precision="fp32", optimizer=name, engine="ddp", param_tensors=4)
    assert st.optimizer_states == held


def test_lion_keeps_one_state_and_no_step_counter():
    """Lion (Chen et al. 2023) keeps only the momentum: 1 state, 4 B per fp32 parameter; it is not torch's Adam, so no
    per-tensor step counter is counted even with 10 tensors."""
    st = model_state_bytes(1000, precision="fp32", optimizer="lion", engine="ddp", param_tensors=10)
    assert st.optimizer_states == 4 * 1000


@pytest.mark.parametrize("precision,label", [("16psi", "16Ψ:"), ("18psi", "18Ψ:"), ("20psi", "20Ψ:"),
                                             ("fp32", "fp32:")])
def test_each_convention_is_described_by_its_own_bytes(precision, label):
    """The text an estimate carries names its convention's bytes per parameter (the module's table): a swapped or
    garbled description would mislabel every estimate."""
    from coursekit.memory.states import PRECISION_TEXT
    assert model_state_bytes(1e6, precision=precision, engine="ddp").convention.startswith(label)
    assert PRECISION_TEXT[precision].startswith(label)
    assert ("master" in PRECISION_TEXT[precision]) and ("optimizer states" in PRECISION_TEXT[precision])


@pytest.mark.parametrize("kw,needles", [
    ({"precision": "17psi"}, ["unknown precision '17psi'", "16psi"]),  # the field, the bad value, what is allowed
    ({"optimizer": "rmsprop"}, ["unknown optimizer 'rmsprop'", "adamw"]),
    ({"offload": "disk"}, ["unknown offload 'disk'", "nvme"]),
    ({"offload_params": "tape", "zero": 3}, ["unknown offload_params 'tape'", "nvme"]),
    ({"zero": 4}, ["zero stage", "0, 1, 2 or 3", "got 4"]),
    ({"zero": -1}, ["zero stage", "got -1"]),
])
def test_unknown_choices_are_refused_naming_the_bad_value(kw, needles):
    from coursekit.memory.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        model_state_bytes(1e9, **kw)
    for needle in needles:
        assert needle in str(e.value)


@pytest.mark.parametrize("zero,offload", [(0, "none"), (1, "none"), (2, "cpu"), (3, "nvme")])
def test_every_zero_stage_and_offload_target_is_accepted(zero, offload):
    """DeepSpeed's stages 0-3 and the targets none, cpu, nvme are all valid (a typo in a table refuses one)."""
    assert model_state_bytes(1e9, zero=zero, shard=2, offload=offload if zero else "none").parameters > 0


@pytest.mark.parametrize("d0,n", [(10, 4), (10, 3), (2, 4), (5, 4), (12, 4), (1, 1), (7, 8), (0, 3)])
def test_local_rows_are_torch_chunks_split(d0, n):
    """FSDP2 shards dim 0 as torch.chunk does: ceil(d0/n) rows per rank, the last ranks short or empty (torch.chunk
    then returns fewer chunks: the missing ranks hold 0 rows)."""
    import torch
    from coursekit.memory.states import local_rows
    sizes = [len(c) for c in torch.chunk(torch.arange(d0), n)] if d0 else []
    sizes += [0] * (n - len(sizes))
    assert [local_rows(d0, n, r) for r in range(n)] == sizes


def test_replicated_engines_hold_no_offload_buffer_and_resident_sums_categories():
    """DDP offloads nothing: no ZeRO-Offload gradient buffer. ``resident`` is the five GPU categories added (20Ψ:
    2 + 2 + 4 + 8 + 4 B per parameter), the step-only copies and the CPU bytes excluded."""
    st = model_state_bytes(1000, precision="20psi", engine="ddp")
    assert st.offload_buffers == 0 and st.cpu == 0 and st.nvme == 0
    assert (st.parameters, st.gradients, st.master_weights, st.optimizer_states, st.grad_copy) == \
        (2000, 2000, 4000, 8000, 4000)
    assert st.resident == 20 * 1000
