"""The n-gram pool: key token -> up to G continuations of N-1 tokens, most recent last."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class NGramPool:
    """Continuations seen after each key token, capped at ``capacity`` per key.

    One insert path (``add``): a continuation already present is refreshed to most recent; a new
    one is appended, and when the key is full the oldest is evicted. ``candidates(key)`` returns
    them oldest first, the order the reference verifies them in (ties go to the first).
    ``origin`` names what inserted an n-gram last (the lookahead window, the text); ``tagged(key)``
    returns it and the n-gram's hit count beside each continuation, so acceptance can be counted
    per source and per hit count.

    >>> pool = NGramPool(ngram=3, capacity=2)
    >>> for gram in [(5, 1, 2), (5, 3, 4), (5, 1, 2), (5, 7, 8)]:
    ...     pool.add(gram)
    >>> pool.candidates(5)   # (1, 2) was refreshed, so (3, 4) was the oldest and got evicted
    [(1, 2), (7, 8)]
    """

    def __init__(self, ngram: int, capacity: int) -> None:
        if ngram < 2:
            raise ValueError(f"ngram must be >= 2, got {ngram}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.ngram = ngram
        self.capacity = capacity
        self._table: dict[int, OrderedDict[tuple[int, ...], tuple[str, int]]] = {}   # -> (origin, hits)

    def add(self, gram: Sequence[int], origin: str = "pool") -> None:
        """Insert one n-gram (key token followed by its N-1 continuation)."""
        if len(gram) != self.ngram:
            raise ValueError(f"expected an {self.ngram}-gram, got {len(gram)} tokens")
        if self.capacity == 0:
            return
        key, continuation = int(gram[0]), tuple(int(t) for t in gram[1:])
        bucket = self._table.setdefault(key, OrderedDict())
        if continuation in bucket:
            bucket.move_to_end(continuation)
            bucket[continuation] = (origin, bucket[continuation][1] + 1)
            return
        bucket[continuation] = (origin, 1)
        if len(bucket) > self.capacity:
            bucket.popitem(last=False)

    def add_all(self, grams: Iterable[Sequence[int]], origin: str = "pool") -> None:
        for gram in grams:
            self.add(gram, origin)

    def add_from_sequence(self, tokens: Sequence[int], new_from: int = 0, origin: str = "pool") -> None:
        """Insert every n-gram of ``tokens`` that contains a token at index >= ``new_from``.

        Called with ``new_from`` = the length before the last commit, each n-gram of the text is
        inserted exactly once (the reference re-inserts the last token after multi-token
        accepts; this does not).
        """
        n = self.ngram
        for end in range(max(n, new_from + 1), len(tokens) + 1):
            self.add(tokens[end - n:end], origin)

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        bucket = self._table.get(int(key))
        return list(bucket) if bucket else []

    def tagged(self, key: int) -> list[tuple[tuple[int, ...], str, int]]:
        """``candidates(key)`` with the origin of each and its hits: how many times it was inserted
        (seen again in the text, or proposed again by the window) while in the pool."""
        bucket = self._table.get(int(key))
        return [(c, origin, hits) for c, (origin, hits) in bucket.items()] if bucket else []

    def __len__(self) -> int:
        return sum(len(b) for b in self._table.values())

    def __contains__(self, gram: Sequence[int]) -> bool:
        bucket = self._table.get(int(gram[0]))
        return bucket is not None and tuple(int(t) for t in gram[1:]) in bucket
