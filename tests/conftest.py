"""Shared test settings, and the data root the data-backed tests read.

``DATA_ROOT`` is the full offline data when it exists (``$LOOKAHEAD_DATA_ROOT``, else
``<repo>/../shared/data``, as :func:`default_data_root` says), else the few items committed under
``tests/fixtures/data`` (same layout; provenance in tests/fixtures/data/SOURCES.md), so that a fresh clone runs them too.
Tests that need the full set (item counts, all solutions) mark themselves ``needs_full_data``.

A run fails if it leaves ``pip freeze`` changed (:mod:`same_environment`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.data.datasets import default_data_root
from same_environment import pytest_sessionfinish, pytest_sessionstart  # noqa: F401 (hooks: pip freeze unchanged)

# Tiny models run fastest on one thread, and on a shared 2-core machine two threads spin-wait
# against other processes and run many times slower.
torch.set_num_threads(1)

FULL_DATA_ROOT = default_data_root()
FIXTURE_DATA_ROOT = Path(__file__).resolve().parent / "fixtures" / "data"
FULL_DATA = FULL_DATA_ROOT.is_dir()
DATA_ROOT = FULL_DATA_ROOT if FULL_DATA else FIXTURE_DATA_ROOT


def _fixture_items(dataset: str | None, options: dict[str, object]) -> str:
    if dataset is None:
        return "the fixtures have a few items per data set"
    from experiments.data.datasets import get_dataset

    count = len(get_dataset(dataset, **options).load(FIXTURE_DATA_ROOT, source="local"))
    return f"the fixtures have {count} {dataset} items"


def needs_full_data(dataset: str | None = None, *, why: str = "", **options: object) -> pytest.MarkDecorator:
    """Skip unless the full data set is there; the reason names the path, how many items the
    fixtures have of ``dataset`` (``options`` go to its adapter, e.g. ``variant="full"``) and
    ``why`` the test needs more (e.g. "it runs items 81-84 by id")."""
    reason = "" if FULL_DATA else f"needs the full data set under {FULL_DATA_ROOT}; {_fixture_items(dataset, options)}"
    if why and reason:
        reason += f"; {why}"
    return pytest.mark.skipif(not FULL_DATA, reason=reason)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The full offline data when present, else the committed fixtures."""
    return DATA_ROOT


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``auto``'s calibration cache (latency curves, acceptance, picks) in a fresh folder per test:
    no test reuses another's calibration, and none writes to the user's cache."""
    root = tmp_path_factory.mktemp("calibration")
    monkeypatch.setenv("LOOKAHEAD_CALIBRATION_CACHE", str(root))
    return root
