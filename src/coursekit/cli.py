"""The ``coursekit`` command: one small class per subcommand, one registry, errors become exit codes.

Subcommands import their heavy dependencies (torch, deepspeed, nbgrader) only when they run, so
``coursekit memory`` answers instantly.
"""
from __future__ import annotations

import argparse
import importlib
import sys


class Command:
    name = ""
    help = ""

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        pass

    def run(self, args, rest: list[str]) -> int:
        raise NotImplementedError


class Passthrough(Command):
    """A subcommand whose module parses its own arguments: ``module.main(argv) -> int``."""

    target = ""

    def run(self, args, rest):
        mod, fn = self.target.split(":")
        return int(getattr(importlib.import_module(mod), fn)(rest) or 0)


class Demo(Passthrough):
    name, help, target = "demo", "the main job: short real trainings on 1 and 2+ processes, a table", \
        "coursekit.demo:main"


class Train(Passthrough):
    name, help, target = "train", "run the reference trainer through the launcher (coursekit train --help)", \
        "coursekit.train.launcher:main"


class Doctor(Passthrough):
    name, help, target = "doctor", "what this machine offers: torch build, backends, GPUs, DeepSpeed ops, Slurm, " \
        "nbgrader", "coursekit.doctor:main"


class Memory(Passthrough):
    name, help, target = "memory", "exact per-GPU memory budget of a training configuration", \
        "coursekit.memory.cli:main"


class Plan(Passthrough):
    name, help, target = "plan", "the fastest parallel layout that fits, with a predicted step time", \
        "coursekit.plan.cli:main"


class Course(Passthrough):
    name, help, target = "course", "instructors: build, validate, grade and report the labs", "coursekit.course.cli:main"


class Lab(Passthrough):
    name, help, target = "lab", "start JupyterLab on the course (learners; --instructor: with formgrader's labs)", \
        "coursekit.course.lab:main"


class K8s(Passthrough):
    name, help, target = "k8s", "Kubernetes manifests for the course's jobs (render), checked offline (validate)", \
        "coursekit.k8s.cli:main"


class Trace(Passthrough):
    name, help, target = "trace", "compute vs communication per rank and step from profiler traces (overlap %%)", \
        "coursekit.profiling.trace_cli:main"


class Launch(Passthrough):
    name, help, target = "launch", "run any script on N processes under torchrun; --diagnose explains a hang", \
        "coursekit.profiling.hangs:main"


class Layout(Passthrough):
    name, help, target = "layout", "which rank holds which mesh coordinate, which groups it talks in", \
        "coursekit.layout_cli:main"


COMMANDS = [Demo(), Train(), Doctor(), Memory(), Plan(), Layout(), Course(), Lab(), K8s(), Trace(), Launch()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="coursekit", description="coursekit: the library behind the course labs")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for c in COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, add_help=not isinstance(c, Passthrough), allow_abbrev=False)
        c.add_arguments(sp)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    by_name = {c.name: c for c in COMMANDS}
    if argv[0] not in by_name:
        print(f"error: unknown command {argv[0]!r}; choose one of: {', '.join(by_name)}", file=sys.stderr)
        return 2
    cmd = by_name[argv[0]]
    if isinstance(cmd, Passthrough):
        args, rest = argparse.Namespace(), argv[1:]
    else:
        args, rest = parser.parse_known_args(argv)
    try:
        return cmd.run(args, rest)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a failed job: the launcher's message already names the rank and its traceback
        from coursekit.launch import LaunchError

        if isinstance(e, LaunchError):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
