"""The session check of :mod:`same_environment`: a run whose tests change ``pip freeze`` fails,
naming what changed; a run that changes nothing passes. Each runs pytest in a subprocess whose
``PYTHONPATH`` holds a folder of its own, into which the changing test writes a distribution's
metadata (pip freeze lists it, and nothing outside that folder is touched)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CHANGES = '''
from pathlib import Path

def test_installs_a_distribution():
    meta = Path({site!r}) / "fake_dist-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\\nName: fake-dist\\nVersion: 1.0\\n")
'''
KEEPS = '''
def test_changes_nothing():
    assert 1 + 1 == 2
'''


@pytest.mark.parametrize(("body", "status"), [(CHANGES, 1), (KEEPS, 0)], ids=["installs", "keeps"])
def test_a_session_that_changes_pip_freeze_fails_naming_the_change(tmp_path: Path, body: str, status: int):
    site = tmp_path / "site"
    site.mkdir()
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text("from same_environment import pytest_sessionfinish, pytest_sessionstart\n")
    (inner / "test_inner.py").write_text(body.format(site=str(site)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(site)])}
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner)], cwd=inner,
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == status, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout
    assert ("environment changed" in ran.stdout and "+ fake-dist==1.0" in ran.stdout) == (status == 1), ran.stdout
