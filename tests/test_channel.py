"""The grader/program channel's codec (experiments/grading/channel.py): every type that crosses
comes back equal and of its exact type; what is not data (forged classes, subclasses, cycles,
oversized values) is refused or becomes a handle; a hostile message decodes to nothing else."""

from __future__ import annotations

import collections
import datetime
import decimal
import json
import math

import pytest

from experiments.grading import channel

# Every type the codec builds on the receiving side, and no other.
BUILT = {int, float, complex, bool, str, bytes, type(None), list, tuple, dict, set, frozenset, type, collections.deque,
         collections.OrderedDict, collections.Counter, collections.defaultdict, datetime.date, datetime.datetime,
         datetime.time, datetime.timedelta, datetime.timezone, decimal.Decimal}

VALUES = [
    None, True, False, 0, -7, 2**200, 1.5, -0.0, 1e-310, float("inf"), complex(1.5, -2), "text ✓", b"\x00\xff",
    [1, [2, [3]]], (1, "a", (2.5,)), {1: "a", (1, 2): [3], "k": {"n": None}}, {1, 2, 3}, frozenset({"x"}),
    collections.deque([1, 2], maxlen=5), collections.OrderedDict([("b", 1), ("a", 2)]), collections.Counter("abca"),
    collections.defaultdict(list, {"a": [1]}), datetime.date(2024, 2, 29), datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
    datetime.datetime(2024, 1, 2, 3, 4, tzinfo=datetime.timezone(datetime.timedelta(hours=2), "X")),
    datetime.time(1, 2, 3), datetime.timedelta(days=-1, seconds=5), decimal.Decimal("3.14159265358979323846"),
    int, str, type(None),
]


def exact_types(value):
    """Every node's type, walked through the containers."""
    yield type(value)
    if type(value) in (list, tuple, set, frozenset, collections.deque):
        for item in value:
            yield from exact_types(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from exact_types(key)
            yield from exact_types(item)


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ + str(i) for i, v in enumerate(VALUES)])
def test_data_crosses_equal_and_of_its_exact_type(value):
    back = channel.decode(channel.encode(value))
    assert back == value and list(exact_types(back)) == list(exact_types(value))
    assert set(exact_types(back)) <= BUILT
    if type(value) is float:
        assert math.copysign(1, back) == math.copysign(1, value)
    if type(value) is collections.defaultdict:
        assert back.default_factory is list
    if type(value) is collections.deque:
        assert back.maxlen == value.maxlen


def test_nan_crosses_as_nan():
    assert math.isnan(channel.decode(channel.encode(float("nan"))))


class LiesAboutEquality:
    def __eq__(self, other):
        return True


class Sneaky(int):
    pass


class Plain:
    pass


@pytest.mark.parametrize("forged", [LiesAboutEquality(), Sneaky(3), [1, Sneaky(2)], {"k": LiesAboutEquality()},
                                    type("S", (str,), {})("x"), type("L", (list,), {})([1]), Plain,
                                    collections.defaultdict(lambda: 0), iter([1]), print])
def test_what_is_not_data_is_refused_without_a_handle(forged):
    with pytest.raises(channel.NotData, match="not data|defaultdict"):
        channel.encode(forged)


def test_objects_of_the_program_cross_as_handles_and_come_back_as_the_same_object():
    kept: list = []

    def give(obj):                                  # the program side: one number per object, kept alive
        for number, held in enumerate(kept):
            if held is obj:
                return number
        kept.append(obj)
        return len(kept) - 1

    a, b = Plain(), Plain()
    text = channel.encode([a, {"pair": (b, a)}], give)
    proxies: dict[int, object] = {}
    back = channel.decode(text, lambda tag, n: proxies.setdefault(n, object()))
    assert back[0] is back[1]["pair"][1] and back[0] is not back[1]["pair"][0]      # identity kept
    assert kept == [a, b]
    assert channel.decode(channel.encode(a, give), lambda tag, n: kept[n]) is a   # a handle sent back resolves


def test_cycles_depth_and_size_are_capped():
    loop: list = []
    loop.append(loop)
    with pytest.raises(channel.NotData, match="contains itself"):
        channel.encode(loop)
    shared = [1]
    assert channel.decode(channel.encode([shared, shared])) == [[1], [1]]          # sharing is not a cycle
    deep: list = []
    for _ in range(channel.DEPTH + 5):
        deep = [deep]
    with pytest.raises(channel.NotData, match="deeper"):
        channel.encode(deep)
    with pytest.raises(channel.NotData, match="more than the channel's"):
        channel.encode("x" * 2000, limit=1000)
    with pytest.raises(channel.NotData, match="more than the channel's"):
        channel.decode(json.dumps("x" * 2000), limit=1000)


@pytest.mark.parametrize("message", ['{"eval": "1"}', '{"type": "LiesAboutEquality"}', "{}", '{"handle": 1}',
                                     '{"numpy": ["object", {"int": "1"}]}', '{"numpy": ["U5", "x"]}',
                                     '[{"tuple": [1, {"os.system": "x"}]}]'])
def test_a_hostile_message_builds_nothing_but_data(message):
    with pytest.raises((channel.NotData, KeyError)):
        channel.decode(message)


def test_a_module_tag_imports_nothing_the_receiver_does_not_hold():
    """A module's name resolves to one the receiver has loaded, or one of the short allowlist; any
    other import would run code on the sender's word (``this`` prints, ``unittest.__main__`` runs
    test discovery in the current directory): refused, and not imported."""
    import math
    import sys

    for name in ("this", "unittest.__main__", "antigravity"):
        assert name not in sys.modules
        with pytest.raises(channel.NotData, match="is not loaded here"):
            channel.decode(json.dumps({"module": name}))
        assert name not in sys.modules, name
    assert channel.decode('{"module": "math"}') is math and channel.decode('{"module": "sys"}') is sys


def test_an_exception_crosses_as_its_name_and_message():
    class Custom(ValueError):
        pass

    assert (channel.raised(ValueError("bad")).kind, channel.raised(ValueError("bad")).message) == ("ValueError", "bad")
    assert channel.raised(Custom("x")).kind.endswith("Custom")

    class Loud(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert channel.raised(Loud()).message == "<the message could not be read>"


# ---------------------------------------------------------------------------------------------
# The protocol: the grader drives the program's namespace through Server/Remote (here in one
# process, send = server.answer; across processes the same lines go through pipes)

from conftest import DATA_ROOT  # noqa: E402
from experiments.data.datasets import get_dataset  # noqa: E402


def connect(source: str) -> channel.Remote:
    namespace: dict = {}
    exec(compile(source, "program.py", "exec"), namespace)
    return channel.Remote.local(namespace)


def test_objects_are_driven_by_handle_and_exceptions_cross_by_name():
    remote = connect("""
class Order:
    def __init__(self):
        self.menu = []
        self.paid = False
    def total(self):
        return sum(d["price"] * d["count"] for d in self.menu)
    def pay(self, amount):
        if amount < 0:
            raise ValueError("negative amount")
        self.paid = amount >= self.total()
        return self
class Oops(Exception):
    pass
def fail():
    raise Oops("custom")
""")
    Order = remote.global_("Order")
    order = Order()
    order.menu.append({"dish": "a", "price": 10, "count": 2})      # in place, as ClassEval_67's tests do
    order.menu += [{"dish": "b", "price": 5, "count": 1}]
    assert order.menu == [{"dish": "a", "price": 10, "count": 2}, {"dish": "b", "price": 5, "count": 1}]
    assert order.total() == 25 and type(order.total()) is int
    assert order.pay(30) is order and order.paid is True                 # the same proxy: identity holds
    order.paid = False
    assert order.paid is False
    with pytest.raises(ValueError, match="negative amount"):
        order.pay(-1)
    with pytest.raises(channel.Raised, match="Oops: custom"):
        remote.global_("fail")()
    assert order != Order() and order == order                            # identity, as object compares


def test_numpy_scalars_cross_by_dtype_and_arrays_by_handle():
    np = pytest.importorskip("numpy")
    for value in (np.float64(1.5), np.int32(-3), np.bool_(True), np.float32(0.1)):
        back = channel.decode(channel.encode(value))
        assert type(back) is type(value) and back == value
    remote = connect("import numpy as np\ndef matrix():\n    return np.arange(6).reshape(2, 3)\n")
    array = remote.global_("matrix")()
    assert type(array) is channel.ProgramObject and array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert len(array) == 2 and array.shape == (2, 3) and array[1].tolist() == [3, 4, 5]


def test_arguments_the_program_changes_in_place_come_back_changed():
    remote = connect("""
def fill(items, table, seen):
    items.append(len(items))
    table["n"] = table.get("n", 0) + 1
    seen.add("x")
    return None
class Box:
    def __init__(self):
        self.data = {}
    def __getitem__(self, key):
        return self.data[key]
    def __setitem__(self, key, value):
        self.data[key] = value
    def __len__(self):
        return len(self.data)
    def __contains__(self, key):
        return key in self.data
""")
    items, table, seen = [1], {}, set()
    fill = remote.global_("fill")
    fill(items, table, seen)
    fill(items, table=table, seen=seen)
    assert items == [1, 1, 2] and table == {"n": 2} and seen == {"x"}
    box = remote.global_("Box")()
    box["k"] = [1, 2]
    assert box["k"] == [1, 2] and len(box) == 1 and "k" in box and "z" not in box
    with pytest.raises(KeyError):
        box["z"]
    assert box != box["k"] and box == box                                # comparisons stay identity


# ---------------------------------------------------------------------------------------------
# Across processes: the program in a child process, its only link the two pipes


def start_program(source: str, tmp_path) -> tuple:
    """A child process that runs ``source`` and then serves it on two pipes (no sandbox: what
    crosses and how the grader survives the child, not the OS layer, is tested here)."""
    import os
    import subprocess
    import sys
    import time

    from experiments.data.datasets import repo_root

    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    script = tmp_path / "program_side.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(repo_root())!r})\n"
        "from experiments.grading.channel import serve\n"
        f"namespace = {{}}\nexec(compile(open({str(tmp_path / 'program.py')!r}).read(), 'program.py', 'exec'), namespace)\n"
        f"serve(namespace, {to_child_r}, {from_child_w})\n")
    (tmp_path / "program.py").write_text(source)
    child = subprocess.Popen([sys.executable, "-I", str(script)], pass_fds=(to_child_r, from_child_w))
    os.close(to_child_r)
    os.close(from_child_w)
    transport = channel.Pipes(from_child_r, to_child_w, time.monotonic() + 30)
    return child, channel.Remote(transport), transport


def test_the_program_in_another_process_answers_through_pipes(tmp_path):
    import os

    child, remote, transport = start_program("""
import os
def add(a, b):
    return a + b
def pid():
    return os.getpid()
class Counter:
    def __init__(self):
        self.n = 0
    def tick(self, times=1):
        self.n += times
        return self
def hang():
    while True:
        pass
def die():
    os._exit(3)
""", tmp_path)
    try:
        assert remote.global_("add")(2, 3) == 5 and remote.global_("add")([1], [2]) == [1, 2]
        assert remote.global_("pid")() == child.pid != os.getpid()          # it ran over there
        counter = remote.global_("Counter")()
        assert counter.tick().tick(times=2) is counter and counter.n == 3
        transport.deadline = __import__("time").monotonic() + 1
        with pytest.raises(channel.ProgramGone, match="did not answer"):
            remote.global_("hang")()
        transport.deadline += 30
        with pytest.raises(channel.ProgramGone, match="did not answer"):   # out of step: no late reply is read
            remote.global_("add")(1, 1)
    finally:
        child.kill()
        child.wait()
    child, remote, transport = start_program("import os\ndef die():\n    os._exit(3)\n", tmp_path)
    try:
        with pytest.raises(channel.ProgramGone, match="ended"):
            remote.global_("die")()
        assert child.wait(timeout=10) == 3
    finally:
        child.kill()
        child.wait()


def test_humaneval_solutions_pass_with_the_program_in_another_process(tmp_path):
    """The first items of HumanEval, each program in its own child process, the test in this one."""
    items = get_dataset("humaneval").load(DATA_ROOT, source="local")[:10]
    for item in items:
        extra = item.extra
        child, remote, _ = start_program(extra["prompt"] + item.reference, tmp_path)
        try:
            names = remote.test_globals(extra["test"])
            exec(extra["test"], names)
            names["check"](remote.global_(extra["entry_point"]))
        finally:
            child.kill()
            child.wait()


LENDING = """
def use(mock, key, element, items):
    mock.start(3)
    mock.client.send("x", retries=2)
    found = [child.tag for child in element]
    element[1].text = "set by the program"
    return {"key": key("AbC"), "found": found, "n": len(element), "first": element[0].text, "sum": sum(items)}
def peek(obj, name):
    return getattr(obj, name)
"""


@pytest.mark.parametrize("across", [False, True], ids=["one process", "two processes"])
def test_objects_of_the_grader_are_lent_to_the_program_and_called_back(across, tmp_path):
    """What a test passes that is not data (ClassEval_84's MagicMock, a function, an XML element)
    is lent by reference: the program's calls, public attributes and iteration come back to the
    grader as callbacks; nothing starting with ``_`` is shown, so no frame, global or class of the
    grader is reachable that way."""
    import xml.etree.ElementTree as ET
    from unittest.mock import MagicMock

    if across:
        child, remote, _ = start_program(LENDING, tmp_path)
    else:
        child, remote = None, connect(LENDING)
    try:
        mock = MagicMock()
        element = ET.fromstring("<r><a>1</a><b>2</b></r>")
        out = remote.global_("use")(mock, str.lower, element, (1, 2, 3))
        assert out == {"key": "abc", "found": ["a", "b"], "n": 2, "first": "1", "sum": 6}
        assert element[1].text == "set by the program"
        mock.start.assert_called_once_with(3)
        mock.client.send.assert_called_once_with("x", retries=2)
        peek = remote.global_("peek")
        for target, name in ((str.lower, "__globals__"), (str.lower, "__self__"), (mock, "_mock_children"),
                             (mock, "__dict__"), (element, "_private")):
            with pytest.raises(AttributeError):
                peek(target, name)
        stand_in = peek(mock, "__class__")           # the program's own stand-in class, not the grader's
        assert type(stand_in) is channel.ProgramObject and stand_in is not MagicMock
        assert [c[0] for c in mock.method_calls] == ["start", "client.send"]   # nothing else reached the mock
    finally:
        if child is not None:
            child.kill()
            child.wait()


def test_modules_cross_by_name_and_the_receiver_uses_its_own(tmp_path):
    """A module the test reads from the program (one the test forgot to import) is the grader's own
    copy: what the program did to its ``math`` does not reach the grader's."""
    import math as graders_math

    child, remote, _ = start_program("import math\nmath.isclose = lambda *a, **k: True\n"
                                     "def close():\n    return math.isclose(1, 2)\n", tmp_path)
    try:
        assert remote.global_("close")() is True                    # patched over there
        assert remote.global_("math") is graders_math and graders_math.isclose(1, 2) is False
    finally:
        child.kill()
        child.wait()


def test_a_test_reads_the_programs_names_but_not_its_builtins():
    """``test_globals``: the program's functions and helpers the test names cross; a builtin's name
    stays the grader's own unless it is the function under test (MBPP task 126's ``sum``)."""
    remote = connect("def abs(x):\n    return 0\ndef sum(a, b):\n    return 6\ndef helper():\n    return 1\n")
    names = remote.test_globals("assert abs(sum(1, 2) - helper()) < 1", tested=["sum"])
    assert "abs" not in names and names["sum"](1, 2) == 6 and names["helper"]() == 1
    own = remote.test_globals("assert helper() == 2", own="def helper():\n    return 2\n")
    assert own["helper"]() == 2                         # the grader's own copy (HumanEval's prompt helpers)


def test_isinstance_of_a_program_class_is_answered_by_the_program():
    remote = connect("class Node:\n    pass\nclass Other:\n    pass\ndef make():\n    return Node()\n")
    node, cls, other = remote.global_("make")(), remote.global_("Node"), remote.global_("Other")
    assert isinstance(node, cls) and not isinstance(node, other) and not isinstance(3, cls)


def test_a_reply_that_is_not_a_message_ends_the_conversation():
    """A program that writes anything but a message of the channel (a forged record, a blank line)
    has broken the protocol: that request and every later one fail with ProgramGone."""
    replies = iter(['{"nonce": "0", "status": "passed"}', '{"ok": 5}'])
    remote = channel.Remote(lambda line: next(replies))
    with pytest.raises(channel.ProgramGone, match="not a message of the channel"):
        remote.global_("add")
    with pytest.raises(channel.ProgramGone):
        remote.global_("add")                           # the well-formed reply after it is never read
    assert remote.gone is not None


def test_pillow_images_cross_as_pixels():
    image_module = pytest.importorskip("PIL.Image")
    image = image_module.new("P", (3, 2), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] * 128)
    back = channel.decode(channel.encode(image))
    assert type(back) is image_module.Image and back.mode == "P" and back.size == (3, 2)
    assert back.tobytes() == image.tobytes() and back.getpalette() == image.getpalette()
