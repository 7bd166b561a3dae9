"""The student's process: calls return plain data; raising, hanging, exiting and printing are contained."""
import time

import psutil
import pytest

from coursekit.course.program import definitions
from coursekit.course.sandbox import StudentError, StudentFunction, StudentProcess

CODE = '''
import os, signal, sys, time

def add(a, b):
    print("noise on stdout", flush=True)
    return a + b

def boom():
    raise ValueError("student bug")

def hang_hard():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(PID_FILE, "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)

def leave():
    os._exit(7)

def exit_politely():
    sys.exit(0)

def opaque():
    return object()

def shaped():
    return {"pair": (1, 2), 3: [1.5]}
'''


@pytest.fixture
def student(tmp_path):
    pid_file = tmp_path / "pid"
    chunks = [definitions(f"PID_FILE = {str(pid_file)!r}\n" + CODE, "<cell code>")]
    names = ["add", "boom", "hang_hard", "leave", "exit_politely", "opaque", "shaped", "missing"]
    with StudentProcess(chunks, names, call_timeout=3, log_path=str(tmp_path / "student.log")) as sp:
        ready = sp.start()
        assert ready["names"]["add"] == {"kind": "function"} and ready["names"]["missing"] == {"kind": "missing"}
        yield sp, tmp_path


def test_calls_return_plain_values_and_output_goes_to_the_log(student):
    sp, tmp = student
    assert sp.call("add", (2, 3)) == 5
    assert StudentFunction(sp, "shaped")() == {"pair": (1, 2), 3: [1.5]}
    assert "noise on stdout" in (tmp / "student.log").read_text()


def test_errors_are_reported_per_call_and_the_process_goes_on(student):
    sp, _ = student
    with pytest.raises(StudentError) as e:
        sp.call("boom")
    assert e.value.kind == "raised" and "ValueError: student bug" in str(e.value)
    assert 'File "<cell code>"' in e.value.traceback and "sandbox" not in e.value.traceback
    assert isinstance(e.value, ValueError)  # a test's `except ValueError` catches a refusal made in the student's code
    with pytest.raises(ValueError):
        sp.call("boom")
    with pytest.raises(StudentError) as e:
        sp.call("opaque")
    assert e.value.kind == "not_plain"
    with pytest.raises(StudentError) as e:
        sp.call("exit_politely")  # SystemExit is just an error of this call
    assert e.value.kind == "raised" and not isinstance(e.value, SystemExit)  # never the interpreter's own exits
    assert sp.call("add", (1, 1)) == 2 and sp.starts == 1


def test_a_hang_that_ignores_signals_is_killed_and_the_next_call_restarts(student):
    sp, tmp = student
    t0 = time.monotonic()
    with pytest.raises(StudentError) as e:
        sp.call("hang_hard")
    assert e.value.kind == "timeout" and time.monotonic() - t0 < 3 + 5
    pid = int((tmp / "pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert sp.call("add", (4, 4)) == 8 and sp.starts == 2


def test_os_exit_is_a_crash_of_that_call_only(student):
    sp, _ = student
    with pytest.raises(StudentError) as e:
        sp.call("leave")
    assert e.value.kind == "crashed" and "exit code 7" in str(e.value)
    assert sp.call("add", (1, 2)) == 3


def test_code_that_hangs_while_loading_makes_every_call_fail_fast(tmp_path):
    chunks = [definitions("import time\nDELAY = time.sleep(60)\ndef f():\n    return 1\n", "<cell slow>")]
    with StudentProcess(chunks, ["f"], call_timeout=2, log_path=str(tmp_path / "log")) as sp:
        sp.start_timeout = 2
        with pytest.raises(StudentError, match="did not finish loading"):
            sp.start()
        t0 = time.monotonic()
        with pytest.raises(StudentError, match="did not finish loading"):
            sp.call("f")
        assert time.monotonic() - t0 < 1
