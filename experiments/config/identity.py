"""A result's identity: what names its file, from the job's resolved settings alone.

A results file is ``<results_dir>/<experiment>/<model>/<decoders>-<hash>-s<seed>.csv``, where the
hash is :func:`config_hash` of the values that differ from their declared defaults
(:func:`differing`). Nothing here names a parameter: a parameter added with a default changes no
existing name, and a field that only names or finds things (a cache folder, the sandbox kind, the
item subset) says so where it is declared, with ``field(metadata=ASIDE)``. ``<decoders>`` is for a
person (the decoders' row names); the hash tells results apart. The full config lives in the yaml
beside the file (``<name>.yaml``), and resuming reads it from there (README, "Results").

This module imports nothing of the harness, torch or omegaconf.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import PurePath
from typing import Any

ASIDE = {"identity": False}
"""``field(metadata=ASIDE)``: the field does not tell results apart (it names, finds or schedules)."""

NAME_LIMIT = 80           # the most characters of a results file name, ``.csv.gz`` included
SUFFIX = ".csv.gz"


def differing(value: Any) -> Any:
    """``value`` as plain data, each dataclass reduced to the fields whose values differ from their
    declared defaults (a field without a default always counts; ``ASIDE`` fields never do); an
    object with an ``identity()`` method (a decoder) is what that returns."""
    if hasattr(value, "identity") and callable(value.identity):
        return value.identity()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kept = {}
        for field in dataclasses.fields(value):
            if field.metadata.get("identity", True) is False:
                continue
            own = differing(getattr(value, field.name))
            if field.default is not dataclasses.MISSING:
                default = differing(field.default)
            elif field.default_factory is not dataclasses.MISSING:
                default = differing(field.default_factory())
            else:
                default = dataclasses.MISSING
            if own != default:
                kept[field.name] = own
        return kept
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): differing(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [differing(v) for v in value]
    return value


def config_hash(settings: Any) -> str:
    """The hash of ``differing(settings)``: equal settings, equal hash; the "h" keeps CSV readers
    from parsing a hash such as ``951e9898`` as a number."""
    blob = json.dumps(differing(settings), sort_keys=True, default=str)
    return "h" + hashlib.sha1(blob.encode()).hexdigest()[:8]


def readable(names: Sequence[str], seed: int) -> str:
    """The person's part of a results file name: the decoders' names joined by ``+`` (a kernel
    twin's ``@stock``/``@stream`` dropped); where they would push the name past ``NAME_LIMIT``, the
    first name and how many more (``lookahead+5-more``), the first name itself cut to fit."""
    bases = list(dict.fromkeys(name.split("@", 1)[0] for name in names))
    room = NAME_LIMIT - len(f"-h12345678-s{seed}{SUFFIX}")
    joined = "+".join(bases)
    if len(joined) <= room:
        return joined
    more = f"+{len(bases) - 1}-more"
    return bases[0][:room - len(more)] + more


def decoder_names(settings: Any) -> list[str]:
    """The names a job's file is read by: its candidates' (``model.linear=both``: not the baseline's
    own twin), else the baseline's."""
    baseline = settings.baseline.name.split("@", 1)[0]
    return [d.name for d in settings.candidates if d.name.split("@", 1)[0] != baseline] or [baseline]


def results_name(settings: Any) -> str:
    """``<decoders>-<hash>-s<seed>`` for ``settings`` (a :class:`~experiments.config.settings.RunSettings`)."""
    return f"{readable(decoder_names(settings), settings.seed)}-{config_hash(settings)}-s{settings.seed}"
