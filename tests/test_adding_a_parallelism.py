"""docs/adding-a-parallelism.md is true: a new parallelism is a folder of new files and one registry entry.

On a copy of the package, the test adds a toy parallelism, ``xp`` (extra data-parallel replicas: an axis outside the
data-parallel ones whose ranks see different data and average their losses), exactly as the doc says: a new folder
``coursekit/xp/`` and one line in ``coursekit/spec/registry.py``, nothing else. With that copy first on the path:
the axis is validated before launch (a world it does not divide is refused naming it), ``coursekit layout`` shows
it, the option ``--xp`` exists, a strategy the entry does not list is refused, and DDP over ``xp`` trains equal to
one process, step by step on every rank.
"""
from __future__ import annotations

import difflib
import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parity import COMMON, assert_equal_to_single, baseline

from coursekit.launch import launch

SRC = Path(__file__).resolve().parents[1] / "src" / "coursekit"

OPTIONS = '''"""The toy parallelism's option group (pure Python: the CLI parses without torch)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class XPOptions:
    xp: int = 1
    """Extra data-parallel replicas (a toy axis)."""
'''

PARALLELISM = '''"""Extra replicas: the model is unchanged; the axis joins the batch and loss groups, so the strategy's gradient
average covers it and the data is sliced over it."""
from __future__ import annotations


class ExtraReplicas:
    name = "xp"

    @classmethod
    def check(cls, opts, dims) -> None:
        if opts.train.global_batch is not None and opts.train.global_batch % dims.xp:
            raise ValueError(f"--xp {dims.xp} needs a global batch divisible by it")

    def __init__(self, ctx):
        self.ctx = ctx

    def apply(self, model, strategy):
        assert self.ctx.mesh["xp"].size() == self.ctx.dims.xp  # its own sub-mesh exists
        return model
'''

ENTRY = ('    "xp": Parallelism("coursekit.xp.parallel:ExtraReplicas", mesh=5, order=30, options="coursekit.xp:XPOptions", '
         'groups=("batch", "loss"), strategies=("ddp",), help="extra data-parallel replicas"),\n')


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("toy") / "src"
    shutil.copytree(SRC, root / "coursekit", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "coursekit" / "xp").mkdir()
    (root / "coursekit" / "xp" / "__init__.py").write_text(OPTIONS)
    (root / "coursekit" / "xp" / "parallel.py").write_text(PARALLELISM)
    reg = root / "coursekit" / "spec" / "registry.py"
    text = reg.read_text()
    anchor = "PARALLELISMS = {\n"
    assert anchor in text
    reg.write_text(text.replace(anchor, anchor + ENTRY, 1))
    return root


def _env(toy: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(toy) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _cli(toy, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "coursekit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(toy))


def test_the_toy_is_new_files_and_one_registry_line(toy):
    cmp = filecmp.dircmp(SRC, toy / "coursekit", ignore=["__pycache__"])

    def changed(c, prefix=""):
        out = [f"{prefix}{n}" for n in c.diff_files] + [f"{prefix}{n}" for n in c.right_only]
        out += [f"{prefix}{n}" for n in c.left_only]
        for name, sub in c.subdirs.items():
            out += changed(sub, f"{prefix}{name}/")
        return out

    assert sorted(changed(cmp)) == ["spec/registry.py", "xp"]
    diff = [d for d in difflib.unified_diff((SRC / "spec/registry.py").read_text().splitlines(),
                                            (toy / "coursekit/spec/registry.py").read_text().splitlines(), lineterm="")
            if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    assert diff == ["+" + ENTRY.rstrip("\n")]


def test_the_axis_is_validated_shown_and_an_option(toy):
    out = _cli(toy, "layout", "--nproc", "4", "--xp", "2", "--json")
    assert out.returncode == 0, out.stderr
    import json

    lay = json.loads(out.stdout)
    assert lay["layout"]["xp"] == 2 and lay["layout"]["dp_replicate"] == 2
    assert lay["ranks"][1]["groups"]["xp"] == [1, 3]  # mesh place 5: outside the data-parallel axes
    bad = _cli(toy, "layout", "--nproc", "3", "--xp", "2")
    assert bad.returncode == 2 and "xp 2" in bad.stderr and "Traceback" not in bad.stderr
    assert "--xp" in _cli(toy, "train", "--help").stdout
    refused = _cli(toy, "train", "--strategy", "fsdp2", "--xp", "2", "--nproc", "2")
    assert refused.returncode == 2 and "does not support xp" in refused.stderr
    assert "does not support xp" not in _cli(toy, "train", "--strategy", "ddp", "--xp", "2", "--nproc", "2",
                                             "--steps", "0").stderr  # ddp is listed (--steps 0: refused for that)


def test_ddp_over_the_toy_axis_trains_equal_to_one_process(toy, no_orphans):
    res = launch("coursekit.train", ["--strategy", "ddp", "--xp", "2", *COMMON], nproc=2, timeout=300, stream=False,
                 env={"PYTHONPATH": str(toy)})
    assert all(r["final"]["world_size"] == 2 for r in res.results)
    assert_equal_to_single(res, baseline())
