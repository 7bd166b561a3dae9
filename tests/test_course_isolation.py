"""The grading sandbox: a student's code never runs with the instructor's user, files or network.

Two kinds of check. Unit checks start the student's process (``StudentProcess``) in a sandbox and look at what it
is: its user, capabilities, environment, view of the files, network, and each limit. Then one batch grades two
hostile students next to two honest ones (toy lab, real nbgrader autograde): every attack runs both in a top-level
cell (in nbgrader's kernel) and in a graded function (in the re-check). Each is contained: nothing outside changes,
the hostile student gets a row with a score and a reason, and the honest students' rows equal those of a batch
without the hostile ones. The sandbox needs bubblewrap (scripts/test.sh installs it where it runs as root with apt).
"""
import csv
import hashlib
import os
import secrets
import shutil
import socket
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from coursekit.course.authoring import build
from coursekit.course.isolation import Isolation, IsolationUnavailable, Limits, for_batch
from coursekit.course.program import definitions
from coursekit.course.sandbox import StudentError, StudentProcess
from test_course_toy import REPO, SOLUTIONS, TOY, make_course, submission, write_submission

ISO = Isolation.detect()
needs_sandbox = pytest.mark.skipif(not ISO.on, reason=f"no sandbox can be built here: {ISO.reason}")
LIMITS = Limits(cpu=60, memory=512 << 20, nproc=64, fsize=16 << 20, tmp=40 << 20)


def student(code: str, names, tmp_path, iso: Isolation, **kw) -> StudentProcess:
    return StudentProcess([definitions(code, "<cell attack>")], names, isolation=iso,
                          log_path=str(tmp_path / "student.log"), **kw)


PROBE = '''
import errno, os, socket
def who():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
            "no_new_privs": status["NoNewPrivs"].strip(), "env": dict(os.environ), "pids": sorted(
            int(p) for p in os.listdir("/proc") if p.isdigit())}
def exists(paths):
    return [os.path.exists(p) for p in paths]
def interfaces():
    return [name for _, name in socket.if_nameindex()]
def connect(host, port):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
def loopback():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    c = socket.create_connection(srv.getsockname(), timeout=5)
    conn, _ = srv.accept()
    c.sendall(b"ping")
    return conn.recv(4).decode()
def spin():
    while True:
        pass
'''


@needs_sandbox
def test_the_student_runs_as_an_unprivileged_user_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "instructor-secret")  # a credential of the instructor's
    with student(PROBE, ["who"], tmp_path, ISO) as sp:
        w = sp.call("who")
        again = sp.call("who")
    assert w["uid"] == w["euid"] == w["gid"] and w["uid"] not in (0, os.getuid())
    assert ISO.uids[0] <= w["uid"] <= ISO.uids[1] and w["groups"] == []
    assert int(w["cap_eff"], 16) == 0 and int(w["cap_bnd"], 16) == 0 and w["no_new_privs"] == "1"
    assert "AWS_SECRET_ACCESS_KEY" not in w["env"] and w["env"]["HOME"] == "/tmp"
    assert len(w["pids"]) <= 4  # its own pid namespace: bwrap's init, the shell it execs through, itself
    assert again["uid"] == w["uid"]  # one process per start ...
    with student(PROBE, ["who"], tmp_path, ISO) as sp:
        assert sp.call("who")["uid"] != w["uid"]  # ... and a fresh user id for the next (random in a wide range)


@needs_sandbox
def test_files_the_student_sees(tmp_path):
    course = tmp_path / "course"
    (course / "solutions" / "lab").mkdir(parents=True)
    (course / "solutions" / "lab" / "lab.py").write_text("# hidden tests")
    (course / "labs").mkdir()
    (course / "labs" / "released.txt").write_text("for students")
    (course / "out").mkdir()
    (course / "out" / "grades.csv").write_text("student,score")
    home_file = Path.home() / f".coursekit-isolation-{secrets.token_hex(4)}"
    home_file.write_text("the instructor's")
    try:
        iso = Isolation.detect(course_root=course, hide=[course / "out"])
        with student(PROBE, ["exists"], tmp_path, iso) as sp:
            seen = sp.call("exists", ([str(course / "labs" / "released.txt"), sys.executable,
                                       str(course / "solutions" / "lab" / "lab.py"), str(course / "out"),
                                       str(course / "out" / "grades.csv"),
                                       str(home_file), str(tmp_path / "student.log"), "/home", "/root/.bashrc"],))
    finally:
        home_file.unlink()
    # released lab and Python: read-only; hidden tests, the output folder's files, home, the log file: absent
    assert seen == [True, True, False, True, False, False, False, False, False]


@needs_sandbox
def test_network_is_loopback_only(tmp_path):
    with student(PROBE, ["interfaces", "connect", "loopback"], tmp_path, ISO) as sp:
        assert sp.call("interfaces") == ["lo"]  # the namespace has no other interface, hence no route
        t0 = time.monotonic()
        assert sp.call("connect", ("192.0.2.1", 80)) == "ENETUNREACH"  # TEST-NET-1: never routed anywhere
        assert time.monotonic() - t0 < 2  # refused at once by the namespace, not a timeout on the way
        assert sp.call("loopback") == "ping"
    assert [n for _, n in socket.if_nameindex()] != ["lo"] or pytest.skip("this machine itself has only lo")


@needs_sandbox
def test_cpu_time_limit_kills_a_spinning_call(tmp_path):
    iso = Isolation.detect(limits=Limits(cpu=1))
    with student(PROBE, ["spin"], tmp_path, iso, call_timeout=300) as sp:
        with pytest.raises(StudentError) as e:
            sp.call("spin")
    # killed by the kernel after 1 s of CPU time (SIGKILL at the hard limit: bwrap exits 128 + 9), long before the
    # call's own timeout (which would be kind "timeout")
    assert e.value.kind == "crashed" and "exit code 137" in str(e.value), str(e.value)


def test_gpu_device_nodes_only_are_bound():
    iso = Isolation("root", devices=("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"), tools={})
    cmd = iso.wrap(["true"])
    binds = [cmd[i + 1] for i, a in enumerate(cmd) if a in ("--dev-bind", "--dev-bind-try")]
    assert binds == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert "--dev" in cmd and "/dev" not in binds  # a minimal /dev otherwise (null, zero, urandom, tty, shm)


def test_grading_is_refused_without_a_sandbox(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, setpriv or prlimit to be found
    monkeypatch.setenv("COURSEKIT_ISOLATION", "required")  # the default outside the test suite
    with pytest.raises(IsolationUnavailable, match="--trust-submissions"):
        for_batch("required", course_root=tmp_path)
    assert for_batch("auto", course_root=tmp_path) is None and for_batch("off", course_root=tmp_path) is None
    from coursekit.cli import main

    course = tmp_path / "course"  # refused before anything is built or read: a lab source and a notebook suffice
    (course / "solutions" / "toy").mkdir(parents=True)
    (course / "solutions" / "toy" / "toy.py").write_text(TOY)
    shutil.copy(REPO / "nbgrader_config.py", course)
    (tmp_path / "subs" / "ada" / "toy").mkdir(parents=True)
    (tmp_path / "subs" / "ada" / "toy" / "toy.ipynb").write_text("{}")
    args = ["course", "--root", str(course), "grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"),
            "--no-nbgrader", "--jobs", "1"]
    assert main(args) == 2 and not (tmp_path / "out" / "grades.csv").exists()
    assert "refusing to grade untrusted submissions without a sandbox" in capsys.readouterr().err


# -- the hostile batch ---------------------------------------------------------------------------------------------
def intrusions(paths: dict) -> str:
    """Cell source: ``_intrude()`` tries every attack on the files and the network and says how each ended."""
    return textwrap.dedent(f'''\
        import errno as _errno, glob as _glob, os as _os, socket as _socket
        _PATHS = {paths!r}
        def _try(fn):
            try:
                fn()
                return "DONE"
            except OSError as e:
                return _errno.errorcode.get(e.errno, type(e).__name__)
        def _write(p):
            with open(p, "w") as f:
                f.write("PWN" + "ED")
        def _read(p):
            with open(p) as f:
                f.read()
        def _intrude():
            out = {{}}
            out["h_rm"] = _try(lambda: _os.remove(_PATHS["home"]))
            out["h_w"] = _try(lambda: _write(_PATHS["home"]))
            out["sub"] = _try(lambda: _write(_PATHS["other"]))
            out["gb"] = _try(lambda: _write(_PATHS["gradebook"]))
            out["csv"] = _try(lambda: _write(_PATHS["csv"]))
            out["hid"] = _try(lambda: _read(_PATHS["hidden"]))
            out["tmp"] = str(len(_glob.glob("/tmp/coursekit-grade-*")))  # the batch's private folders
            out["net"] = _try(lambda: _socket.create_connection(("192.0.2.1", 80), timeout=3))
            return " ".join(f"{{k}}={{v}}" for k, v in out.items())
        _EXPECTED = {INTRUDER_EXPECTED!r}
        def _contained(report):
            return "DONE" not in report and all(e in report for e in _EXPECTED)
    ''')


# how each attempt must end: the home is not there (or not writable), the submissions, gradebook and output are
# hidden (empty read-only folders), no batch folder is visible, and the network stops at the namespace
INTRUDER_EXPECTED = ("h_rm=ENOENT", "h_w=E", "sub=ENOENT", "gb=EROFS", "csv=EROFS", "hid=ENOENT", "tmp=0",
                     "net=ENETUNREACH")


HOG = textwrap.dedent('''\
    import errno as _errno, os as _os, time as _time
    def _hog():
        out, chunks = {}, []
        try:
            while True:
                chunks.append(bytes(32 << 20))  # calloc'd: counted against the limit, quick to get
        except MemoryError:
            out["mem_mib"] = f"{32 * len(chunks)}/MemoryError"
        del chunks
        written, n, errors = 0, 0, []
        while n < 20:  # files until the disk is full: each stops at the file size limit
            try:
                with open(f"/tmp/fill-{n}", "wb", buffering=0) as f:
                    n += 1
                    for _ in range(1 << 12):
                        f.write(b"x" * (1 << 20))
                        written += 1
            except OSError as e:
                errors.append(_errno.errorcode.get(e.errno, "?"))
                if e.errno != _errno.EFBIG:
                    break
        out["disk_mib"] = f"{written}/{'+'.join(errors)}/files={n}"
        pids = []
        try:
            while True:
                pid = _os.fork()
                if pid == 0:
                    _time.sleep(30)
                    _os._exit(0)
                pids.append(pid)
        except OSError as e:
            out["forks"] = f"{len(pids)}/{_errno.errorcode.get(e.errno)}"
        for pid in pids:  # the kernel needs a thread or two later
            _os.kill(pid, 9)
            _os.waitpid(pid, 0)
        for i in range(n):  # so that a second run finds the same room
            _os.remove(f"/tmp/fill-{i}")
        return " ".join(f"{k}={v}" for k, v in out.items())
    def _bounded(report):
        mem, disk, forks = (int(report.split(k + "=")[1].split("/")[0]) for k in ("mem_mib", "disk_mib", "forks"))
        return (mem <= _LIMITS["memory"] and "MemoryError" in report and disk <= _LIMITS["tmp"]
                and "/EFBIG+EFBIG+ENOSPC/files=3" in report and 0 < forks < _LIMITS["nproc"] and "/EAGAIN" in report)
''')


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    if not ISO.on:
        pytest.skip(f"no sandbox can be built here: {ISO.reason}")
    root = tmp_path_factory.mktemp("isolation")
    course = make_course(root / "course", timeout=60)  # nbgrader's cell timeout: room for a loaded machine
    src = course.source_path("toy")  # room for a loaded machine: these limits are not what is tested here
    src.write_text(src.read_text().replace("autograde_timeout: 60", "autograde_timeout: 300"))
    build(course)
    # submissions and output inside the course folder: the sandbox must hide them, not merely not mount them
    subs, out = course.root / "submitted", course.root / "out"
    (course.root / "course").mkdir(exist_ok=True)
    (course.root / "course" / "gradebook.db").write_bytes(b"formgrader's gradebook")
    home = Path.home() / f".coursekit-isolation-{secrets.token_hex(4)}"
    home.write_text("the instructor's file")
    paths = {"home": str(home), "other": str(subs / "solution" / "toy" / "toy.ipynb"),
             "gradebook": str(course.root / "course" / "gradebook.db"), "csv": str(out / "grades.csv"),
             "hidden": str(course.source_path("toy"))}
    honest = {"solution": dict(square=SOLUTIONS["square"], hyp=SOLUTIONS["hyp"]),
              "partial": dict(square=SOLUTIONS["square"])}
    attack = intrusions(paths)
    limits = f"_LIMITS = {{'memory': {LIMITS.memory >> 20}, 'tmp': {LIMITS.tmp >> 20}, 'nproc': {LIMITS.nproc}}}\n"
    # Every attack runs at the top level of a cell (in nbgrader's kernel; an UPPER_CASE assignment also runs when
    # the re-check loads the definitions) and in a graded function (in the re-check). The top-level outcome decides
    # whether the student's other function is right, so nbgrader's score says whether the kernel contained it.
    hostile_cells = {
        # files and network; square is right only if every attempt failed as it must, hypot reports them
        "intruder": dict(square=attack + "CONTAINED = _contained(_intrude())\n"
                                         "def square(x):\n    return x * x if CONTAINED else -1\n",
                         hyp=attack + "def hypot(a, b):\n    raise RuntimeError('contained: ' + _intrude())\n"),
        # memory, disk and processes; hypot is right only if every limit held, square reports them
        "hog": dict(square=HOG + limits + "def square(x):\n    raise RuntimeError('contained: ' + _hog())\n",
                    hyp="import math\nBOUNDED = _bounded(_hog())\n"
                        "def hypot(a, b):\n    return math.hypot(a, b) if BOUNDED else 0.0\n"),
    }
    for name, cells in {**honest, **hostile_cells}.items():
        write_submission(subs, name, submission(course, **cells))
    before = {"course": tree(course.root), "home": home.read_text()}
    os.environ["COURSEKIT_SANDBOX_UIDS"] = f"{1_700_000_000 + os.getpid() % 1000 * 1000}-" \
                                           f"{1_700_000_000 + os.getpid() % 1000 * 1000 + 999}"
    from coursekit.course.grading import grade

    try:
        t0 = time.monotonic()
        rows = {r.student: r for r in grade(course, subs, out, jobs=2, isolation="required", limits=LIMITS,
                                            timeout=600, call_timeout=60)}
        seconds = time.monotonic() - t0
        control_subs = root / "control"
        for name, cells in honest.items():
            write_submission(control_subs, name, submission(course, **cells))
        control = {r.student: r for r in grade(course, control_subs, root / "control-out", jobs=2,
                                               isolation="required", limits=LIMITS, timeout=600, call_timeout=60)}
        uids = tuple(map(int, os.environ["COURSEKIT_SANDBOX_UIDS"].split("-")))
        left = [p.pid for p in psutil.process_iter(["uids"]) if uids[0] <= p.info["uids"].real <= uids[1]]
    finally:
        del os.environ["COURSEKIT_SANDBOX_UIDS"]
        after = {"course": tree(course.root), "home": home.read_text() if home.exists() else None}
        home.unlink(missing_ok=True)
    return {"rows": rows, "control": control, "out": out, "before": before, "after": after, "left": left,
            "seconds": seconds}


def fields(r):
    return r.score, r.max_score, r.nbgrader_score, r.status, r.reason, r.exercises


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_honest_students_graded_as_without_the_hostile_ones(hostile):
    for name in ("solution", "partial"):
        assert fields(hostile["rows"][name]) == fields(hostile["control"][name]), name
    assert hostile["rows"]["solution"].score == 5 and hostile["rows"]["partial"].score == 2


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_nothing_outside_the_sandbox_changed(hostile):
    before, after = hostile["before"], hostile["after"]
    assert after["home"] == before["home"]
    changed = {k for k in set(before["course"]) | set(after["course"])
               if before["course"].get(k) != after["course"].get(k) and not k.startswith("out/")}
    assert changed == set()  # submissions, gradebook, solutions, labs: byte for byte
    out = hostile["out"]
    with open(out / "grades.csv") as f:
        assert {r["student"] for r in csv.DictReader(f)} == {"solution", "partial", "intruder", "hog"}
    for p in out.rglob("*"):
        if p.is_file() and p.suffix in (".csv", ".json"):
            assert "PWNED" not in p.read_text(), p
    assert hostile["left"] == []  # no process of a sandbox outlived the batch


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_intruder_is_contained_in_the_kernel_and_in_the_recheck(hostile):
    r = hostile["rows"]["intruder"]
    # square right: the top-level attempts failed as they must, in the re-check's process and (nbgrader's score)
    # in the kernel; hypot, which makes them again, failed with their outcome as its reason
    assert r.score == 2 and r.nbgrader_score == 2 and r.status == "graded", r.reason
    assert r.exercises == {"square": [2.0, 2.0], "hyp": [0.0, 3.0]}
    assert "DONE" not in r.reason and all(e in r.reason for e in INTRUDER_EXPECTED), r.reason


@pytest.mark.slow  # default-tier budget: minutes on 2 cores (moved by the lead after a timed run)
def test_hog_is_bounded_by_the_limits(hostile):
    r = hostile["rows"]["hog"]
    # hypot right: every limit held at the top level, in the re-check and (nbgrader's score) in the kernel
    assert r.score == 3 and r.nbgrader_score == 3 and r.status == "graded", r.reason
    assert r.exercises["square"] == [0.0, 2.0]
    mem, disk, forks = (int(r.reason.split(k + "=")[1].split("/")[0]) for k in ("mem_mib", "disk_mib", "forks"))
    assert 0 < mem <= LIMITS.memory >> 20 and "MemoryError" in r.reason
    assert 0 < disk <= LIMITS.tmp >> 20 and "/EFBIG+EFBIG+ENOSPC/files=3" in r.reason  # 16 MiB files, 40 MiB
    assert 0 < forks < LIMITS.nproc and "/EAGAIN" in r.reason


SUBUID_USER = os.environ.get("COURSEKIT_TEST_SUBUID_USER")


@pytest.mark.skipif(not SUBUID_USER or os.geteuid() != 0,
                    reason="set COURSEKIT_TEST_SUBUID_USER to a user with an /etc/subuid range (run as root: the "
                           "test switches to that user, as a Slurm job runs as its submitter)")
def test_a_grader_that_is_not_root_sandboxes_with_its_subordinate_ids():
    import subprocess

    import coursekit

    src = Path(coursekit.__file__).resolve().parents[1]
    code = (f"import sys; sys.path.insert(0, {str(src)!r}); from coursekit.course.isolation import Isolation; "
            "iso = Isolation.detect(); print(iso.mechanism, iso.reason)")
    # the system Python: the test's venv may sit where that user cannot read; the probe checks uid and network
    p = subprocess.run(["su", SUBUID_USER, "-s", "/bin/sh", "-c", f"cd /tmp && /usr/bin/python3 -c {code!r}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split()[0] == "subuid", p.stdout + p.stderr


def test_sandbox_limits_parse_as_the_cli_takes_them():
    assert Limits.parse("cpu=600,memory=8G,nproc=256,fsize=1G,tmp=512M") == Limits(
        cpu=600, memory=8 << 30, nproc=256, fsize=1 << 30, tmp=512 << 20)
    assert Limits.parse("memory=1.5GiB") == Limits(memory=3 << 29) and Limits.parse(None) == Limits()
    with pytest.raises(ValueError, match="unknown sandbox limit 'disk'"):
        Limits.parse("disk=1G")
