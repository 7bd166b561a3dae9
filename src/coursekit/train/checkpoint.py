"""DCP checkpoints of a run: save every K steps, resume from the latest *complete* one.

    ckpt = Checkpointer(dir, info); start = ckpt.resume(strategy) or 0; ...; ckpt.save(strategy, step)

Each rank also saves its random-number generators (``rng-rank<R>.pt``: they differ per rank, so they are not part of
the DCP state dict), so a resumed run draws what the uninterrupted one would have: losses after a restart are
bit-identical. The data position needs nothing: step s always reads samples [s·G, (s+1)·G).

Atomic by construction: every rank writes its shards into ``step-N/`` (``torch.distributed.checkpoint.save``), all
ranks meet at a barrier, rank 0 records every file's size and SHA-256 (``checksums.json``) and only then replaces the
one-line marker ``latest`` (write-then-rename). A crash mid-save leaves ``latest`` pointing at the previous
checkpoint, so a half-written folder is never loaded; a checkpoint damaged later (flipped bytes, a truncated shard)
is refused on resume, naming the file, and the newest intact one is loaded instead (``coursekit.train.integrity``).
The ``--keep`` newest checkpoints are kept.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from coursekit.train import integrity


class Checkpointer:
    def __init__(self, ckpt_dir: str | os.PathLike, info, save_every: int = 0, async_mode: str = "none",
                 keep: int = 3):
        self.dir, self.info, self.save_every, self.keep = Path(ckpt_dir), info, save_every, keep
        self.dir.mkdir(parents=True, exist_ok=True)
        self.async_mode, self.blocked_s, self._pending, self._group = async_mode, [], None, None
        self.notes: list[str] = []  # what resume refused and why
        self.resharded_from: int | None = None  # the world size a resumed checkpoint was saved by, when not ours
        if async_mode != "none":  # on the default gloo group a background save mixes with training's collectives
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")

    def latest(self) -> int | None:
        return integrity.marker(self.dir)[0]

    def resume(self, strategy) -> int | None:
        """Load the newest intact checkpoint into the strategy; its step, or None when there is none. Rank 0 checks
        the files (``integrity.choose``) and every rank loads what it chose; what was refused is printed and kept in
        ``notes``. A checkpoint of another world size is resharded by DCP, and that is said too."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        from coursekit.parallel import split  # torch: this module stays light for the CLI's pre-launch checks

        pick = [None]
        if self.info.is_main:
            last, notes = integrity.choose(self.dir)
            if notes and last is not None:  # what was refused moves aside (renamed, not deleted), and the marker
                notes = notes + integrity.set_aside(self.dir, last)  # names what is loaded
                self._mark(last)
            pick = [(last, notes)]
        if dist.is_initialized():
            dist.broadcast_object_list(pick, src=0)
        last, self.notes = pick[0]
        saved_by = (integrity.manifest(self.dir / f"step-{last}") or {}).get("world_size") if last is not None else None
        if saved_by is not None and saved_by != self.info.world_size:
            self.resharded_from = saved_by
            self.notes = [*self.notes, f"step-{last} was saved by {saved_by} ranks: resharded onto "
                                       f"{self.info.world_size}"]
        if self.info.is_main:
            for n in self.notes:
                print(f"checkpoint: {n}", file=sys.stderr, flush=True)
        if last is None:
            if self.notes:  # checkpoints were there, none intact: refuse rather than train from scratch over them
                raise integrity.CheckpointError(f"{self.dir}: no intact checkpoint to resume from "
                                                f"({'; '.join(self.notes[:-1]) or self.notes[-1]})")
            return None
        sd = strategy.state_dict()
        step_dir = self.dir / f"step-{last}"
        split.check_slices(dcp.FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata, sd["model"])
        dcp.load(sd, checkpoint_id=str(step_dir))
        strategy.load_state_dict(sd)
        rng = self.dir / f"step-{last}" / f"rng-rank{self.info.rank}.pt"
        if rng.exists():
            set_rng_state(torch_load(rng))
        return last

    def due(self, step_done: int) -> bool:
        return bool(self.save_every) and step_done % self.save_every == 0

    def save(self, strategy, step: int, before_marker=None) -> None:
        """Save ``step``. Sync: returns when the checkpoint is complete. ``--async-ckpt thread|process``: returns once
        the state is staged (copied to host memory); the write finishes in the background while training goes on,
        and its marker is written when the next save (or ``finish``) waits for it, so every rank runs the same steps
        meanwhile. The time the loop is blocked here is kept in ``blocked_s``."""
        import time

        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        self.finish()  # a save still in flight completes (and gets its marker) before the next one starts
        cid = self.dir / f"step-{step}"
        if self.async_mode == "none":
            dcp.save(strategy.state_dict(), checkpoint_id=str(cid))
            fut = None
        else:
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            kind = AsyncCheckpointerType.PROCESS if self.async_mode == "process" else AsyncCheckpointerType.THREAD
            fut = dcp.async_save(strategy.state_dict(), checkpoint_id=str(cid), process_group=self._group,
                                 async_checkpointer_type=kind)
            fut = getattr(fut, "upload_completion", fut)  # an AsyncSaveResponse in some versions
        cid.mkdir(parents=True, exist_ok=True)
        torch_save(rng_state(), cid / f"rng-rank{self.info.rank}.pt")  # this step's generators, not the finish's
        self._pending = (fut, step, before_marker)
        if fut is None:
            self.finish()
        self.blocked_s.append(time.perf_counter() - t0)

    def finish(self) -> None:
        """Wait for the save in flight (if any), then write its marker: all ranks meet, rank 0 renames."""
        import torch.distributed as dist

        if self._pending is None:
            return
        fut, step, before_marker = self._pending
        self._pending = None
        if fut is not None:
            fut.result()
        if before_marker:  # fault injection (--kill-in-save): die with the shards written, no marker yet
            before_marker(step)
        dist.barrier()
        if self.info.is_main:  # checksums, then the marker, last: a crash mid-save never points at half a checkpoint
            integrity.write(self.dir / f"step-{step}", world_size=self.info.world_size)
            self._mark(step)
            integrity.prune(self.dir, self.keep, step)
        dist.barrier()

    def _mark(self, step: int) -> None:
        tmp = self.dir / "latest.tmp"
        tmp.write_text(str(step))
        os.replace(tmp, self.dir / integrity.MARKER)

    def stats(self) -> dict:
        """For the final record: how the loop was blocked by checkpoints (sync vs async)."""
        return {"ckpt_async": self.async_mode, "ckpt_saves": len(self.blocked_s),
                "ckpt_blocked_s": sum(self.blocked_s), "ckpt_blocked_each_s": list(self.blocked_s),
                "ckpt_notes": list(self.notes), "resharded_from": self.resharded_from}


def rng_state() -> dict:
    import random

    import torch

    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    import random

    import torch

    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def torch_save(obj, path) -> None:
    import torch

    tmp = Path(str(path) + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def torch_load(path):
    import torch

    return torch.load(path, weights_only=False)
