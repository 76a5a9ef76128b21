"""The test session leaves the Python environment that runs it as it found it.

``pytest_sessionstart`` records ``pip freeze`` of this interpreter, ``pytest_sessionfinish`` takes
it again and fails the run (exit status 1) with the lines that differ: a test that installs into,
upgrades or removes from the running environment (issue 58: the packaging test's ``pip install
--prefix`` uninstalled the project itself) fails the suite that ran it. ``tests/conftest.py``
imports both hooks."""

from __future__ import annotations

import subprocess
import sys

import pytest

_BEFORE = pytest.StashKey[list[str]]()


def installed() -> list[str]:
    """``pip freeze`` of this interpreter (its environment, as ``PYTHONPATH`` extends it), sorted."""
    ran = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                         check=True, timeout=300)
    return sorted(line for line in ran.stdout.splitlines() if line.strip())


def changes(before: list[str], after: list[str]) -> list[str]:
    """The lines of ``before`` gone from ``after`` (``-``) and those new in it (``+``)."""
    gone, new = set(before) - set(after), set(after) - set(before)
    return [f"- {line}" for line in before if line in gone] + [f"+ {line}" for line in after if line in new]


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):      # under pytest-xdist: the controller checks
        session.config.stash[_BEFORE] = installed()


def pytest_sessionfinish(session: pytest.Session) -> None:
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    diff = changes(before, installed())
    if diff:
        message = ("the tests changed the Python environment that runs them (pip freeze before -> after); "
                   "a test must install into an environment of its own:\n" + "\n".join(diff))
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("=", "environment changed", red=True)
            reporter.write_line(message)
        else:
            sys.stderr.write(message + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
