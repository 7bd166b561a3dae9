"""One torchft replica group (one process here): the course's tiny model trained with torchft's wrappers.

    TORCHFT_LIGHTHOUSE=http://localhost:29510 MASTER_ADDR=localhost MASTER_PORT=29600 RANK=0 WORLD_SIZE=1 \\
        python -m coursekit.ft.replica --replica 0 --steps 20 --out r0.jsonl [--kill-at-step 8]

Every step: ``manager`` starts a quorum with the live replica groups (asynchronously, during the forward), the
gradient all-reduce runs over the groups in the quorum (torchft's DDP: a comm hook on its managed gloo process
group), and ``optimizer.step()`` commits only if every group's all-reduce succeeded. A group that joins late
(restarted after a SIGKILL) is behind: the manager copies the model and optimizer state from a peer (``state_dict``
/ ``load_state_dict`` below) and it goes on from the peer's step. One JSON line per committed step goes to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--replica", type=int, required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=0, help="sleep per step (paces the run so a kill lands mid-run)")
    p.add_argument("--kill-at-step", type=int, default=None, help="SIGKILL this process at this step")
    p.add_argument("--timeout-s", type=float, default=10)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    import torch
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    from coursekit.data import make_dataset
    from coursekit.models import build_model
    from coursekit.parallel.api import adamw
    from coursekit.parallel.loss import cross_entropy

    model = build_model("tiny-llama", seed=0)
    opt = adamw(model.parameters(), lr=1e-3)

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    t = timedelta(seconds=a.timeout_s)
    # the group's store (torchrun would host it; one process per group here, so it is its own master)
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=True,
                                       wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=t), min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"coursekit_{a.replica}", timeout=t, quorum_timeout=t,
                      connect_timeout=t)
    ddp = DistributedDataParallel(manager, model)
    optim = Optimizer(manager, opt)
    ds = make_dataset("synthetic", seq_len=a.seq + 1, num_samples=256, seed=a.replica).with_format("torch")["input_ids"]
    out = open(a.out, "a")
    i = 0
    while manager.current_step() < a.steps:
        step = manager.current_step()
        if a.kill_at_step is not None and step == a.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.time()
        time.sleep(a.step_ms / 1000)
        x = torch.stack([ds[(i * a.batch + k) % len(ds)] for k in range(a.batch)]).long()
        i += 1
        optim.zero_grad()
        logits = ddp(input_ids=x[:, :-1]).logits
        loss = cross_entropy(logits, x[:, 1:])
        loss.backward()
        optim.step()  # all-reduce result checked by every group: the step counts only if all succeeded
        committed = manager.current_step() > step
        out.write(json.dumps({"replica": a.replica, "step": step, "committed": committed, "t0": t0,
                              "t1": time.time(), "loss": loss.item(),
                              "participants": manager.num_participants()}) + "\n")
        out.flush()
    manager.shutdown()
    del store
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
