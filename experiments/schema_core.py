"""``lookahead_core.config`` (the core's self-validating dataclasses) without importing torch.

``import lookahead_core.config`` would run ``lookahead_core/__init__.py``, which imports the
decoder and so torch and transformers (several seconds). Configs must be validated before that
(``run.py``: validate first, import after), so this loads the one dependency-free file under its
own module name; a later ``import lookahead_core`` finds it in ``sys.modules`` and reuses it, so
there is only ever one ``LookaheadConfig`` class.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "lookahead_core.config"


def _load():
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    path = Path(__file__).resolve().parent.parent / "lookahead_core" / "config.py"
    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


_config = _load()
DecodeLimits = _config.DecodeLimits
LookaheadConfig = _config.LookaheadConfig
SamplingConfig = _config.SamplingConfig

__all__ = ["DecodeLimits", "LookaheadConfig", "SamplingConfig"]
