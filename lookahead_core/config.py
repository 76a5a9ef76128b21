"""Typed, self-validating configuration for the decoder.

Names follow the paper (Fu et al., ICML 2024): W = window size, N = n-gram size, G = the most
candidates verified per step. Every dataclass checks itself in ``__post_init__`` so that an
impossible value fails with a ``ValueError`` naming the field, before any model work.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LookaheadConfig:
    """Lookahead decoding settings.

    window (W): future positions in the Jacobi window (lookahead branch), >= 1.
    ngram (N): n-gram size; the window keeps N-1 levels and candidates are N-1 tokens long, >= 2.
    guess (G): the most pool candidates verified per step (and kept per key in the pool), >= 0;
        0 runs the lookahead branch alone (one token per step).
    prompt_pool: seed the pool with every n-gram of the prompt and of the generated text.
    pool_only: no lookahead branch at all; verify pool candidates only (prompt lookup). Implies
        ``prompt_pool`` and needs ``guess >= 1``.
    keep_pool: keep the pool across the turns of one conversation (``DecodeState``).
    seed: seeds the draw of the initial window from the prompt; same inputs, same steps.
    """

    window: int = 15
    ngram: int = 5
    guess: int = 15
    prompt_pool: bool = False
    pool_only: bool = False
    keep_pool: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        _require(_is_int(self.window) and self.window >= 1, f"window (W) must be an int >= 1, got {self.window!r}")
        _require(_is_int(self.ngram) and self.ngram >= 2, f"ngram (N) must be an int >= 2, got {self.ngram!r}")
        _require(_is_int(self.guess) and self.guess >= 0, f"guess (G) must be an int >= 0, got {self.guess!r}")
        _require(_is_int(self.seed), f"seed must be an int, got {self.seed!r}")
        if self.pool_only:
            _require(self.guess >= 1, f"guess (G) must be >= 1 when pool_only is set, got {self.guess!r}")
            object.__setattr__(self, "prompt_pool", True)

    @property
    def uses_window(self) -> bool:
        return not self.pool_only

    @property
    def max_tokens_per_step(self) -> int:
        """Upper bound on tokens fed per forward: (N-1) * (W + G), or 1 + G*(N-1) pool-only."""
        cand = self.guess * (self.ngram - 1)
        if self.pool_only:
            return 1 + cand
        return 1 + (self.window - 1) + (self.ngram - 2) * self.window + cand


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. ``temperature == 0`` is greedy.

    temperature, top_k and top_p are applied to the logits exactly as transformers'
    ``generate`` applies them (temperature first, then top-k, then top-p). ``seed`` seeds the
    ``torch.Generator`` that all random draws come from: same seed, same output.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        _require(isinstance(self.temperature, (int, float)) and self.temperature >= 0,
                 f"temperature must be >= 0, got {self.temperature!r}")
        _require(_is_int(self.top_k) and self.top_k >= 0, f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        _require(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1,
                 f"top_p must be in (0, 1], got {self.top_p!r}")
        _require(_is_int(self.seed), f"seed must be an int, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class DecodeLimits:
    """When to stop: ``max_new_tokens``, any of ``eos_token_ids`` (kept in the output, as
    ``generate`` does), or any of ``stop_strings`` in the decoded text (needs a tokenizer)."""

    max_new_tokens: int = 128
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        _require(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
                 f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        eos = self.eos_token_ids
        if eos is None:
            eos = ()
        elif _is_int(eos):
            eos = (eos,)
        eos = tuple(eos)
        _require(all(_is_int(t) and t >= 0 for t in eos), f"eos_token_ids must be non-negative ints, got {eos!r}")
        object.__setattr__(self, "eos_token_ids", eos)
        stops = (self.stop_strings,) if isinstance(self.stop_strings, str) else tuple(self.stop_strings or ())
        _require(all(isinstance(s, str) and s for s in stops), f"stop_strings must be non-empty strings, got {stops!r}")
        object.__setattr__(self, "stop_strings", stops)
