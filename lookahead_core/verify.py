"""Verification: which draft tokens to commit, given the logits that predict them.

The step's drafts form a tree (``layout.DraftTree``) under the input token. ``logits`` is (n+1, V):
row 0 predicts the input token's children (the next token), row i+1 the children of node i (the
token after it). Verification walks down the tree from the input token: at each node a *pick*
decides which child, if any, is accepted, and the walk ends with one token of the model's own (the
bonus token). Greedy and sampling decoding differ only in the token each row chooses (its argmax,
or a draw from its distribution: :class:`Sampler`), made on the device for every row at once and
read by the host in the step's one copy; the walk and the decode loop are shared.

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
    """How a step's tokens are chosen. ``choose(logits)``: each logit row's token (r,), on the logits'
    device, which the host reads with the step's other reads (one copy a step); the call: the
    verdict on ``tree`` from ``logits`` (r, V), ``rows[0]`` the row that predicts the input
    token's children, ``rows[i + 1]`` node i's (default: row i), ``chosen`` what ``choose`` gave,
    as the host read it (None: chosen and read here)."""

    def choose(self, logits: torch.Tensor) -> torch.Tensor: ...

    def __call__(self, tree: DraftTree, logits: torch.Tensor, rows: Sequence[int] | None = None,
                 chosen: Sequence[int] | None = None) -> Verdict: ...


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


def walk_chosen(tree: DraftTree, chosen: Sequence[int], rows: Sequence[int] | None = None) -> Verdict:
    """Walk ``tree`` taking at each node the token chosen at its row (``chosen[rows[i]]``): the
    longest accepted path plus the token chosen after it (the bonus token)."""
    picked = chosen if rows is None else [chosen[r] for r in rows]

    def pick(row: int, options: Sequence[int]) -> tuple[int, bool]:
        return picked[row], picked[row] in options

    return walk_tree(tree, pick)


class Greedy:
    """Greedy verification: every row's argmax."""

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)

    def __call__(self, tree: DraftTree, logits: torch.Tensor, rows: Sequence[int] | None = None,
                 chosen: Sequence[int] | None = None) -> Verdict:
        return walk_chosen(tree, chosen if chosen is not None else self.choose(logits).tolist(), rows)


verify_greedy = Greedy()


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
    """(..., V) logits -> the warped sampling distribution, float64 on the logits' device."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    warped = warper(None, flat)
    return torch.softmax(warped.double(), dim=-1).reshape(logits.shape)


class Sampler:
    """Sampling verification, SpecInfer's recursive rejection with point-mass drafts: a node's child
    tokens are tried in order, token x accepted with probability p(x) (else p(x) is set to 0 and p
    renormalised); when every one is rejected, the token is drawn from what is left. The token the
    node gets is then distributed exactly as p, and it is accepted exactly when it is a child's: the
    same as one draw from p, accepted where a child holds it. So each row draws its token once, on
    the device (inverse CDF with the generator's uniforms), and the host reads the draws with the
    step's other reads; the committed tokens are distributed as sampling token by token."""

    def __init__(self, warper: LogitsProcessorList, generator: torch.Generator) -> None:
        self.warper, self.generator = warper, generator
        self._device_generator: torch.Generator | None = None

    def _generator_on(self, device: torch.device) -> torch.Generator:
        """The generator, or on another device one seeded from it (once)."""
        if device == self.generator.device:
            return self.generator
        if self._device_generator is None or self._device_generator.device != device:
            seed = int(torch.randint(1 << 62, (), generator=self.generator))
            self._device_generator = torch.Generator(device=device).manual_seed(seed)
        return self._device_generator

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        cdf = sampling_probs(logits, self.warper).cumsum(-1)
        uniform = torch.rand(len(cdf), 1, dtype=cdf.dtype, device=cdf.device, generator=self._generator_on(cdf.device))
        return torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).clamp_max(cdf.shape[-1] - 1)[:, 0]

    def __call__(self, tree: DraftTree, logits: torch.Tensor, rows: Sequence[int] | None = None,
                 chosen: Sequence[int] | None = None) -> Verdict:
        return walk_chosen(tree, chosen if chosen is not None else self.choose(logits).tolist(), rows)


def make_verifier(sampling: SamplingConfig, generator: torch.Generator | None = None) -> Verifier:
    if sampling.greedy:
        return verify_greedy
    return Sampler(make_warper(sampling), generator if generator is not None else torch.Generator().manual_seed(sampling.seed))
