"""The configs ``auto`` chooses among: the paper's grid, pool-only, token trees, and what each
registered draft source adds (``lookahead_core/sources.py``)."""

from __future__ import annotations

from ..config import LookaheadConfig
from ..sources import SOURCES

# (N, W, G) for the lookahead branch, each with and without the prompt pool, and (N, G) for
# pool-only decoding (prompt lookup, no window: one step feeds at most 1 + G*(N-1) tokens).
DEFAULT_LOOKAHEAD_GRID: tuple[tuple[int, int, int], ...] = ((3, 2, 2), (3, 4, 4), (4, 5, 5), (5, 7, 7), (5, 15, 15))
DEFAULT_POOL_ONLY_GRID: tuple[tuple[int, int], ...] = ((3, 1), (4, 1), (5, 1), (4, 3), (6, 2))
# Token trees without a window (pool + suffix matches + recycled successors, or without recycling),
# one per token budget: a CPU wants 3-8 tokens per step, a GPU tens. Plus the paper's W7 N5 G7
# lookahead with the prompt pool as a tree within the budget of its linear branches.
DEFAULT_TREE_BUDGETS: tuple[int, ...] = (3, 4, 5, 6, 8, 12, 16, 32, 64)
DEFAULT_SUFFIX_TREE_BUDGETS: tuple[int, ...] = (4, 8)
# Suffix-only trees (no pool, no recycling) as (matches, depth, budget): prompt lookup's shape, and
# deeper ones for outputs that copy long spans (ClassEval: one match 10 deep beat prompt lookup
# k = 10 where the depth-6 trees above could not; results/benchmark/trees/README.md). One match
# gets the budget 1 + depth: no cut by itself, but what a cost-aware step cuts from (a 16-deep
# copy fed only where its match is long: Qwen2.5-Coder CNN/DM, the README's auto4 section).
DEFAULT_SUFFIX_ONLY_TREES: tuple[tuple[int, int, int], ...] = (
    (1, 3, 4), (4, 6, 8), (1, 10, 11), (4, 10, 12), (1, 16, 17), (4, 16, 16))


def tree_config(budget: int, recycle: int = 4, depth: int = 6) -> LookaheadConfig:
    """A pool-only token tree: pool N4 G4, 4 suffix matches, ``recycle`` successors, ``depth`` deep."""
    return LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True, tree=True,
                           sources={"suffix": 4, "recycle": recycle}, depth=depth, budget=budget)


def default_grid() -> list[LookaheadConfig]:
    grid = [LookaheadConfig(window=w, ngram=n, guess=g, prompt_pool=pool)
            for n, w, g in DEFAULT_LOOKAHEAD_GRID for pool in (False, True)]
    grid += [LookaheadConfig(window=1, ngram=n, guess=g, pool_only=True) for n, g in DEFAULT_POOL_ONLY_GRID]
    grid += [LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": m},
                             depth=d, budget=b)
             for m, d, b in DEFAULT_SUFFIX_ONLY_TREES]
    grid += [tree_config(b) for b in DEFAULT_TREE_BUDGETS]
    grid += [tree_config(b, recycle=0) for b in DEFAULT_SUFFIX_TREE_BUDGETS]
    grid.append(LookaheadConfig(window=7, ngram=5, guess=7, prompt_pool=True, tree=True,
                                sources={"suffix": 4, "recycle": 4}, depth=6,
                                budget=LookaheadConfig(window=7, ngram=5, guess=7).max_tokens_per_step))
    for kind in SOURCES.values():                 # registered sources add their own configs
        if kind.grid is not None:
            grid += [c for c in kind.grid() if c not in grid]
    return grid

