"""The Jacobi window of the lookahead branch: N-1 levels of guessed tokens over W columns."""

from __future__ import annotations

import random
from collections.abc import Sequence


class JacobiWindow:
    """Levels of the lookahead branch (docs/algorithm.md, "One step: layout, positions, mask").

    Level 0 holds W-1 tokens (the step's input token is its column 0); levels 1.. hold W each.
    Level 0 is drawn from the prompt with a seeded RNG; the following N-2 steps are warm-up that
    append one level each from the model's argmax. Once full, every step harvests one n-gram per
    column and shifts the levels up by one.
    """

    def __init__(self, width: int, ngram: int, prompt: Sequence[int], seed: int) -> None:
        if not prompt:
            raise ValueError("the window is initialised from the prompt, which is empty")
        rng = random.Random(seed)
        self.width = width                # W: the columns of every level but level 0's W-1
        self.ngram = ngram
        self.levels: list[list[int]] = [[rng.choice(prompt) for _ in range(width - 1)]]

    @property
    def full(self) -> bool:
        return len(self.levels) == self.ngram - 1

    def tokens(self) -> list[int]:
        """The window's tokens in layout order (level 0 first, without the input token)."""
        return [t for level in self.levels for t in level]

    def update(self, input_token: int, new_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        """Advance by one Jacobi iteration given the argmax of the last level's W rows.

        Returns the n-grams harvested this step (none during warm-up): column i gives
        (level-0 token, level-1 token, ..., new token), level 0's column 0 being the input token.
        """
        new = [int(t) for t in new_tokens]
        if len(new) != self.width:
            raise ValueError(f"expected {self.width} new window tokens, got {len(new)}")
        if not self.full:
            self.levels.append(new)
            return []
        first_column = [input_token, *self.levels[0]]
        grams = [
            (first_column[i], *(level[i] for level in self.levels[1:]), new[i])
            for i in range(self.width)
        ]
        upper = self.levels[1:] + [new]
        self.levels = [upper[0][1:], *upper[1:]]
        return grams
