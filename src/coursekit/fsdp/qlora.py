"""QLoRA + FSDP2 on CPU: a frozen 4-bit NF4 base (torchao ``NF4Tensor``) with trainable LoRA adapters (peft).

    model = qlora_model("tiny-llama", r=8)           # LoRA on q/k/v/o/gate/up/down, base weights -> NF4
    for block in blocks(model): fully_shard(block)    # then fully_shard(model): NF4 data and scalers shard too
    trainable = [p for p in model.parameters() if p.requires_grad]   # only the adapters

torchao's NF4Tensor implements FSDP2's all-gather hooks (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``): each
rank keeps 1/N of the 4-bit data (2 values a byte), of the int8 block scalers and of their fp32 factors; the
gathered weight is dequantized for the matmul. Block sizes must divide: numel % block == 0 and (numel / block) %
scaler_block == 0 (torchao's defaults 64 / 256 fail on tiny shapes; 32 / 8 fit the tiny models), and each inner
tensor must split evenly over N.

The common GPU recipe is bitsandbytes 4-bit (``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")``,
``bnb_4bit_quant_storage=bf16`` so FSDP can flatten it): there FSDP shards only the packed storage, and every rank
keeps the whole ``quant_state`` (absmax scalers); tests/test_fsdp_qlora.py runs it where a GPU is present.

``predicted_bytes`` is what one rank holds (pure Python): the NF4 pieces per quantized weight, the adapters, their
AdamW states and the unquantized rest (embeddings, norms, head), all sharded over N.
"""
from __future__ import annotations

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def qlora_model(model: str = "tiny-llama", *, r: int = 8, alpha: int = 16, block: int = 32, scaler_block: int = 8,
                seed: int = 0):
    import torch
    from peft import LoraConfig, get_peft_model
    from torchao.quantization import to_nf4

    from coursekit.models import build_model

    base = build_model(model, seed=seed)
    torch.manual_seed(seed + 1)
    m = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(TARGETS), lora_dropout=0.0,
                                        bias="none"))
    for name, mod in m.named_modules():
        if hasattr(mod, "base_layer") and isinstance(mod.base_layer, torch.nn.Linear):
            w = mod.base_layer.weight
            mod.base_layer.weight = torch.nn.Parameter(to_nf4(w.detach(), block, scaler_block), requires_grad=False)
    return m


def lora_params(shape, r: int) -> int:
    """Trainable adapter parameters: r·(in + out) per targeted projection per layer."""
    h, f, qw, kw = shape.hidden, shape.ffn, shape.q_width, shape.kv_width
    per_layer = r * ((h + qw) + 2 * (h + kw) + (qw + h) + 2 * (h + f) + (f + h))
    return per_layer * shape.layers


def predicted_bytes(shape, *, shard: int, r: int = 8, block: int = 32, scaler_block: int = 8) -> dict:
    """One rank's bytes (evenly divisible shapes): NF4 base, unquantized rest, adapters, adapter AdamW states."""
    h, f, qw, kw = shape.hidden, shape.ffn, shape.q_width, shape.kv_width
    weights = [h * qw, h * kw, h * kw, qw * h, h * f, h * f, f * h] * shape.layers
    # sharded: 4-bit data, int8 block scalers, fp32 scaler factors; replicated: the fp32 mean and 16-entry table
    nf4 = sum(n // 2 + n // block + 4 * (n // block // scaler_block) for n in weights) // shard + 68 * len(weights)
    rest = shape.num_params() - sum(weights)
    lora = lora_params(shape, r)
    adapters = 4 * lora // shard
    tensors = 2 * len(TARGETS) * shape.layers  # lora_A and lora_B per projection: one fp32 step counter each
    return {"nf4_base": nf4, "rest": 4 * rest // shard, "adapters": adapters,
            "adapter_optimizer": 2 * adapters + 4 * tensors, "trainable_params": lora,
            "bf16_base_bytes": 2 * sum(weights) // shard}
