"""Lossless lookahead decoding (Fu et al., ICML 2024) for any Hugging Face causal LM.

    >>> from lookahead_core import decode, LookaheadConfig, DecodeLimits
    >>> out = decode(model, input_ids, LookaheadConfig(window=7, ngram=5, guess=7),
    ...              DecodeLimits(max_new_tokens=128, eos_token_ids=(tokenizer.eos_token_id,)))
    >>> out.tokens, out.stats.compression

``decode(model, ids)`` with no lookahead config is the greedy baseline through the same loop.
Pass a ``CausalLM(model)`` instead of the model to skip re-inspecting it on every call.
Before the first branching lookahead step on a model, ``probe`` checks that the model computes
such a step right and refuses it otherwise (``UnsupportedModelError``); an attention backend that
computes wrong logits on this device is refused for every decoder (``UnsupportedAttentionError``). ``divergence`` tells a
departure from greedy caused by a near-tie in fp16/bf16 numerics from a real mismatch.
"""

import re
from importlib import import_module, metadata
from typing import TYPE_CHECKING

TRANSFORMERS = "transformers>=5.17,<6"
"""The transformers releases served: those CI tests, the lower bound in an environment of its own
(``make test-lower``). pyproject.toml requires the same (tests/test_versions.py)."""


def _require_transformers() -> None:
    """Refuse, in one line, a transformers outside :data:`TRANSFORMERS` (read from its metadata:
    importing it here would import torch). A release outside passes its keywords under other names,
    and a module's ``**kwargs`` swallows them without a word (tests/test_module_keywords.py)."""
    low, high = (_release(v) for v in re.fullmatch(r"transformers>=([\d.]+),<([\d.]+)", TRANSFORMERS).groups())
    try:
        installed = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        installed = "none"
    if installed == "none" or not low <= _release(installed) < high:
        raise ImportError(f"lookahead_core needs {TRANSFORMERS}, and transformers {installed} is installed: "
                          f"pip install '{TRANSFORMERS}'")


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version (``5.17.0rc1`` -> ``(5, 17, 0)``)."""
    return tuple(int(part) for part in re.match(r"\d+(?:\.\d+)*", version).group().split("."))


_require_transformers()

# Exports load on first use: ``from lookahead_core.config import LookaheadConfig`` (or
# ``lookahead_core.LookaheadConfig``) validates a config without importing torch, so a harness can
# reject a bad config before any heavy import. tests/test_layering.py holds this rule.
_EXPORTS: dict[str, str] = {
    "DecodeLimits": "config", "LookaheadConfig": "config", "SamplingConfig": "config",
    "DecodeOutput": "decoder", "DecodeState": "decoder", "DecodeStats": "decoder", "decode": "decoder",
    "decode_batch": "decoder", "DraftStats": "drafts", "LOGIT_TOLERANCE": "numerics", "Divergence": "numerics",
    "divergence": "numerics", "CausalLM": "model_io", "NGramPool": "pool", "ProbeResult": "capability",
    "UnsupportedModelError": "capability", "probe": "capability", "UnsupportedAttentionError": "capability",
    "attention_verdict": "capability",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lookahead_core' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from .capability import ProbeResult, UnsupportedAttentionError, UnsupportedModelError, attention_verdict, probe
    from .config import DecodeLimits, LookaheadConfig, SamplingConfig
    from .decoder import DecodeOutput, DecodeState, DecodeStats, decode, decode_batch
    from .drafts import DraftStats
    from .model_io import CausalLM
    from .numerics import LOGIT_TOLERANCE, Divergence, divergence
    from .pool import NGramPool

__all__ = [
    "CausalLM",
    "DecodeLimits",
    "DecodeOutput",
    "DecodeState",
    "DecodeStats",
    "Divergence",
    "DraftStats",
    "LOGIT_TOLERANCE",
    "LookaheadConfig",
    "NGramPool",
    "ProbeResult",
    "SamplingConfig",
    "UnsupportedAttentionError",
    "UnsupportedModelError",
    "attention_verdict",
    "decode",
    "decode_batch",
    "divergence",
    "probe",
]
