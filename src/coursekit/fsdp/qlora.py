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

``predicted_bytes`` is what one rank holds, from the calculator itself (``coursekit memory --strategy fsdp2 --qlora
--lora-rank r --nf4-block 32 --nf4-scaler-block 8``; the byte model is ``coursekit.memory.qlora``): the NF4 pieces
per quantized weight, the adapters, their gradients and AdamW states, the unquantized rest (embeddings, norms, head).
"""
from __future__ import annotations

from coursekit.memory.qlora import TARGETS, lora_params  # noqa: F401 (the calculator's, re-exported)


def qlora_model(model: str = "tiny-llama", *, r: int = 8, alpha: int = 16, block: int = 32, scaler_block: int = 8,
                targets=TARGETS, seed: int = 0):
    """Every block projection quantized to NF4 (frozen), LoRA adapters of rank ``r`` on ``targets``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torchao.quantization import to_nf4

    from coursekit.models import blocks, build_model

    base = build_model(model, seed=seed)
    torch.manual_seed(seed + 1)
    m = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                                        bias="none"))
    for layer in blocks(m.base_model.model):
        for name, mod in layer.named_modules():
            lin = mod.base_layer if hasattr(mod, "base_layer") else mod
            if name.rsplit(".", 1)[-1] in TARGETS and isinstance(lin, torch.nn.Linear):
                w = lin.weight.detach()
                lin.weight = torch.nn.Parameter(to_nf4(w, block, scaler_block), requires_grad=False)
    return m


def predicted_bytes(shape, *, shard: int, r: int = 8, block: int = 32, scaler_block: int = 8, targets=TARGETS,
                    rank: int = 0) -> dict:
    """One rank's bytes from ``coursekit memory --qlora`` (fp32 adapters and rest, AdamW): NF4 base, unquantized
    rest, adapters, their gradients and optimizer states, the gathered unit sizes."""
    from coursekit.memory import estimate

    e = estimate(shape, micro_batch=1, seq=8, dtype="fp32", precision="fp32", strategy="fsdp2", dp_shard=shard,
                 dp_rank=rank, qlora=True, lora_rank=r, lora_targets=tuple(targets), nf4_block=block,
                 nf4_scaler_block=scaler_block)
    q = dict(e.detail["qlora"])
    q["rest"] = q.pop("frozen_rest")
    q["categories"] = {k: e.categories[k] for k in ("parameters", "gradients", "optimizer_states",
                                                    "unsharded_fsdp_units", "communication_buckets")}
    return q
