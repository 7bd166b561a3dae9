"""The launcher: results gathered per rank, failures name the rank, timeouts and crashes leave no process."""
import os
import signal
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


def test_a_workers_stray_child_is_reaped_when_the_job_succeeds(tmp_path, no_orphans):
    """A rank starts a child that outlives it (``sleep``, not waited for) and exits 0: the job succeeds, and launch()
    stops the child anyway (it is still in torchrun's session), so nothing is left for the next test."""
    code = textwrap.dedent(f"""
        import os, subprocess
        p = subprocess.Popen(["sleep", "300"])
        open(os.path.join({str(tmp_path)!r}, "child-" + os.environ["RANK"]), "w").write(str(p.pid))
    """)
    t0 = time.monotonic()
    launch_code(code, nproc=2, timeout=120, stream=False)
    assert time.monotonic() - t0 < 60  # not held up by the child keeping the output pipe open
    for r in (0, 1):
        pid = int((tmp_path / f"child-{r}").read_text())
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


# ---- the orphan check itself, the clean-up paths, check=False and max_restarts ----------------------------------

def _wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def test_sigkill_of_the_cli_leaves_nothing_running():
    """SIGKILL of ``coursekit train`` itself (no handler can run): its torchrun agent was started with a parent-death
    signal (coursekit.launch._die_with_parent), so it gets SIGTERM and stops its workers; nothing of the job is left
    within a few seconds."""
    from conftest import launched_processes

    from coursekit.launch import kill_tree

    before = launched_processes()
    cli = subprocess.Popen([sys.executable, "-m", "coursekit.cli", "train", "--strategy", "ddp", "--nproc", "2",
                            "--steps", "1000000", "--seq", "16", "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # the agent and both workers, stamped with this test's pid through the CLI subprocess
        job = _wait_for(lambda: (launched_processes() - before) if len(launched_processes() - before) >= 3
                        else set(), 90, "the CLI's job to start")
        assert cli.pid not in job  # the CLI itself is not part of the launch
        cli.kill()
        cli.wait(timeout=30)
        t0 = time.monotonic()
        while launched_processes() - before and time.monotonic() - t0 < 15:
            time.sleep(0.2)
        assert not launched_processes() - before, "the job outlived the CLI that started it"
    finally:
        cli.kill()
        for p in launched_processes() - before:
            kill_tree(p, grace_s=2)


def test_orphan_check_sees_a_stamped_process_that_no_launch_stopped():
    """The guard itself: a process carrying this test's launch stamp, re-parented away from us (started detached,
    as an orphan is), is found and named; once it is gone the check passes again."""
    from conftest import assert_no_orphans, launched_processes

    from coursekit.launch import STAMP_ENV, kill_tree

    before = launched_processes()
    env = {**os.environ, STAMP_ENV: str(os.getpid())}
    starter = subprocess.run([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
                              "'-c', 'import time; time.sleep(120)'], start_new_session=True, stdout=subprocess.DEVNULL, "
                              "stderr=subprocess.DEVNULL); print(p.pid)"],
                             env=env, capture_output=True, text=True, timeout=60)
    orphan = int(starter.stdout.strip())
    try:
        assert psutil.Process(orphan).ppid() != os.getpid()  # its parent is gone: a real orphan
        assert _wait_for(lambda: orphan in launched_processes(), 30, "the stamped process")
        with pytest.raises(AssertionError, match="left behind by coursekit.launch") as e:
            assert_no_orphans()
        assert str(orphan) in str(e.value)
    finally:
        kill_tree(orphan, grace_s=2)
    assert launched_processes() == before  # cleaned up: the check passes again


def test_keyboard_interrupt_stops_every_process(tmp_path, no_orphans):
    # What a notebook's "interrupt kernel" does: SIGINT to the Python process that waits in launch()
    code = textwrap.dedent(f"""
        import os, time
        open(os.path.join({str(tmp_path)!r}, "pid-" + os.environ["RANK"]), "w").write(str(os.getpid()))
        time.sleep(600)
    """)
    (tmp_path / "job.py").write_text(code)
    # A kernel installs its own SIGINT handler. The driver does too: a suite started in the background (`cmd &`
    # under a non-interactive shell, nohup, some CI runners) inherits SIGINT *ignored*, Python then installs no
    # KeyboardInterrupt handler, and the signal this test sends would never arrive (the flake seen in session 9).
    driver = (f"import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              f"from coursekit.launch import launch\n"
              f"launch({str(tmp_path / 'job.py')!r}, nproc=2, timeout=300, stream=False)\n")
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    pids = _wait_for(lambda: [int(f.read_text()) for f in sorted(tmp_path.glob("pid-*")) if f.read_text()]
                     if len(list(tmp_path.glob("pid-*"))) == 2 else None, 90, "both workers")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    assert time.monotonic() - t0 < 30
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_check_false_returns_the_failure_with_what_the_ranks_reported(no_orphans):
    code = textwrap.dedent("""
        import os, sys
        from coursekit.launch import report
        rank = int(os.environ["RANK"])
        report({"rank": rank})
        sys.exit(3 if rank == 1 else 0)
    """)
    res = launch_code(code, nproc=2, timeout=120, stream=False, check=False)
    assert res.returncode != 0
    assert res.results == [{"rank": 0}, {"rank": 1}]
    with pytest.raises(LaunchError) as e:  # the same job with the default check=True
        launch_code(code, nproc=2, timeout=120, stream=False)
    assert e.value.rank == 1 and e.value.returncode == res.returncode


@pytest.mark.slow  # default-tier budget: ~18 s; launch(max_restarts=1) runs in test_elastic through the CLI
def test_max_restarts_restarts_failed_workers(no_orphans):
    # rank 1 dies in the first attempt only; with one restart allowed torchrun starts both workers again, they
    # form a new process group (a collective proves it) and the job succeeds
    code = textwrap.dedent("""
        import os, sys, torch, torch.distributed as dist
        from coursekit import dist as ckdist
        from coursekit.launch import report
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        with ckdist.session() as info:
            if attempt == 0 and info.rank == 1:
                sys.exit(7)
            t = torch.tensor([float(info.rank + 1)])
            dist.all_reduce(t)
            report({"rank": info.rank, "attempt": attempt, "sum": t.item()})
    """)
    res = launch_code(code, nproc=2, timeout=180, stream=False, max_restarts=1)
    assert res.returncode == 0
    assert res.results == [{"rank": r, "attempt": 1, "sum": 3.0} for r in (0, 1)]
    with pytest.raises(LaunchError) as e:  # no restart allowed: the first failure ends the job
        launch_code(code, nproc=2, timeout=180, stream=False)
    # rank 1 left no traceback (sys.exit); rank 0's is only the lost peer: the launcher names rank 1
    assert e.value.rank == 1 and "rank 1" in str(e.value)


def test_sigterm_to_the_caller_stops_every_process(tmp_path):
    """A script that launches a job and is sent SIGTERM (a scheduler's cancel, a killed notebook) takes its torchrun
    agent and workers with it."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    script = tmp_path / "caller.py"
    script.write_text("from coursekit.launch import launch_code\n"
                      "launch_code('import time\\nprint(\"up\", flush=True)\\ntime.sleep(300)', nproc=2, timeout=300)\n")
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    proc = psutil.Process(caller.pid)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(proc.children(recursive=True)) < 3:  # agent + 2 workers
        time.sleep(0.5)
    kids = proc.children(recursive=True)
    assert len(kids) >= 3, "the job did not start"
    caller.send_signal(signal.SIGTERM)
    assert caller.wait(timeout=60) == 128 + signal.SIGTERM
    gone, alive = psutil.wait_procs(kids, timeout=30)
    assert not alive, f"left behind: {[p.pid for p in alive]}"


def test_a_quiet_launch_in_a_notebook_says_when_each_run_starts_and_ends(monkeypatch, capsys):
    """A notebook cell that runs several quiet launches (the labs' helpers: stream=False) shows one line as each
    starts (target, ranks, layout flags) and one as it ends; outside a kernel (tests, CLIs) nothing is printed."""
    import sys
    import types

    from coursekit import launch as L

    import ipykernel.kernelapp  # imported (ipyparallel's client does) but no kernel runs here

    assert L.notebook_progress("coursekit.train", [], 2) is None
    kernel = types.SimpleNamespace(IPKernelApp=types.SimpleNamespace(initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "ipykernel.kernelapp", kernel)
    monkeypatch.setenv("COURSEKIT_PROGRESS", "0")  # under grading (coursekit.course.grading.student_env)
    assert L.notebook_progress("coursekit.train", [], 2) is None
    from coursekit.course.grading import student_env

    assert student_env()["COURSEKIT_PROGRESS"] == "0"
    from coursekit.course.isolation import sandbox_env

    # and the sandbox a graded kernel runs in keeps it (its cleared environment dropped it: the slow tier's executed
    # Lab 1 solution showed launch lines in a graded cell)
    assert sandbox_env(student_env())["COURSEKIT_PROGRESS"] == "0"
    monkeypatch.delenv("COURSEKIT_PROGRESS")
    say = L.notebook_progress("coursekit.train", ["--model", "m.json", "--strategy", "hsdp", "--dp-replicate", 2,
                                                   "--quiet"], 4)
    say("done in 12.3 s")
    assert capsys.readouterr().out.splitlines() == [
        "[launch] coursekit.train on 4 rank(s) --strategy hsdp --dp-replicate 2 …",
        "[launch] coursekit.train: done in 12.3 s"]


def test_the_trainer_forks_from_an_agent_that_preloaded_the_run(monkeypatch):
    """On CPU a module target whose package has ``preload(args)`` (coursekit.train) runs in workers torchrun forks from
    its agent (torchrun's own --run-path mode, on the package's __main__.py) after ``preload(args)``; a script, a
    package without preload, a command that names its start method, a GPU node (unless COURSEKIT_DEVICE=cpu) and
    $COURSEKIT_LAUNCH_FORK=0 keep one interpreter per worker."""
    from pathlib import Path

    import coursekit.train
    from coursekit import launch as launcher

    seen = []
    monkeypatch.setattr(coursekit.train, "preload", seen.append)
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: seen.append(kw))  # not this test process's forks
    monkeypatch.setenv("COURSEKIT_DEVICE", "cpu")
    monkeypatch.delenv(launcher.FORK_ENV, raising=False)
    head = ["--standalone", "--nproc-per-node", "2", "--tee", "3"]
    main = str(Path(coursekit.train.__file__).with_name("__main__.py"))
    assert launcher._forking([*head, "-m", "coursekit.train", "--steps", "1"]) == [
        *head, "--run-path", "--start-method", "fork", main, "--steps", "1"]
    assert seen == [["--steps", "1"], {"after_in_child": launcher._fresh_signals}]
    for argv in ([*head, "job.py", "--steps", "1"], [*head, "-m", "coursekit.memory", "--model", "gpt2"],
                 [*head, "--start-method", "spawn", "-m", "coursekit.train"]):
        assert launcher._forking(list(argv)) == argv
    monkeypatch.setattr(launcher, "GPU_DEVICES", (__file__,))  # a GPU node (a device file that exists) ...
    monkeypatch.delenv("COURSEKIT_DEVICE")
    assert launcher._forking([*head, "-m", "coursekit.train"]) == [*head, "-m", "coursekit.train"]
    monkeypatch.setenv("COURSEKIT_DEVICE", "cpu")  # ... told to run on its CPUs forks again
    assert launcher._forking([*head, "-m", "coursekit.train"])[len(head):][:3] == ["--run-path", "--start-method",
                                                                               "fork"]
    monkeypatch.setenv(launcher.FORK_ENV, "0")
    assert launcher._forking([*head, "-m", "coursekit.train"]) == [*head, "-m", "coursekit.train"]
    assert len(seen) == 4  # preload (and the signals' reset) for the two forked cases only
    monkeypatch.delenv(launcher.FORK_ENV)

    def broken(args):
        raise ImportError("a broken install")

    monkeypatch.setattr(coursekit.train, "preload", broken)  # the workers import in their own interpreters and say why
    assert launcher._forking([*head, "-m", "coursekit.train"]) == [*head, "-m", "coursekit.train"]
    assert len(seen) == 4


def test_a_forked_worker_gets_a_fresh_interpreters_signal_handlers():
    """torchrun's agent raises on SIGTERM / SIGINT / SIGHUP / SIGQUIT; a forked worker must die on SIGTERM as a
    fresh one does (default action) and raise KeyboardInterrupt on SIGINT."""
    import signal

    from coursekit.launch import _fresh_signals

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    try:
        for s in old:
            signal.signal(s, lambda *a: None)
        _fresh_signals()
        assert [signal.getsignal(s) for s in old] == [signal.SIG_DFL, signal.default_int_handler, signal.SIG_DFL,
                                                      signal.SIG_DFL]
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_forked_trainer_workers_train_as_fresh_interpreters_do(tmp_path, no_orphans):
    """The same DDP run (attention dropout 0.1: every step draws random numbers on each rank) with forked workers and
    with one interpreter per worker: the same loss at every step and the same weights after, each rank saying how it
    started; a crashing forked rank is named with its own frames (not torchrun's wrapper's)."""
    import json

    from coursekit.memory import preset
    from coursekit.memory.presets import to_hf_config_dict
    from coursekit.launch import FORK_ENV

    cfg = tmp_path / "tiny-llama-dropout.json"
    cfg.write_text(json.dumps(to_hf_config_dict(preset("tiny-llama").with_(attn_dropout=0.1))))
    args = ["--strategy", "ddp", "--model", str(cfg), "--steps", "3", "--seq", "16", "--quiet"]
    runs = {how: launch("coursekit.train", args, nproc=2, timeout=240, stream=False, env={FORK_ENV: flag}).results
            for how, flag in (("forked", "1"), ("interpreter", "0"))}
    for how, ranks in runs.items():
        assert [r["final"]["worker"] for r in ranks] == [how, how]
    fork, fresh = runs["forked"], runs["interpreter"]
    assert [s["loss"] for s in fork[0]["steps"]] == [s["loss"] for s in fresh[0]["steps"]]
    assert len({s["loss"] for s in fork[0]["steps"]}) == 3
    assert [r["final"]["param_sq_sum"] for r in fork] == [r["final"]["param_sq_sum"] for r in fresh]
    with pytest.raises(LaunchError) as e:
        launch("coursekit.train", [*args, "--crash-at-step", "1"], nproc=2, timeout=240, stream=False)
    assert "injected failure at step 1" in e.value.traceback
    assert "run_script_path" not in e.value.traceback and "coursekit/train/loop.py" in e.value.traceback
