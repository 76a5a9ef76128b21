"""Typed, self-validating configuration for the decoder.

Names follow the paper (Fu et al., ICML 2024): W = window size, N = n-gram size, G = the most
candidates verified per step. Every dataclass checks itself in ``__post_init__`` so that an
impossible value fails with a ``ValueError`` naming the field, before any model work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from . import sources as _sources


def window_rows(window: int, levels: int) -> int:
    """The Jacobi window's rows: tokens the input token and a window of ``levels`` filled levels feed
    (here, torch-free, so that a config validates before torch loads; ``layout`` builds on it)."""
    return 1 + (window - 1) + (levels - 1) * window if levels else 1


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

    Token trees and more draft sources (``lookahead_core/drafts.py``):
    tree: merge the step's candidates into one prefix tree, each shared prefix fed once; False
        feeds every candidate as a branch of its own (the paper's linear branches).
    recycle_window: with the ``recycle`` source and a window, every window row keeps its logits
        too, so the successor table also learns from the window's guesses (more LM-head rows a
        step, the same tokens fed); otherwise only the rows the step needs (input, last level,
        tree) refresh it. A flag of the recycle source (``SourceKind.flags``), named ``_rw``.
    depth: how deep the sources' drafts go; 0 = N-1.
    budget: the most tokens fed per step (input token + window rows + tree nodes); nodes are kept
        by their estimated acceptance, measured online per source and depth. 0 = no cap.
    step_costs: the device's cost of a step that feeds k tokens, relative to one token, for
        k = 1 .. budget (``decoding=auto`` fills it from its latency curve). With it, every step
        keeps the m best nodes that maximise expected tokens committed per cost, (1 + the sum of
        their acceptance estimates) / step_costs[rows + m - 1], from none (a greedy step) up to
        the budget; without it (empty), every step fills the budget.
    draft_cost: the price of one level of a trained drafter's own forwards (EAGLE's tree), in
        greedy steps of this device (``decoding=auto`` measures it); the drafter stops growing its
        tree once the acceptance its next level could add is below it. 0 = every level of ``depth``.
    sources: registered draft sources (``lookahead_core/sources.py``) and how many drafts of
        ``depth`` tokens each proposes per step, as a mapping ``{name: size}`` (0 = off; stored as
        sorted ``(name, size)`` pairs, so configs stay hashable). Built in:
        ``suffix``: the most suffix-match drafts per step (prompt lookup / SuffixDecoding:
        continuations of the longest context suffix seen before in prompt + output);
        ``recycle``: successors kept per token from the logits every step computes (Token
        Recycling), and the branching of the tree grown from them;
        ``medusa``: trained Medusa heads' drafts (``lookahead_core/medusa.py``).
    """

    window: int = 15
    ngram: int = 5
    guess: int = 15
    prompt_pool: bool = False
    pool_only: bool = False
    keep_pool: bool = True
    seed: int = 0
    tree: bool = False
    recycle_window: bool = False
    depth: int = 0
    budget: int = 0
    step_costs: tuple[float, ...] = ()
    draft_cost: float = 0.0
    sources: tuple[tuple[str, int], ...] = field(default=(), metadata={"yaml": dict[str, int]})

    def __post_init__(self) -> None:
        _require(_is_int(self.window) and self.window >= 1, f"window (W) must be an int >= 1, got {self.window!r}")
        _require(_is_int(self.ngram) and self.ngram >= 2, f"ngram (N) must be an int >= 2, got {self.ngram!r}")
        _require(_is_int(self.guess) and self.guess >= 0, f"guess (G) must be an int >= 0, got {self.guess!r}")
        _require(_is_int(self.seed), f"seed must be an int, got {self.seed!r}")
        for name in ("tree", "prompt_pool", "pool_only", "keep_pool", "recycle_window"):
            _require(isinstance(getattr(self, name), bool), f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("depth", "budget"):
            value = getattr(self, name)
            _require(_is_int(value) and value >= 0, f"{name} must be an int >= 0, got {value!r}")
        _require(isinstance(self.draft_cost, (int, float)) and not isinstance(self.draft_cost, bool)
                 and self.draft_cost >= 0, f"draft_cost must be a number >= 0, got {self.draft_cost!r}")
        object.__setattr__(self, "draft_cost", float(self.draft_cost))
        object.__setattr__(self, "sources", _sizes(self.sources))
        if self.recycle_window:
            _require(self.size("recycle") >= 1 and not self.pool_only,
                     f"recycle_window needs the recycle source (sources={{'recycle': k}}, k >= 1) and a window "
                     f"(pool_only=False), got sources={dict(self.sources)!r}, pool_only={self.pool_only!r}")
        if self.pool_only:
            _require(self.guess + len(self.sources) >= 1,
                     f"pool_only needs a draft source: guess (G) >= 1 or sources (e.g. suffix, recycle), "
                     f"got G={self.guess!r} and no sources")
            object.__setattr__(self, "prompt_pool", True)
        costs = self.step_costs
        _require(isinstance(costs, (tuple, list)) and all(isinstance(c, (int, float)) and not isinstance(c, bool)
                                                          and c > 0 for c in costs),
                 f"step_costs must be a sequence of positive numbers, got {costs!r}")
        object.__setattr__(self, "step_costs", tuple(float(c) for c in costs))
        if costs:
            _require(self.tree and self.budget and len(costs) == self.budget,
                     f"step_costs needs tree=True and one cost per step size up to the budget "
                     f"({self.budget!r}), got {len(costs)} costs")
        if self.budget:
            least = self.window_rows + 1
            _require(self.budget >= least, f"budget must be 0 (no cap) or >= {least} (the input token"
                     f"{' and the window rows' if self.uses_window else ''} plus one draft token), got {self.budget!r}")

    def size(self, source: str) -> int:
        """The size ``sources`` gives the registered source ``source`` (0: off)."""
        return dict(self.sources).get(source, 0)

    @property
    def uses_window(self) -> bool:
        return not self.pool_only

    @property
    def draft_depth(self) -> int:
        """Depth of the registered sources' drafts (suffix, recycled, ...)."""
        return self.depth or self.ngram - 1

    @property
    def window_rows(self) -> int:
        """Tokens the input token and a warmed-up window feed: 1 + (W-1) + (N-2)*W, or 1 pool-only."""
        return 1 if self.pool_only else window_rows(self.window, self.ngram - 1)

    @property
    def parallel_units(self) -> int:
        """The most pieces one step can be split into over the ranks of lookahead parallelism
        (``parallel.ShardedLM``): the window's columns and the step's drafts (pool candidates,
        the registered sources' drafts); a rank beyond them would feed nothing but the input token."""
        drafts = self.guess + sum(size for _, size in self.sources)
        return (self.window if self.uses_window else 0) + drafts

    @property
    def max_tokens_per_step(self) -> int:
        """Upper bound on tokens fed per forward: the budget, or window rows + G*(N-1) + the other
        sources' draft tokens (``size`` drafts of ``draft_depth`` each, and the recycle source's
        tree: k, then k*(k//2), ... nodes a level)."""
        if self.budget:
            return self.budget
        recycle = self.size("recycle")
        nodes = (self.guess * (self.ngram - 1)
                 + sum(size for name, size in self.sources if name != "recycle") * self.draft_depth)
        width, level = recycle, recycle
        for _ in range(self.draft_depth if recycle else 0):
            nodes += level
            width = max(1, width // 2)
            level *= width
        return self.window_rows + nodes


def _sizes(value) -> tuple[tuple[str, int], ...]:
    """``sources`` as sorted (name, size) pairs of registered sources, zero sizes dropped."""
    pairs = list(value.items()) if isinstance(value, Mapping) else list(value or ())
    _require(all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs),
             f"sources must map registered source names to sizes, got {value!r}")
    for name, size in pairs:
        _require(name in _sources.SOURCES,
                 f"sources: {name!r} is not a registered source (registered: {sorted(_sources.SOURCES)})")
        _require(_is_int(size) and size >= 0, f"sources: {name} must be an int >= 0, got {size!r}")
    _require(len({name for name, _ in pairs}) == len(pairs), f"sources: a name is given twice in {value!r}")
    return tuple(sorted((name, size) for name, size in pairs if size))


def config_fields(config: LookaheadConfig | None) -> dict | None:
    """Every field of ``config`` but the seed (``None`` for greedy): what a record or a result row
    stores, and what ``LookaheadConfig(**fields, seed=...)`` rebuilds."""
    return None if config is None else {f.name: getattr(config, f.name) for f in fields(config) if f.name != "seed"}


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
