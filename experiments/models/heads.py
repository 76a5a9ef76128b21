"""Where trained drafters live: outside the repository, keyed by the kind and the harness's model name.

``experiments/tools/medusa.py`` trains Medusa heads and ``experiments/tools/eagle.py`` EAGLE drafters
into :func:`heads_dir`; the core decoders (``experiments/decoders/registry.py``) load them from
there, or say :func:`train_command`.
"""

from __future__ import annotations

from pathlib import Path

from experiments.models.loader import default_cache_root


def heads_dir(model: str, cache_dir: str | Path | None = None, kind: str = "medusa") -> Path:
    """``<cache root>/<kind>/<model>``: the trained drafter (``medusa`` heads, an ``eagle`` drafter)
    of harness model ``model``."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    return root / kind / model


def train_command(model: str, kind: str = "medusa") -> str:
    return f"python -m experiments.tools.{kind} model={model}"
