"""The transformers releases served are the ones tested: pyproject.toml requires exactly
``lookahead_core.TRANSFORMERS``, ``make test-lower`` (run by .ci/run) tests its lower bound, and
``import lookahead_core`` refuses a transformers outside it in one line that names the installed
version, the range and the pip command, without importing torch or transformers to find out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import lookahead_core

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_requires_the_range_the_core_serves():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in dependencies if d.startswith("transformers")] == [lookahead_core.TRANSFORMERS]


def test_ci_tests_the_lower_bound_environment_and_it_installs_the_lower_bound():
    assert "make test-lower" in (ROOT / ".ci" / "run").read_text().splitlines()
    lower = re.search(r">=([\d.]+)", lookahead_core.TRANSFORMERS).group(1)
    done = subprocess.run(["make", "-s", "--no-print-directory", "print-lower"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.stdout.strip() == f"transformers=={lower}", done.stderr


def import_with_transformers(version: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    """``import lookahead_core`` in a fresh interpreter that sees transformers ``version`` (a bare
    dist-info ahead of the installed one; None: the installed one)."""
    env = dict(os.environ)
    if version is not None:
        info = tmp_path / f"transformers-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    code = "import sys, lookahead_core; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("version", ["5.16.1", "5.0.0", "4.57.6", "6.0.0", "6.1.0.dev0"])
def test_a_transformers_outside_the_range_is_refused_at_import_in_one_line(version, tmp_path):
    done = import_with_transformers(version, tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: lookahead_core needs {lookahead_core.TRANSFORMERS}, and transformers {version} "
                    f"is installed: pip install '{lookahead_core.TRANSFORMERS}'")


@pytest.mark.parametrize("version", ["5.17.0", "5.25.0", "5.99.3", None])
def test_a_transformers_inside_the_range_imports(version, tmp_path):
    done = import_with_transformers(version, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_missing_transformers_is_refused(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(ImportError, match=r"needs transformers>=.*, and transformers none is installed: pip install"):
        lookahead_core._require_transformers()
