"""QLoRA + FSDP2: a frozen NF4 base (torchao) with peft LoRA adapters, sharded by fully_shard per block then root.

In process: the merge check (dequantized base + scaling·B·A equals the LoRA module's forward) and the trainable
parameter count. On 2 gloo ranks (``qlora_run``): the loss goes down; what each rank holds (4-bit data + scalers,
frozen rest, adapters, their gradients and AdamW states) equals ``coursekit memory --strategy fsdp2 --qlora``
(``coursekit.fsdp.qlora.predicted_bytes`` asks the same calculator; tiny-llama: 26,152 B of NF4 base per rank,
where the same weights take 92,160 B in bf16). 4 ranks and uneven adapter shards: tests/test_fsdp_memory.py.
bitsandbytes: GPU only.
"""
import pytest
import torch

from coursekit.fsdp.qlora import TARGETS, lora_params, predicted_bytes, qlora_model
from coursekit.memory.calculator import resolve_model


def test_trainable_count_and_merge_check():
    shape = resolve_model("tiny-llama")
    m = qlora_model("tiny-llama", r=8)
    assert sum(p.numel() for p in m.parameters() if p.requires_grad) == lora_params(shape, 8)
    layer = m.base_model.model.model.layers[0].mlp.gate_proj
    with torch.no_grad():  # a nonzero B (peft starts it at 0) so the merge really adds B·A
        layer.lora_B["default"].weight.normal_()
    x = torch.randn(3, shape.hidden)
    w = layer.base_layer.weight.get_original_weight()  # NF4 dequantized
    s = layer.scaling["default"]
    merged = w + s * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    with torch.no_grad():
        assert torch.allclose(layer(x), x @ merged.T, atol=1e-5)
    assert len(TARGETS) == 7


@pytest.fixture(scope="module")
def qlora_run():
    from coursekit.launch import launch

    return launch("coursekit.fsdp.qlora_run", ["--steps", "4", "--batch", "4"], nproc=2, timeout=600, stream=False)


def coursekit_memory(*argv) -> dict:
    """``coursekit memory ... --json`` in process (its parser and run, as the command line runs them)."""
    from coursekit.memory.cli import build_parser, run

    return run(build_parser().parse_args([*argv, "--json"]))


def test_qlora_fsdp2_trains_and_holds_predicted_bytes(qlora_run, no_orphans):
    assert sorted(r["rank"] for r in qlora_run.results) == [0, 1]
    for r in qlora_run.results:
        rank = r["rank"]
        d = coursekit_memory("--model", "tiny-llama", "--micro-batch", "4", "--seq", "32", "--dtype", "fp32",
                             "--strategy", "fsdp2", "--dp-shard", "2", "--dp-rank", str(rank), "--qlora",
                             "--lora-rank", "8", "--nf4-block", "32", "--nf4-scaler-block", "8")
        q, k, h = d["detail"]["qlora"], r["kinds"], r["held"]
        assert r["losses"][-1] < r["losses"][0]
        assert r["trainable"] == q["trainable_params"]
        assert (k["nf4_base"], k["rest"], k["adapters"]) == (q["nf4_base"], q["frozen_rest"], q["adapters"])
        assert d["parameters_bytes"] == sum(k.values())
        assert (h["grads_bytes"], h["optimizer_bytes"]) == (d["gradients_bytes"], d["optimizer_states_bytes"])
        assert q["nf4_base"] < q["bf16_base_bytes"] / 3  # ~4.5 bits a weight against bf16's 16
        # the library's helper (what the lab prints) against this rank's measured bytes, not against the CLI
        want = predicted_bytes(resolve_model("tiny-llama"), shard=2, rank=rank)
        assert (want["nf4_base"], want["rest"], want["adapters"]) == (k["nf4_base"], k["rest"], k["adapters"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bitsandbytes' FSDP recipe (quant_storage=bf16, "
                    "quant_state copied to every rank) is the GPU path; on CPU FSDP2 shards it only through bnb's "
                    "re-wrap hack (field notes), so the course shows torchao's NF4Tensor there")
def test_bitsandbytes_4bit_gpu_recipe(tmp_path):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from coursekit.models import build_model

    build_model("tiny-llama", seed=0).save_pretrained(tmp_path)
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                           bnb_4bit_quant_storage=torch.bfloat16)
    m = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=q, device_map="cuda")
    x = torch.randint(0, 256, (2, 16), device="cuda")
    assert torch.isfinite(m(input_ids=x).logits).all()
