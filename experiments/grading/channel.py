"""Values as data between two processes: the codec of the grader/program channel (issue 48).

The program under test and the grader that judges it are to run in two processes, and every value
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
zones, ``decimal.Decimal``, and builtin classes themselves (``type(x) == int``). An exception
crosses as its type's name and message (:class:`Raised`). Sizes are capped (``limit`` bytes of
text, ``depth`` levels); a cycle is refused.

Standard library only: both processes load it inside the sandbox.
"""

from __future__ import annotations

import base64
import builtins
import collections
import datetime
import decimal
import json
from collections.abc import Callable
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


def encode(value: Any, handle: Callable[[Any], int | None] | None = None, *, limit: int = LIMIT,
           depth: int = DEPTH) -> str:
    """``value`` as JSON text naming every node's exact type. ``handle(obj)``: a handle number for
    an object that is not data (the program side's objects; the same number for the same object,
    so that identity survives the crossing), or None to refuse it (:class:`NotData`)."""
    text = json.dumps(_node(value, handle, depth, set()), separators=(",", ":"), allow_nan=False)
    if len(text) > limit:
        raise NotData(f"the value is {len(text)} bytes as data, more than the channel's {limit}")
    return text


def decode(text: str, handle: Callable[[int], Any] | None = None, *, limit: int = LIMIT) -> Any:
    """The value :func:`encode` wrote; ``handle(n)`` gives the object standing for handle ``n``."""
    if len(text) > limit:
        raise NotData(f"a message of {len(text)} bytes, more than the channel's {limit}")
    return _value(json.loads(text), handle)


def _node(value: Any, handle, depth: int, path: set[int]) -> Any:
    if depth <= 0:
        raise NotData(f"the value nests deeper than {DEPTH} levels")
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
    number = handle(value) if handle is not None else None
    if number is None:
        module = getattr(cls, "__module__", "?")
        raise NotData(f"a {cls.__qualname__ if module == 'builtins' else f'{module}.{cls.__qualname__}'} "
                      "is not data")
    return {"handle": number}


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
    if tag == "handle":
        if handle is None:
            raise NotData("a handle where none is expected")
        return handle(int(body))
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
