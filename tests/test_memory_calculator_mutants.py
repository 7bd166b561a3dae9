"""The calculator's sums (``coursekit.memory.calculator``): with a stub engine and a stub Megatron split whose
every quantity is its own power of two, each category and each phase of ``estimate`` is the sum its module
docstring states, worked out here by hand; its refusals and notes word for word; how a model is found. Where
bench/bench_mutation.py found no test. Pure Python, well under a second."""
from __future__ import annotations

import json
import re

import pytest

from coursekit.memory import calculator, engines
from coursekit.memory.activations import ActivationReport
from coursekit.memory.calculator import estimate, resolve_model
from coursekit.memory.engines import megatron
from coursekit.memory.engines.base import Engine
from coursekit.memory.engines.megatron import Stage
from coursekit.memory.errors import ConfigError
from coursekit.memory.shapes import ModelShape
from coursekit.memory.states import StateBytes
from coursekit.memory.train_config import TrainConfig

SHAPE = ModelShape(layers=4, hidden=4, heads=2, vocab=10, ffn=6, max_positions=16, name="tiny")
ACTS = ActivationReport(per_layer={"x": 3}, embed={"e": 5}, shared={"r": 7}, head={"h": 11}, layers=4,
                        attention_kernel="flash", notes=("the activations' note",))
# parameters 1, gradients 2, master 4, optimizer 8, fp32 grad copy 16, step copy 32, temporaries 64, the offload
# staging buffer 128; units at the start 256 and the end 512; buckets 1024 (backward) and 2048 (step); saved
# activations 8192, loss buffers 16384, recompute working set 32768; runtime 4096
STATES = StateBytes(1, 2, 4, 8, 16, 32, 64, 9, 11, "stub convention", offload_buffers=128)


class Stub(Engine):
    name = "stub"
    autocast = True
    seen: list = []

    def states(self, shape, c, stage):
        return STATES, 1

    def units(self, c, P, stage):
        self.seen.append(("units", P))
        return {"start": 256, "end": 512, "largest": 7}

    def buckets(self, c, P, params, largest_unit):
        self.seen.append(("buckets", P, params, largest_unit))
        return 1024, 2048

    def notes(self, c):
        return ["the engine's note"]

    def detail(self, shape, c):
        return {"stub": 1}


TWO = [Stage(0, 2, True, False, 100, 50, 0, 5, 1), Stage(1, 2, False, True, 100, 0, 30, 5, 1)]


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setitem(engines.REGISTRY, "stub", Stub())
    Stub.seen = []
    calls = []

    def saved(acts, stage, c=None, shape=None, graph_only=False):
        calls.append((acts is ACTS, c is not None, shape is SHAPE))
        return 8192

    monkeypatch.setattr(megatron, "activations", lambda shape, c: (ACTS, 32768))
    monkeypatch.setattr(megatron, "saved_bytes", saved)
    monkeypatch.setattr(megatron, "logits_bytes", lambda shape, c, stage: 16384)
    monkeypatch.setattr(megatron, "stages", lambda shape, c: TWO)  # two stages alike: the first is reported
    monkeypatch.setattr(megatron, "per_stage", lambda shape, c, acts: [{"stage": 0}])
    return calls


def config(**kw):
    return TrainConfig(**{"batch": 1, "seq": 8, "engine": "stub", "runtime_bytes": 4096, "precision": "18psi", **kw})


def test_every_category_and_phase_is_the_stated_sum(stubbed):
    """Catches a term added with the wrong sign, left out, or put in the wrong category or phase.
    Model states: 1 + 4 + 8 + 16 + runtime 4096 = 4125. Buckets: backward 1024 + staging 128 = 1152, step 2048 + 128
    = 2176. start_of_backward: states + saved 8192 + max(loss 16384, recompute 32768) + units 256 + 1152 = 46493 (one
    micro-batch: no gradients yet); end_of_backward: states + gradients 2 + the end's unit 512 + 1152 = 5791;
    optimizer_step: states + 2 + step copy 32 + temporaries 64 + 2176 = 6399."""
    e = estimate(SHAPE, config())
    assert e.categories == {"parameters": 1, "gradients": 2, "master_weights": 4, "optimizer_states": 8,
                            "grad_copy": 16, "step_grad_copy": 32, "optimizer_temporaries": 64,
                            "saved_activations": 8192, "logits_loss": 16384, "communication_buckets": 2176,
                            "unsharded_fsdp_units": 256, "recompute_working": 32768, "runtime": 4096}
    assert e.phases == {"start_of_backward": 46493, "end_of_backward": 5791, "optimizer_step": 6399}
    assert (e.pp_stage, e.dp_rank, e.cpu_bytes, e.nvme_bytes, e.convention) == (0, 1, 9, 11, "stub convention")
    assert (e.model, e.num_params, e.params_per_tp_pp_rank) == ("tiny", SHAPE.num_params(), 2 * 100 + 50)
    assert e.detail == {"stub": 1} and e.pp_stages == [{"stage": 0}]
    # the engine is asked in the parameters' bytes (18Ψ: 2, not the gradients' 4), about the stage's parameters
    assert Stub.seen[:2] == [("units", 2), ("buckets", 2, 250, 7)]
    assert stubbed[0] == (True, True, True)  # saved_bytes gets the report, the configuration and the shape
    # two micro-batches: the gradients are there at the start of backward already
    assert estimate(SHAPE, config(microbatches=2)).phases["start_of_backward"] == 46493 + 2


def test_the_loss_buffers_count_where_they_are_larger(stubbed, monkeypatch):
    """Catches max(loss, recompute) turned into one of them: with no recompute working set the loss buffers count."""
    monkeypatch.setattr(megatron, "activations", lambda shape, c: (ACTS, 0))
    assert estimate(SHAPE, config()).phases["start_of_backward"] == 4125 + 8192 + 16384 + 256 + 1152


def test_to_dict_and_json_whole(stubbed):
    """Catches a key renamed or a value from the wrong field in the JSON the CLI prints."""
    e = estimate(SHAPE, config())
    d, j = e.to_dict(), json.loads(e.to_json())
    assert json.loads(e.to_json(indent=1)) == j and "\n " in e.to_json(indent=1)
    c, jc = d.pop("config"), j.pop("config")
    assert c == e.config.to_dict() and jc == {k: list(v) if isinstance(v, tuple) else v for k, v in c.items()}
    assert d == j
    want = {"model": "tiny", "num_params": SHAPE.num_params(), "params_per_tp_pp_rank": 250,
            "convention": "stub convention", "activation_profile": "hf-cuda", "attention_kernel": "flash",
            "activations_bytes": 3 * 4 + 5 + 7 + 11,
            **{f"{k}_bytes": v for k, v in e.categories.items()},
            "peak_bytes": 46493, "peak_phase": "start_of_backward", "phases": dict(e.phases), "pp_stage": 0,
            "dp_rank": 1, "cpu_bytes": 9, "nvme_bytes": 11, "gpu": None, "gpu_memory_bytes": None, "fits": None,
            "activation_terms": {"per_layer": {"x": 3}, "layers": 4, "embed": {"e": 5}, "shared": {"r": 7},
                                 "head": {"h": 11}},
            "notes": list(e.notes), "pp_stages": [{"stage": 0}], "detail": {"stub": 1}}
    assert d == want
    assert estimate(SHAPE, config(impl="fused")).to_dict()["activation_profile"] == "fused"
    assert estimate(SHAPE, config(kernels="cpu")).to_dict()["activation_profile"] == "hf-cpu"


def test_notes_word_for_word(stubbed):
    """Catches a note lost, given where it does not apply, or reworded: the activations', a RoPE model run past its
    max_position_embeddings (16 here; 16 itself is fine), the engine's, autocast, the hf-cuda profile."""
    assert estimate(SHAPE, config(seq=16)).notes == [
        "the activations' note", "the engine's note",
        "hf-cuda activation profile is modelled from CUDA kernel signatures (measured profile: hf-cpu)"]
    assert estimate(SHAPE, config(seq=32, precision="fp32", kernels="cpu")).notes == [
        "the activations' note", "seq 32 exceeds the model's max_position_embeddings (16)", "the engine's note",
        "autocast (fp32 weights, bf16 compute): model states as held; saved activations are a bf16 model's, below "
        "autocast's (it also saves fp32 norm tensors and the bf16 weight copies its matmuls use: 1.5x on "
        "tiny-llama, measured on CPU)"]
    assert estimate(SHAPE, config(impl="fused", dtype="fp32", precision="fp32")).notes == [
        "the activations' note", "the engine's note"]


def whole(message):
    return "^" + re.escape(message) + "$"


MOE = ModelShape(layers=4, hidden=8, heads=2, vocab=16, ffn=8, family="mixtral", experts=4, name="moe")


@pytest.mark.parametrize("model,kw,message", [
    (SHAPE, dict(engine="fsdp2", dp=2, ep=2), "ep 2 needs a mixture-of-experts model; tiny (llama) is dense"),
    (MOE, dict(engine="fsdp2", dp=3, ep=3), "ep (3) does not divide the 4 experts of moe"),
    (SHAPE, dict(pp=5), "pp (5) exceeds the number of layers (4)"),
    (SHAPE, dict(pp=3, pp_schedule="interleaved-1f1b"),
     "interleaved-1f1b keeps 2 stages per rank: pp x 2 = 6 exceeds the 4 layers"),
])
def test_refusals_word_for_word(model, kw, message):
    with pytest.raises(ConfigError, match=whole(message)):
        estimate(model, TrainConfig(batch=1, seq=8, **kw))


def test_the_limits_themselves_are_accepted():
    """Catches > turned into >=: 4 stages of 4 layers, 2 x 2 interleaved stages of 4 layers, ep 2 dividing 4
    experts are all fine."""
    assert estimate(SHAPE, TrainConfig(batch=1, seq=8, pp=4)).config.pp == 4
    assert estimate(SHAPE, TrainConfig(batch=1, seq=8, pp=2, pp_schedule="interleaved-1f1b")).config.pp == 2
    assert estimate(MOE, TrainConfig(batch=1, seq=8, engine="fsdp2", dp=2, ep=2)).config.ep == 2


def test_a_config_and_keywords_together_are_refused():
    with pytest.raises(ConfigError, match=whole("give either a TrainConfig or keyword arguments, not both")):
        estimate(SHAPE, TrainConfig(batch=1, seq=8), batch=2)


def test_a_run_description_with_the_calculators_own_knobs():
    """Catches the run description or the knobs lost: the run's micro-batch and sequence, the knob's kernels."""
    from coursekit.spec.runspec import RunSpec

    spec = RunSpec(model="tiny-llama", micro_batch=2, seq=32)
    e = estimate(spec)
    assert (e.model, e.config.batch, e.config.seq) == ("tiny-llama", 2, 32)
    e = estimate("tiny-llama", spec, kernels="cpu")
    assert (e.config.batch, e.config.kernels) == (2, "cpu")


LLAMA_CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4, "num_attention_heads": 2,
                "intermediate_size": 6, "vocab_size": 10}


def test_resolve_model_from_each_kind_of_source(tmp_path):
    """Catches a source not read, or read from the wrong path: a dict, a config.json, any existing file, a model
    directory holding config.json (named after the directory), a missing .json path (its own error), a bad type."""
    assert resolve_model(LLAMA_CONFIG).layers == 2 and resolve_model(SHAPE) is SHAPE
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (d / "model.cfg").write_text(json.dumps(LLAMA_CONFIG))
    assert resolve_model(d / "config.json").name == "my-model"
    assert resolve_model(str(d / "model.cfg")).name == "my-model"
    assert resolve_model(d).name == "my-model" and resolve_model(str(d)).hidden == 4
    assert resolve_model("tiny-llama").name == "tiny-llama"
    with pytest.raises(ConfigError, match=whole(f"no such config file: {tmp_path / 'missing.json'}")):
        resolve_model(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="^unknown model preset 'nope'; known: "):
        resolve_model("nope")
    with pytest.raises(ConfigError, match=whole("model must be a preset name, a config.json path, a dict or a "
                                                "ModelShape, got 3")):
        resolve_model(3)


def test_table_line_by_line(stubbed):
    """Catches a label, a column width, a unit or a line of the printed table changed. The stub's bytes are far
    below a MiB, so every GiB column reads 0.000 (10 wide, 3 decimals); Ψ of the shape: 4 layers x 144 + embedding
    40 + final norm 4 + head 40 = 660."""
    zero = "     0.000"
    e = estimate(SHAPE, config(gpu="H100-80GB"))
    cats = ["parameters", "gradients", "master_weights", "optimizer_states", "grad_copy", "step_grad_copy",
            "optimizer_temporaries", "saved_activations", "logits_loss", "communication_buckets",
            "unsharded_fsdp_units", "recompute_working", "runtime"]
    assert e.table().split("\n") == [
        "tiny: 660 params, 250 on this TP/PP rank (pp stage 0) before ZeRO/FSDP sharding",
        "b=1 s=8 bf16 sdpa/flash impl=hf-cuda recompute=none | dp=1 stub zero=0 tp=1 pp=1 cp=1 | stub convention",
        "category" + " " * 18 + "       GiB",
        *[k.ljust(26) + zero for k in cats],
        "activations (1 micro-batch)" + zero,
        "phase start_of_backward   " + zero + "  <- peak",
        "phase end_of_backward     " + zero,
        "phase optimizer_step      " + zero,
        "CPU / NVMe                " + zero + zero,
        "H100-80GB (80.0 GiB): fits",
        "note: the activations' note", "note: the engine's note",
        "note: hf-cuda activation profile is modelled from CUDA kernel signatures (measured profile: hf-cpu)"]
    assert e.fits is True and e.gpu == "H100-80GB" and e.gpu_memory_bytes == 80 * 2**30
