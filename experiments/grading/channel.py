"""Values as data between two processes: the codec and protocol of the grader/program channel.

The program under test and the grader that judges it run in two processes (``sandbox.py``), and every value
that crosses between them crosses as data: :func:`encode` turns a value into JSON text whose every
node names its exact type, :func:`decode` rebuilds it from those names alone. So the receiving side
only ever holds objects of the types listed here, built by its own code: a value whose class lies
about equality, an ``int`` subclass, or an object with a forged ``__class__`` cannot cross; on the
program's side it either becomes a *handle* (an object of the program's own classes, which stays
there and is driven by reference) or is refused with the reason.

Types that cross by value (exactly these, not subclasses): ``None``, ``bool``, ``int``, ``float``
(bit-exact, ``nan`` and infinities included), ``complex``, ``str``, ``bytes``, ``list``, ``tuple``,
``dict`` (any keys), ``set``, ``frozenset``, ``collections.deque``, ``OrderedDict``, ``Counter``,
``defaultdict`` (of a builtin factory), ``datetime`` dates, times, datetimes, deltas and fixed-offset
zones, ``decimal.Decimal``, numpy's number scalars (by dtype), and builtin classes themselves
(``type(x) == int``), and Pillow images (pixels and mode: ClassEval's image tasks compare them
with ``ImageChops``). A module crosses by its name, and the receiver gives its own copy only of a
module it has already loaded or one of :data:`IMPORTABLE` (an import runs code: a name such as
``unittest.__main__`` would run test discovery in the receiver). An exception crosses as its type's
name and message (:class:`Raised`); names of code (types, factories, exceptions) resolve only
among builtins. Sizes are capped (``limit`` bytes of text, ``depth`` levels); a cycle is refused.

Standard library only: both processes load it inside the sandbox.
"""

from __future__ import annotations

import builtins
import collections
import datetime
import decimal
import json
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

LIMIT = 16 << 20           # bytes of encoded text per message
DEPTH = 200                # nesting levels


class NotData(TypeError):
    """A value that cannot cross as data (and was given no handle): the message says which type."""


class Raised(Exception):
    """An exception that crossed the channel: ``kind`` is its type's name, ``message`` its text."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


_BUILTIN_TYPES = {t.__name__: t for t in (int, float, complex, bool, str, bytes, type(None), list, tuple, dict, set,
                                          frozenset, object, type)}
_FACTORIES = {t.__name__: t for t in (int, float, str, list, dict, set, tuple)}
_TAGGED_SEQUENCES = {"tuple": tuple, "set": set, "frozenset": frozenset, "deque": collections.deque}
_TAGGED_MAPPINGS = {"dict": dict, "odict": collections.OrderedDict, "counter": collections.Counter}
_DATES = {"date": datetime.date, "datetime": datetime.datetime, "time": datetime.time}
# Modules a receiver may import on a sender's word (their import runs nothing but their own
# definitions); any other module tag resolves only to a module the receiver has already loaded.
IMPORTABLE = frozenset({"math", "cmath", "re", "string", "json", "itertools", "functools", "operator", "collections",
                        "heapq", "bisect", "random", "statistics", "fractions", "decimal", "datetime", "time",
                        "copy", "numpy", "PIL.Image"})  # fmt: skip


def module(name: Any) -> types.ModuleType:
    """The receiver's own module ``name``: one already in ``sys.modules``, or one of :data:`IMPORTABLE`
    imported; any other name is refused (:class:`NotData`), so that no sender's word runs code here."""
    found = sys.modules.get(name) if type(name) is str else None
    if type(found) is types.ModuleType:
        return found
    if name not in IMPORTABLE:
        raise NotData(f"module {str(name)[:100]!r} is not loaded here; a module crosses only as one the receiver holds")
    import importlib

    return importlib.import_module(name)


def encode(value: Any, handle: Callable[[Any], int | dict | None] | None = None, *, limit: int = LIMIT,
           depth: int = DEPTH) -> str:
    """``value`` as JSON text naming every node's exact type. ``handle(obj)``: a handle number for
    an object that is not data (the program side's objects; the same number for the same object,
    so that identity survives the crossing), a reference node to send as it is (``{"ghandle": n}``:
    an object of the grader's), or None to refuse it (:class:`NotData`)."""
    text = json.dumps(_node(value, handle, depth, set()), separators=(",", ":"), allow_nan=False)
    if len(text) > limit:
        raise NotData(f"the value is {len(text)} bytes as data, more than the channel's {limit}")
    return text


def decode(text: str, handle: Callable[[str, int], Any] | None = None, *, limit: int = LIMIT) -> Any:
    """The value :func:`encode` wrote; ``handle(tag, n)`` gives the object standing for reference
    ``n`` (``tag``: ``handle``, an object of the program's, or ``ghandle``, one of the grader's)."""
    if len(text) > limit:
        raise NotData(f"a message of {len(text)} bytes, more than the channel's {limit}")
    return _value(json.loads(text), handle)


def _node(value: Any, handle, depth: int, path: set[int]) -> Any:
    if depth <= 0:
        raise NotData(f"the value nests deeper than {DEPTH} levels")
    cls = type(value)
    if cls in _LIVE_BASE:                 # the grader's own view of a program attribute: its data
        value = cls = _LIVE_BASE[cls](value)
        cls = type(value)
    if value is None or cls is bool or cls is str:
        return value
    if cls is int:
        return {"int": str(value)}                  # exact whatever the size (JSON readers round big ones)
    if cls is float:
        return {"float": value.hex()}
    if cls is complex:
        return {"complex": [value.real.hex(), value.imag.hex()]}
    if cls is bytes:
        import base64

        return {"bytes": base64.b64encode(value).decode()}
    if cls is decimal.Decimal:
        return {"decimal": str(value)}
    if cls is datetime.timedelta:
        return {"timedelta": [value.days, value.seconds, value.microseconds]}
    if cls is datetime.timezone:
        return {"timezone": [_node(value.utcoffset(None), handle, depth - 1, path), value.tzname(None)]}
    if cls in (datetime.date, datetime.datetime, datetime.time):
        zone = getattr(value, "tzinfo", None)
        if zone is not None and type(zone) is not datetime.timezone:
            raise NotData(f"a {cls.__name__} with a {type(zone).__name__} zone does not cross as data")
        return {cls.__name__: [value.isoformat(), getattr(value, "fold", 0)]}
    if cls is type and _BUILTIN_TYPES.get(value.__name__) is value:
        return {"type": value.__name__}
    if cls is types.ModuleType:           # by name: the receiver uses its own copy of the module
        return {"module": value.__name__}
    containers = (list, tuple, set, frozenset, dict, collections.deque, collections.OrderedDict, collections.Counter,
                  collections.defaultdict)
    if cls in containers:
        if id(value) in path:
            raise NotData("the value contains itself (a cycle does not cross as data)")
        path = path | {id(value)}
        if cls is list:
            return [_node(v, handle, depth - 1, path) for v in value]
        if cls in (dict, collections.OrderedDict, collections.Counter, collections.defaultdict):
            pairs = [[_node(k, handle, depth - 1, path), _node(v, handle, depth - 1, path)] for k, v in value.items()]
            if cls is collections.defaultdict:
                factory = value.default_factory
                name = None if factory is None else getattr(factory, "__name__", None)
                if factory is not None and _FACTORIES.get(name) is not factory:
                    raise NotData("a defaultdict crosses as data only with a builtin factory (int, list, ...)")
                return {"defaultdict": [name, pairs]}
            return {{dict: "dict", collections.OrderedDict: "odict", collections.Counter: "counter"}[cls]: pairs}
        tag = {tuple: "tuple", set: "set", frozenset: "frozenset", collections.deque: "deque"}[cls]
        items = [_node(v, handle, depth - 1, path) for v in value]
        return {tag: items, "maxlen": value.maxlen} if cls is collections.deque and value.maxlen is not None \
            else {tag: items}
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls.__module__ == "numpy" and issubclass(cls, (numpy.number, numpy.bool_)):
        return {"numpy": [numpy.dtype(cls).name, _node(value.item(), handle, depth - 1, path)]}
    image = sys.modules.get("PIL.Image")
    if image is not None and isinstance(value, image.Image) and cls.__module__.startswith("PIL."):
        return {"image": _image_node(value)}
    number = handle(value) if handle is not None else None
    if type(number) is dict:
        return number
    if number is None:
        module = getattr(cls, "__module__", "?")
        raise NotData(f"a {cls.__qualname__ if module == 'builtins' else f'{module}.{cls.__qualname__}'} "
                      "is not data")
    return {"handle": number}


def _image_node(image: Any) -> list:
    """A Pillow image as data: its mode, size, pixels, palette and the two names it carries
    (``format`` of the file it was read from, ``filename``); rebuilt as a plain ``Image``."""
    import base64

    palette = image.getpalette() if image.mode in ("P", "PA") else None
    pixels = base64.b64encode(image.tobytes()).decode()
    return [image.mode, list(image.size), pixels, palette, image.format, getattr(image, "filename", "")]


def _image(body: list) -> Any:
    import base64

    Image = module("PIL.Image")                      # noqa: N806 - Pillow's own name
    mode, size, pixels, palette, kind, filename = body
    made = Image.frombytes(mode, tuple(size), base64.b64decode(pixels))
    if palette is not None:
        made.putpalette(palette)
    made.format, made.filename = kind, filename
    return made


def _value(node: Any, handle) -> Any:
    if node is None or type(node) in (bool, str):
        return node
    if type(node) is list:
        return [_value(v, handle) for v in node]
    if type(node) is not dict or not node:
        raise NotData(f"not a node of this codec: {node!r}"[:200])
    tag = next(iter(node))
    body = node[tag]
    if tag == "int":
        return int(body)
    if tag == "float":
        return float.fromhex(body)
    if tag == "complex":
        return complex(float.fromhex(body[0]), float.fromhex(body[1]))
    if tag == "bytes":
        import base64

        return base64.b64decode(body)
    if tag == "decimal":
        return decimal.Decimal(body)
    if tag == "timedelta":
        return datetime.timedelta(days=body[0], seconds=body[1], microseconds=body[2])
    if tag == "timezone":
        return datetime.timezone(_value(body[0], handle), body[1])
    if tag in _DATES:
        made = _DATES[tag].fromisoformat(body[0])
        return made.replace(fold=body[1]) if tag != "date" else made
    if tag == "type":
        return _BUILTIN_TYPES[body]
    if tag == "module":
        return module(body)
    if tag in _TAGGED_SEQUENCES:
        items = [_value(v, handle) for v in body]
        if tag == "deque":
            return collections.deque(items, node.get("maxlen"))
        return _TAGGED_SEQUENCES[tag](items)
    if tag in _TAGGED_MAPPINGS:
        made = _TAGGED_MAPPINGS[tag]()
        for k, v in body:
            made[_value(k, handle)] = _value(v, handle)
        return made
    if tag == "defaultdict":
        factory = None if body[0] is None else _FACTORIES[body[0]]
        return collections.defaultdict(factory, ((_value(k, handle), _value(v, handle)) for k, v in body[1]))
    if tag == "numpy":                      # a number of numpy's own scalar types, by dtype name
        dtype = module("numpy").dtype(body[0])
        if dtype.kind not in "biufc":                  # numbers and booleans only, whatever is claimed
            raise NotData(f"numpy dtype {body[0]!r} is not a number's")
        return dtype.type(_value(body[1], handle))
    if tag == "image":
        return _image(body)
    if tag in ("handle", "ghandle"):
        if handle is None:
            raise NotData("a handle where none is expected")
        return handle(tag, int(body))
    raise NotData(f"unknown tag {tag!r}")


def raised(exc: BaseException) -> Raised:
    """What crosses for an exception: its type's qualified name (builtins bare) and its message."""
    cls = builtins.type(exc)
    module = getattr(cls, "__module__", "builtins")
    name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
    try:
        message = str(exc)
    except Exception:                          # noqa: BLE001 - a program's __str__ may raise
        message = "<the message could not be read>"
    return Raised(name, message[:2000])


def read_names(source: str) -> frozenset[str]:
    """Every name ``source`` loads (the globals and builtins its code can look up)."""
    import ast

    return frozenset(node.id for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load))


def defined_names(source: str) -> frozenset[str]:
    """Names ``source`` binds at its top level (its functions, classes, assignments, imports)."""
    import ast

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


def tested_names(asserts: Sequence[str]) -> frozenset[str]:
    """The functions under test of assert lines: the names every line calls, builtins left out
    unless nothing else is (MBPP task 126 tests a ``sum`` of its own: ``assert sum(10, 15) == 6``)."""
    import ast

    called = [frozenset(node.func.id for node in ast.walk(ast.parse(line))
                        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) for line in asserts]
    common = frozenset.intersection(*called) if called else frozenset()
    return frozenset(name for name in common if not hasattr(builtins, name)) or common


# ---------------------------------------------------------------------------------------------
# The protocol: the program's side serves calls on its namespace; the grader's side drives it.
#
# One JSON line each way per request. Grader -> program: {"op": "global", "name": n} (a global of
# the program's namespace), {"op": "call", "target": node, "args": [node...], "kwargs": [[k, node]...]},
# {"op": "get", "target": node, "attr": a}, {"op": "set", "target": node, "attr": a, "value": node},
# {"op": "mutate", "target": node, "attr": a, "method": m, "args": [...]} (an in-place change of an
# attribute's container, e.g. ``obj.menu.append(x)``). Program -> grader: {"ok": node} or
# {"raise": [kind, message]}. ``target`` nodes are handles or globals; values are codec nodes.

MUTATORS = {list: ("append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse", "__setitem__",
                   "__delitem__", "__iadd__"),
            dict: ("update", "pop", "popitem", "clear", "setdefault", "__setitem__", "__delitem__"),
            set: ("add", "discard", "remove", "pop", "clear", "update", "difference_update",
                  "intersection_update", "symmetric_difference_update")}


class Server:
    """The program's side: answers requests on ``namespace`` (the program's globals), keeping each
    object it hands out by handle (one number per object) for as long as the conversation lasts."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.held: list[Any] = []
        self._numbers: dict[int, int] = {}
        self.lent: dict[int, GraderObject] = {}             # the grader's objects, by their number
        self.ask_grader: Callable[[str], str] | None = None  # a callback line -> the grader's reply line

    def _give(self, obj: Any) -> int | dict:
        if type(obj) is GraderObject and obj._server is self:
            return {"ghandle": obj._number}
        number = self._numbers.get(id(obj))
        if number is None:
            number = self._numbers[id(obj)] = len(self.held)
            self.held.append(obj)
        return number

    def _resolve(self, tag: str, number: int) -> Any:
        if tag == "handle":
            return self.held[number]
        if number not in self.lent:
            self.lent[number] = GraderObject(self, number)
        return self.lent[number]

    def _target(self, node: Any) -> Any:
        if type(node) is dict and set(node) == {"global"}:
            return self.namespace[node["global"]]
        return _value(node, self._resolve)

    def callback(self, op: str, **fields: Any) -> Any:
        """A request of the program's code to an object the grader lent it (``GraderObject``)."""
        if self.ask_grader is None:
            raise NotData("no grader to ask: this channel carries no callbacks")
        line = json.dumps({"cb": {"op": op, **fields}}, separators=(",", ":"))
        return _answer_value(json.loads(self.ask_grader(line)), self._resolve)

    def answer(self, line: str) -> str:
        """The reply line to one request line."""
        try:
            request = json.loads(line)
            op = request["op"]
            arg = lambda node: _value(node, self._resolve)    # noqa: E731
            if op == "global":
                result = self.namespace[request["name"]]
            elif op == "call":
                args = [arg(a) for a in request["args"]]
                kwargs = {k: arg(v) for k, v in request["kwargs"]}
                result = self._target(request["target"])(*args, **kwargs)
                # what the call left in its mutable arguments goes back: the caller's own list,
                # dict or set then holds it, as it would have after an in-process call
                after = [_node(a, self._give, DEPTH, set()) if type(a) in MUTATORS else None
                         for a in [*args, *kwargs.values()]]
                return json.dumps({"ok": _node(result, self._give, DEPTH, set()), "after": after},
                                  separators=(",", ":"))
            elif op == "item":                          # obj[key], len(obj), key in obj, list(obj), ...
                result = _ITEM[request["how"]](self._target(request["target"]), arg(request["key"]),
                                               arg(request.get("value")))
            elif op == "get":
                result = getattr(self._target(request["target"]), request["attr"])
            elif op == "set":
                setattr(self._target(request["target"]), request["attr"], arg(request["value"]))
                result = None
            elif op == "mutate":
                container = getattr(self._target(request["target"]), request["attr"])
                if request["method"] not in MUTATORS.get(type(container), ()):
                    raise NotData(f"{request['method']} does not change a {type(container).__name__} in place")
                getattr(container, request["method"])(*[arg(a) for a in request["args"]])
                result = None
            else:
                raise NotData(f"unknown request {op!r}")
            return json.dumps({"ok": _node(result, self._give, DEPTH, set())}, separators=(",", ":"))
        except BaseException as exc:              # noqa: BLE001 - every failure of the program is an answer
            if type(exc) in (KeyboardInterrupt, SystemExit):
                raise
            kind = raised(exc)
            return json.dumps({"raise": [kind.kind, kind.message]})


class Remote:
    """The grader's side: requests to the program through ``send(line) -> reply line`` (the
    transport: pipes to the program's process, with its time limit). Objects come back as
    :class:`ProgramObject` (one per handle, so identity holds), data as data, exceptions re-raised: a
    builtin exception type as itself (``assertRaises(ValueError)`` works), any other as
    :class:`Raised`."""

    def __init__(self, send: Callable[[str], str]) -> None:
        self.send = send
        self.gone: str | None = None               # why the conversation ended, once it has
        self.proxies: dict[int, ProgramObject] = {}
        self.lent: list[Any] = []                  # objects of the grader the program may call back
        self._lent_numbers: dict[int, int] = {}

    @classmethod
    def local(cls, namespace: dict[str, Any]) -> Remote:
        """Both sides in this process (tests): a Server on ``namespace``, callbacks answered directly."""
        server = Server(namespace)
        remote = cls(server.answer)
        server.ask_grader = lambda line: remote.answer_callback(json.loads(line)["cb"])
        return remote

    def _resolve(self, tag: str, number: int) -> Any:
        if tag == "ghandle":
            return self.lent[number]
        if number not in self.proxies:
            self.proxies[number] = ProgramObject(self, {"handle": number})
        return self.proxies[number]

    def _lend(self, obj: Any) -> int | dict | None:
        """The reference node of a grader object lent to the program; ``None`` (refused) for a proxy
        of another conversation and for what opens the grader's insides: a frame (a generator's
        ``gi_frame``, a coroutine's ``cr_frame``), code or a traceback."""
        if type(obj) is ProgramObject:
            return obj._ref["handle"] if obj._remote is self else None
        if type(obj) in _INSIDES:
            return None
        number = self._lent_numbers.get(id(obj))
        if number is None:
            number = self._lent_numbers[id(obj)] = len(self.lent)
            self.lent.append(obj)
        return {"ghandle": number}

    def request(self, op: str, _mutable: Sequence[Any] = (), **fields: Any) -> Any:
        """One request; ``_mutable``: the call's arguments, whose lists, dicts and sets take back what
        the program left in them. While the program works on it, its callbacks to the objects the
        grader lent it are answered (:meth:`answer_callback`)."""
        reply = self._reply(json.dumps({"op": op, **fields}, separators=(",", ":")))
        while "cb" in reply:
            reply = self._reply(self.answer_callback(reply["cb"]))
        value = _answer_value(reply, self._resolve)
        for mine, node in zip(_mutable, reply.get("after") or ()):
            if node is not None and type(mine) in _REFILL:
                _REFILL[type(mine)](mine, _value(node, self._resolve))
        return value

    def _reply(self, line: str) -> dict:
        """The program's answer to ``line``; once the program has gone or broken the protocol
        (``gone`` says how), every request fails with :class:`ProgramGone`."""
        if self.gone is not None:
            raise ProgramGone(self.gone)
        try:
            reply = json.loads(self.send(line))
            if type(reply) is not dict or not {"ok", "raise", "cb"} & set(reply):
                raise ValueError(f"{str(reply)[:80]!r}")
            return reply
        except ProgramGone as gone:
            self.gone = str(gone)
        except ValueError as exc:                # not JSON, or JSON that is not a message of the channel
            self.gone = f"the program answered with what is not a message of the channel ({type(exc).__name__})"
        raise ProgramGone(self.gone)

    def answer_callback(self, request: dict) -> str:
        """The grader's answer to the program's request on an object it lent: a call, a public
        attribute read or written (no name starting with ``_``: nothing reaches the grader's frames, globals or
        classes through dunders), or the container protocol; the result crosses as data or lent."""
        try:
            target = _value(request["target"], self._resolve)
            if not any(target is obj for obj in self.lent):
                raise NotData("a callback must name an object the grader lent")
            arg = lambda node: _value(node, self._resolve)    # noqa: E731
            op = request["op"]
            if op == "call":
                result = target(*[arg(a) for a in request["args"]], **{k: arg(v) for k, v in request["kwargs"]})
            elif op in ("get", "set"):
                name = request["attr"]
                if type(name) is not str or name.startswith("_"):
                    raise AttributeError(f"the grader's objects show no attribute {name!r} to the program")
                result = getattr(target, name) if op == "get" else setattr(target, name, arg(request["value"]))
            elif op == "item" and request["how"] in _ITEM_READS:
                result = _ITEM[request["how"]](target, arg(request["key"]), None)
            else:
                raise NotData(f"unknown callback {op!r} {request.get('how') or ''}".strip())
            return json.dumps({"ok": _node(result, self._lend, DEPTH, set())}, separators=(",", ":"))
        except Exception as exc:                                 # noqa: BLE001 - answered to the program
            kind = raised(exc)
            return json.dumps({"raise": [kind.kind, kind.message]})

    def encode(self, value: Any) -> Any:
        """A grader-side value as a node: data, a proxy sent back as its handle, or any other
        object lent to the program by reference (the program may call it back)."""
        return _node(value, self._lend, DEPTH, set())

    def test_globals(self, test: str, own: str = "", tested: Sequence[str] = ()) -> dict[str, Any]:
        """Globals for running the benchmark's ``test`` source in the grader: ``own`` (the test's
        imports, its setup, HumanEval's prompt with its helpers) runs here; ``tested``, the
        functions under test, and every other name the test reads that neither defines come from
        the program, as data or a proxy. A builtin's name (``abs``, ``sorted``) stays the grader's
        own unless it is one of ``tested`` (MBPP task 126 tests a ``sum`` of its own): a program's
        global ``abs`` never answers the test's ``abs(x - y)``, nor its ``poly`` the prompt's."""
        names: dict[str, Any] = {}
        exec(own, names)
        wanted = read_names(test) - defined_names(test) - set(names)
        for name in sorted({*tested, *(n for n in wanted if not hasattr(builtins, n))}):
            try:
                names[name] = self.global_(name)
            except KeyError:                       # a name neither side defines: the test's NameError
                continue
        return names

    def global_(self, name: str) -> Any:
        """The program's global ``name``: data, or a proxy (its functions, classes, objects)."""
        return self.request("global", name=name)


# What the grader never lends: through a frame, code or a traceback its globals and locals are reached.
_INSIDES = (types.FrameType, types.CodeType, types.TracebackType)
# The container protocol across the channel: (target, key, value) -> result, by ``how``. The
# grader's objects answer only the reads; the program's also take writes.
_ITEM: dict[str, Callable[[Any, Any, Any], Any]] = {
    "get": lambda target, key, _: target[key], "len": lambda target, _, __: len(target),
    "in": lambda target, key, _: key in target, "iter": lambda target, _, __: list(target),
    "set": lambda target, key, value: target.__setitem__(key, value),
    "del": lambda target, key, _: target.__delitem__(key),
    "instance": lambda target, key, _: isinstance(key, target),
}
_ITEM_READS = ("get", "len", "in", "iter")


class _Container:
    """``obj[key]``, ``len``, ``in`` and iteration answered by the other side as data (through the
    subclass's ``_item(how, key)``); ``==`` and ``<`` are never forwarded and stay identity."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        return self._item("get", key)

    def __len__(self) -> int:
        size = self._item("len")
        if type(size) is not int:
            raise TypeError(f"len() of an object of the other process gave a {type(size).__name__}")
        return size

    def __contains__(self, key: Any) -> bool:
        return self._item("in", key) is True

    def __iter__(self) -> Any:
        return iter(self._item("iter"))


class ProgramObject(_Container):
    """An object of the program, in the grader: calls, attribute reads and writes go to the program
    and come back as data or proxies. It compares by identity (``object``'s rules), which is how
    ClassEval's and MBPP's objects compare; an attribute's container read from it remembers where
    it came from, so an in-place change (``obj.menu.append(x)``) reaches the program too."""

    __slots__ = ("_remote", "_ref")

    def __init__(self, remote: Remote, ref: dict) -> None:
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_ref", ref)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        remote = self._remote
        return remote.request("call", [*args, *kwargs.values()], target=self._ref,
                              args=[remote.encode(a) for a in args],
                              kwargs=[[k, remote.encode(v)] for k, v in kwargs.items()])

    def _item(self, how: str, key: Any = None, value: Any = None) -> Any:
        remote = self._remote
        return remote.request("item", target=self._ref, how=how, key=remote.encode(key), value=remote.encode(value))

    # Beside the reads of _Container, the program's objects take item writes.
    def __setitem__(self, key: Any, value: Any) -> None:
        self._item("set", key, value)

    def __delitem__(self, key: Any) -> None:
        self._item("del", key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = self._remote.request("get", target=self._ref, attr=name)
        live = _LIVE.get(type(value))
        return live(value, self, name) if live is not None else value

    def __setattr__(self, name: str, value: Any) -> None:
        self._remote.request("set", target=self._ref, attr=name, value=self._remote.encode(value))

    def __instancecheck__(self, value: Any) -> bool:       # isinstance(x, ProgramClass): the program says
        return self._item("instance", value) is True

    def __repr__(self) -> str:
        return f"<program object {self._ref}>"


def _answer_value(reply: dict, resolve: Callable[[str, int], Any]) -> Any:
    """The value of a reply line, or its exception raised: a builtin exception type as itself,
    any other as :class:`Raised`."""
    if "raise" in reply:
        kind, message = reply["raise"]
        cls = getattr(builtins, kind, None)
        if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
            raise cls(message)
        raise Raised(kind, message)
    return _value(reply["ok"], resolve)


class GraderObject(_Container):
    """An object the grader lent the program (a mock, an XML element, a function the test passes),
    in the program's process: calls, public attributes (read and written) and the container protocol go back to the
    grader as callbacks (:meth:`Remote.answer_callback`), answered as data or further lent objects."""

    __slots__ = ("_server", "_number")

    def __init__(self, server: Server, number: int) -> None:
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_number", number)

    def _ref(self) -> dict:
        return {"ghandle": self._number}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        give = self._server._give
        return self._server.callback("call", target=self._ref(), args=[_node(a, give, DEPTH, set()) for a in args],
                                     kwargs=[[k, _node(v, give, DEPTH, set())] for k, v in kwargs.items()])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._server.callback("get", target=self._ref(), attr=name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            raise AttributeError(f"the grader's objects take no attribute {name!r} from the program")
        self._server.callback("set", target=self._ref(), attr=name, value=_node(value, self._server._give, DEPTH, set()))

    def _item(self, how: str, key: Any = None) -> Any:
        return self._server.callback("item", target=self._ref(), how=how,
                                     key=_node(key, self._server._give, DEPTH, set()))


def _live(base: type) -> type:
    """``base`` (list, dict, set) whose in-place changes also reach the program attribute it was read from."""
    def mutator(method: str) -> Callable[..., Any]:
        def change(self, *args: Any) -> Any:
            owner, attr = self._owner
            owner._remote.request("mutate", target=owner._ref, attr=attr, method=method,
                                  args=[owner._remote.encode(a) for a in args])
            return getattr(base, method)(self, *args)

        change.__name__ = method
        return change

    def init(self, value: Any, owner: ProgramObject, attr: str) -> None:
        base.__init__(self, value)
        self._owner = (owner, attr)

    body = {"__init__": init, "__slots__": ("_owner",), **{m: mutator(m) for m in MUTATORS[base]}}
    return type(f"Live{base.__name__.capitalize()}", (base,), body)


_LIVE = {base: _live(base) for base in MUTATORS}
_REFILL = {list: lambda mine, new: mine.__setitem__(slice(None), new),
           dict: lambda mine, new: (mine.clear(), mine.update(new)),
           set: lambda mine, new: (mine.clear(), mine.update(new))}
_LIVE_BASE = {live: base for base, live in _LIVE.items()}


# ---------------------------------------------------------------------------------------------
# Across processes: one line per message over a pair of pipes


class ProgramGone(RuntimeError):
    """The program's process stopped answering: it died (end of file) or ran past its time."""


class Pipes:
    """The grader's transport: ``send(line)`` writes a request to ``write_fd`` and reads the reply
    line from ``read_fd``, waiting at most until ``deadline`` (``time.monotonic()``); a program
    that closed its end fails the call with :class:`ProgramGone`, and so does one that runs past
    the deadline. Replies are read in chunks up to ``limit`` bytes a line. Once an exchange fails
    in any way (a test's own time limit interrupting it included), the stream is out of step:
    ``gone`` says why and every later call fails with it."""

    def __init__(self, read_fd: int, write_fd: int, deadline: float, limit: int = LIMIT + 1024) -> None:
        self.read_fd, self.write_fd, self.deadline, self.limit = read_fd, write_fd, deadline, limit
        self._buffer = b""
        self.gone: str | None = None

    def __call__(self, line: str) -> str:
        return self._guarded(self._write, line)

    def receive(self) -> str:
        """The next line the program sends of its own accord (its first: ready, or why not)."""
        return self._guarded(lambda: None)

    def _guarded(self, before: Callable[..., None], *args: Any) -> str:
        if self.gone is not None:
            raise ProgramGone(self.gone)
        try:
            before(*args)
            return self._read_line()
        except ProgramGone as gone:
            self.gone = str(gone)
            raise
        except BaseException as exc:
            self.gone = f"an exchange with the program was interrupted ({type(exc).__name__})"
            raise

    def _write(self, line: str) -> None:
        import os

        data = line.encode() + b"\n"
        try:
            while data:
                data = data[os.write(self.write_fd, data):]
        except BrokenPipeError:
            raise ProgramGone("the program's process ended (it closed the channel)") from None

    def _read_line(self) -> str:
        import os
        import select
        import time

        while b"\n" not in self._buffer:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise ProgramGone("the program did not answer within the item's time")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise ProgramGone("the program's process ended (it closed the channel)")
            self._buffer += chunk
            if len(self._buffer) > self.limit:
                raise ProgramGone(f"the program's answer exceeds {self.limit} bytes")
        reply, _, self._buffer = self._buffer.partition(b"\n")
        return reply.decode("utf-8", errors="replace")


def serve(namespace: dict[str, Any], read_fd: int, write_fd: int) -> None:
    """The program's side of :class:`Pipes`: answer each request line until the grader closes the
    channel; a callback to a lent object writes its line and reads the grader's answer in between."""
    import os

    buffer = [b""]

    def read_line() -> str | None:
        while b"\n" not in buffer[0]:
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                return None
            buffer[0] += chunk
        line, _, buffer[0] = buffer[0].partition(b"\n")
        return line.decode("utf-8", errors="replace")

    def write_line(line: str) -> None:
        data = line.encode() + b"\n"
        while data:
            data = data[os.write(write_fd, data):]

    def ask_grader(line: str) -> str:
        write_line(line)
        answer = read_line()
        if answer is None:
            raise ProgramGone("the grader closed the channel")
        return answer

    server = Server(namespace)
    server.ask_grader = ask_grader
    while (line := read_line()) is not None:
        write_line(server.answer(line))
