"""The launcher: results gathered per rank, failures name the rank, timeouts and crashes leave no process."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from coursekit.launch import LaunchError, launch, launch_code

REPORT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from coursekit import dist as ckdist
    from coursekit.launch import report
    with ckdist.session() as info:
        t = torch.tensor([float(info.rank + 1)])
        dist.all_reduce(t)
        report({"rank": info.rank, "world": info.world_size, "sum": t.item(), "pid": os.getpid(),
                "backend": info.backend})
""")


def test_results_gathered_per_rank(no_orphans):
    res = launch_code(REPORT, nproc=3, timeout=120, stream=False)
    assert res.returncode == 0
    assert [r["rank"] for r in res.results] == [0, 1, 2]
    assert all(r["world"] == 3 and r["sum"] == 6.0 and r["backend"] == "gloo" for r in res.results)


def test_log_lines_prefixed_by_rank(no_orphans):
    res = launch_code("import os\nprint('hello from', os.environ['RANK'])\n", nproc=2, timeout=60, stream=False)
    assert "[rank 0] hello from 0" in res.log.splitlines()
    assert "[rank 1] hello from 1" in res.log.splitlines()


def test_failing_rank_is_named_with_its_traceback(no_orphans):
    code = REPORT.replace("report(", "assert info.rank != 1, 'boom on rank one'\n    report(")
    with pytest.raises(LaunchError) as e:
        launch_code(code, nproc=2, timeout=120, stream=False)
    assert e.value.rank == 1
    assert "boom on rank one" in e.value.traceback and "Traceback" in e.value.traceback
    assert "rank 1" in str(e.value)


def test_timeout_kills_every_process_even_sigterm_proof(tmp_path, no_orphans):
    # each rank records its pid, then hangs; rank 1 also ignores SIGTERM so only SIGKILL can stop it
    code = textwrap.dedent(f"""
        import os, signal, time
        rank = int(os.environ["RANK"])
        open(os.path.join({str(tmp_path)!r}, f"pid-{{rank}}"), "w").write(str(os.getpid()))
        if rank == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    """)
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as e:
        launch_code(code, nproc=2, timeout=8, stream=False)
    assert e.value.timed_out and "timed out" in str(e.value)
    assert time.monotonic() - t0 < 40
    pids = [int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_two_launches_at_once(no_orphans):
    out, errs = [], []

    def go():
        try:
            out.append(launch_code(REPORT, nproc=2, timeout=120, stream=False))
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errs, errs
    assert len(out) == 2 and all(r.results[1]["sum"] == 3.0 for r in out)


def test_works_when_path_lacks_the_venv(tmp_path):
    # a notebook kernel often has the venv's python but not its bin/ on PATH
    code = ("from coursekit.launch import launch\n"
            "r = launch('coursekit.dist', nproc=2, timeout=120, stream=False)\n"
            "print('SUM', r.results[0]['allreduce'])\n")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SUM 3.0" in out.stdout


def test_missing_script_and_bad_nproc():
    with pytest.raises(FileNotFoundError):
        launch("no/such/script.py", nproc=2)
    with pytest.raises(ValueError):
        launch("coursekit.dist", nproc=0)
