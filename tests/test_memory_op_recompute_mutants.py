"""``recompute="op"`` (``coursekit.memory.op_recompute``) worked out by hand from its module docstring: which
linears a block keeps (every second mm, every addmm), their bytes, the attention kernel's kept outputs, SP's
reduce-scatters, the weights the policy re-runs (coursekit.flops), and the refusals word for word. The torch
measurements are tests/test_recompute_op.py; these are pure Python, well under a second."""
from __future__ import annotations

import pytest

from coursekit.memory.activations import activation_bytes
from coursekit.memory.errors import ConfigError
from coursekit.memory.op_recompute import _linears, check, layer_terms, recomputed_params
from coursekit.memory.shapes import ModelShape

# h 12, 4 heads of 5 (not 12 / 4: head_dim is read, not derived), 2 K/V heads, FFN 20
DIMS = dict(layers=2, hidden=12, heads=4, kv_heads=2, head_dim=5, ffn=20, vocab=16)
LLAMA = ModelShape(**DIMS)
QWEN2 = ModelShape(**DIMS, family="qwen2", qkv_bias=True)  # bias on q, k, v; none on o
ATTN_BIAS = ModelShape(**DIMS, qkv_bias=True)  # llama's attention_bias: q, k, v and o
MLP_BIAS = ModelShape(**DIMS, mlp_bias=True)
GELU = ModelShape(**DIMS, mlp="gelu")  # fc -> act -> proj
MOE = ModelShape(**DIMS, family="mixtral", experts=4, top_k=2, expert_ffn=7)
GPT2 = ModelShape(layers=2, hidden=12, heads=4, vocab=16, arch="gpt2")

# layer_terms' dimensions: 2-byte activations, 2 sequences of 5 tokens (n = 10), 4 heads of 3, 2 K/V heads, h 5,
# FFN 7; every kept linear output is P·n·width: q 2·10·12 = 240, k and v 2·10·6 = 120, o and down 2·10·5 = 100,
# gate / up / fc 2·10·7 = 140
KW = dict(P=2, n=10, a=4, k=2, d=3, h=5, f=7, batch=2, s=5)
RNG = {"flash": 1000, "efficient": 2000}
INPUT = {"layer_input(checkpoint)": 100}  # P·n·h


@pytest.fixture(autouse=True)
def _uncached():
    """activation_bytes is cached: a report computed before (another test, mutmut's first run) would not call
    layer_terms again."""
    activation_bytes.cache_clear()


def terms(shape, kernel="flash", *, cuda=True, p_attn=0.0, **kw):
    return layer_terms(shape, kernel, **{**KW, **kw}, p_attn=p_attn, cuda=cuda, rng_state=RNG)


def test_a_llama_block_keeps_q_v_gate_down_and_the_flash_outputs():
    # mms q 1, k 2, v 3, o 4, gate 5, up 6, down 7: the odd ones kept; flash on CUDA keeps its output (P·n·a·d =
    # 240) and its fp32 log-sum-exp, one per (sequence, head, query row): 4·2·4·5 = 160
    assert terms(LLAMA) == {**INPUT, "q_proj.out(mm)": 240, "v_proj.out(mm)": 120, "mlp.gate_proj.out(mm)": 140,
                            "mlp.down_proj.out(mm)": 100, "attn.sdpa_out": 240, "attn.logsumexp_fp32": 160}


def test_under_dropout_the_kernels_rng_state_is_kept():
    assert terms(LLAMA, p_attn=0.1)["attn.rng_state"] == 1000
    assert terms(LLAMA, "efficient", p_attn=0.5)["attn.rng_state"] == 2000
    assert "attn.rng_state" not in terms(LLAMA, p_attn=0.0)


def test_the_efficient_kernel_pads_its_log_sum_exp_to_32_rows():
    # rows = ceil(s / 32) · 32: s 5 -> 32, 32 -> 32, 33 -> 64, 64 -> 64; 4 bytes · 2 sequences · 4 heads · rows
    for s, rows in ((5, 32), (32, 32), (33, 64), (64, 64)):
        t = terms(LLAMA, "efficient", s=s, n=2 * s)
        assert t["attn.logsumexp_fp32"] == 4 * 2 * 4 * rows
        assert t["attn.sdpa_out"] == 2 * (2 * s) * 4 * 3
    assert terms(LLAMA, s=33, n=66)["attn.logsumexp_fp32"] == 4 * 2 * 4 * 33  # flash: s rows, unpadded


def test_cpus_flash_kernel_is_not_on_the_list():
    linears = {"q_proj.out(mm)": 240, "v_proj.out(mm)": 120, "mlp.gate_proj.out(mm)": 140,
               "mlp.down_proj.out(mm)": 100}
    assert terms(LLAMA, cuda=False, p_attn=0.1) == {**INPUT, **linears}
    assert terms(LLAMA, "efficient", cuda=False) == {**INPUT, **linears}


def test_eager_and_math_keep_their_bmm_outputs():
    # eager: the scores P·b·a·s·s = 2·2·4·25 = 400 and probs·v P·n·a·d = 240; math: the same in fp32 (800, 480),
    # whatever the device
    linears = {"q_proj.out(mm)": 240, "v_proj.out(mm)": 120, "mlp.gate_proj.out(mm)": 140,
               "mlp.down_proj.out(mm)": 100}
    assert terms(LLAMA, "eager", cuda=False) == {**INPUT, **linears, "attn.scores(bmm)": 400,
                                                 "attn.probs_v(bmm)": 240}
    assert terms(LLAMA, "math") == {**INPUT, **linears, "attn.scores_fp32(bmm)": 800,
                                    "attn.probs_v_fp32(bmm)": 480}
    assert terms(LLAMA, "math", cuda=False, p_attn=0.1) == terms(LLAMA, "math")  # no RNG state kept


def test_sp_keeps_the_reduce_scatter_outputs_of_the_sequence_shard():
    # n_res 5 tokens of the residual stream (n / tp under SP): block input and the two reduce-scatters 2·5·5 = 50
    t = terms(LLAMA, n_res=5, sp=True)
    assert {k: t[k] for k in ("layer_input(checkpoint)", "o_proj.reduce_scatter_out",
                              "mlp.down_proj.reduce_scatter_out")} == {
        "layer_input(checkpoint)": 50, "o_proj.reduce_scatter_out": 50, "mlp.down_proj.reduce_scatter_out": 50}
    assert t["q_proj.out(mm)"] == 240 and t["mlp.down_proj.out(mm)"] == 100  # the mms see all n tokens
    assert terms(LLAMA, n_res=5) == {**terms(LLAMA), "layer_input(checkpoint)": 50}  # without SP: no scatters


def test_an_addmm_is_kept_and_not_counted():
    # qwen2: q, k, v addmm (kept); then o mm 1 (kept), gate 2, up 3 (kept), down 4
    assert terms(QWEN2, "eager", cuda=False) == {
        **INPUT, "q_proj.out(addmm)": 240, "k_proj.out(addmm)": 120, "v_proj.out(addmm)": 120,
        "o_proj.out(mm)": 100, "mlp.up_proj.out(mm)": 140, "attn.scores(bmm)": 400, "attn.probs_v(bmm)": 240}
    # attention_bias: q, k, v, o addmm; gate 1 (kept), up 2, down 3 (kept)
    assert terms(ATTN_BIAS, cuda=False) == {
        **INPUT, "q_proj.out(addmm)": 240, "k_proj.out(addmm)": 120, "v_proj.out(addmm)": 120,
        "o_proj.out(addmm)": 100, "mlp.gate_proj.out(mm)": 140, "mlp.down_proj.out(mm)": 100}
    # mlp_bias: q 1, k 2, v 3, o 4 as llama; gate, up, down addmm
    assert terms(MLP_BIAS, cuda=False) == {
        **INPUT, "q_proj.out(mm)": 240, "v_proj.out(mm)": 120, "mlp.gate_proj.out(addmm)": 140,
        "mlp.up_proj.out(addmm)": 140, "mlp.down_proj.out(addmm)": 100}


def test_a_gelu_mlp_and_a_moe_block():
    # gelu: q 1, k 2, v 3, o 4, fc 5 (kept), proj 6; MoE: the router and experts are not among the mms
    assert terms(GELU, cuda=False) == {**INPUT, "q_proj.out(mm)": 240, "v_proj.out(mm)": 120, "mlp.fc.out(mm)": 140}
    assert terms(MOE, cuda=False) == {**INPUT, "q_proj.out(mm)": 240, "v_proj.out(mm)": 120}


def test_linears_in_block_order_with_their_weights():
    # (name, width, weight elements h·out, biased, kept) with a 4, k 2, d 3, h 5, f 7
    dims = dict(a=4, k=2, d=3, h=5, f=7)
    attn = [("q_proj", 12, 60, False, True), ("k_proj", 6, 30, False, False), ("v_proj", 6, 30, False, True),
            ("o_proj", 5, 60, False, False)]
    assert _linears(LLAMA, **dims) == attn + [("mlp.gate_proj", 7, 35, False, True),
                                              ("mlp.up_proj", 7, 35, False, False),
                                              ("mlp.down_proj", 5, 35, False, True)]
    assert _linears(GELU, **dims) == attn + [("mlp.fc", 7, 35, False, True), ("mlp.proj", 5, 35, False, False)]
    assert _linears(MOE, **dims) == attn
    assert [r[3:] for r in _linears(QWEN2, **dims)] == [(True, True)] * 3 + [
        (False, True), (False, False), (False, True), (False, False)]
    assert [r[3:] for r in _linears(ATTN_BIAS, **dims)] == [(True, True)] * 4 + [
        (False, True), (False, False), (False, True)]
    assert [r[3:] for r in _linears(MLP_BIAS, **dims)] == [
        (False, True), (False, False), (False, True), (False, False)] + [(True, True)] * 3


def test_recomputed_params_are_the_weights_of_the_mms_not_kept():
    # h 12, a 4, k 2, d 5, f 20: k 12·2·5 = 120, o 4·5·12 = 240, up / gate / down / proj 12·20 = 240
    assert recomputed_params(LLAMA) == 120 + 240 + 240  # k, o, up
    assert recomputed_params(QWEN2) == 240 + 240  # gate, down
    assert recomputed_params(ATTN_BIAS) == 240  # up
    assert recomputed_params(MLP_BIAS) == 120 + 240  # k, o
    assert recomputed_params(GELU) == 120 + 240 + 240  # k, o, proj
    # MoE: k, o, the router 12·4 = 48, and top_k 2 experts of 3·12·7 = 252 each
    assert recomputed_params(MOE) == 120 + 240 + 48 + 2 * 252


def test_op_is_refused_where_not_modelled_word_for_word():
    with pytest.raises(ConfigError, match=r"^recompute 'op' is modelled for Llama-style blocks, not 'gpt2' "
                                          r"\(GPT-2's Conv1D runs addmm\)$"):
        check(GPT2, tp=1, cp=1, ep=1)
    refused = (r"^recompute 'op' is modelled without cp or ep, and under tp for dense blocks only \(the policy keeps "
               r"the all-to-alls' outputs there\)$")
    for shape, kw in ((LLAMA, dict(tp=1, cp=2, ep=1)), (MOE, dict(tp=1, cp=1, ep=2)), (MOE, dict(tp=2, cp=1, ep=1))):
        with pytest.raises(ConfigError, match=refused):
            check(shape, **kw)
    assert check(LLAMA, tp=8, cp=1, ep=1) is None  # dense under TP
    assert check(MOE, tp=1, cp=1, ep=1) is None
    assert check(QWEN2, tp=1, cp=1, ep=1) is None


def test_activation_bytes_under_tp_and_sp_by_hand():
    # bf16 (P 2) on CUDA: flash; tp 2: a 2, k 1, f 10; 2 sequences of 6 tokens: n 12, SP n_res 6 (h 12, d 5)
    r = activation_bytes(LLAMA, 2, 6, recompute="op", tp=2, sp=True)
    assert r.attention_kernel == "flash"
    assert r.per_layer == {
        "layer_input(checkpoint)": 2 * 6 * 12, "o_proj.reduce_scatter_out": 2 * 6 * 12,
        "mlp.down_proj.reduce_scatter_out": 2 * 6 * 12,
        "q_proj.out(mm)": 2 * 12 * 10, "v_proj.out(mm)": 2 * 12 * 5, "mlp.gate_proj.out(mm)": 2 * 12 * 10,
        "mlp.down_proj.out(mm)": 2 * 12 * 12, "attn.sdpa_out": 2 * 12 * 10, "attn.logsumexp_fp32": 4 * 2 * 2 * 6}
