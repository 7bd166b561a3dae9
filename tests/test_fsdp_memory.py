"""Item 3 of Module 3: what every FSDP2 rank holds and sends equals ``coursekit memory --strategy fsdp2``.

Two measurements of one rank of N, in one subprocess (``coursekit.fsdp.memcheck``: FSDP2 over torch's fake process
group, so each rank's tensors have their real shapes): the course's ``state_bytes`` and torch's ``FSDPMemTracker``
(per phase: unsharded units, all-gather and reduce-scatter buffers). Shapes that do not divide: tiny-llama on 3
ranks (64, 32, 176, 256 rows) and an odd-shaped Llama on 4. The live multi-rank runs (held bytes and the counted
collectives of the trainer's measured step) are checked in tests/test_fsdp.py on the runs it already makes.

A third count (memcheck's unit probe, from FSDP2's parameter states) gives what a rank holds of the gathered units
right after forward and at the start of backward: with ``--reshard-after-forward 2`` on 4 ranks each block keeps a
1/2 slice of its gathered copy between forward and backward. QLoRA (NF4 base + LoRA, r=6 on 4 ranks: lora_A's 6 rows
pad to 2 per rank, the last rank has none) is measured the same way against ``coursekit memory --qlora``.
"""
import json
import subprocess
import sys

import pytest

from coursekit.memory import estimate

ODD = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 72, "intermediate_size": 190,
       "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 250,
       "max_position_embeddings": 128, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
# (model, shard degree, rank, reshard after forward, CPU offload, QLoRA adapter rank or None)
CASES = [("tiny-llama", 2, 1, True, False, None), ("tiny-llama", 3, 0, True, False, None),
         ("tiny-llama", 3, 2, True, False, None), ("tiny-llama", 4, 3, False, False, None),
         ("odd", 4, 3, True, False, None), ("odd", 3, 2, False, False, None), ("tiny-llama", 2, 0, True, True, None),
         ("tiny-llama", 4, 1, 2, False, None), ("odd", 4, 3, 2, False, None)]  # reshard to 2 of 4
QLORA_CASES = [("tiny-llama", 4, 3, True, False, 6), ("tiny-llama", 4, 0, True, False, 6)]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return _measure(CASES, tmp_path_factory)


@pytest.fixture(scope="module")
def measured_qlora(tmp_path_factory):
    return _measure(QLORA_CASES, tmp_path_factory)


def _measure(table, tmp_path_factory):
    odd = tmp_path_factory.mktemp("odd") / "config.json"
    odd.write_text(json.dumps(ODD))
    cases = [dict(model=str(odd) if m == "odd" else m, shard=n, rank=r, reshard=rs, offload=off,
                  qlora=None if q is None else {"r": q}) for m, n, r, rs, off, q in table]
    code = ("import json, sys\nfrom coursekit.fsdp.memcheck import measure\n"
            "for c in json.loads(sys.argv[1]):\n    print('RESULT ' + json.dumps(measure(**c)), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(got) == len(cases)
    return list(zip(cases, got))


def predicted(case):
    q = case["qlora"]
    extra = {} if q is None else dict(qlora=True, lora_rank=q["r"], nf4_block=32, nf4_scaler_block=8)
    return estimate(case["model"], micro_batch=2, seq=32, dtype="fp32", precision="fp32", strategy="fsdp2",
                    dp_shard=case["shard"], dp_rank=case["rank"], fsdp_reshard=case["reshard"],
                    offload_params="cpu" if case["offload"] else "none", **extra)


def test_held_states_equal_calculator_per_rank(measured):
    for case, m in measured:
        if case["qlora"]:
            continue  # below, by kind
        e, h = predicted(case), m["held"]
        if case["offload"]:  # CPUOffloadPolicy: all of it on the host, nothing on the accelerator
            assert e.categories["parameters"] == e.categories["gradients"] == e.categories["optimizer_states"] == 0
            assert e.to_dict()["cpu_bytes"] == h["params_bytes"] + h["grads_bytes"] + h["optimizer_bytes"], case
            continue
        got = (h["params_bytes"], h["grads_bytes"], h["optimizer_bytes"])
        want = (e.categories["parameters"], e.categories["gradients"], e.categories["optimizer_states"])
        assert got == want, case
        # the second measurement agrees: torch's tracker sees the same sharded parameters and optimizer states
        assert (m["peak_backward"]["sharded_param"], m["peak_backward"]["optstate"]) == (got[0], got[2]), case


def test_padding_is_what_differs_from_psi_over_n(measured):
    # uneven shards: every rank holds ceil(d0/N) rows of each parameter (more than Ψ/N), the last rank's
    # optimizer states only the rows it really has (fewer)
    by = {(c["model"].endswith("json"), c["shard"], c["rank"]): m for c, m in measured}
    psi = 4 * 125248
    r0, r2 = by[(False, 3, 0)], by[(False, 3, 2)]
    assert r0["held"]["params_bytes"] == r2["held"]["params_bytes"] > psi / 3
    assert r2["held"]["optimizer_bytes"] < r0["held"]["optimizer_bytes"]
    assert r2["held"]["numel"] < 125248 / 3 < r0["held"]["numel"]


def test_unsharded_units_and_buffers_equal_calculator(measured):
    for case, m in measured:
        if case["offload"] or case["qlora"]:
            continue
        e = predicted(case)
        if isinstance(case["reshard"], bool):
            # at the peak of backward: the root (kept from forward) and the block being differentiated, or every
            # unit (the tracker files reshard-to-N's post-forward slices under activations: see the next test)
            assert m["peak_backward"]["unsharded_param"] == e.categories["unsharded_fsdp_units"], case
        # all-gather output and reduce-scatter input of the largest unit (fp32 here), at their largest
        ag, rs = m["max_buffers"]["all_gather"], m["max_buffers"]["reduce_scatter"]
        assert ag == rs and ag + rs == e.categories["communication_buckets"], case


def test_units_after_forward_and_at_backward_start_equal_calculator(measured):
    """What a rank holds of the gathered units, counted from FSDP2's own parameter states: after forward (the root,
    plus every block with no reshard, plus a 1/N slice of every block with reshard to N) and once backward has
    gathered the last block (the other blocks' slices are still there)."""
    for case, m in measured:
        if case["offload"]:
            continue
        e, u = predicted(case), m["units"]
        fu = e.detail["fsdp_units"]
        assert u["after_forward"]["total"] == fu["held_after_forward_bytes"], case
        assert u["start_of_backward"]["total"] == e.categories["unsharded_fsdp_units"], case
        *blocks, root = fu["gathered_bytes"]
        if case["reshard"] is True:
            assert u["after_forward"] == {"gathered": root, "post_forward": 0, "total": root}, case
        elif case["reshard"] == 2:  # half of each gathered block stays; the last is gathered again at backward
            assert u["after_forward"]["post_forward"] == sum(blocks) // 2, case
            assert u["start_of_backward"]["post_forward"] == sum(blocks[:-1]) // 2, case
    reshard2 = [m for c, m in measured if c["reshard"] == 2 and c["model"] == "tiny-llama" and not c["qlora"]]
    full = [m for c, m in measured if c["reshard"] is False and c["shard"] == 4 and not c["qlora"]]
    # between forward and backward: reshard to 2 of 4 holds less than no reshard, more than full reshard
    assert reshard2[0]["units"]["after_forward"]["total"] < full[0]["units"]["after_forward"]["total"]


@pytest.mark.slow  # ~15 s more on 2 idle cores (peft + torchao imports); the 2-rank live run is default-tier
def test_qlora_bytes_by_kind_equal_coursekit_memory(measured_qlora):
    """QLoRA on 4 ranks (coursekit.fsdp.qlora's model over the fake process group): NF4 base, frozen rest, adapters,
    their gradients and AdamW states, and the gathered units, each equal to ``coursekit memory --qlora``'s; the last
    rank holds no lora_A rows (6 rows pad to 2 per rank), so its optimizer states are smaller than rank 0's."""
    opt = {}
    for case, m in measured_qlora:
        e = predicted(case)
        assert m["units"]["start_of_backward"]["total"] == e.categories["unsharded_fsdp_units"], case
        q, k, h = e.detail["qlora"], m["kinds"], m["held"]
        assert (k["nf4_base"], k["rest"], k["adapters"]) == (q["nf4_base"], q["frozen_rest"], q["adapters"]), case
        assert e.categories["parameters"] == sum(k.values()), case
        assert (h["grads_bytes"], h["optimizer_bytes"]) == (e.categories["gradients"],
                                                            e.categories["optimizer_states"]), case
        # the largest all-gather (the root's fp32 embeddings and head) and reduce-scatter (one block's adapters)
        assert m["max_buffers"]["all_gather"] == max(q["unit_gather_bytes"]), case
        assert m["max_buffers"]["reduce_scatter"] == max(q["unit_reduce_bytes"]), case
        opt[case["rank"]] = h["optimizer_bytes"]
    assert opt[3] < opt[0]
