"""Verification: which candidate tokens to commit, given the logits that predict them.

Greedy and sampling decoding differ only in the function used here; the decode loop is shared.
Both take ``candidates`` (c, L) and ``logits`` (c, L+1, V) where ``logits[j, k]`` predicts
candidate token k (k < L) and, at k = L, the token after a fully matched candidate. With no
candidates, c = 1 and L = 0: the step commits the model's own next token.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]   # committed this step: the accepted candidate prefix plus one model token
    winner: int         # candidate whose KV rows hold the accepted prefix
    matched: int        # accepted candidate tokens (len(tokens) - 1)


class Verifier(Protocol):
    def __call__(self, candidates: torch.Tensor, logits: torch.Tensor) -> Verdict: ...


def verify_greedy(candidates: torch.Tensor, logits: torch.Tensor) -> Verdict:
    """Longest prefix equal to the argmax; ties go to the first candidate (as the reference)."""
    predicted = logits.argmax(-1).cpu()                                   # (c, L+1)
    matches = (candidates == predicted[:, :-1]).cumprod(-1).sum(-1)       # (c,)
    winner = int(matches.argmax())
    matched = int(matches[winner])
    return Verdict(candidates[winner, :matched].tolist() + [int(predicted[winner, matched])], winner, matched)


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


def verify_sampling(
    candidates: torch.Tensor,
    logits: torch.Tensor,
    *,
    warper: LogitsProcessorList,
    generator: torch.Generator,
) -> Verdict:
    """Multi-draft speculative sampling with point-mass drafts (SpecInfer-style).

    At each depth, the drafts of the candidates that share the accepted prefix are tried in
    order: draft x is accepted with probability p(x); on rejection p(x) is set to 0 and p is
    renormalised. If every draft is rejected, the token is drawn from what is left and the step
    ends. The committed tokens are distributed exactly as sampling from the model token by token.
    """
    length = candidates.shape[1]
    alive = list(range(candidates.shape[0]))
    tokens: list[int] = []
    for depth in range(length + 1):
        probs = sampling_probs(logits[alive[0], depth], warper)
        if depth < length:
            for j in alive:
                draft = int(candidates[j, depth])
                if torch.rand((), generator=generator, dtype=torch.float64) < probs[draft]:
                    tokens.append(draft)
                    alive = [i for i in alive if int(candidates[i, depth]) == draft]
                    break
                probs[draft] = 0.0
                probs /= probs.sum()
            else:
                return Verdict(tokens + [_draw(probs, generator)], alive[0], depth)
            continue
        tokens.append(_draw(probs, generator))
    return Verdict(tokens, alive[0], length)


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def make_verifier(sampling: SamplingConfig, generator: torch.Generator | None = None) -> Verifier:
    if sampling.greedy:
        return verify_greedy
    generator = generator if generator is not None else torch.Generator().manual_seed(sampling.seed)
    warper = make_warper(sampling)

    def verify(candidates: torch.Tensor, logits: torch.Tensor) -> Verdict:
        return verify_sampling(candidates, logits, warper=warper, generator=generator)

    return verify

