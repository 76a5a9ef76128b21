"""Where trained draft heads live: outside the repository, keyed by the harness's model name.

``experiments/tools/medusa.py`` trains Medusa heads into :func:`heads_dir`; the core decoders
(``experiments/decoders/registry.py``) load them from there, or say :func:`train_command`.
"""

from __future__ import annotations

from pathlib import Path

from experiments.models.loader import default_cache_root


def heads_dir(model: str, cache_dir: str | Path | None = None) -> Path:
    """``<cache root>/medusa/<model>``: the trained heads of harness model ``model``."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    return root / "medusa" / model


def train_command(model: str) -> str:
    return f"python -m experiments.tools.medusa model={model}"
