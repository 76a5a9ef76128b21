"""Verification: which draft tokens to commit, given the logits that predict them.

The step's drafts form a tree (``layout.DraftTree``) under the input token. ``logits`` is (n+1, V):
row 0 predicts the input token's children (the next token), row i+1 the children of node i (the
token after it). Verification walks down the tree from the input token: at each node a *pick*
decides which child, if any, is accepted, and the walk ends with one token of the model's own (the
bonus token). Greedy and sampling decoding differ only in the pick; the walk and the decode loop
are shared.

Siblings with the same token (a tree built without merging, i.e. linear branches) are treated as
one: the walk keeps every node on the accepted prefix alive, so the longest accepted candidate
wins and ties go to the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .config import SamplingConfig
from .layout import DraftTree


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]   # committed this step: the accepted draft tokens plus one model token
    path: list[int]     # tree nodes holding the accepted draft tokens, depth 1 first

    @property
    def matched(self) -> int:
        return len(self.path)


class Verifier(Protocol):
    """``logits`` (r, V): a step's logit rows, on the model's device; ``rows[0]`` is the row that
    predicts the input token's children, ``rows[i + 1]`` node i's (default: row i); ``argmax``:
    every row's argmax, when the caller has read them to the host already (one copy a step)."""

    def __call__(self, tree: DraftTree, logits: torch.Tensor, rows: Sequence[int] | None = None,
                 argmax: Sequence[int] | None = None) -> Verdict: ...


# pick(row, options) -> (token, accepted): the token the model takes after the node whose logits
# are row ``row``, and whether it is one of ``options`` (the distinct child tokens, in node order).
Pick = Callable[[int, Sequence[int]], tuple[int, bool]]


def walk_tree(tree: DraftTree, pick: Pick) -> Verdict:
    """Follow ``pick`` down ``tree`` from the input token; the walk's accepted path and tokens."""
    alive, tokens = [-1], []
    while True:
        kids = [c for a in alive for c in tree.children.get(a, ())]
        options = list(dict.fromkeys(tree.tokens[c] for c in kids))
        token, accepted = pick(alive[0] + 1, options)
        tokens.append(token)
        if not accepted:
            break
        alive = [c for c in kids if tree.tokens[c] == token]
    return Verdict(tokens, tree.path_to(alive[0]))


def verify_greedy(tree: DraftTree, logits: torch.Tensor, rows: Sequence[int] | None = None,
                  argmax: Sequence[int] | None = None) -> Verdict:
    """Follow the model's argmax down the tree: the longest accepted path plus the bonus token."""
    argmax = argmax if argmax is not None else logits.argmax(-1).tolist()     # one device-to-host copy
    predicted = argmax if rows is None else [argmax[r] for r in rows]           # (n+1,)

    def pick(row: int, options: Sequence[int]) -> tuple[int, bool]:
        return predicted[row], predicted[row] in options

    return walk_tree(tree, pick)


def make_warper(sampling: SamplingConfig) -> LogitsProcessorList:
    """The same warpers, in the same order and under the same conditions, as ``generate`` uses."""
    warpers = LogitsProcessorList()
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(top_k=sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p))
    return warpers


def sampling_probs(logits: torch.Tensor, warper: LogitsProcessorList) -> torch.Tensor:
    """(..., V) logits -> the warped sampling distribution, float64 on the CPU."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    warped = warper(None, flat)
    return torch.softmax(warped.double(), dim=-1).cpu().reshape(logits.shape)


def sampling_pick(logits: torch.Tensor, warper: LogitsProcessorList, generator: torch.Generator,
                  rows: Sequence[int] | None = None) -> Pick:
    """Recursive rejection over a node's children with point-mass drafts (SpecInfer-style).

    The children's tokens are tried in order: token x is accepted with probability p(x); on
    rejection p(x) is set to 0 and p is renormalised. If every child is rejected, the token is drawn
    from what is left. The chosen token is distributed exactly as p, so the committed tokens are
    distributed as sampling from the model token by token.
    """

    def pick(row: int, options: Sequence[int]) -> tuple[int, bool]:
        probs = sampling_probs(logits[row if rows is None else rows[row]], warper)
        for draft in options:
            if torch.rand((), generator=generator, dtype=torch.float64) < probs[draft]:
                return draft, True
            probs[draft] = 0.0
            total = probs.sum()
            if total <= 0:                   # the drafts covered the support (rounding): take the last
                return draft, True
            probs /= total
        return int(torch.multinomial(probs, 1, generator=generator)), False

    return pick


def make_verifier(sampling: SamplingConfig, generator: torch.Generator | None = None) -> Verifier:
    if sampling.greedy:
        return verify_greedy
    generator = generator if generator is not None else torch.Generator().manual_seed(sampling.seed)
    warper = make_warper(sampling)

    def verify(tree: DraftTree, logits: torch.Tensor, rows: Sequence[int] | None = None,
               argmax: Sequence[int] | None = None) -> Verdict:
        return walk_tree(tree, sampling_pick(logits, warper, generator, rows))

    return verify
