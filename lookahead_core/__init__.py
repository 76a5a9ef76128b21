"""Lossless lookahead decoding (Fu et al., ICML 2024) for any Hugging Face causal LM.

    >>> from lookahead_core import decode, LookaheadConfig, DecodeLimits
    >>> out = decode(model, input_ids, LookaheadConfig(window=7, ngram=5, guess=7),
    ...              DecodeLimits(max_new_tokens=128, eos_token_ids=(tokenizer.eos_token_id,)))
    >>> out.tokens, out.stats.compression

``decode(model, ids)`` with no lookahead config is the greedy baseline through the same loop.
Pass a ``CausalLM(model)`` instead of the model to skip re-inspecting it on every call.
Before the first branching lookahead step on a model, ``probe`` checks that the model computes
such a step right and refuses it otherwise (``UnsupportedModelError``). ``divergence`` tells a
departure from greedy caused by a near-tie in fp16/bf16 numerics from a real mismatch.
"""

from .config import DecodeLimits, LookaheadConfig, SamplingConfig
from .decoder import DecodeOutput, DecodeState, DecodeStats, decode, decode_batch
from .drafts import DraftStats
from .numerics import LOGIT_TOLERANCE, Divergence, divergence
from .model_io import CausalLM
from .pool import NGramPool
from .capability import ProbeResult, UnsupportedModelError, probe

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
    "UnsupportedModelError",
    "decode",
    "decode_batch",
    "divergence",
    "probe",
]
