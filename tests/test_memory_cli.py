"""The `coursekit memory` command contract (run as `python -m coursekit.memory`), and the no-torch promise."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from coursekit.memory.cli import main

CATEGORY_FIELDS = ("parameters_bytes", "gradients_bytes", "master_weights_bytes", "optimizer_states_bytes",
                   "saved_activations_bytes", "logits_loss_bytes", "communication_buckets_bytes",
                   "unsharded_fsdp_units_bytes", "runtime_bytes")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coursekit.memory", *args], capture_output=True, text=True,
                          timeout=60)


def test_json_contract_and_measured_activations():
    r = run_cli("--model", "tiny-llama", "--batch", "2", "--seq", "48", "--kernels", "cpu", "--dp", "2",
                "--zero", "2", "--gpu", "H100-80GB", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in CATEGORY_FIELDS + ("activations_bytes", "peak_bytes", "phases", "peak_phase", "cpu_bytes",
                                "nvme_bytes", "convention"):
        assert k in d, k
    assert d["peak_bytes"] == max(d["phases"].values()) and d["fits"] is True
    assert "16Ψ" in d["convention"]
    # activations_bytes is the saved-for-backward bytes of a real forward pass of that model on the CPU
    import torch
    import transformers
    from coursekit.measure.activations import saved_activation_bytes
    from coursekit.memory import preset, to_hf_config_dict
    cfg = to_hf_config_dict(preset("tiny-llama"))
    cfg.pop("model_type")
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**cfg), dtype=torch.bfloat16,
                                                           attn_implementation="sdpa").train()
    ids = torch.randint(0, 256, (2, 48))
    measured = saved_activation_bytes(model, ids, labels=ids)["total_bytes"]
    assert d["activations_bytes"] == measured  # to the byte, like test_memory_activations


def test_config_json_path_and_solver(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                                "vocab_size": 50257, "n_positions": 1024}))
    r = run_cli("--model", str(path), "--batch", "4", "--seq", "1024", "--attention", "eager", "--json")
    assert r.returncode == 0, r.stderr
    from coursekit.memory import preset
    assert json.loads(r.stdout)["num_params"] == preset("gpt2").num_params()  # checked on the meta device
    r = run_cli("--model", "llama3-8b", "--seq", "4096", "--dp", "8", "--zero", "3", "--gpu", "H100-80GB",
                "--solve", "max-batch", "--json")
    d = json.loads(r.stdout)
    assert d["solution"]["max_batch"] == d["config"]["batch"] and d["fits"]


@pytest.mark.parametrize("args,message", [
    (["--model", "llama3-8b", "--batch", "1", "--seq", "1024", "--tp", "3"], "must divide heads"),
    (["--model", "nope", "--batch", "1", "--seq", "1024"], "unknown model preset"),
    (["--model", "llama3-8b", "--batch", "0", "--seq", "1024"], "batch must be > 0"),
    (["--model", "llama3-8b", "--seq", "1024"], "--batch is required"),
    (["--model", "llama3-8b", "--batch", "1", "--seq", "1024", "--world", "6", "--tp", "4"], "not divisible"),
    (["--model", "llama3-8b", "--batch", "1", "--seq", "1024", "--dp", "4", "--zero", "2", "--dp-rank", "4"],
     "dp_rank (4) must be below the sharding degree (4)"),
    (["--model", "llama3-8b", "--seq", "1024", "--batch", "1", "--zero", "3", "--gpu", "H100-80GB", "--solve",
      "min-gpus", "--dp-rank", "3"], "--dp-rank does not combine with --solve min-gpus"),
])
def test_errors_exit_2(args, message, capsys):
    assert main(args + ["--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_table_output(capsys):
    assert main(["--model", "gpt2", "--batch", "8", "--seq", "1024", "--gpu", "A100-40GB"]) == 0
    out = capsys.readouterr().out
    assert "phase start_of_backward" in out and "A100-40GB" in out


def test_memory_package_imports_no_torch():
    code = ("import sys, coursekit.memory, coursekit.memory.cli, coursekit.memory.solvers, coursekit.flops; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_fsdp2_reshard_to_n_and_qlora_flags(capsys):
    """``--reshard-after-forward N`` and ``--qlora`` reach the fsdp2 engine (measured against live FSDP2 in
    tests/test_fsdp_memory.py and tests/test_fsdp_qlora.py); what they cannot mean is refused with the reason."""
    base = ["--model", "tiny-llama", "--micro-batch", "2", "--seq", "32", "--dtype", "fp32", "--strategy", "fsdp2",
            "--dp-shard", "4", "--json"]

    def out(*extra):
        assert main([*base, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    full, two, four, none = (out("--reshard-after-forward", v) for v in ("true", "2", "4", "false"))
    assert four == full  # N = the shard degree is reshard_after_forward=True, as torch reads it
    held = [d["detail"]["fsdp_units"]["held_after_forward_bytes"] for d in (full, two, none)]
    assert held[0] < held[1] < held[2]  # between forward and backward: root only < root + 1/2 of each block < all
    assert full["parameters_bytes"] == two["parameters_bytes"]  # the shards themselves do not change
    q = out("--qlora", "--lora-rank", "4", "--lora-targets", "q_proj,v_proj", "--nf4-block", "32",
            "--nf4-scaler-block", "8")["detail"]["qlora"]
    assert q["trainable_params"] == 2 * 4 * ((64 + 64) + (64 + 32))  # 2 layers, r·(in + out) on q and v
    for extra, msg in [(("--reshard-after-forward", "3"), "must divide the 4 sharding ranks"),
                       (("--qlora",), "NF4 block sizes must divide"),  # torchao's defaults 64 / 256 on 64x64
                       (("--lora-rank", "4"), "set qlora"),
                       (("--qlora", "--nf4-block", "32", "--nf4-scaler-block", "8", "--reshard-after-forward", "2"),
                        "FSDP2 refuses it"),
                       (("--qlora", "--nf4-block", "32", "--nf4-scaler-block", "8", "--lora-targets", "c_attn"),
                        "lora targets must be among")]:
        assert main([*base, *extra]) == 2
        assert msg in capsys.readouterr().err, extra


def test_fp8_is_sized_as_bf16_and_compile_as_eager_each_saying_so(capsys):
    """``--dtype fp8`` / ``--compile`` (the planner's names): the same bytes as the bf16 eager run, plus a note each."""
    base = ["--model", "llama3-8b", "--micro-batch", "1", "--seq", "4096", "--json"]
    out = {}
    for extra in ([], ["--dtype", "fp8"], ["--compile"]):
        assert main(base + extra) == 0
        out[" ".join(extra)] = json.loads(capsys.readouterr().out)
    plain, fp8, comp = out[""], out["--dtype fp8"], out["--compile"]
    assert fp8["peak_bytes"] == comp["peak_bytes"] == plain["peak_bytes"]
    assert fp8["config"]["dtype"] == "bf16"
    assert any(n.startswith("fp8: sized as bf16") for n in fp8["notes"])
    assert any("sized as eager" in n for n in comp["notes"]) and not any("sized as eager" in n for n in plain["notes"])
