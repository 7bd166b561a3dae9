"""DCP checkpoints of a run: save every K steps, resume from the latest *complete* one.

    ckpt = Checkpointer(dir, info); start = ckpt.resume(strategy) or 0; ...; ckpt.save(strategy, step)

Atomic by construction: every rank writes its shards into ``step-N/`` (``torch.distributed.checkpoint.save``), all
ranks meet at a barrier, and only then rank 0 replaces the one-line marker ``latest`` (write-then-rename). A crash
mid-save leaves ``latest`` pointing at the previous checkpoint, so a half-written folder is never loaded.
"""
from __future__ import annotations

import os
from pathlib import Path


class Checkpointer:
    def __init__(self, ckpt_dir: str | os.PathLike, info, save_every: int = 0):
        self.dir, self.info, self.save_every = Path(ckpt_dir), info, save_every
        self.dir.mkdir(parents=True, exist_ok=True)

    def latest(self) -> int | None:
        f = self.dir / "latest"
        return int(f.read_text()) if f.exists() else None

    def resume(self, strategy) -> int | None:
        """Load the latest complete checkpoint into the strategy; its step, or None when there is none."""
        import torch.distributed.checkpoint as dcp

        last = self.latest()
        if last is None:
            return None
        sd = strategy.state_dict()
        dcp.load(sd, checkpoint_id=str(self.dir / f"step-{last}"))
        strategy.load_state_dict(sd)
        return last

    def due(self, step_done: int) -> bool:
        return bool(self.save_every) and step_done % self.save_every == 0

    def save(self, strategy, step: int) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        dcp.save(strategy.state_dict(), checkpoint_id=str(self.dir / f"step-{step}"))
        dist.barrier()
        if self.info.is_main:  # the marker is written last, so a crash mid-save never points at half a checkpoint
            tmp = self.dir / "latest.tmp"
            tmp.write_text(str(step))
            os.replace(tmp, self.dir / "latest")
        dist.barrier()
