"""Mutation score of the pure-Python core: how many small planted bugs (mutmut 3's mutants) the fast tests kill.

    .venv/bin/python bench/bench_mutation.py                      # every module below (minutes to an hour)
    .venv/bin/python bench/bench_mutation.py comm.volume flops    # some of them

For each module: a copy of the repository (its tracked files) in a temporary folder, ``[tool.mutmut]`` pointing at
that one file and at its fast tests (pure Python: no launch), ``mutmut run``, and one row: mutants, killed,
survived, not reached by those tests, and the score = killed / (killed + survived + not reached). A survivor is a
change of the code that no test notices: read them with ``mutmut results`` / ``mutmut show NAME`` in the copy the
script names (``--keep``). The goal (issue 31) is >= 90 % in each module. Prints figures; it is not a test.

Equivalent mutants (no input can tell them from the code) are marked in ``MARKED`` below, one reason per mutant
name: they are reported apart (column "equivalent") and left out of the score's denominator. A marked mutant that a
test kills, or that no longer exists (the function changed, so mutmut renumbered), is printed as a stale mark, counted
as what it is, not as equivalent. ``--survivors``: the marks and reasons, no run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# module -> the fast tests that exercise it (no multi-process launch), as pytest node selections
MODULES = {
    "comm.volume": ["tests/test_comm.py", "tests/test_comm_volume_mutants.py"],
    "flops": ["tests/test_memory_flops.py"],
    "spec.dims": ["tests/test_parallel_dims.py"],
    "spec.runspec": ["tests/test_runspec.py", "tests/test_run_vocabulary.py", "tests/test_runspec_mutants.py"],
    "memory.states": ["tests/test_memory_states.py", "tests/test_memory_engines.py"],
    # its measured grids (torch, CPU and meta device) and the CUDA kernels' meta registrations; not the launch test
    "memory.activations": ["tests/test_memory_activations.py", "tests/test_memory_activations_mutants.py",
                           "tests/test_memory_cuda_kernels.py", "--deselect",
                           "tests/test_memory_activations.py::"
                           "test_saved_bytes_per_cp_rank_equal_coursekit_memory_cp_impl"],
    "memory.pp_order": ["tests/test_pp_models.py"],  # its torch reference test too (orders cached: it clears them)
    "pp.bubble": ["tests/test_pp_models.py", "tests/test_pp.py::test_bubble_theory",  # pure Python, no torch
                  "tests/test_pp.py::test_each_schedules_order_with_equal_stages_replays_its_bubble",
                  "tests/test_pp.py::test_replay_of_an_even_gpipe_timeline_is_the_theory",
                  "tests/test_pp.py::test_uneven_stage_formula_is_what_the_schedule_replays"],
}
# Modules not yet marked one by one (MARKED below): their survivors' kinds in words, read 2026-12-03, found equivalent
# (no behaviour can tell them apart) or left on purpose; printed with --survivors. They still count in the score.
EQUIVALENT = {
    "comm.volume": [
        "left open: fsdp's HSDP all-reduce u // world -> u / world differs only for a unit not divisible by the "
        "world, which FSDP2 always pads (the docstring asks for padded counts) but fsdp does not refuse"],
}
# Equivalent mutants, one by one: mutmut's name (without the module's prefix) -> why no input can tell it from the
# code. Left out of the score's denominator and reported apart; read them with ``mutmut show NAME`` in a --keep copy.
_VIRT = ("VIRTUAL.get(schedule, 1)'s default -> {}: VIRTUAL holds every schedule of coursekit.spec."
         "schedules, MODELLED among them; any other name _order refuses (not modelled) before it reads v")
MARKED: dict[str, dict[str, str]] = {
    "memory.pp_order": {
        **{f"x_order__mutmut_{i}": _VIRT.format(d) for i, d in ((15, "None"), (17, "(none)"), (18, "2"))},
        **{f"x_peak__mutmut_{i}": _VIRT.format(d) for i, d in ((5, "None"), (7, "(none)"), (8, "2"))},
        "x__interleaved__mutmut_1": "zero_bubble's default False -> True: its one caller (_order) always passes it",
        "x__interleaved__mutmut_42": "count's keys 'FIBW' -> 'XXFIBWXX': adds counters for kinds never stepped",
        **{f"x__zbv__mutmut_{i}": "fiw(..., weight=False) -> weight=None: fiw only tests `if weight`, both falsy"
           for i in (62, 67, 74)},
        "x__dualpipev__mutmut_137": "(rank + 1) // 2 -> / 2 where rank % 2 == 1: rank + 1 is even, the same number "
                                    "(and for an even rank the `and` is False either way)",
        "x__dualpipev__mutmut_139": "(rank + 1) // 2 -> (rank + 2) // 2 where rank % 2 == 1: equal for an odd rank",
        **{f"x__dualpipev__mutmut_{i}": f"the tail loop's \"B\" branch {what}: dead, split is always True there (the "
           "split loop reaches i = (rank + 1) // 2 <= rank for every rank, and rank 0 splits at i = 0)"
           for i, what in ((186, "-> `split or True`"), (189, "-> 'XXBXX'"), (190, "-> 'b'"))},
        "x__dualpipev__mutmut_193": "the last weight() loop range(rank + 1) -> rank + 2: the extra call finds "
                                    "nothing pending (every input pass's W has run: each chunk F, I, W exactly "
                                    "once, tests/test_pp_models.py) and does nothing",
    },
    "spec.dims": {
        "x_check_model__mutmut_16": "kv >= tp -> kv > tp: they differ only at kv == tp, where kv % tp is 0 (no "
                                    "error either way)",
        "x_check_model__mutmut_20": "kv < tp -> kv <= tp: they differ only at kv == tp, where tp % kv is 0 (no "
                                    "error either way)",
    },
    "comm.volume": {
        "x_expert_rows__mutmut_5": "E's value for an empty group 0 -> 1: an empty group is refused either way "
                                   "(n 0 != ep, or ep 0 < 1) and the message does not show E",
        "x_textbook_table__mutmut_24": "zero1's row -> zero(2, ...): the table is one micro-batch, where ZeRO-1 "
                                       "and ZeRO-2 issue the same calls (they differ only in micro_batches)",
    },
    "flops": {
        **{f"x_mfu__mutmut_{i}": f"mfu's causal=causal -> {what}: flops_per_token reads it as a flag, and "
           "its default is False" for i, what in ((22, "causal=None (falsy, as False)"), (25, "left out"))},
    },
    "pp.bubble": {
        "x_ideal__mutmut_17": "ideal's timelines start at t = 1.0 instead of 0: replay only sorts by start time and "
                              "restarts its own clock from 0",
        **{f"x_replay__mutmut_{i}": f"replay's clock {what}: _duration reads only 'cpu', anything else is wall"
           for i, what in ((1, "default 'wall' -> 'XXwallXX'"), (2, "default 'wall' -> 'WALL'"), (6, "-> None"))},
        "x_replay__mutmut_39": "moved = False -> None: only read as `not moved`",
    },
    "memory.activations": {
        "x__check__mutmut_79": "sp's seq // cp % tp -> seq / cp % tp: seq % cp was refused just above, so seq / cp "
                               "is a whole number (as a float: the same remainder)",
        "x__attention__mutmut_1": "_attention's ulysses=0 default -> 1: its one caller always passes it",
        "x__attention__mutmut_147": "the MQA view's a > 1 -> a >= 1: they differ only at a == k == 1, where "
                                    "(k if kv_view else a) is 1 either way",
    },
    "spec.runspec": {
        **{f"xǁRunSpecǁtrainer_argv__mutmut_{i}": f"the defaults' filter 'degrees' -> {what}: only adds the degrees "
           "field's default (MISSING: it has a default_factory) to a dict read for seven other fields"
           for i, what in ((4, "'XXdegreesXX'"), (5, "'DEGREES'"))},
        "xǁRunSpecǁfrom_options__mutmut_87": "bool(opt('TPOptions', 'sp', False)) -> default None: bool(None) is "
                                             "False too",
        **{f"xǁRunSpecǁfrom_options__mutmut_{i}": f"opt('TPOptions', 'sp_style', 'torch')'s default -> {what}: "
           "it only meets == 'megatron', False for any other default" for i, what in
           ((103, "None"), (112, "'XXtorchXX'"), (113, "'TORCH'"))},
        "xǁRunSpecǁcalculator__mutmut_7": "self.batch(dims) -> self.batch(None): batch then builds self.dims() "
                                          "again, the same mesh (a frozen spec; only slower)",
    },
}


# Further modules, each area's tests and marks in a file of its own (same three tables, merged here)
# (bench/mutants_*.py: every file found is merged, so an area's tables stay in one file a person edits)
import importlib  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ scripts are not a package
for _path in sorted(Path(__file__).resolve().parent.glob("mutants_*.py")):
    _area = importlib.import_module(_path.stem)
    for _table, _more in ((MODULES, _area.MODULES), (EQUIVALENT, _area.EQUIVALENT), (MARKED, _area.MARKED)):
        assert not set(_table) & set(_more), f"{_area.__name__}: module listed twice"
        _table.update(_more)


def _copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def tally(module: str, exit_codes: dict) -> dict:
    """Each mutant's status from mutmut's exit codes (its ``.meta`` file), the marked equivalent ones apart."""
    from mutmut.stats import status_by_exit_code  # noqa: PLC0415 - mutmut is the venv's, only for a run

    prefix = "coursekit." + module + "."
    marks = MARKED.get(module, {})
    out = {"mutants": len(exit_codes), "killed": 0, "survived": 0, "not_reached": 0, "equivalent": 0,
           "left": [], "stale": []}
    for name, code in exit_codes.items():
        short = name.removeprefix(prefix)
        status = status_by_exit_code[code]
        caught = status in ("killed", "timeout", "segfault", "caught by type check")  # a hang or crash is caught
        if short in marks and not caught:
            out["equivalent"] += 1
            continue
        if short in marks:
            out["stale"].append(f"{short} (marked equivalent, but killed)")
        if caught:
            out["killed"] += 1
        elif status == "skipped":  # mutmut's own skip (none here): neither caught nor missed
            pass
        elif status in ("no tests", "not checked", "check was interrupted by user"):
            out["not_reached"] += 1
            out["left"].append(f"{short} (not reached)")
        else:  # survived, suspicious
            out["survived"] += 1
            out["left"].append(short)
    short_names = {n.removeprefix(prefix) for n in exit_codes}
    out["stale"] += [f"{n} (marked equivalent, no such mutant now)" for n in marks if n not in short_names]
    out["score"] = out["killed"] / max(1, out["killed"] + out["survived"] + out["not_reached"])
    return out


def score(module: str, tests: list[str], *, keep: bool = False, timeout: float = 3600, children: int = 0) -> dict:
    path = "src/coursekit/" + module.replace(".", "/") + ".py"
    work = Path(tempfile.mkdtemp(prefix=f"mutmut-{module}-"))
    try:
        _copy(work)
        missing = [t for t in tests if t.startswith("tests/") and not (work / t.split("::")[0]).is_file()]
        if missing:  # the copy holds git's tracked files only
            return {"module": module, "error": [f"{', '.join(missing)}: not tracked by git (git add it)"]}
        cfg = work / "pyproject.toml"
        cfg.write_text(cfg.read_text() + "\n[tool.mutmut]\n" + f'paths_to_mutate = ["{path}"]\n'
                       + f"pytest_add_cli_args_test_selection = {tests!r}\n".replace("'", '"')
                       + 'also_copy = ["src/", "tests/", "configs/", "labs/", "solutions/"]\n')
        env = {**os.environ, "PYTHONPATH": "src", "COURSEKIT_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
               "HF_HUB_OFFLINE": "1"}
        mutmut = str(Path(sys.executable).with_name("mutmut"))
        t0 = time.monotonic()
        r = subprocess.run([mutmut, "run", "--max-children", str(children or os.cpu_count() or 2)], cwd=work, env=env,
                           capture_output=True, text=True, timeout=timeout)
        meta = work / "mutants" / (path + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.is_file() else {}
        if not any(c is not None for c in codes.values()):  # nothing checked: the tests did not even collect
            said = [ln for ln in (r.stdout + r.stderr).replace("\r", "\n").splitlines()
                    if ln.strip() and "Warning" not in ln and "warnings.warn" not in ln and "Running stats" not in ln]
            return {"module": module, "error": said[-8:]}
        return {"module": module, **tally(module, codes),
                "seconds": time.monotonic() - t0, "copy": str(work) if keep else None}
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    p.add_argument("--keep", action="store_true", help="keep each copy (to read the survivors with mutmut) and list "
                   "the unmarked survivors")
    p.add_argument("--survivors", action="store_true", help="print the marked equivalent mutants and why, no run")
    p.add_argument("--children", type=int, default=0, help="mutmut's parallel test runs (default: one per CPU)")
    a = p.parse_args(argv)
    if a.survivors:
        for m in a.modules or MODULES:
            marks = MARKED.get(m, {})
            notes = EQUIVALENT.get(m, [])
            print(f"{m}: {len(marks)} marked equivalent" + "".join(f"\n  - {n}: {why}" for n, why in marks.items())
                  + "".join(f"\n  - (not marked one by one) {why}" for why in notes))
        return 0
    unknown = set(a.modules) - set(MODULES)
    if unknown:
        p.error(f"unknown module(s) {sorted(unknown)}; known: {', '.join(MODULES)}")
    print(f"{'module':<24} {'mutants':>7} {'killed':>7} {'survived':>8} {'not reached':>11} {'equivalent':>10} "
          f"{'score':>7} {'s':>6}")
    for m in a.modules or MODULES:
        r = score(m, MODULES[m], keep=a.keep, children=a.children)
        if "error" in r:
            print(f"{m:<24} error: {r['error']}")
            continue
        print(f"{m:<24} {r['mutants']:>7} {r['killed']:>7} {r['survived']:>8} {r['not_reached']:>11} "
              f"{r['equivalent']:>10} {100 * r['score']:>6.1f}% {r['seconds']:>6.0f}"
              + (f"  (copy: {r['copy']})" if r["copy"] else ""), flush=True)
        for what, names in (("left (unmarked survivors)", r["left"]), ("stale marks", r["stale"])):
            if names and (a.keep or what == "stale marks"):
                print(f"  {what}:" + "".join(f"\n    {n}" for n in names), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
