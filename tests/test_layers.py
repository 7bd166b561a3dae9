"""The floors of src/coursekit hold: import-linter's contracts (pyproject.toml) and no import cycle anywhere.

A back-arrow (a lower floor importing a higher one, e.g. the calculator importing the trainer) breaks the layers
contract; a torch import reached from the calculator, the planner's model or the run description breaks the
forbidden contract; a cycle inside a floor (or inside one package, as memory/'s engines once were) fails the
cycle test. grimp's graph counts every import, the ones inside functions included, so a function-local import
cannot hide a back-arrow.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "coursekit"
# Function-local imports of coursekit's own modules (the torch-heavy ones keep `coursekit train --help`, `coursekit memory` and a lab's first
# import fast). With no cycle left none of them hides a back-arrow; the budget only stops their number growing
# unnoticed: lower it when you remove some.
LOCAL_IMPORT_BUDGET = 256  # a ratchet: lower it when imports leave functions (session 17: +2 train.preload's options and loop, imported by the forking launch agent only; session 16: -1 the ZeRO config's check, now in the torch-free zero.rules; EP apply +1, expert load +2 earlier; -5 session 12, -4 session 13; +1 the resume's expert-slice check, +1 TP's partial-gradient mark, +1 its vocab-parallel embedding: torch kept out of the CLI; session 15: +1 course gradebook (nbgrader's models), -3 plan.cli's own modules at its top)


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert "3 kept, 0 broken" in out.stdout, out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0


def _sccs(nodes, succ):
    """Tarjan's strongly connected components with more than one member (iterative: no recursion limit)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ(root)))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ(w))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("coursekit")


def test_sccs_finds_a_planted_cycle():
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": []}
    assert _sccs(list(edges), lambda v: edges[v]) == [["a", "b", "c"]]


def test_no_module_imports_itself_back(graph):
    """No cycle between modules (e.g. states -> engines -> states)."""
    mods = sorted(graph.modules)
    internal = lambda m: sorted(x for x in graph.find_modules_directly_imported_by(m) if x.startswith("coursekit"))  # noqa: E731
    assert _sccs(mods, internal) == []


def test_no_cycle_between_packages(graph):
    """No cycle between the top-level packages either (16 of 27 were in one before the floors)."""
    def top(m):
        return ".".join(m.split(".")[:2])

    succ: dict[str, set] = {}
    for m in graph.modules:
        for x in graph.find_modules_directly_imported_by(m):
            if x.startswith("coursekit.") and top(x) != top(m):
                succ.setdefault(top(m), set()).add(top(x))
    pkgs = sorted({top(m) for m in graph.modules if m != "coursekit"})
    assert _sccs(pkgs, lambda p: sorted(succ.get(p, ()))) == []


def _local_imports() -> list[str]:
    out = []
    for f in sorted(SRC.rglob("*.py")):
        tree = ast.parse(f.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(fn):
                    if not isinstance(n, (ast.Import, ast.ImportFrom)):
                        continue
                    names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
                    if getattr(n, "level", 0) or any(x.startswith("coursekit") for x in names):
                        out.append(f"{f.relative_to(SRC)}:{n.lineno}")
    return sorted(set(out))


def test_function_local_imports_are_counted():
    n = len(_local_imports())
    print(f"function-local imports: {n} (budget {LOCAL_IMPORT_BUDGET})")
    assert 0 < n <= LOCAL_IMPORT_BUDGET, f"{n} function-local imports, budget {LOCAL_IMPORT_BUDGET}"


@pytest.mark.parametrize("module", ["coursekit.spec", "coursekit.options", "coursekit.memory.cli",
                                    "coursekit.plan.cli", "coursekit.layout_cli"])
def test_pure_modules_load_without_torch_at_run_time(module):
    """The same promise at run time (a package __init__ the static graph does not follow would show here)."""
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "bad = [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} pulled in {out.stdout.strip()}"


def test_coursekit_train_checks_a_run_before_launch_without_torch():
    """``coursekit train`` refuses a bad run before launching (``coursekit.parallel.validate``: the strategies' torch-free
    ``rules``, the parallelisms' checks): no torch in the CLI's process (~1 s of every launch on 2 CPU cores)."""
    runs = [["--strategy", "ddp", "--nproc", "2"], ["--strategy", "zero2", "--nproc", "2"],
            ["--strategy", "fsdp2", "--nproc", "2", "--reshard-after-forward", "false"],
            ["--strategy", "hsdp", "--dp-replicate", "2", "--dp-shard", "2"], ["--strategy", "ddp", "--tp", "2"],
            ["--strategy", "fsdp2", "--cp", "2"], ["--strategy", "single", "--nproc", "1"]]
    code = ("import sys; from coursekit.train.launcher import plan\n"
            f"for a in {runs!r}:\n    plan(a + ['--steps', '1'])\n"
            "print([m for m in ('torch', 'transformers', 'datasets', 'deepspeed') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COURSEKIT_DEVICE": "cpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"the checks before launch pulled in {out.stdout.strip()}"


def test_the_trainers_preloaded_modules_are_what_its_run_imports():
    """``coursekit.train.loop.RUN_MODULES`` (imported by torchrun's agent before it forks the workers) names the
    coursekit modules ``run`` imports inside: a new local import left out of it would be imported after the fork by
    every worker (slower, silently), one dropped from ``run`` would be preloaded for nothing."""
    import ast
    import inspect

    from coursekit.train import loop

    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(loop.run))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("coursekit"):
            names |= ({f"coursekit.{a.name}" for a in node.names} if node.module == "coursekit" else {node.module})
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("coursekit")}
    assert names == set(loop.RUN_MODULES), names ^ set(loop.RUN_MODULES)
