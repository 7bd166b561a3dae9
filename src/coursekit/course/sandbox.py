"""The student's process: it holds a submission's code and answers calls; it never sees a check.

    with StudentProcess(chunks, names=["count_params"], call_timeout=60) as student:
        student.start()
        student.call("count_params", {"layers": 2, ...})     # -> a plain value, or StudentError

The checks (``recheck``) run in the grader's process and reach the student's code only through ``call``: the
arguments go over a pipe as JSON, the student's function runs here, its return value comes back as JSON
(``wire``). So no student object, patch or kernel trick can reach the process where the asserts run.

A call that raises, returns something that is not plain data, runs past its timeout (even ignoring SIGINT and
SIGTERM: the whole process tree is killed) or ends the process (``os._exit``, a segfault) becomes a StudentError
for that call only; the next call starts a fresh process. Printed output goes to a log file, never to the checks.

With an ``isolation`` (``coursekit course grade`` passes one), every start is in a fresh OS sandbox (``isolation``):
a user id of its own, the course read-only with ``solutions/`` hidden, loopback-only network, CPU, memory, process
and file-size limits. What the student's code can do to the machine stops there; what it can do to the grade stops
at the pipe.
"""
from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import select
import subprocess
import sys
import time
import traceback
import types

from coursekit.course import wire
from coursekit.launch import stamped_env

MAX_MESSAGE = 32 << 20  # bytes of one answer line


class StudentError(Exception):
    """A call into the student's code failed. ``kind``: raised, not_plain, timeout, crashed or unavailable."""

    def __init__(self, message: str, *, kind: str, traceback: str = ""):
        super().__init__(message)
        self.kind, self.traceback = kind, traceback


_RAISED: dict = {}


def _raised_as(type_name: str) -> type:
    """A StudentError that is also the builtin exception the student's code raised (a test's ``except ValueError``
    catches a refusal made in the student's process); StudentError alone for any other type."""
    import builtins

    base = getattr(builtins, type_name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        return StudentError
    if type_name not in _RAISED:
        try:
            _RAISED[type_name] = type(f"Student{type_name}", (StudentError, base), {})
        except TypeError:  # a builtin whose instance layout cannot be combined (OSError's family)
            _RAISED[type_name] = StudentError
    return _RAISED[type_name]


def _student_traceback(exc: BaseException) -> str:
    """The traceback without this module's frames (the student needs their own lines only)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _serve(req_fd: int, resp_fd: int) -> None:
    """Student side: run the chunks statement by statement, report what is defined, then answer calls."""
    reader = os.fdopen(req_fd, "r", encoding="utf-8")
    writer = os.fdopen(resp_fd, "w", encoding="utf-8")

    def send(obj):
        writer.write(json.dumps(obj) + "\n")
        writer.flush()

    hello = json.loads(reader.readline())
    module = types.ModuleType("student")  # a real module, so student functions can be pickled by reference
    module.__dict__["__builtins__"] = builtins
    sys.modules["student"] = module
    ns, errors = module.__dict__, []
    for label, source in hello["chunks"]:
        linecache.cache[label] = (len(source), None, source.splitlines(True), label)  # source lines in tracebacks
        for stmt in ast.parse(source).body:  # one failing statement does not hide the definitions after it
            try:
                exec(compile(ast.Module([stmt], []), label, "exec"), ns)
            except BaseException as e:  # noqa: BLE001 (SystemExit too: the student's code must not end us)
                errors.append(f"{label.strip('<>')}, line {stmt.lineno}: {type(e).__name__}: {e}".rstrip(": "))
    names = {}
    for name in hello["names"]:
        if name not in ns:
            names[name] = {"kind": "missing"}
        elif callable(ns[name]):
            names[name] = {"kind": "function"}
        else:
            try:
                names[name] = {"kind": "value", "value": wire.encode(ns[name])}
            except Exception as e:  # noqa: BLE001
                names[name] = {"kind": "not_plain", "error": str(e)}
    send({"ready": True, "errors": errors, "names": names})
    for line in reader:
        req = json.loads(line)
        try:
            args, kwargs = wire.decode(req["args"]), wire.decode(req["kwargs"])
            value = ns[req["name"]](*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            send({"id": req["id"], "ok": False, "kind": "raised", "error": f"{type(e).__name__}: {e}".rstrip(": "),
                  "type": type(e).__name__, "traceback": _student_traceback(e)})
            continue
        try:
            send({"id": req["id"], "ok": True, "value": wire.encode(value)})
        except Exception as e:  # noqa: BLE001
            send({"id": req["id"], "ok": False, "kind": "not_plain", "error": str(e)})


class StudentProcess:
    """Grader side: starts, calls and (after a hang or crash) restarts the student's process."""

    def __init__(self, chunks, names, *, call_timeout: float = 60.0, start_timeout: float = 120.0,
                 cwd: str | None = None, env: dict | None = None, log_path: str | None = None, max_starts: int = 4,
                 isolation=None):
        self.chunks = [(c.label, c.source) for c in chunks]
        self.isolation = isolation  # coursekit.course.isolation.Isolation: every start in a fresh OS sandbox
        self.names = list(names)
        self.call_timeout, self.start_timeout = call_timeout, start_timeout
        self.cwd, self.env, self.log_path, self.max_starts = cwd, env, log_path, max_starts
        self.proc: subprocess.Popen | None = None
        self.ready: dict | None = None
        self.events: list[str] = []  # timeouts and crashes, for the feedback
        self.starts = 0
        self._broken: str | None = None  # loading the code itself failed: no call can succeed
        self._next_id = 0

    # -- process lifecycle -------------------------------------------------------------------------------------
    def start(self) -> dict:
        if self._broken:
            raise StudentError(self._broken, kind="unavailable")
        if self.starts >= self.max_starts:
            raise StudentError(f"gave up after {self.starts} fresh starts of your code", kind="unavailable")
        self.starts += 1
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        argv = [sys.executable, "-m", "coursekit.course.sandbox", str(req_r), str(resp_w)]
        if self.isolation is not None and self.isolation.on:
            argv = self.isolation.wrap(argv, env=self.env)  # its own user, files, network, limits (cwd: its /tmp)
        try:
            self.proc = subprocess.Popen(
                argv, pass_fds=(req_r, resp_w), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.cwd, env=stamped_env(self.env), start_new_session=True)
        finally:
            os.close(req_r)
            os.close(resp_w)
            if log is not subprocess.DEVNULL:
                log.close()
        self._w, self._r, self._buf = os.fdopen(req_w, "w", encoding="utf-8"), resp_r, b""
        self._send({"chunks": self.chunks, "names": self.names})
        try:
            msg = self._receive(self.start_timeout, expect_id=None)
        except StudentError as e:
            self._broken = f"your code did not finish loading ({e})"
            raise StudentError(self._broken, kind="unavailable") from None
        self.ready = msg
        return msg

    def stop(self) -> int | None:
        """Kill the process and everything it started; returns its exit code (None if none was running)."""
        if self.proc is None:
            return None
        from coursekit.launch import kill_tree

        if self.proc.poll() is None:
            kill_tree(self.proc.pid, grace_s=1.0)
        code = self.proc.wait()
        try:
            self._w.close()
        except OSError:
            pass
        os.close(self._r)
        self.proc = None
        return code

    close = stop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    # -- protocol ----------------------------------------------------------------------------------------------
    def _send(self, obj) -> None:
        try:
            self._w.write(json.dumps(obj) + "\n")
            self._w.flush()
        except (BrokenPipeError, OSError):
            pass  # the process is gone: _receive reports how it ended

    def _receive(self, timeout: float, expect_id):
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stop()
                    raise StudentError(f"no answer within {timeout:g} s (the process was killed)", kind="timeout")
                ready, _, _ = select.select([self._r], [], [], left)
                if not ready:
                    continue
                data = os.read(self._r, 1 << 16)
                if not data:
                    time.sleep(0.05)  # let an exiting process finish, so its own exit code is reported
                    code = self.stop()
                    raise StudentError(f"the process running your code ended (exit code {code})", kind="crashed")
                self._buf += data
                if len(self._buf) > MAX_MESSAGE:
                    self.stop()
                    raise StudentError(f"answer larger than {MAX_MESSAGE >> 20} MiB", kind="not_plain")
            line, _, self._buf = self._buf.partition(b"\n")
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not ours (the student's code wrote into the pipe)
            if isinstance(msg, dict) and msg.get("id") == expect_id:
                return msg

    def call(self, name: str, args=(), kwargs: dict | None = None, *, timeout: float | None = None):
        """``name(*args, **kwargs)`` in the student's process; a plain value, or StudentError."""
        kwargs = kwargs or {}
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.stop()
            self.start()
        self._next_id += 1
        rid = self._next_id
        try:
            payload = {"id": rid, "name": name, "args": wire.encode(list(args)), "kwargs": wire.encode(kwargs)}
        except wire.NotPlainData as e:
            raise TypeError(f"arguments of a student call must be plain data: {e}") from None
        self._send(payload)
        limit = self.call_timeout if timeout is None else timeout
        try:
            msg = self._receive(limit, expect_id=rid)
        except StudentError as e:
            self.events.append(f"{name}(...): {e}")
            raise StudentError(f"{name}(...): {e}", kind=e.kind) from None
        if not msg.get("ok"):
            cls = _raised_as(msg.get("type", "")) if msg["kind"] == "raised" else StudentError
            raise cls(f"{name}(...) {'raised ' if msg['kind'] == 'raised' else ''}{msg['error']}",
                      kind=msg["kind"], traceback=msg.get("traceback", ""))
        return wire.decode(msg["value"])


class StudentFunction:
    """Stands for a function of the student's in the checks: calling it runs the student's code over there."""

    def __init__(self, process: StudentProcess, name: str):
        self._process, self.__name__ = process, name

    def __call__(self, *args, **kwargs):
        return self._process.call(self.__name__, args, kwargs)

    @property
    def chunks(self) -> list[tuple[str, str]]:
        """The student's code, (label, source) per cell (``launch_function`` runs it under torchrun)."""
        return list(self._process.chunks)

    def __repr__(self):
        return f"<student function {self.__name__}>"


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
