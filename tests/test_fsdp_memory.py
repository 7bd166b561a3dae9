"""Item 3 of Module 3: what every FSDP2 rank holds and sends equals ``coursekit memory --strategy fsdp2``.

Two measurements of one rank of N, in one subprocess (``coursekit.fsdp.memcheck``: FSDP2 over torch's fake process
group, so each rank's tensors have their real shapes): the course's ``state_bytes`` and torch's ``FSDPMemTracker``
(per phase: unsharded units, all-gather and reduce-scatter buffers). Shapes that do not divide: tiny-llama on 3
ranks (64, 32, 176, 256 rows) and an odd-shaped Llama on 4. The live multi-rank runs (held bytes and the counted
collectives of the trainer's measured step) are checked in tests/test_fsdp.py on the runs it already makes.
"""
import json
import subprocess
import sys

import pytest

from coursekit.memory import estimate

ODD = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 72, "intermediate_size": 190,
       "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 250,
       "max_position_embeddings": 128, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
# (model, shard degree, rank, reshard after forward, CPU offload)
CASES = [("tiny-llama", 2, 1, True, False), ("tiny-llama", 3, 0, True, False), ("tiny-llama", 3, 2, True, False),
         ("tiny-llama", 4, 3, False, False), ("odd", 4, 3, True, False), ("odd", 3, 2, False, False),
         ("tiny-llama", 2, 0, True, True)]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    odd = tmp_path_factory.mktemp("odd") / "config.json"
    odd.write_text(json.dumps(ODD))
    cases = [dict(model=str(odd) if m == "odd" else m, shard=n, rank=r, reshard=rs, offload=off)
             for m, n, r, rs, off in CASES]
    code = ("import json, sys\nfrom coursekit.fsdp.memcheck import measure\n"
            "for c in json.loads(sys.argv[1]):\n    print('RESULT ' + json.dumps(measure(**c)), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(got) == len(cases)
    return list(zip(cases, got))


def predicted(case):
    return estimate(case["model"], micro_batch=2, seq=32, dtype="fp32", precision="fp32", strategy="fsdp2",
                    dp_shard=case["shard"], dp_rank=case["rank"], fsdp_reshard=case["reshard"],
                    offload_params="cpu" if case["offload"] else "none")


def test_held_states_equal_calculator_per_rank(measured):
    for case, m in measured:
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
        if case["offload"]:
            continue
        e = predicted(case)
        # at the peak of backward: the root (kept from forward) and the block being differentiated, or every unit
        assert m["peak_backward"]["unsharded_param"] == e.categories["unsharded_fsdp_units"], case
        # all-gather output and reduce-scatter input of the largest unit (fp32 here), at their largest
        ag, rs = m["max_buffers"]["all_gather"], m["max_buffers"]["reduce_scatter"]
        assert ag == rs and ag + rs == e.categories["communication_buckets"], case
