"""Grade a batch of submissions: one grader process per submission, several at once, every row recorded.

    rows = grade(Course(), "submitted/", "grades/", jobs=2)

Layout in: ``SUBMISSIONS/<student>/<lab>/<lab>.ipynb`` (nbgrader's); a folder that itself holds ``<lab>/`` folders
is one student (what a Slurm array task passes). Out:

    grades.csv          student, lab, score, max_score, percent, nbgrader_score, status, reason, seconds
    exercises.csv       student, lab, exercise, points, max_points     (one row per exercise of a submitted lab)
    feedback/<student>/<lab>.html   results/<student>/<lab>.json (and .ipynb: nbgrader's executed notebook)
    logs/<student>/<lab>.log

Each submission runs in its own grader process (``python -m coursekit.course.grading worker``) with a private
course folder and gradebook, so graders run in parallel safely. The grader first runs the independent re-check
(``recheck``) and sends its result, then nbgrader's autograde (``autograde``). The batch stops a grader that runs
past its limits by killing its process tree; both the grader and the batch are child subreapers (Linux), so
processes a submission detaches (a torchrun agent in its own session, a daemon) are found and killed too. A
submission that crashes, hangs or kills its grader still gets a row with the reason, and the batch goes on.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coursekit.course.config import Course
from coursekit.launch import stamped_env

GRADE_FIELDS = ["student", "lab", "score", "max_score", "percent", "nbgrader_score", "status", "reason", "seconds"]
EXERCISE_FIELDS = ["student", "lab", "exercise", "points", "max_points"]
_DROP_ENV = ("COURSEKIT_RESULTS_DIR", "COURSEKIT_SUBMISSION", "COURSEKIT_RUN_DIR")


@dataclass
class Row:
    student: str
    lab: str
    score: float = 0.0
    max_score: float = 0.0
    nbgrader_score: float | None = None
    status: str = "graded"  # graded | flagged | missing | error
    reason: str = ""
    seconds: float = 0.0
    exercises: dict = field(default_factory=dict)  # exercise -> [points, max_points]

    @property
    def percent(self) -> float:
        return round(100.0 * self.score / self.max_score, 1) if self.max_score else 0.0


# -- process hygiene ---------------------------------------------------------------------------------------------
def set_subreaper(on: bool = True) -> bool:
    """Become the reaper of orphaned descendants (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(36, 1 if on else 0, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER


def kill_descendants(keep: set[int] = frozenset()) -> int:
    """Kill every descendant of this process (with its own descendants) except the pids in ``keep``."""
    import psutil

    from coursekit.launch import kill_tree

    n = 0
    for child in psutil.Process().children():
        if child.pid not in keep:
            kill_tree(child, grace_s=1.0)
            n += 1
    return n


def student_env() -> dict:
    """Environment for student code: one thread per process, no batch bookkeeping variables, no launch progress
    lines (``coursekit.launch``: a graded cell's output is the lab's own). No MPLBACKEND: the
    kernel keeps its inline backend, so the feedback shows the student's figures (a plain process without a display
    falls back to Agg by itself)."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV and k != "MPLBACKEND"}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env["COURSEKIT_PROGRESS"] = "0"  # graded cells print what the lab prints, no launch progress lines
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def fingerprint(course: Course, labs: list[str]) -> str:
    """Hash of the grader's own code and the sources of the labs being graded (a submission that rewrites them is
    caught)."""
    import coursekit.course

    h = hashlib.sha256()
    pkg = Path(coursekit.course.__file__).parent
    files = sorted(pkg.rglob("*.py")) + [course.solutions / lab / f"{lab}.py" for lab in labs]
    for f in files + [course.root / "nbgrader_config.py"]:
        if f.is_file():
            h.update(str(f).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


# -- the grader of one submission (its own process) -------------------------------------------------------------
def worker_main() -> int:
    nonce = sys.stdin.readline().strip()
    job = json.loads(sys.stdin.readline())
    channel = os.fdopen(os.dup(1), "w")  # private: dup'd descriptors are not inherited by children
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)  # the kernel and the student's process inherit these: their output goes to the log
    os.dup2(log, 2)
    set_subreaper()

    def emit(obj):
        channel.write(f"{nonce} {json.dumps(obj)}\n")
        channel.flush()

    import nbformat

    from coursekit.course.authoring import read_lab
    from coursekit.course.recheck import RecheckResult, TestResult, recheck

    course = Course(job["root"], overrides=job["overrides"])
    lab = read_lab(course, job["lab"])  # read before any student code runs
    os.environ.clear()
    os.environ.update(student_env())
    work = Path(job["workdir"])
    (work / "student").mkdir(parents=True, exist_ok=True)
    try:
        submission = nbformat.read(job["notebook"], as_version=4)
    except Exception as e:  # noqa: BLE001
        tests = [TestResult(t.grade_id, ex.name, t.points, 0.0, False, "notebook not readable")
                 for ex in lab.exercises for t in ex.tests]
        result = RecheckResult(lab.name, tests, [f"not a readable notebook: {e}"])
        emit({"phase": "recheck", "result": result.to_dict()})
        emit({"phase": "done"})
        return 0
    t0 = time.monotonic()
    from coursekit.course.isolation import Isolation

    iso = Isolation.from_dict(job.get("isolation"))  # None: --trust-submissions (the student's code runs as us)
    rc = recheck(lab, submission, cwd=str(work / "student"), env=dict(os.environ), log_path=job["student_log"],
                 call_timeout=job.get("call_timeout"), isolation=iso)
    emit({"phase": "recheck", "result": {**rc.to_dict(), "seconds": round(time.monotonic() - t0, 2)}})
    kill_descendants()
    if job["autograde"]:
        from coursekit.course.autograde import autograde

        t0 = time.monotonic()
        try:
            ag = autograde(course, lab, Path(job["template"]), job["student"], Path(job["notebook"]),
                           work / "nbgrader", isolation=iso, sockets=job.get("kernel_dir"))
        except Exception as e:  # noqa: BLE001 (nbgrader itself failed: the re-check still stands)
            ag = {"success": False, "error": f"{type(e).__name__}: {e}", "score": None, "notebook": None}
        ag["seconds"] = round(time.monotonic() - t0, 2)
        kill_descendants()
        emit({"phase": "autograde", "result": ag})
    emit({"phase": "done"})
    return 0


# -- the batch -----------------------------------------------------------------------------------------------------
def student_folders(course: Course, submissions: Path) -> list[Path]:
    """The student folders under ``submissions`` (itself, when it holds lab folders: one student's folder)."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"no such folder: {submissions}")
    children = sorted(d for d in submissions.iterdir() if d.is_dir() and not d.name.startswith("."))
    if any(d.name in course.lab_names() for d in children):  # a single student's folder
        return [submissions]
    return children


def submitted_labs(course: Course, submissions: Path) -> list[str]:
    """The course's labs that at least one student folder under ``submissions`` has a folder for."""
    students = student_folders(course, submissions)
    return [lab for lab in course.lab_names() if any((s / lab).is_dir() for s in students)]


def discover(course: Course, submissions: Path, labs: list[str]) -> list[tuple[str, str, Path | None]]:
    """(student, lab, notebook or None) for every student folder and every lab in ``labs``."""
    students = student_folders(course, submissions)
    out = []
    for s in students:
        for lab in labs:
            nb = s / lab / f"{lab}.ipynb"
            out.append((s.name, lab, nb if nb.is_file() else None))
    return out


class Batch:
    def __init__(self, course: Course, out: Path, labs: list[str], *, jobs: int, autograde: set[str],
                 timeout: float | None, call_timeout: float | None, progress=None, isolation=None):
        self.course, self.out, self.jobs = course, Path(out), jobs
        self.isolation = isolation  # coursekit.course.isolation.Isolation, or None (submissions trusted)
        self.autograde = autograde  # labs that nbgrader's autograde runs for, besides the re-check
        self.timeout, self.call_timeout = timeout, call_timeout
        self.progress = progress or (lambda msg: None)
        self.tmp = Path(tempfile.mkdtemp(prefix="coursekit-grade-"))
        # sandboxed kernels' socket folders: apart from self.tmp (a kernel sees its folder's path), removed with it
        self.kernels = Path(tempfile.mkdtemp(prefix="coursekit-kernels-"))
        os.chmod(self.kernels, 0o711)
        self.labs: dict = {}
        self.templates: dict[str, Path] = {}
        self.lock = threading.Lock()
        self.live: set[int] = set()
        self.before: set[int] = set()
        self.stopped: str | None = None
        self.lab_names = labs
        self.print_ = fingerprint(course, labs)

    def prepare(self, lab_names: list[str], submitted: set[str]) -> None:
        """Parse every lab; make nbgrader's template course folder for those with submissions."""
        from coursekit.course.authoring import read_lab
        from coursekit.course.autograde import prepare_template

        for name in lab_names:
            self.labs[name] = read_lab(self.course, name)
            if name in self.autograde and name in submitted:
                self.templates[name] = prepare_template(self.course, self.labs[name], self.tmp / "template" / name)

    def run_one(self, student: str, lab_name: str, notebook: Path | None) -> Row:
        lab = self.labs[lab_name]
        row = Row(student, lab_name, max_score=lab.max_points)
        row.exercises = {e.name: [0.0, e.points] for e in lab.exercises}
        if notebook is None:
            row.status, row.reason = "missing", f"no {lab_name}/{lab_name}.ipynb submitted"
            return row
        if self.stopped:
            row.status, row.reason = "error", f"not graded: {self.stopped}"
            return row
        t0 = time.monotonic()
        work = self.tmp / "work" / f"{student}--{lab_name}"
        work.mkdir(parents=True, exist_ok=True)
        logs = self.out / "logs" / student
        logs.mkdir(parents=True, exist_ok=True)
        job = {"root": str(self.course.root), "overrides": self.course.overrides, "lab": lab_name,
               "student": student, "notebook": str(notebook.resolve()), "workdir": str(work),
               "template": str(self.templates.get(lab_name, "")), "autograde": lab_name in self.autograde,
               "log": str(work / "grader.log"), "student_log": str(logs / f"{lab_name}.student.log"),
               "call_timeout": self.call_timeout,
               "isolation": self.isolation.to_dict() if self.isolation is not None else None,
               "kernel_dir": str(self.kernels)}
        msgs, killed = self._supervise(job, lab)
        recheck = msgs.get("recheck")
        ag = msgs.get("autograde")
        reasons = []
        if recheck:
            row.score = recheck["score"]
            for t in recheck["tests"]:
                row.exercises[t["exercise"]][0] += t["points"]
            failed = {}
            for t in recheck["tests"]:
                if not t["passed"]:
                    failed.setdefault(t["exercise"], t["message"].strip().splitlines()[0][:160] if t["message"]
                                      else "failed")
            reasons += [f"{e}: {m}" for e, m in failed.items()]
        else:
            row.status = "error"
            reasons.append(killed or "the grader ended before the re-check finished")
        if ag:
            row.nbgrader_score = ag.get("score")
            if not ag.get("success"):
                reasons.append(f"nbgrader autograde failed: {ag.get('error') or 'unknown error'}")
        elif recheck and lab_name in self.autograde:
            reasons.append(f"nbgrader autograde: {killed or 'did not finish'}")
        if row.nbgrader_score is not None and row.nbgrader_score > row.score + 1e-9 and row.status == "graded":
            row.status = "flagged"
            reasons.insert(0, f"nbgrader's in-kernel score {row.nbgrader_score:g} exceeds the independent "
                              f"re-check {row.score:g}: the notebook defeats in-kernel tests")
        row.reason = "; ".join(reasons)[:1000]
        row.seconds = round(time.monotonic() - t0, 2)
        self._write_outputs(row, lab, recheck, ag, notebook, work)
        shutil.rmtree(work, ignore_errors=True)
        if fingerprint(self.course, self.lab_names) != self.print_ and not self.stopped:
            self.stopped = f"grader files changed while grading {student}/{lab_name}"
            row.status, row.reason = "error", f"{self.stopped} (score withheld); {row.reason}"
        return row

    def _supervise(self, job: dict, lab) -> tuple[dict, str]:
        """Run one grader process within its limits; returns (messages by phase, why it was stopped or '')."""
        nonce = secrets.token_hex(16)
        with self.lock:  # registered before another thread's orphan sweep can see it
            proc = subprocess.Popen([sys.executable, "-m", "coursekit.course.grading", "worker"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, text=True, errors="replace", env=stamped_env())
            self.live.add(proc.pid)
        q: queue.Queue = queue.Queue()

        def pump():
            for line in proc.stdout:
                if line.startswith(nonce + " "):
                    q.put(json.loads(line[len(nonce) + 1:]))
            q.put(None)

        threading.Thread(target=pump, daemon=True).start()
        proc.stdin.write(nonce + "\n" + json.dumps(job) + "\n")
        proc.stdin.close()
        total = self.timeout or lab.settings.submission_timeout
        deadline = time.monotonic() + total
        phase_deadline, phase = deadline, "the re-check"
        msgs, killed = {}, ""
        while True:
            left = min(deadline, phase_deadline) - time.monotonic()
            if left <= 0:
                killed = f"{phase} did not finish within its time limit; the grader was stopped"
                break
            try:
                msg = q.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                if "done" not in msgs:
                    killed = f"the grader ended during {phase} (exit code {proc.wait()})"
                break
            msgs[msg["phase"]] = msg.get("result", True)
            if msg["phase"] == "recheck":
                phase = "nbgrader's autograde"
                phase_deadline = time.monotonic() + lab.settings.autograde_timeout
            if msg["phase"] == "done":
                break
        from coursekit.launch import kill_tree

        kill_tree(proc.pid, grace_s=2.0)
        proc.wait()
        with self.lock:
            self.live.discard(proc.pid)
            kill_descendants(self.live | self.before)  # orphans the grader left: reparented to us
        return msgs, killed

    def _write_outputs(self, row: Row, lab, recheck, ag, notebook: Path, work: Path) -> None:
        from coursekit.course.feedback import render

        res_dir = self.out / "results" / row.student
        res_dir.mkdir(parents=True, exist_ok=True)
        rec = {"row": {**asdict(row), "percent": row.percent}, "recheck": recheck, "autograde": ag}
        (res_dir / f"{row.lab}.json").write_text(json.dumps(rec, indent=1))
        if (ag or {}).get("notebook") and Path(ag["notebook"]).is_file():  # the executed notebook, for the instructor
            shutil.copy(ag["notebook"], res_dir / f"{row.lab}.ipynb")
        log = work / "grader.log"
        if log.is_file():
            shutil.copy(log, self.out / "logs" / row.student / f"{row.lab}.grader.log")
        fb = self.out / "feedback" / row.student
        fb.mkdir(parents=True, exist_ok=True)
        nb_path = (ag or {}).get("notebook") or str(notebook)
        (fb / f"{row.lab}.html").write_text(render({**asdict(row), "percent": row.percent}, lab, recheck, nb_path))


def write_csv(rows: list[Row], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=lambda r: (r.student, r.lab))
    with open(out / "grades.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=GRADE_FIELDS)
        w.writeheader()
        for r in rows:
            d = {k: getattr(r, k) for k in GRADE_FIELDS}
            d["nbgrader_score"] = "" if r.nbgrader_score is None else r.nbgrader_score
            w.writerow(d)
    with open(out / "exercises.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=EXERCISE_FIELDS)
        w.writeheader()
        for r in rows:
            if r.status == "missing":  # not submitted: no points to count, in either direction
                continue
            for name, (p, m) in r.exercises.items():
                w.writerow({"student": r.student, "lab": r.lab, "exercise": name, "points": p, "max_points": m})


def grade(course: Course, submissions: str | Path, out: str | Path, *, labs: list[str] | None = None,
          jobs: int | None = None, autograde: bool | list[str] = True, timeout: float | None = None,
          call_timeout: float | None = None, progress=None, isolation: str | None = None,
          limits=None) -> list[Row]:
    """Grade every student × lab under ``submissions`` into ``out``; returns the rows (also in grades.csv).

    ``isolation``: "required" (default, or $COURSEKIT_ISOLATION): every execution of student code runs in an OS
    sandbox (``coursekit.course.isolation``), and grading is refused (IsolationUnavailable) where none can be built;
    "auto": a sandbox where one can be built; "off": none (``--trust-submissions``). ``limits``: its ``Limits``.

    ``labs``: the labs to grade (default: every lab of the course that some student submitted; a student without
    one of them gets a ``missing`` row). ``autograde``: also run nbgrader's autograde (True: for every lab; a list:
    for those labs only)."""
    import psutil

    out = Path(out)
    if not course.lab_names():
        raise FileNotFoundError(f"no labs in {course.solutions}")
    lab_names = labs or submitted_labs(course, Path(submissions))
    if not lab_names:
        raise FileNotFoundError(f"no lab submitted under {submissions} (expected <student>/<lab>/<lab>.ipynb for a "
                                f"lab of {', '.join(course.lab_names())})")
    for name in lab_names:
        course.source_path(name)
    todo = discover(course, Path(submissions), lab_names)
    jobs = jobs or max(1, os.cpu_count() or 1)
    autograde = set(lab_names if autograde is True else (autograde or []))
    from coursekit.course.isolation import for_batch

    out.mkdir(parents=True, exist_ok=True)  # exists before any sandbox starts, so each one hides it
    iso = for_batch(isolation, course_root=course.root, hide=[Path(submissions), out], limits=limits)
    batch = Batch(course, out, lab_names, jobs=jobs, autograde=autograde, timeout=timeout, call_timeout=call_timeout,
                  progress=progress, isolation=iso)
    reaper = set_subreaper()
    batch.before = {p.pid for p in psutil.Process().children()}
    try:
        batch.prepare(lab_names, {lab for _, lab, nb in todo if nb is not None})
        rows: list[Row] = []

        def one(item):
            row = batch.run_one(*item)
            batch.progress(f"{row.student}/{row.lab}: {row.score:g}/{row.max_score:g} {row.status} "
                           f"({row.seconds:.1f} s){' - ' + row.reason[:120] if row.reason else ''}")
            return row

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            rows = list(pool.map(one, todo))
        write_csv(rows, out)
        return rows
    finally:
        if reaper:
            set_subreaper(False)
        shutil.rmtree(batch.tmp, ignore_errors=True)
        shutil.rmtree(batch.kernels, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker_main())
    print("usage: python -m coursekit.course.grading worker  (started by coursekit course grade)", file=sys.stderr)
    sys.exit(2)
