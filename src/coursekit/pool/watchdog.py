"""A pool's keeper: when the kernel that made a pool dies without closing it (SIGKILL, a crash, the OOM killer),
stop every process of that pool — the controller and every rank carry the pool's launch stamp.

    python -m coursekit.pool.watchdog LAUNCH_ID KERNEL_PID      # started by Pool, a child of the kernel

``Pool.close`` stops it with the rest (it carries the stamp too); on its own it only waits: it polls its parent and
when the kernel is gone (the watchdog re-parented) it reaps the stamp (``coursekit.launch.reap``) and exits.
"""
from __future__ import annotations

import os
import sys
import time

from coursekit.launch import reap

POLL_S = 0.5


def main(argv=None) -> int:
    launch_id, kernel = (sys.argv[1:] if argv is None else argv)[:2]
    while os.getppid() == int(kernel):
        time.sleep(POLL_S)
    reap(launch_id, grace_s=2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
