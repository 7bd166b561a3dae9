"""Grading speed of Lab 1: seconds for one submission, and submissions per minute for a batch.

    python bench/bench_grading.py                      # one submission, then a batch of 4 with 2 graders at once
    python bench/bench_grading.py --students 6 --jobs 1,2 --json
    python bench/bench_grading.py --sandbox on,off --no-nbgrader --skip-single   # the sandbox's cost
    python bench/bench_grading.py --root COURSE --lab NAME ...    # another course folder and lab

Every submission is graded as ``coursekit course grade`` grades it: the independent re-check (the lab's visible and
hidden tests against the student's functions in a separate process; Lab 1 launches a 4-process benchmark and two
torchrun jobs there) and nbgrader's in-kernel autograde (which runs the whole notebook again, launches included).
``--no-nbgrader`` measures the re-check alone (the score is the same; there is no executed notebook in the feedback).
The batch mixes the instructor's solution, a partial submission and the released lab, as a class hands in.
``--sandbox on,off`` grades the same submissions with the OS sandbox (the default) and without it
(``--trust-submissions``), and times a bare sandbox start (``python -c pass`` wrapped and not).
Figures depend on the machine's load: the load average is printed before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from coursekit.course.authoring import read_lab, write_notebook
from coursekit.course.config import Course
from coursekit.course.grading import grade
from coursekit.course.isolation import Isolation

LAB = "lab1_memory"


def submissions(course: Course, root: Path, n: int, lab_name: str = LAB) -> Path:
    """``n`` students: solutions, a partial one (first half of the exercises) and the release, in turn."""
    lab = read_lab(course, lab_name)
    release = nbformat.read(course.release_path(lab_name), as_version=4)
    half = {gid for ex in lab.exercises[: len(lab.exercises) // 2] for gid in ex.solution_ids}
    partial = nbformat.from_dict(release)
    for cell in partial.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in half:
            cell.source = lab.cell(gid).source
    kinds = [("solution", lab.notebook), ("partial", partial), ("solution", lab.notebook), ("release", release)]
    for i in range(n):
        kind, nb = kinds[i % len(kinds)]
        write_notebook(nb, root / f"student{i:02d}-{kind}" / lab_name / f"{lab_name}.ipynb")
    return root


def sandbox_start(root: Path, n: int = 7) -> dict:
    """Median seconds of ``python -c pass``, plain and in a fresh sandbox (what each sandboxed start adds)."""
    import statistics
    import subprocess

    iso = Isolation.detect(course_root=root)
    out = {"mechanism": iso.mechanism}  # "off": no sandbox here, both figures are plain starts
    for name, wrap in (("plain", list), ("sandbox", iso.wrap)):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(wrap([sys.executable, "-c", "pass"]), check=True)
            times.append(time.perf_counter() - t0)
        out[name] = round(statistics.median(times), 3)
    return out


def run(course: Course, subs: Path, out: Path, jobs: int, autograde: bool, lab_name: str = LAB,
        sandbox: str = "on") -> dict:
    t0 = time.monotonic()
    rows = grade(course, subs, out, labs=[lab_name], jobs=jobs, autograde=autograde,
                 isolation=None if sandbox == "on" else "off")  # on: the default ($COURSEKIT_ISOLATION or required)
    wall = time.monotonic() - t0
    graded = [r for r in rows if r.status != "missing"]
    phases = []
    for r in graded:
        path = out / "results" / r.student / f"{lab_name}.json"
        res = json.loads(path.read_text()) if path.is_file() else {}
        phases.append({"student": r.student, "score": r.score, "status": r.status, "reason": r.reason[:200],
                       "seconds": r.seconds, "recheck_s": (res.get("recheck") or {}).get("seconds"),
                       "autograde_s": (res.get("autograde") or {}).get("seconds")})
    return {"jobs": jobs, "sandbox": sandbox, "submissions": len(graded), "wall_s": round(wall, 1),
            "per_minute": round(60 * len(graded) / wall, 2), "rows": phases}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--students", type=int, default=4, help="submissions in the batch")
    p.add_argument("--jobs", default="2", help="comma list of graders at once for the batch (e.g. 1,2)")
    p.add_argument("--no-nbgrader", action="store_true", help="re-check only")
    p.add_argument("--skip-single", action="store_true", help="no single-submission measurement")
    p.add_argument("--sandbox", default="on", help="comma list of on/off: grade in the OS sandbox or not "
                                                    "(on,off compares them on the same submissions)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="course folder (default: this "
                   "repository)")
    p.add_argument("--lab", default=LAB, help=f"lab to grade (default {LAB})")
    args = p.parse_args(argv)
    os.environ.setdefault("COURSEKIT_DEVICE", "cpu")
    course = Course(Path(args.root))
    autograde = not args.no_nbgrader
    report = {"cpus": os.cpu_count(), "python": platform.python_version(), "nbgrader": autograde,
              "load_before": os.getloadavg()}
    modes = args.sandbox.split(",")
    if "on" in modes:
        report["sandbox_start_s"] = sandbox_start(course.root)
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        single = submissions(course, tmp / "one", 1, args.lab)
        subs = submissions(course, tmp / "batch", args.students, args.lab)
        report["single"], report["batch"] = [], []
        for mode in modes:
            if not args.skip_single:
                report["single"].append(run(course, single, tmp / f"out-one-{mode}", 1, autograde, args.lab, mode))
            report["batch"] += [run(course, subs, tmp / f"out-{j}-{mode}", int(j), autograde, args.lab, mode)
                                for j in args.jobs.split(",")]
    report["load_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    mode = "re-check + nbgrader autograde" if autograde else "re-check only"
    print(f"{args.lab} grading ({mode}), {report['cpus']} CPUs, load average before {report['load_before'][0]:.1f}, "
          f"after {report['load_after'][0]:.1f}")
    if "sandbox_start_s" in report:
        st = report["sandbox_start_s"]
        print(f"  python -c pass: {st['plain'] * 1000:.0f} ms plain, {st['sandbox'] * 1000:.0f} ms in a fresh sandbox "
              f"({st['mechanism']})")
    for s in report["single"]:
        r = s["rows"][0]
        phases = f"re-check {r['recheck_s']} s" + (f", nbgrader {r['autograde_s']} s" if autograde else "")
        print(f"  one submission, sandbox {s['sandbox']}: {r['seconds']:.1f} s in its grader ({phases}); "
              f"{s['wall_s']:.1f} s for the whole command"
              f"{' (with making nbgrader’s template course)' if autograde else ''}")
    for b in report["batch"]:
        print(f"  batch of {b['submissions']} with {b['jobs']} grader(s) at once, sandbox {b['sandbox']}: "
              f"{b['wall_s']:.1f} s, {b['per_minute']:.2f} submissions per minute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
