"""Module 5, hangs: planted collective bugs on 2 gloo ranks, diagnosed from flight-recorder dumps.

Each case runs ``coursekit.profiling.planted`` under ``coursekit launch --diagnose`` with a 3 s group timeout;
rank 1 goes wrong at collective #3. Default tier: the op mismatch (through the CLI, --json) and the late rank.
Slow tier: the whole job past the launcher's --timeout, the shape mismatch, the skipped collective, DETAIL mode and
the control run (~15 s each unloaded).
"""
import json
import pickle
import subprocess
import sys
import time

import pytest

from coursekit.profiling import hangs

PG_TIMEOUT, JOB_TIMEOUT = 3.0, 240.0


def planted(case, tmp_path, **kw):
    return hangs.run("coursekit.profiling.planted", ["--case", case], nproc=2, timeout=JOB_TIMEOUT,
                     pg_timeout_s=PG_TIMEOUT, folder=tmp_path / case, stream=False, **kw)


def ops(d):
    return {r: (o["op"], o["input_sizes"]) for o in d["ops"] for r in o["ranks"]}


def test_op_mismatch_through_the_cli(tmp_path, no_orphans):
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "launch", "--nproc", "2", "--timeout",
                          str(JOB_TIMEOUT), "--diagnose", "--json", "--pg-timeout", str(PG_TIMEOUT), "--dump-dir",
                          str(tmp_path / "fr"), "-m", "coursekit.profiling.planted", "--case", "op"],
                         capture_output=True, text=True, timeout=JOB_TIMEOUT + 60)
    assert out.returncode == 1, out.stderr[-3000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["kind"] == "mismatch" and d["ranks"] == [1] and d["seq"] == 3, d
    assert ops(d) == {0: ("all_reduce", [[4]]), 1: ("all_gather", [[4]])}
    assert "COLLECTIVE_TYPE_MISMATCH" in d["why"] and "default_pg" in d["pg"]
    assert not d["timed_out"]  # the group timeout ended it, not the job timeout
    assert "planted.py" in next(o["where"] for o in d["ops"] if o["ranks"] == [1])
    # the repaired dumps are what torch's analyser reads: pg_config now names the group the entries name
    fixed = pickle.loads((tmp_path / "fr" / "repaired" / "fr_0").read_bytes())
    assert {e["process_group"][0] for e in fixed["entries"]} <= set(fixed["pg_config"])


def test_a_late_rank_is_a_timeout_and_its_stack_shows_where_it_was(tmp_path, no_orphans):
    d = planted("sleep", tmp_path)
    assert d["kind"] == "timeout" and d["ranks"] == [1] and d["seq"] == 3, d
    assert ops(d) == {0: ("all_reduce", [[4]])}  # rank 0 waits in all_reduce #3; rank 1 never issued it
    assert "time.sleep" in d["last_stack"][1]  # dumped on SIGTERM while sleeping
    assert not d["timed_out"] and d["elapsed_s"] < JOB_TIMEOUT
    assert "Timed out" in json.dumps(hangs._sidecars(tmp_path / "sleep")[0])


WHOLE_JOB_TIMEOUT = 45.0  # the launcher's --timeout; the group timeout is far longer, so only the launcher can end it


def _whole_job(tmp_path, timeout):
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "launch", "--nproc", "2", "--timeout", str(timeout),
                          "--diagnose", "--json", "--pg-timeout", "600", "--dump-dir", str(tmp_path), "-m",
                          "coursekit.profiling.planted", "--case", "sleep"],
                         capture_output=True, text=True, timeout=timeout + 90)
    assert out.returncode == 1, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), time.monotonic() - t0


def _reached(folder, seq) -> bool:
    """Whether rank 0's dump holds collective ``seq``: the job got as far as its hang before the timeout."""
    f = folder / "fr_trace_0.pkl"
    return f.exists() and any(e["collective_seq_id"] == seq for e in pickle.loads(f.read_bytes())["entries"])


@pytest.mark.slow  # runs to its 45 s job timeout by design (75 s at load average ~25)
def test_the_whole_job_past_its_timeout_names_the_rank_that_never_arrived(tmp_path, no_orphans):
    """No rank ever raises: rank 1 sleeps before collective #3 and rank 0 waits in it, with a 600 s group timeout
    (and the wrapper's watchdog at 605 s) against a 45 s job timeout. So the launcher ends the job: it sends SIGUSR1
    to every worker (each dumps its flight recorder from its signal thread, rank 0 while its main thread is blocked
    in the all-reduce, rank 1 while it sleeps), then stops them all; the diagnosis comes from those dumps alone.

    45 s because the timeout counts from the launch: on 2 cores at load average ~20 the two workers' imports alone
    took 30-35 s (measured 2026-12-01). If the workers did not even reach collective #3 in that time (the diagnosis
    then is a timeout of every rank, at no collective), the test runs once more with twice the timeout."""
    timeout, folder = WHOLE_JOB_TIMEOUT, tmp_path / "fr"
    d, wall = _whole_job(folder, timeout)
    if not _reached(folder, 3):
        print(f"\nthe job had not reached collective #3 after {timeout:.0f} s (start-up under load): once more")
        timeout, folder = 2 * timeout, tmp_path / "fr-2"
        d, wall = _whole_job(folder, timeout)
    assert d["timed_out"], d  # the launcher's timeout ended it, not the group timeout
    assert d["kind"] == "timeout" and d["ranks"] == [1] and d["seq"] == 3, d
    assert ops(d) == {0: ("all_reduce", [[4]])}  # rank 0 waits in all_reduce #3; rank 1 never issued it
    stack = {int(r): where for r, where in d["last_stack"].items()}  # JSON keys are strings
    assert "time.sleep" in stack[1] and "all_reduce" in stack[0], stack
    side = hangs._sidecars(folder)
    for rank in (0, 1):  # both dumped on the launcher's request, alive; neither raised (no group timeout fired)
        reasons = [x["reason"] for x in side[rank]["dumps"]]
        assert "signal" in reasons and "exception" not in reasons, (rank, reasons)
    # stopped at its timeout, not at the group's (600 s): the dumps (<= 5 s), the stop (<= 10 s), then the
    # analysis (torch's analyser imports torch: ~25 s in all at load average 20-29, measured 2026-12-01)
    assert timeout <= d["elapsed_s"] < timeout + 45, d["elapsed_s"]
    assert wall < timeout + 75
    print(f"\nwhole-job timeout {timeout:.0f} s -> diagnosis after {d['elapsed_s']:.1f} s (command {wall:.1f} s)")


@pytest.mark.slow
def test_shape_mismatch(tmp_path, no_orphans):
    d = planted("shape", tmp_path)
    assert d["kind"] == "mismatch" and d["seq"] == 3, d
    assert ops(d)[1] == ("all_reduce", [[2]]), d
    if "aborted" not in d:  # gloo may also abort the rank that receives too many bytes (then no dump from it)
        assert d["ranks"] == [1] and ops(d)[0] == ("all_reduce", [[4]])
    assert d["elapsed_s"] < JOB_TIMEOUT


@pytest.mark.slow
def test_a_rank_that_skips_a_collective_is_missing(tmp_path, no_orphans):
    d = planted("skip", tmp_path)
    assert d["kind"] == "missing" and d["ranks"] == [1] and d["seq"] == 3, d
    assert ops(d) == {0: ("all_reduce", [[4]])}
    assert hangs._sidecars(tmp_path / "skip")[1]["dumps"][-1]["reason"] == "exit"  # it finished its script


@pytest.mark.slow
def test_detail_mode_names_the_mismatch_from_its_fingerprints(tmp_path, no_orphans):
    d = planted("op", tmp_path, debug="DETAIL")
    assert d["kind"] == "mismatch" and d["seq"] is not None, d
    assert {r: op for r, (op, _) in ops(d).items()} == {0: "allreduce", 1: "allgather"}


@pytest.mark.slow
def test_control_run_is_ok(tmp_path, no_orphans):
    d = planted("none", tmp_path)
    assert d["kind"] == "ok" and d["returncode"] == 0 and d["ranks"] == [], d
