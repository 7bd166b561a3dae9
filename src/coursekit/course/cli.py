"""``coursekit course``: the instructor's commands.

    coursekit course build [--lab L] [--check]      generate labs/ from solutions/ (--check: fail on drift)
    coursekit course validate [--lab L] [--fast]     solutions pass every test; releases fail every exercise
    coursekit course grade SUBMISSIONS --out DIR     grades.csv, exercises.csv, feedback HTML per student
    coursekit course report DIR [--out FIG]          score distribution per exercise
    coursekit course gradebook DIR...                the graded rows into formgrader's gradebook
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit course", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--root", default=None, help="course folder (default: nearest folder with nbgrader_config.py)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    b = sub.add_parser("build", help="generate labs/<lab>/ from solutions/<lab>/<lab>.py", allow_abbrev=False)
    b.add_argument("--lab", action="append", help="only this lab (repeatable)")
    b.add_argument("--check", action="store_true", help="write nothing; exit 1 if labs/ differ from a fresh build")

    v = sub.add_parser("validate", help="every solution passes all its tests; every released lab fails every "
                                        "exercise", allow_abbrev=False)
    v.add_argument("--lab", action="append", help="only this lab (repeatable)")
    v.add_argument("--fast", action="store_true", help="re-check only, without nbgrader's autograde")
    v.add_argument("--jobs", type=int, default=None, help="submissions graded at once (default: CPU count)")

    g = sub.add_parser("grade", help="grade SUBMISSIONS/<student>/<lab>/<lab>.ipynb", allow_abbrev=False)
    g.add_argument("submissions", help="folder of student folders (or one student's folder)")
    g.add_argument("--out", default=None, help="output folder (grades.csv, exercises.csv, feedback/, ...); default "
                   "$COURSEKIT_RESULTS_DIR, which slurm/grade-array.sbatch sets per task")
    g.add_argument("--lab", action="append", help="only this lab (repeatable; default: every lab someone submitted)")
    g.add_argument("--jobs", type=int, default=None, help="submissions graded at once (default: CPU count)")
    g.add_argument("--timeout", type=float, default=None,
                   help="seconds per submission (default: the lab's submission_timeout)")
    g.add_argument("--call-timeout", type=float, default=None,
                   help="seconds per call of a student function in the re-check (default: the lab's)")
    g.add_argument("--no-nbgrader", action="store_true",
                   help="skip nbgrader's in-kernel autograde (the re-check alone sets the score anyway)")
    g.add_argument("--trust-submissions", action="store_true",
                   help="run the students' code without the OS sandbox, as yourself (default: every execution of "
                        "student code runs in a sandbox, and grading is refused where none can be built)")
    g.add_argument("--sandbox-limits", default=None, metavar="cpu=S,memory=B,nproc=N,fsize=B,tmp=B",
                   help="limits of each sandbox (default cpu=1800,memory=8G,nproc=512,fsize=1G,tmp=1G; "
                        "$COURSEKIT_SANDBOX_LIMITS)")
    g.add_argument("--gradebook", action="store_true",
                   help="then write the graded rows into formgrader's gradebook (course/gradebook.db), as "
                        "`coursekit course gradebook DIR` does (not from a Slurm array's tasks: run that once after)")

    r = sub.add_parser("report", help="score distribution per exercise as a figure", allow_abbrev=False)
    r.add_argument("grades", nargs="+", help="output folder(s) of `coursekit course grade` (merged)")
    r.add_argument("--out", default=None, help="figure file (default: score_distribution.png in the first folder)")

    k = sub.add_parser("gradebook", help="write graded rows into formgrader's gradebook (course/gradebook.db) and "
                                         "their executed notebooks into course/autograded/", allow_abbrev=False)
    k.add_argument("grades", nargs="+", help="output folder(s) of `coursekit course grade` (later ones win)")
    return p


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _gradebook(course, outs) -> int:
    from coursekit.course.gradebook import publish  # nbgrader's database models: only for this command

    n = publish(course, *outs, log=_say)
    print(f"wrote {n} submission(s) into formgrader's gradebook")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from coursekit.course.config import Course

    course = Course(args.root)
    if args.cmd == "build":
        from coursekit.course.authoring import build, drift

        if args.check:
            problems = drift(course, args.lab)
            for p in problems:
                print(p)
            print("labs/ in sync with solutions/" if not problems else f"{len(problems)} difference(s)")
            return 1 if problems else 0
        for d, changed in build(course, args.lab):
            print(f"{'wrote' if changed else 'unchanged'} {d.relative_to(course.root)}")
        return 0
    if args.cmd == "validate":
        from coursekit.course.validate import validate

        problems = validate(course, args.lab, nbgrader=not args.fast, jobs=args.jobs, progress=_say)
        for p in problems:
            print(f"FAIL {p}")
        print("all labs valid" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    if args.cmd == "grade":
        import os

        from coursekit.course.grading import grade

        args.out = args.out or os.environ.get("COURSEKIT_RESULTS_DIR")
        if not args.out:
            raise ValueError("give --out DIR (or set COURSEKIT_RESULTS_DIR)")
        rows = grade(course, args.submissions, args.out, labs=args.lab, jobs=args.jobs,
                     autograde=not args.no_nbgrader, timeout=args.timeout, call_timeout=args.call_timeout,
                     progress=_say, isolation="off" if args.trust_submissions else None,
                     limits=args.sandbox_limits)
        bad = [r for r in rows if r.status in ("error", "flagged")]
        print(f"graded {len(rows)} row(s) into {Path(args.out) / 'grades.csv'}"
              f"{f'; {len(bad)} flagged or failed (see the reason column)' if bad else ''}")
        return _gradebook(course, [args.out]) if args.gradebook else 0
    if args.cmd == "gradebook":
        return _gradebook(course, args.grades)
    if args.cmd == "report":
        from coursekit.course.report import figure, load, table

        data = load(*args.grades)
        print(table(data))
        out = figure(data, args.out or Path(args.grades[0]) / "score_distribution.png")
        print(f"wrote {out}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
