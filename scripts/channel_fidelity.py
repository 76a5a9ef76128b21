"""The benchmarks' own solutions graded through the grader/program channel, in one process:

    python scripts/channel_fidelity.py --data-root ../shared/data

Each solution runs in a namespace served by ``experiments.grading.channel.Server``; the benchmark's
test runs beside it with every program name it reads reached through ``Remote`` (``Remote.local``:
no second process, no sandbox; the benchmarks' code only). HumanEval: ``check(candidate)``; MBPP
(sanitized test split): the setup code and asserts; ClassEval: the listed unittest classes, each
in a fresh temporary working directory with a 30 s limit. Prints pass counts and each failure's
last line. The issue-48 note quotes it against today's sandboxed grader.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import tempfile
import unittest
from pathlib import Path

from experiments.data.datasets import default_data_root, get_dataset
from experiments.grading import channel


def humaneval(item) -> None:
    remote = channel.Remote.local(_run(item.extra["prompt"] + item.reference))
    names = remote.test_globals(item.extra["test"])
    exec(item.extra["test"], names)
    names["check"](remote.global_(item.extra["entry_point"]))


def mbpp(item) -> None:
    extra = item.extra
    imports, setup = "\n".join(extra.get("test_imports") or []), extra.get("test_setup_code") or ""
    remote = channel.Remote.local(_run("\n".join([imports, item.reference, setup, ""])))
    asserts = "\n".join(extra["test_list"])
    names = remote.test_globals("\n".join([imports, setup, asserts]), imports)
    exec(setup, names)
    exec(asserts, names)


def classeval(item) -> None:
    imports = "\n".join(item.extra.get("import_statement") or [])
    remote = channel.Remote.local(_run(imports + "\n" + item.reference))
    test = imports + "\n" + item.extra["test"]
    names = remote.test_globals(test, imports)
    exec(test, names)
    outcome = unittest.TestResult()
    for name in item.extra["test_classes"]:
        unittest.TestSuite(unittest.TestLoader().loadTestsFromTestCase(names[name.strip()])).run(outcome)
    if outcome.failures or outcome.errors:
        raise AssertionError((outcome.failures + outcome.errors)[0][1].strip().splitlines()[-1])


def _run(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "program.py", "exec"), namespace)
    return namespace


def _timeout(signum, frame):
    raise TimeoutError("30 s")


def main(argv: list[str] | None = None) -> dict[str, tuple[int, int]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=default_data_root())
    parser.add_argument("--sets", nargs="+", default=["humaneval", "mbpp", "classeval"])
    args = parser.parse_args(argv)
    checks = {"humaneval": humaneval, "mbpp": mbpp, "classeval": classeval}
    signal.signal(signal.SIGALRM, _timeout)
    here, counts = os.getcwd(), {}
    for name in args.sets:
        items = get_dataset(name).load(args.data_root, source="local")
        failed = []
        for item in items:
            with tempfile.TemporaryDirectory() as work:
                os.chdir(work)
                signal.alarm(30)
                try:
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        checks[name](item)
                except BaseException as exc:                  # noqa: BLE001 - a failure is a count
                    failed.append(f"{item.item_id}: {type(exc).__name__}: {str(exc)[:120]}")
                finally:
                    signal.alarm(0)
                    os.chdir(here)
        counts[name] = (len(items) - len(failed), len(items))
        print(f"{name}: {counts[name][0]} of {len(items)} pass through the channel")
        for line in failed:
            print(f"  {line}")
    return counts


if __name__ == "__main__":
    main()
