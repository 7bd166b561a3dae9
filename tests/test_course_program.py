"""What the re-check loads from a notebook (definitions only) and how answers cross processes (plain JSON)."""
import math

import nbformat
import pytest

from coursekit.course import wire
from coursekit.course.authoring import parse_notebook
from coursekit.course.program import definitions, interface, student_program


def kept(src: str) -> str:
    return definitions(src, "<t>").source


def test_definitions_keep_imports_functions_classes_and_constants():
    src = ("import os\nfrom math import pi\n\n@staticmethod\ndef f(x):\n    return x\n\nclass C:\n    pass\n"
           "BYTES = int('4')\nscale = 2 * pi\n")
    assert kept(src).split("\n")[:11] == src.split("\n")[:11]


def test_definitions_drop_top_level_effects_and_keep_line_numbers():
    src = ("x = compute()\nprint('All tests passed!')\n"
           "get_ipython().input_transformers_cleanup.append(lambda lines: [])\n"
           "import os; os._exit(0)\n"
           "def g():\n    return 1\n"
           "numbers.append(3)\nobj.attr = 1\nwhile True: pass\n")
    out = kept(src).split("\n")
    assert out[3] == "import os"  # the exit on the same line is gone
    assert out[4:6] == ["def g():", "    return 1"]  # still at lines 5-6
    assert not any(s in kept(src) for s in ("compute", "print", "get_ipython", "_exit", "append", "attr", "while"))
    assert definitions(src, "<t>").dropped == 7


def test_lambda_defaults_and_magics():
    assert "f = lambda x: g(x)" in kept("f = lambda x: g(x)\n")  # the body does not run at assignment
    assert "lambda" not in kept("f = lambda x=g(): x\n")  # a default does
    assert kept("%matplotlib inline\n!pip install x\ndef h(): pass\n").split("\n")[2] == "def h(): pass"
    assert kept("%%bash\nrm -rf /\n").strip() == ""
    bad = definitions("def broken(:\n", "<t>")
    assert bad.error and "SyntaxError" in bad.error


def _cell(kind, gid, src):
    meta = {"grade": kind == "test", "solution": kind == "solution", "locked": kind != "solution",
            "grade_id": gid, "schema_version": 3}
    if kind == "test":
        meta["points"] = 1
    return nbformat.v4.new_code_cell(src, metadata={"nbgrader": meta})


def test_student_program_takes_instructor_setup_and_student_solutions_only():
    source = nbformat.v4.new_notebook(cells=[
        _cell("readonly", "setup", "import math\nLIMIT = 3\n"),
        _cell("solution", "ans", "def answer():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION\n"),
        _cell("test", "t", "assert answer() == 42\n")])
    lab = parse_notebook(source, "lab")
    assert interface(lab) == ["answer"]
    sub = nbformat.v4.new_notebook(cells=[
        _cell("readonly", "setup", "import math\nLIMIT = 1000\nmath.sqrt = lambda x: 0\n"),  # edited read-only cell
        _cell("solution", "ans", "def answer():\n    return helper()\n"),
        nbformat.v4.new_code_cell("def helper():\n    return 41 + 1\n"),  # a cell the student added
        _cell("test", "t", "pass\n")])  # an emptied test cell
    chunks, notes = student_program(lab, sub)
    text = "\n".join(c.source for c in chunks)
    assert "LIMIT = 3" in text and "LIMIT = 1000" not in text and "math.sqrt" not in text
    assert "return helper()" in text and "def helper" in text
    assert "pass" not in text and "assert" not in text
    assert notes == []
    del sub.cells[1]
    _, notes = student_program(lab, sub)
    assert notes == ["solution cell ans is missing from the submission"]


class AlwaysEqual(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class Liar(float):
    def __eq__(self, other):
        return True

    def __float__(self):
        return 99.0


def test_answers_cross_as_plain_values_only():
    assert AlwaysEqual(1) == 9  # the trick itself
    got = wire.roundtrip(AlwaysEqual(1))
    assert type(got) is int and got == 1 and got != 9
    assert wire.roundtrip(Liar(2.5)) == 2.5 and type(wire.roundtrip(Liar(2.5))) is float
    with pytest.raises(wire.NotPlainData):
        wire.encode(object())

    class Proxy:
        def __eq__(self, other):
            return True

    with pytest.raises(wire.NotPlainData):
        wire.encode({"answer": Proxy()})


def test_values_keep_their_shape():
    value = {"t": (1, 2.5, "x"), 3: [None, True], (1, 2): {"__tuple__": 1}, "nan": math.inf}
    assert wire.roundtrip(value) == value
    assert type(wire.roundtrip((1, 2))) is tuple
    np = pytest.importorskip("numpy")
    assert wire.roundtrip(np.arange(3)) == [0, 1, 2] and type(wire.roundtrip(np.float64(1.5))) is float


def test_close_is_not_fooled_by_eq():
    assert wire.close([1.0, 2.0], (1.0, 2.0 + 1e-12))
    assert not wire.close(AlwaysEqual(1), 2)
    assert not wire.close({"a": 1}, {"a": 1, "b": 2})
