"""The n-gram pool and the Jacobi window on hand-written token lists."""

import pytest

from lookahead_core.pool import NGramPool
from lookahead_core.window import JacobiWindow


def test_insert_order_refresh_and_eviction():
    pool = NGramPool(ngram=3, capacity=2)
    pool.add((5, 1, 2))
    pool.add((5, 3, 4))
    assert pool.candidates(5) == [(1, 2), (3, 4)]          # oldest first: ties go to the older
    pool.add((5, 1, 2))                                     # refresh: (1, 2) becomes most recent
    assert pool.candidates(5) == [(3, 4), (1, 2)]
    pool.add((5, 7, 8))                                     # full: the oldest, (3, 4), goes
    assert pool.candidates(5) == [(1, 2), (7, 8)]
    assert (5, 3, 4) not in pool and (5, 7, 8) in pool
    assert pool.candidates(6) == [] and len(pool) == 2


def test_zero_capacity_keeps_nothing_and_wrong_length_is_rejected():
    pool = NGramPool(ngram=2, capacity=0)
    pool.add((1, 2))
    assert pool.candidates(1) == []
    with pytest.raises(ValueError, match="3-gram"):
        NGramPool(3, 1).add((1, 2))


def test_add_from_sequence_inserts_each_ngram_once():
    pool = NGramPool(ngram=3, capacity=4)
    pool.add_from_sequence([1, 2, 3, 1, 2])
    assert pool.candidates(1) == [(2, 3)] and pool.candidates(2) == [(3, 1)] and pool.candidates(3) == [(1, 2)]
    # Commit [4, 1]: new n-grams are those containing index >= 5: (1,2,4) and (2,4,1).
    seen = []
    pool.add = lambda gram, origin="pool": seen.append(tuple(gram))        # record the insert path
    pool.add_from_sequence([1, 2, 3, 1, 2, 4, 1], new_from=5)
    assert seen == [(1, 2, 4), (2, 4, 1)]


def test_window_warms_up_then_harvests_columns_and_shifts():
    win = JacobiWindow(width=3, ngram=4, prompt=[9], seed=0)
    assert win.levels == [[9, 9]]                          # level 0: W-1 tokens drawn from the prompt
    assert win.update(input_token=1, new_tokens=[10, 11, 12]) == []
    assert win.update(input_token=1, new_tokens=[20, 21, 22]) == []
    assert win.full and win.tokens() == [9, 9, 10, 11, 12, 20, 21, 22]
    grams = win.update(input_token=7, new_tokens=[30, 31, 32])
    assert grams == [(7, 10, 20, 30), (9, 11, 21, 31), (9, 12, 22, 32)]
    assert win.levels == [[11, 12], [20, 21, 22], [30, 31, 32]]


def test_window_n2_is_plain_jacobi():
    win = JacobiWindow(width=3, ngram=2, prompt=[4, 5], seed=1)
    assert win.full
    level0 = list(win.levels[0])
    assert win.update(input_token=8, new_tokens=[1, 2, 3]) == [(8, 1), (level0[0], 2), (level0[1], 3)]
    assert win.levels == [[2, 3]]


def test_window_initialisation_is_seeded():
    prompt = list(range(100))
    assert JacobiWindow(8, 3, prompt, seed=3).levels == JacobiWindow(8, 3, prompt, seed=3).levels
    assert JacobiWindow(8, 3, prompt, seed=3).levels != JacobiWindow(8, 3, prompt, seed=4).levels


def test_origin_tags_follow_the_last_insert_and_hits_count_every_insert():
    pool = NGramPool(ngram=3, capacity=3)
    pool.add((5, 1, 2), "jacobi")
    pool.add((5, 3, 4))
    pool.add((5, 1, 2), "pool")                             # refreshed by the text: now tagged pool
    assert pool.tagged(5) == [((3, 4), "pool", 1), ((1, 2), "pool", 2)]
    pool.add((5, 7, 8), "jacobi")
    assert pool.tagged(5)[-1] == ((7, 8), "jacobi", 1) and pool.candidates(5) == [(3, 4), (1, 2), (7, 8)]
    pool.add((5, 9, 9))                                     # evicts (3, 4): its hits go with it
    pool.add((5, 3, 4))
    assert pool.tagged(5)[-1] == ((3, 4), "pool", 1)
