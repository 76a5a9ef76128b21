"""What a graded call may return, and what it may not change: the grader's defence against forged
values and rebound names (docs/sandbox.md, *Forged values*).

Assert-based tests compare with ``==``, ``<`` or ``abs(a - b)``, and the left operand decides: an
object whose ``__eq__`` answers True passes ``assert candidate(x) == y``, and so does an ``int``
subclass, or honest-looking values after the candidate rebinds ``builtins.abs`` or ``math.isclose``.
Two rules close that, inside the sandbox's launcher:

* **Values that are data.** A graded function's return value, and each operand of a ClassEval
  assertion, must be *plain data*: of an exact type in :data:`PLAIN_TYPES` (``type(v) in ...``,
  not ``isinstance``), recursively through its containers. :data:`ADMITTED` lists the few library
  types admitted beside them (values the benchmarks' own solutions compare), each an immutable
  C type: no program can change its comparisons or subclass its way into the exact-type test.
  Instances of a class the program defines are admitted where the benchmark builds them (MBPP's
  ``Pair(5, 24)`` arguments, ClassEval's task classes) only if they compare as ``object`` does, by
  identity: their class (or a base but ``object``) defines none of :data:`FORGING_METHODS`.
* **An environment that stays put.** :class:`Environment` snapshots, before the program runs, the
  bindings the test code can reach: ``builtins``, the modules the test imports and their Python
  classes, and (once the test is defined) the program's own globals that the test reads, with
  builtins the test names not shadowed there. :meth:`Environment.changes` lists what moved; the
  launcher checks it after every graded call and every assertion.

What remains (docs/sandbox.md): code in the grader's own process can still reach the grader's
objects (frames, closures, ``gc``) and forge from there; the OS layer bounds what it can do.

Standard library only: the launcher loads this file inside the sandbox.
"""

from __future__ import annotations

import ast
import builtins
import collections
import datetime
import decimal
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# Pinned: a program may rebind builtins (that is what Environment detects); the checks that detect
# it must not follow, so every builtin this module uses is a global of its own
# (tests/test_forgery.py checks the list is complete).
from builtins import (BaseException, Exception, OSError, all, any, bool, bytes, complex, dict, float,  # noqa: A004
                      frozenset, getattr, hasattr, id, int, isinstance, issubclass, len, list, object, range, set,
                      sorted, str, tuple, type, vars)
from os import listdir
from sys import getprofile, gettrace
from threading import active_count
from types import ModuleType

PLAIN_TYPES: frozenset[type] = frozenset({int, float, complex, bool, str, bytes, type(None), list, tuple, dict,
                                          set, frozenset})  # fmt: skip
# Beside the builtins: immutable C types the benchmarks' own solutions return or compare (ClassEval's
# dates, decimals, deques; classes themselves, as in ``assertEqual(type(x), int)``, whose ``==`` is
# identity), ``collections.Counter`` (watched, below), and numpy's number scalars (ClassEval_30/57/59
# compare them) when numpy is loaded.
ADMITTED: frozenset[type] = frozenset({type, datetime.date, datetime.datetime, datetime.time, datetime.timedelta,
                                       datetime.timezone, decimal.Decimal, collections.deque,
                                       collections.OrderedDict, collections.defaultdict,
                                       collections.Counter})  # fmt: skip
_SEQUENCES = frozenset({list, tuple, set, frozenset, collections.deque})
_MAPPINGS = frozenset({dict, collections.OrderedDict, collections.defaultdict, collections.Counter})
# Always watched (their classes too): ``collections.Counter`` is a Python class whose ``__eq__`` a
# program could rebind, and it is admitted above (MBPP task 88's own solution returns one).
ALWAYS_WATCHED = ("collections",)
# What an assertion's comparison, truth test, containment, tolerance or isinstance may call on an
# operand: a program's class that defines any of them is not compared.
FORGING_METHODS: frozenset[str] = frozenset({
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__len__", "__contains__",
    "__iter__", "__getitem__", "__sub__", "__rsub__", "__abs__", "__round__", "__float__", "__int__", "__index__",
    "__class__", "__getattr__", "__getattribute__", "__instancecheck__", "__subclasscheck__"})  # fmt: skip


def type_name(cls: type) -> str:
    module = getattr(cls, "__module__", None)
    return cls.__qualname__ if module in (None, "builtins") else f"{module}.{cls.__qualname__}"


def _numpy_scalars() -> frozenset[type]:
    """numpy's number scalars, if numpy is loaded (asked before the program runs: a program could
    plant a module of that name)."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return frozenset()
    return frozenset(t for t in vars(numpy).values()
                     if isinstance(t, type) and issubclass(t, (numpy.number, numpy.bool_)) and t.__module__ == "numpy")


_HEAPTYPE, _IMMUTABLETYPE = 1 << 9, 1 << 8      # CPython's type flags


def compares_as_object(cls: type) -> bool:
    """A program's class whose instances compare by identity: plain ``type`` metaclass, every
    class of its MRO but ``object`` a mutable Python class with none of :data:`FORGING_METHODS`
    (a builtin or C base, such as ``int``, would bring its own comparisons)."""
    if type(cls) is not type or cls.__mro__[-1] is not object:
        return False
    return all(base.__flags__ & _HEAPTYPE and not base.__flags__ & _IMMUTABLETYPE and type(base) is type
               and not FORGING_METHODS & set(vars(base)) for base in cls.__mro__[:-1])


def impostor(value: Any, instances_of: Callable[[type], bool] | None = None,
             admitted: frozenset[type] = PLAIN_TYPES | ADMITTED) -> type | None:
    """The first type in ``value`` (walked through its containers) that is not plain data, or None.

    ``instances_of(cls)``: a class whose instances are admitted too (their attributes are not
    walked: they compare by identity). ``admitted``: the exact types that are data
    (:attr:`Environment.admitted` adds numpy's scalars where the test loads numpy)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        cls = type(item)
        if cls not in admitted:
            if instances_of is not None and instances_of(cls) and compares_as_object(cls):
                continue
            return cls
        if cls in _SEQUENCES or cls in _MAPPINGS:
            if id(item) in seen:
                continue
            seen.add(id(item))
            if cls in _MAPPINGS:
                stack.extend(dict.keys(item))
                stack.extend(dict.values(item))
            else:
                stack.extend(item)
    return None


def not_data(value: Any, what: str, instances_of: Callable[[type], bool] | None = None,
             admitted: frozenset[type] = PLAIN_TYPES | ADMITTED) -> str | None:
    """The failure reason when ``value`` is not plain data, e.g. ``add returned a _Any, not plain data``."""
    found = impostor(value, instances_of, admitted)
    if found is None:
        return None
    inner = "" if found is type(value) else f"{type_name(type(value))} holding a "
    return f"{what} a {inner}{type_name(found)}, not plain data"


# ---------------------------------------------------------------------------------------------
# The environment


def imported_modules(source: str) -> list[str]:
    """Absolute modules ``source`` imports, with their parents (``os.path`` -> ``os``, ``os.path``)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return sorted({".".join(name.split(".")[: i + 1]) for name in names for i in range(name.count(".") + 1)})


def read_names(source: str) -> frozenset[str]:
    """Every name ``source`` loads (the globals and builtins its code can look up)."""
    return frozenset(node.id for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load))


def tested_names(asserts: Iterable[str]) -> frozenset[str]:
    """The functions under test of assert lines: the names every line calls, builtins left out
    unless nothing else is (MBPP task 126 tests a ``sum`` of its own: ``assert sum(10, 15) == 6``)."""
    called = [frozenset(node.func.id for node in ast.walk(ast.parse(line))
                        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) for line in asserts]
    common = frozenset.intersection(*called) if called else frozenset()
    return frozenset(name for name in common if not hasattr(builtins, name)) or common


def defined_names(source: str) -> frozenset[str]:
    """Names ``source`` binds at its top level (its functions, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def _import_bindings(source: str) -> dict[str, tuple[str, str | None]]:
    """The names ``source``'s imports bind: ``{"math": ("math", None), "isclose": ("math", "isclose")}``."""
    bound: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = (top, None)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    bound[alias.asname or alias.name] = (node.module, alias.name)
    return bound


def _thread_count() -> int:
    """Threads of this process, those started by ``_thread`` too (Linux), else ``threading``'s count."""
    try:
        return len(listdir("/proc/self/task"))
    except OSError:
        return active_count()


_MISSING = object()


# Public globals the standard library itself rebinds: ``time.tzset()`` (ClassEval_87's solution, via
# ``datetime``), ``tempfile.gettempdir()`` on first use (ClassEval_92's).
LIBRARY_STATE: dict[str, frozenset[str]] = {"time": frozenset({"tzname", "timezone", "altzone", "daylight"}),
                                            "tempfile": frozenset({"tempdir"})}


def _lazy(label: str, key: Any, before: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """A change a library makes to itself: a submodule bound on its package when imported, a
    private global set on first use (``PIL.Image._initialized``), a warnings registry, the
    globals of :data:`LIBRARY_STATE`. Builtins have none: every change there counts."""
    if label == "builtins" or not isinstance(key, str):
        return False
    if key in LIBRARY_STATE.get(label, ()):
        return True
    if key not in before and isinstance(live.get(key), ModuleType):
        return True
    private = key.startswith("_") and not (key.startswith("__") and key.endswith("__"))
    return private or key == "__warningregistry__"


class Environment:
    """The bindings the test code can reach, as they were; :meth:`changes` names what moved.

    Built before the program runs, it imports the modules ``test_source`` imports (so the program
    finds them loaded and cannot hand the test another) and records ``builtins``, those modules
    and every class they define in Python. :meth:`watch` adds, once the test is defined, the
    program's globals that the test reads."""

    def __init__(self, test_source: str, extra_modules: Iterable[str] = ()) -> None:
        self._watched: dict[str, tuple[Mapping[str, Any], dict[str, Any]]] = {}
        self._modules: dict[str, ModuleType] = {}
        self._add("builtins", vars(builtins))
        for name in [*imported_modules(test_source), *ALWAYS_WATCHED, *extra_modules]:
            try:
                module = importlib.import_module(name)
            except Exception:            # noqa: BLE001 - the test's own import then fails as it would
                continue
            self._modules[name] = module
            self._add(name, vars(module))
            for key, value in list(vars(module).items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    self._add(f"{name}.{key}", vars(value))
        self._reads = read_names(test_source)
        self._imports = _import_bindings(test_source)
        self._threads = _thread_count()
        self._trace = (gettrace(), getprofile())
        self._provided: set[int] | None = None
        self._shadowed: list[str] = []
        self._program: Mapping[str, Any] | None = None
        self._program_before: dict[str, Any] = {}
        self.admitted: frozenset[type] = PLAIN_TYPES | ADMITTED | _numpy_scalars()

    def provides(self, value: Any) -> bool:
        """Whether ``value`` is bound in ``builtins`` or a watched module (a library's, not the program's)."""
        if self._provided is None:
            self._provided = {id(v) for live, _ in self._watched.values() for v in live.values()}
        return id(value) in self._provided

    def _add(self, label: str, live: Mapping[str, Any]) -> None:
        self._watched[label] = (live, dict(live))

    def watch(self, namespace: Mapping[str, Any], tested: Iterable[str] = ()) -> None:
        """Record, once the test is defined, the program's globals the test reads (and
        ``__builtins__``). From now on :meth:`changes` also names the builtins the test reads that
        the program shadows there, but for ``tested`` (functions under test that the benchmark
        names like a builtin: MBPP task 126's ``sum``), and names the test imports that the
        program bound to something else."""
        self._shadowed = [f"builtins.{name} (shadowed by the program's global {name})"
                          for name in sorted(self._reads - set(tested)) if name in namespace and hasattr(builtins, name)]
        for name, (module, attr) in self._imports.items():
            bound = self._modules.get(module, _MISSING)
            if attr is not None:
                bound = getattr(bound, attr, _MISSING)
            if name in namespace and namespace[name] is not bound:
                self._shadowed.append(f"the program's global {name} (not what the test imports)")
        self._program = namespace
        self._program_before = {key: namespace.get(key, _MISSING) for key in self._reads | {"__builtins__"}}

    def restore_builtins(self) -> None:
        """Put ``builtins`` back as it was, so the launcher writes its record with the real ones."""
        live, before = self._watched["builtins"]
        dict.clear(live)
        dict.update(live, before)

    def changes(self) -> list[str]:
        """What differs from the snapshot: ``builtins.abs``, ``math.isclose``, ``the program's global check``."""
        moved = list(self._shadowed)
        for label, (live, before) in self._watched.items():
            if len(live) != len(before) or any(live.get(key, _MISSING) is not value for key, value in before.items()):
                moved += [f"{label}.{key}" for key in sorted(set(live) | set(before), key=str)
                          if live.get(key, _MISSING) is not before.get(key, _MISSING)
                          and not _lazy(label, key, before, live)]
        if self._program is not None:
            moved += [f"the program's global {key}" for key, value in self._program_before.items()
                      if self._program.get(key, _MISSING) is not value]
            builtins_ref = self._program.get("__builtins__", _MISSING)
            if builtins_ref is not builtins and builtins_ref is not vars(builtins):
                moved.append("the program's __builtins__")
        if _thread_count() != self._threads:
            moved.append("a thread left running")
        if (gettrace(), getprofile()) != self._trace:
            moved.append("sys.settrace / sys.setprofile")
        return sorted(set(moved))


def changed(env: Environment) -> str | None:
    moved = env.changes()
    return f"changed the grader's environment: {', '.join(moved[:5])}" if moved else None


def graded_call(fn: Callable[..., Any], name: str, env: Environment, failures: list[str],
                instances_of: Callable[[type], bool] | None = None) -> Callable[..., Any]:
    """``fn`` as the test calls it: each outermost call's return value must be plain data (or, with
    ``instances_of``, an admitted instance) and leave the environment as it was. A breach is
    recorded in ``failures`` (so that a test that swallows the exception still fails) and raised
    as :class:`Forged`, which is not an ``Exception``."""
    depth = [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        if depth[0]:                      # a recursive call through the global name: the outer one checks
            return fn(*args, **kwargs)
        depth[0] += 1
        try:
            value = fn(*args, **kwargs)
        finally:
            depth[0] -= 1
        reason = changed(env) or not_data(value, f"{name} returned", instances_of, env.admitted)
        if reason is not None:
            failures.append(reason)
            raise Forged(reason)
        return value

    call.__name__ = call.__qualname__ = name
    call.__wrapped__ = fn
    return call


class Forged(BaseException):
    """A graded value or the environment failed the rules above (not an ``Exception``, so that
    ``except Exception`` in a test does not turn it into a pass)."""
