"""Fault tolerance without a restart (torchft, Module 5 item 6): two replica groups over gloo, one SIGKILLed; the
survivor goes on after torchft's timeout without recomputing a step; the restarted group heals from its peer (it
resumes at the peer's step, not a checkpoint's) and rejoins the quorum."""
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

HAVE = importlib.util.find_spec("torchft") is not None
LIGHTHOUSE = shutil.which("torchft_lighthouse") or Path(sys.executable).with_name("torchft_lighthouse").exists()


@pytest.mark.slow  # 3 replica processes + a lighthouse, paced steps: ~40 s idle, minutes on a loaded machine
@pytest.mark.skipif(not (HAVE and LIGHTHOUSE), reason="torchft is not installed (pip install -e '.[ft]')")
def test_killed_replica_group_heals_from_its_peer_and_the_survivor_goes_on(tmp_path):
    from coursekit.ft.run import run

    res = run(replicas=2, steps=150, kill_at_step=10, step_ms=200, timeout=600, workdir=str(tmp_path))
    assert res["victim_exit"] == -9  # SIGKILL, no Python clean-up
    assert res["survivor_steps"] == 150 and res["survivor_lost_steps"] == 0  # no restart, nothing recomputed
    # the survivor waited for the dead group about one torchft timeout (10 s here), then went on alone
    assert 1 < res["survivor_stall_s"] < 30, res
    assert res["healed_at_step"] is not None and res["healed_at_step"] > 10, res  # the peer's step, not 0
    assert res["steps_without_it"] == res["healed_at_step"] - 10  # done by the survivor, none recomputed
    assert res["rejoined_participants"] == 2 and res["heal_s"] > 0, res
