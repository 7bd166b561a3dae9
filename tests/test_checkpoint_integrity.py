"""A checkpoint carries its own integrity (coursekit.train.integrity): a damaged or partial one is refused with one
line naming the file, the newest intact one is loaded instead, the --keep newest are kept, and a resume onto another
world size says so. The folder tests are pure Python (files shaped like DCP's); one real run damages a real shard."""
from __future__ import annotations

import json

import pytest

from coursekit.train import integrity
from coursekit.train.launcher import plan

from parity import LOSS_ATOL, baseline, losses, train


def fake_checkpoint(d, step, *, world=2, manifest=True, marker=True):
    folder = d / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"meta" * 64)
    for r in range(world):
        (folder / f"__{r}_0.distcp").write_bytes(bytes(range(256)) * 64 * (r + 1))
        (folder / f"rng-rank{r}.pt").write_bytes(b"rng" * 100)
    if manifest:
        integrity.write(folder, world_size=world)
    if marker:
        (d / "latest").write_text(str(step))
    return folder


def flip(path, at=None, n=4096):
    data = bytearray(path.read_bytes())
    at = len(data) // 3 if at is None else at
    for i in range(at, min(at + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_an_intact_checkpoint_is_chosen_silently(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    assert integrity.choose(tmp_path) == (4, [])
    assert integrity.manifest(tmp_path / "step-4")["world_size"] == 2
    assert integrity.choose(tmp_path / "nothing-here") == (None, [])


@pytest.mark.parametrize("damage,needle", [
    (lambda f: flip(f / "__1_0.distcp"), "step-4/__1_0.distcp: its SHA-256 differs"),
    (lambda f: (f / "__0_0.distcp").write_bytes((f / "__0_0.distcp").read_bytes()[:100]),
     "step-4/__0_0.distcp: 100 bytes"),
    (lambda f: (f / ".metadata").unlink(), "step-4/.metadata: missing"),
    (lambda f: (f / "rng-rank1.pt").write_bytes(b""), "step-4/rng-rank1.pt: 0 bytes"),
    (lambda f: (f / integrity.MANIFEST).write_text("{not json"), "step-4/checksums.json: missing or unreadable"),
])
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_newest_intact_one_is_used(tmp_path, damage, needle):
    fake_checkpoint(tmp_path, 2)
    damage(fake_checkpoint(tmp_path, 4))
    step, notes = integrity.choose(tmp_path)
    assert step == 2, notes
    assert notes[0].startswith(needle), notes
    assert notes[-1] == "resuming from step-2, the newest intact checkpoint"
    assert integrity.set_aside(tmp_path, 2) == ["step-4 set aside as step-4.damaged"]
    assert integrity.steps(tmp_path) == [2] and (tmp_path / "step-4.damaged").is_dir()


def test_a_flipped_byte_passes_the_size_check_but_not_the_hash(tmp_path):
    flip(fake_checkpoint(tmp_path, 4) / "__0_0.distcp", n=1)
    assert integrity.problem(tmp_path / "step-4", full=False) is None  # what the CLI checks before launching
    assert "SHA-256" in integrity.problem(tmp_path / "step-4")


def test_a_bad_marker_is_named_and_the_newest_intact_checkpoint_used(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 6, marker=False)
    (tmp_path / "latest").write_text("hello\n")
    step, notes = integrity.choose(tmp_path)
    assert step == 6 and notes[0] == "latest: holds 'hello', not a step number", notes


def test_an_unfinished_save_is_skipped_and_an_older_coursekit_checkpoint_loads_unverified(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4, manifest=False, marker=False)  # killed mid-save: no checksums, no marker
    assert integrity.choose(tmp_path) == (2, [])
    legacy = tmp_path / "legacy"
    fake_checkpoint(legacy, 8, manifest=False)  # the marker names it: written before checksums existed
    step, notes = integrity.choose(legacy)
    assert step == 8 and "loaded unverified" in notes[0]


def test_no_intact_checkpoint_is_refused_before_launch(tmp_path):
    for s in (2, 4):
        f = fake_checkpoint(tmp_path, s)
        (f / "__0_0.distcp").write_bytes(b"x")  # truncated: the size check finds it without reading a byte
    step, notes = integrity.choose(tmp_path, full=False)
    assert step is None and notes[-1] == "no intact checkpoint is left" and len(notes) == 3, notes
    with pytest.raises(integrity.CheckpointError, match=r"no intact checkpoint to resume from \(step-4/__0_0"):
        plan(["--strategy", "ddp", "--nproc", "2", "--ckpt-dir", str(tmp_path)])


def test_keep_deletes_all_but_the_newest_checkpoints(tmp_path):
    for s in (1, 2, 3, 4):
        fake_checkpoint(tmp_path, s)
    fake_checkpoint(tmp_path, 5, manifest=False, marker=False)  # a save in flight after the marker's step
    (tmp_path / "latest").write_text("4")
    assert integrity.prune(tmp_path, 2, 4) == [2, 1]
    assert integrity.steps(tmp_path) == [5, 4, 3]
    with pytest.raises(ValueError, match="--keep must be >= 1"):
        plan(["--strategy", "ddp", "--nproc", "2", "--ckpt-dir", str(tmp_path), "--keep", "0"])


def test_a_damaged_shard_falls_back_and_a_resume_onto_fewer_ranks_says_it_reshards(tmp_path, no_orphans):
    """A real run: DDP on 2 ranks saves steps 1-3 (--keep 2 leaves 2 and 3); 4 KiB flipped inside step 3's shard
    (its size unchanged, as a bad disk would); the resume on ONE rank refuses step 3 naming the shard, loads step 2,
    says it reshards from 2 ranks, and then trains exactly as the uninterrupted single-process run."""
    d = tmp_path / "ckpt"
    train("ddp", 2, "--ckpt-dir", d, "--save-every", "1", "--steps", "3", "--keep", "2")
    assert integrity.steps(d) == [3, 2] and (d / "latest").read_text() == "3"
    assert integrity.problem(d / "step-3") is None and integrity.problem(d / "step-2") is None
    shard = max((d / "step-3").glob("*.distcp"), key=lambda p: p.stat().st_size)
    flip(shard)
    rec = train("ddp", 1, "--ckpt-dir", d, "--keep", "2").results[0]
    f = rec["final"]
    assert f["resumed_from_step"] == 2 and f["resharded_from"] == 2
    notes = f["ckpt_notes"]
    assert notes[0] == f"step-3/{shard.name}: its SHA-256 differs from the one saved (damaged bytes)", notes
    assert "resuming from step-2, the newest intact checkpoint" in notes
    assert "step-2 was saved by 2 ranks: resharded onto 1" in notes
    assert [s["step"] for s in rec["steps"]] == [2, 3]
    assert losses(rec) == pytest.approx(losses(baseline())[2:], abs=LOSS_ATOL)
    assert "step-3 set aside as step-3.damaged" in notes and (d / "step-3.damaged" / shard.name).exists()
    assert integrity.steps(d) == [4, 2] and (d / "latest").read_text() == "4"  # --keep 2: the intact ones
    assert json.loads((d / "step-4" / integrity.MANIFEST).read_text())["world_size"] == 1
