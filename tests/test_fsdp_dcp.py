"""DCP checkpoints of FSDP2 runs: async saves (``--async-ckpt``), resharding on resume, a consolidated export.

Default tier: an async (thread) save on 2 FSDP2 ranks, resumed on 3 (a different shard layout, uneven shards), the
resumed losses equal the uninterrupted single-process run; the saved step exported with ``dcp_to_torch_save``
into a plain transformers model gives the uninterrupted run's loss at that step. Slow tier: saved on 4, resumed
on 2 and 3; FSDP2 -> DDP; HSDP -> FSDP2; the process-based async mode.
"""
import pytest
import torch

from parity import COMMON, LOSS_ATOL, STEPS, baseline, losses, train

HALF = STEPS // 2
G6, G12 = ("--global-batch", "6"), ("--global-batch", "12")  # the same global batch before and after a resume


def resumed_equal_base(res, base):
    for r in res.results:
        assert r["final"]["resumed_from_step"] == HALF, r["rank"]
        assert [s["step"] for s in r["steps"]] == list(range(HALF, STEPS))
        assert losses(r) == pytest.approx(losses(base)[HALF:], abs=LOSS_ATOL), r["rank"]


@pytest.fixture(scope="module")
def saved_async(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp-async")
    res = train("fsdp2", 2, *G6, "--steps", HALF, "--save-every", 1, "--ckpt-dir", d, "--async-ckpt", "thread")
    return d, res


def test_async_thread_save_then_resume_on_3(saved_async, no_orphans):
    d, res = saved_async
    for r in res.results:
        f = r["final"]
        assert f["ckpt_async"] == "thread" and f["ckpt_saves"] == HALF and f["ckpt_blocked_s"] > 0
        assert losses(r) == pytest.approx(losses(baseline(*G6))[:HALF], abs=LOSS_ATOL)
    assert (d / "latest").read_text() == str(HALF) and not list(d.glob("*.tmp"))
    resumed_equal_base(train("fsdp2", 3, *G6, "--ckpt-dir", d), baseline(*G6))


def test_consolidated_export_loads_into_plain_transformers(saved_async, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import LlamaForCausalLM

    from coursekit.data import make_dataset, micro_batches
    from coursekit.models import hf_config
    from coursekit.parallel.loss import cross_entropy

    d, _ = saved_async
    out = tmp_path / "model.pt"
    dcp_to_torch_save(str(d / f"step-{HALF}"), str(out))
    sd = torch.load(out, weights_only=False)["model"]
    model = LlamaForCausalLM(hf_config("tiny-llama"))
    model.load_state_dict(sd, strict=True)  # every key of a plain transformers Llama, no more, no less
    seq, g, seed = int(COMMON[COMMON.index("--seq") + 1]), 6, int(COMMON[COMMON.index("--seed") + 1])
    ds = make_dataset("synthetic", seq_len=seq + 1, num_samples=max(256, 4 * g), seed=seed)
    (b,) = micro_batches(ds, HALF, micro_batch=g, grad_accum=1)
    with torch.no_grad():
        loss = cross_entropy(model(input_ids=b.input_ids, position_ids=b.position_ids).logits, b.labels).item()
    assert loss == pytest.approx(losses(baseline(*G6))[HALF], abs=LOSS_ATOL)


@pytest.fixture(scope="module")
def saved_on_4(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp-4")
    train("fsdp2", 4, *G12, "--steps", HALF, "--ckpt-dir", d)
    return d


def _copy(src, tmp_path):
    import shutil

    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("strategy,nproc", [("fsdp2", 2), ("fsdp2", 3), ("ddp", 2)])
def test_saved_on_4_resumes_elsewhere(saved_on_4, strategy, nproc, tmp_path, no_orphans):
    d = _copy(saved_on_4, tmp_path)  # each resume writes its own final checkpoint
    resumed_equal_base(train(strategy, nproc, *G12, "--ckpt-dir", d), baseline(*G12))


@pytest.mark.slow
def test_hsdp_to_fsdp2_and_process_async(tmp_path, no_orphans):
    train("hsdp", 4, "--dp-replicate", 2, "--dp-shard", 2, "--steps", HALF, "--ckpt-dir", tmp_path,
          "--async-ckpt", "process", "--save-every", 1)
    resumed_equal_base(train("fsdp2", 2, "--ckpt-dir", tmp_path), baseline())
