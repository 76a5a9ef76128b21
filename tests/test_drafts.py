"""Draft sources, acceptance bookkeeping and the budgeted proposer, on hand-made token lists."""

import dataclasses

import pytest
import torch

from lookahead_core.drafts import (
    MATCH_CAP, RECALIBRATION_TRIES, Bins, Counts, DraftStats, NGramSource, Proposer, RecycleSource, StepOutcome,
    SuffixSource, best_size, match_length,
)
from lookahead_core.layout import Draft, build_tree
from lookahead_core.pool import NGramPool


def test_suffix_prefers_the_longest_matching_context_then_the_most_recent():
    #          0  1  2  3  4  5  6  7  8  9 10 11
    context = [7, 1, 2, 3, 9, 1, 2, 4, 8, 5, 2, 6, 1, 2]
    source = SuffixSource(matches=3, depth=2, context=context)
    drafts = source.propose(context)
    # "1 2" ends at 2 and 6: continuations (3, 9) and (4, 8), most recent first; then "2" alone at 10: (6, 1).
    assert [d.tokens for d in drafts] == [(4, 8), (3, 9), (6, 1)]
    assert [d.tags[0] for d in drafts] == ["suffix:2:c1", "suffix:2:c1", "suffix:1:c1"]
    assert len(SuffixSource(matches=1, depth=2, context=context).propose(context)) == 1


def test_suffix_tags_count_the_occurrences_that_agree_on_the_next_token():
    #          0  1  2  3  4  5  6  7  8  9 10
    context = [5, 1, 9, 5, 1, 9, 5, 1, 7, 5, 1]
    # "5 1" ends at 1, 4 and 7 (each a 2-token match): followed by 9, 9 and 7.
    drafts = SuffixSource(matches=3, depth=2, context=context).propose(context)
    assert [(d.tokens, d.tags[0]) for d in drafts] == [((7, 5), "suffix:2:c1"), ((9, 5), "suffix:2:c2")]


def test_suffix_takes_the_longest_measured_match_before_the_most_recent_and_tags_its_bucket():
    copied = [11, 12, 13, 14, 15, 16, 17, 18, 19]            # 9 tokens: the copy in progress
    context = [1] + copied + [20, 21] + [0, 16, 17, 18, 19] + [30, 31] + [5] + copied
    # "16 17 18 19" ends at 9 (matched 9 tokens back: bucket 8) and at 16 (preceded by 0: 4 tokens)
    source = SuffixSource(matches=3, depth=2, context=context)
    drafts = source.propose(context)
    assert [d.tokens for d in drafts][:2] == [(20, 21), (30, 31)]
    assert [d.tags[0] for d in drafts][:2] == ["suffix:8:c1", "suffix:4:c1"]
    # the measure stops at MATCH_CAP, and a match reaching the text's start stops there
    text = list(range(100, 140)) + [7] + list(range(100, 140))          # a 40-token match
    assert match_length(text, end=39, last=80, known=4) == MATCH_CAP < 40
    assert SuffixSource(1, 1, text).propose(text)[0].tags == ("suffix:32:c1",)
    assert SuffixSource(1, 1, [3, 4, 9, 3, 4]).propose([3, 4, 9, 3, 4])[0].tags == ("suffix:2:c1",)


def test_suffix_index_grows_with_the_text_and_copies_past_its_end():
    source = SuffixSource(matches=2, depth=5, context=[4, 5])
    assert source.propose([4, 5]) == []
    text = [4, 5, 6, 4, 5]
    source.update(StepOutcome(text, 2, 5))
    # "4 5" ended at 1; its continuation runs into the end of the text and keeps copying: 6 4 5 6 4.
    assert source.propose(text)[0] == Draft((6, 4, 5, 6, 4), ("suffix:2:c1",) * 5)


def test_recycle_keeps_the_latest_top_k_and_grows_a_halving_tree_tagged_by_probability():
    source = RecycleSource(k=4, depth=3)
    probs = torch.tensor([[0.91, 0.05, 0.02, 0.01], [0.4, 0.3, 0.2, 0.1]])
    source.update(StepOutcome([1], 0, 1, row_tokens=[1, 2], row_topk=torch.tensor([[2, 3, 4, 5], [6, 7, 8, 9]]),
                              row_topk_probs=probs))
    source.update(StepOutcome([1], 0, 1, row_tokens=[6], row_topk=torch.tensor([[1, 2, 3, 4]]),
                              row_topk_probs=torch.tensor([[1.0, 0.0, 0.0, 0.0]])))
    assert source.successors == {1: [(2, 9), (3, 0), (4, 0), (5, 0)], 2: [(6, 4), (7, 3), (8, 2), (9, 1)],
                                 6: [(1, 9), (2, 0), (3, 0), (4, 0)]}          # deciles; p = 1.0 goes in the top one
    drafts = source.propose([0, 1])
    tree = build_tree(drafts)
    # 1 -> 2 3 4 5 (ranks 0-3); 2 -> its top 2: 6 7; 6 -> its top 1: 1 (depth 3).
    assert [d.tokens for d in drafts] == [(2, 6, 1), (2, 7), (3,), (4,), (5,)]
    assert drafts[0].tags == ("recycle:p9", "recycle:p4", "recycle:p9") and drafts[1].tags == ("recycle:p9", "recycle:p3")
    assert len(tree) == 7


def test_recycled_successors_start_from_the_priors_table_and_hand_both_on():
    prior = DraftStats()
    prior.carried["recycle"].update({1: [(2, 9)], 2: [(3, 8)]})
    source = RecycleSource(k=2, depth=3)
    stats = DraftStats(prior=prior)
    Proposer([source], merge=True, stats=stats)                          # the proposer hands it the stats
    assert source.propose([0, 1]) == [Draft((2, 3), ("recycle:p9", "recycle:p8"))]
    source.update(StepOutcome([1], 0, 1, row_tokens=[2], row_topk=torch.tensor([[5, 6]]),
                              row_topk_probs=torch.tensor([[0.5, 0.3]])))
    assert [d.tokens for d in source.propose([0, 1])] == [(2, 5)]        # this decode's own row wins
    assert prior.carried["recycle"] == {1: [(2, 9)], 2: [(3, 8)]}                # the prior is never written
    assert stats.learnt().carried["recycle"] == {1: [(2, 9)], 2: [(5, 5), (6, 3)]}
    cold = RecycleSource(k=2, depth=3)
    Proposer([cold], merge=True)
    assert cold.propose([0, 1]) == []


def test_a_tags_own_estimate_is_its_rate_until_measured():
    from lookahead_core.drafts import tag_guess

    assert [tag_guess(t) for t in ("recycle:p0", "recycle:p9", "suffix:4:c2", "pool:h1", "medusa:0")] == [
        0.05, 0.95, None, None, None]
    stats = DraftStats()
    assert stats.rate("recycle:p8", 1) == 0.85 and stats.rate("recycle:p8", 4) == 0.85 and stats.rate("pool:h1", 1) == 0.5
    assert stats.rate("recycle:p8|alone", 1) == 0.85                      # an unseen class: its tag's rate
    stats.record(build_tree([Draft((1,), ("recycle:p8",))]), [])           # tried once, rejected
    tag_rate = (0 + 2 * 0.85) / 3
    assert stats.rate("recycle:p8", 1) == pytest.approx(tag_rate)
    assert stats.rate("recycle:p8|alone", 1) == pytest.approx((0 + 2 * tag_rate) / 3)
    assert stats.rate("recycle:p8|suffix", 1) == pytest.approx(tag_rate)  # that class still unseen


def test_a_node_other_sources_also_propose_is_its_own_class():
    """Pool n-grams alone are rejected, those a suffix match also proposes accepted (as on SmolLM2
    HumanEval, 0.06 against 0.22): the tag's rate mixes both, each class learns its own, and a
    node is estimated by its class."""
    from lookahead_core.drafts import node_class

    stats = DraftStats()
    for step in range(40):
        if step % 2:
            tree, path = build_tree([Draft((1,), ("pool:h1",))]), []
        else:
            tree, path = build_tree([Draft((1,), ("pool:h1",)), Draft((1,), ("suffix:1:c1",))]), [0]
        stats.record(tree, path)
    assert build_tree([Draft((1,), ("pool:h1",)), Draft((1,), ("suffix:1:c1",))]).tags[0] == ("pool:h1", "suffix:1:c1")
    assert node_class("pool:h1", ("pool:h1",)) == "pool:h1|alone"
    assert stats.counts.tried["pool:h1", 1] == 40 and stats.counts.accepted["pool:h1", 1] == 20
    assert stats.rate("pool:h1", 1) == pytest.approx((20 + 2 * 0.5) / 42)
    assert stats.rate("pool:h1|alone", 1) == pytest.approx((0 + 2 * stats.rate("pool:h1", 1)) / 22)
    assert stats.rate("pool:h1|suffix", 1) == pytest.approx((20 + 2 * stats.rate("pool:h1", 1)) / 22)
    alone, _ = stats.estimate(("pool:h1",), 1)
    agreed, _ = stats.estimate(("pool:h1", "suffix:1:c1"), 1)
    assert alone < 0.1 < 0.9 < agreed
    # The per-source table counts every node once under its tags, never again under its classes.
    assert {(r["source"], r["tried"]) for r in stats.counts.table()} == {("pool", 40), ("suffix", 20)}
    saved = DraftStats(Counts.from_table(stats.counts.table(by_source=False)),
                       Bins.from_list(stats.calibration.to_list()))
    assert saved.counts.tried == stats.counts.tried and saved.calibration == stats.calibration
    assert saved.estimate(("pool:h1",), 1) == pytest.approx(stats.estimate(("pool:h1",), 1))


def test_over_rated_estimates_are_recalibrated_by_their_bin():
    """A source whose nodes were estimated at 0.45 and accepted at 0.2 (the winner's curse of a
    noisy per-class rate) has every estimate in that decile scaled by what it achieved, toward 1
    with RECALIBRATION_TRIES pseudo-nodes; other deciles and sources are untouched."""
    stats = DraftStats()
    stats.calibration["pool", 4, "tried"], stats.calibration["pool", 4, "accepted"] = 200, 40
    stats.calibration["pool", 4, "predicted"] = 200 * 0.45
    ratio = (40 + RECALIBRATION_TRIES) / (90 + RECALIBRATION_TRIES)
    assert stats.corrected("pool", 0.42) == pytest.approx(0.42 * ratio)
    assert stats.corrected("pool", 0.55) == 0.55 and stats.corrected("suffix", 0.42) == 0.42
    assert stats.estimate(("pool:h1",), 1) == (0.5, "pool:h1")            # an unseen class: the coin flip, bin 5
    later = DraftStats(prior=stats.learnt())                             # a later decode keeps the map
    assert later.corrected("pool", 0.42) == pytest.approx(0.42 * ratio)
    under = DraftStats()
    under.calibration["suffix", 2, "accepted"], under.calibration["suffix", 2, "predicted"] = 80, 25.0
    assert under.corrected("suffix", 0.25) == pytest.approx(min(1.0, 0.25 * 85 / 30))   # under-rated: raised


def test_ngram_source_tags_window_and_text_grams_with_their_hits():
    pool = NGramPool(ngram=3, capacity=4)
    source = NGramSource(pool, None, text=True, context=[1, 2, 3, 1])
    assert source.propose([1, 2, 3, 1]) == [Draft((2, 3), ("pool:h1", "pool:h1"))]
    pool.add((1, 5, 6), "jacobi")
    assert source.propose([9, 1])[-1] == Draft((5, 6), ("jacobi:h1", "jacobi:h1"))
    for _ in range(3):
        pool.add((1, 2, 3))                                               # seen again: hits 2, 3, 4 (capped at 3)
    assert source.propose([9, 1])[-1] == Draft((2, 3), ("pool:h3", "pool:h3"))


def test_reliability_bins_each_tried_node_by_the_estimate_it_was_fed_under():
    """Hand-made steps: the estimates are those before each step's own counts, raw (the class
    rate) and used (recalibrated); untried nodes (their parent rejected) are not in the diagram."""
    from lookahead_core.drafts import reliability_table

    stats = DraftStats()
    tree = build_tree([Draft((1, 2), ("recycle:p8", "recycle:p8")), Draft((3,), ("suffix:4:c1",))])
    stats.record(tree, [0, 1])            # node 0 (p8: 0.85) accepted, node 1 (depth 2, p8: 0.85) accepted,
                                          # node 2 (suffix, unseen: 0.5) rejected
    first = [{"source": "recycle", "bin": 8, "tried": 2, "predicted": 0.85, "observed": 1.0},
             {"source": "suffix", "bin": 5, "tried": 1, "predicted": 0.5, "observed": 0.0}]
    assert stats.reliability.rows() == stats.calibration.rows() == first   # nothing to recalibrate by yet
    stats.record(tree, [])                # now node 0's class has 1 of 1: raw (1 + 2 * r) / 3, r its tag's
    tag_rate = (1 + 2 * 0.85) / 3
    raw = (1 + 2 * tag_rate) / 3          # 0.93: bin 9, which no node has reached, so used = raw
    rows = {(r["source"], r["bin"]): r for r in stats.reliability.rows()}
    assert rows["recycle", 9] == {"source": "recycle", "bin": 9, "tried": 1, "predicted": pytest.approx(raw),
                                  "observed": 0.0}
    suffix_raw = (0 + 2 * ((0 + 2 * 0.5) / 3)) / 3                       # its class and its tag: 0 of 1
    assert rows["suffix", 2]["predicted"] == pytest.approx(suffix_raw) and rows["suffix", 2]["tried"] == 1
    raw = stats.rate("suffix:4:c1|alone", 1)                             # 0 of 2 now: 0.125, bin 1
    assert raw == pytest.approx(2 * ((0 + 2 * 0.5) / 4) / 4) and stats.estimate(("suffix:4:c1",), 1)[0] == raw
    stats.calibration["suffix", 1, "predicted"] += 10.0                  # as if 10 more nodes were estimated in
    assert stats.estimate(("suffix:4:c1",), 1)[0] == pytest.approx(    # bin 1, none of them accepted
        raw * RECALIBRATION_TRIES / (10 + RECALIBRATION_TRIES))
    merged = DraftStats()
    merged.merge(stats), merged.merge(stats)
    assert sum(r["tried"] for r in merged.reliability.rows()) == 2 * sum(r["tried"] for r in stats.reliability.rows())
    assert reliability_table([("recycle", 0.82, True), ("recycle", 0.88, False), ("suffix", 0.31, False)]) == [
        {"source": "recycle", "bin": 8, "tried": 2, "predicted": pytest.approx(0.85), "observed": 0.5},
        {"source": "suffix", "bin": 3, "tried": 1, "predicted": 0.31, "observed": 0.0}]


def test_stats_count_fed_tried_and_accepted_per_tag_and_depth():
    tree = build_tree([Draft((1, 2, 3), ("a",) * 3), Draft((1, 4), ("b", "b")), Draft((5,), ("b",))])
    # nodes: 0:1 (a, b)  1:2 (a)  2:3 (a)  3:4 (b)  4:5 (b)
    stats = DraftStats()
    stats.record(tree, [0, 1])          # accepted 1, 2; node 2 tried and rejected; node 3 tried, rejected
    assert stats.counts.fed == {("a", 1): 1, ("b", 1): 2, ("a", 2): 1, ("a", 3): 1, ("b", 2): 1}
    tags = {key: n for key, n in stats.counts.tried.items() if "|" not in key[0]}     # per tag; per node class below
    assert tags == {("a", 1): 1, ("b", 1): 2, ("a", 2): 1, ("a", 3): 1, ("b", 2): 1}
    assert {key: n for key, n in stats.counts.accepted.items() if "|" not in key[0] and n} == {
        ("a", 1): 1, ("b", 1): 1, ("a", 2): 1}
    assert {key: n for key, n in stats.counts.tried.items() if "|" in key[0]} == {
        ("a|b", 1): 1, ("b|a", 1): 1, ("b|alone", 1): 1, ("a|alone", 2): 1, ("a|alone", 3): 1, ("b|alone", 2): 1}
    stats.record(tree, [])              # nothing accepted: only the depth-1 nodes were tried
    assert stats.counts.tried[("a", 2)] == 1 and stats.counts.tried[("a", 1)] == 2
    rows = {(r["source"], r["depth"]): r for r in stats.counts.table()}
    assert rows[("b", 1)]["acceptance"] == 1 / 4 and rows[("a", 3)]["acceptance"] == 0.0


def test_an_unseen_depth_takes_the_rate_one_level_up_so_a_cost_aware_budget_reaches_deep_copies():
    stats = DraftStats()
    copy = build_tree([Draft((1, 2), ("suffix:16",) * 2)])
    for _ in range(8):
        stats.record(copy, [0, 1])                    # 2-deep copies, always accepted
    assert stats.rate("suffix:16", 1) == pytest.approx((8 + 2 * 0.5) / 10)
    assert stats.rate("suffix:16", 2) == pytest.approx((8 + 2 * stats.rate("suffix:16", 1)) / 10)
    assert stats.rate("suffix:16", 9) == stats.rate("suffix:16", 2)     # never fed that deep: the guess
    assert stats.rate("other", 3) == 0.5                                  # unseen tag: coin flips
    # A 9-deep draft against a curve where a 10-token step costs 2 one-token steps: with the old flat
    # prior (0.5 per level) only 4 nodes would pay; with the measured rates all 9 do.
    deep = build_tree([Draft(tuple(range(10, 19)), ("suffix:16",) * 9)])
    scores = Proposer([], merge=True, stats=stats).scores(deep)
    costs = [1.0] + [1.0 + k / 9 for k in range(1, 10)]
    assert best_size(scores, costs, rows=1, room=9) == 9
    assert best_size([0.5 ** d for d in range(1, 10)], costs, rows=1, room=9) < 9
    stats.record(build_tree([Draft((1, 2, 3), ("suffix:16",) * 3)]), [0, 1])  # depth 3 tried, rejected
    assert stats.rate("suffix:16", 3) == 2 * stats.rate("suffix:16", 2) / 3   # the cache was refreshed
    assert best_size(Proposer([], merge=True, stats=stats).scores(deep), costs, rows=1, room=9) < 9


def test_a_learnt_prior_takes_over_where_it_has_tried_and_the_guesses_elsewhere():
    learnt = DraftStats()
    copy = build_tree([Draft((1, 2, 3), ("suffix:8",) * 3)])
    for _ in range(18):
        learnt.record(copy, [0, 1, 2])                      # 3-deep copies, always accepted
    learnt.record(copy, [])                                 # and one rejected at depth 1
    stats = DraftStats(prior=learnt)
    flip = 0.5                                                           # the coin flip of an unseen tag
    assert stats.rate("suffix:8", 1) == learnt.rate("suffix:8", 1) == pytest.approx((18 + 2 * flip) / 21)
    assert stats.rate("suffix:8", 3) == learnt.rate("suffix:8", 3) == (18 + 2 * learnt.rate("suffix:8", 2)) / 20
    assert stats.rate("suffix:8", 5) == stats.rate("suffix:8", 3)      # never tried that deep: the level above
    assert stats.rate("pool", 1) == 0.5 and stats.rate("pool", 2) == 0.5    # nothing learnt: coin flips
    stats.record(build_tree([Draft((4,), ("suffix:8",))]), [])          # this decode's own tries count on top
    assert stats.rate("suffix:8", 1) == (0 + 2 * learnt.rate("suffix:8", 1)) / (1 + 2)
    both = stats.learnt()                                               # the next decode's prior
    assert both.counts.tried[("suffix:8", 1)] == 19 + 1 and both.counts.accepted[("suffix:8", 3)] == 18 \
        and both.prior is None
    assert DraftStats(Counts.from_table(both.counts.table(by_source=False))) == both   # a record's round trip


def test_a_learnt_prior_lets_a_cost_aware_step_feed_a_copy_its_guesses_undervalue():
    """The Qwen2.5-Coder CNN/DM calibration (git show b8db823:results/benchmark/trees/README.md, auto4): one suffix match 16
    deep, a 4-token step costing 1.91 single steps and 2- and 3-token steps 2.27 and 3.01. Cut by
    the guesses (0.5, 0.25, 0.125, ...) no size pays, so the step stays greedy and never measures
    the copies it skips; with rates learnt elsewhere (given the parent: 0.41 at depth 1, then
    0.82-1.0) the whole copy pays."""
    context = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 3, 7]
    costs = (1.0, 2.27, 3.01, 1.91, 2.0, 2.07, 2.2, 2.33, 2.4, 2.5, 2.55, 2.6, 2.7, 2.8, 2.85, 2.9, 2.95)
    cold = Proposer([SuffixSource(1, 16, context)], merge=True, budget=17, step_costs=costs)
    assert len(cold.propose(context, window_rows=1)) == 0
    learnt = DraftStats()
    for tries, accepted, depth in ((100, 41, 1), (41, 34, 2), (34, 31, 3)) + tuple((31, 30, d) for d in range(4, 17)):
        learnt.counts.tried["suffix:1:c1", depth], learnt.counts.accepted["suffix:1:c1", depth] = tries, accepted
    warm = Proposer([SuffixSource(1, 16, context)], merge=True, budget=17, step_costs=costs,
                    stats=DraftStats(prior=learnt))
    assert warm.propose(context, window_rows=1).tokens == tuple(context[1:17])


def test_proposer_keeps_the_most_likely_nodes_within_the_budget():
    class Fixed:
        topk = 0

        def __init__(self, drafts):
            self.drafts = drafts

        def propose(self, context):
            return self.drafts

        def update(self, outcome):
            pass

    good = Draft((1, 2, 3), ("good",) * 3)
    bad = Draft((7, 8, 9), ("bad",) * 3)
    proposer = Proposer([Fixed([bad]), Fixed([good])], merge=True, budget=4)
    for _ in range(20):                                           # "good" is always accepted, "bad" never
        tree = build_tree([bad, good])
        proposer.stats.record(tree, [3, 4, 5])
    kept = proposer.propose([0], window_rows=1)
    assert kept.tokens == (1, 2, 3)                               # 3 nodes: budget 4 minus the input token
    assert len(Proposer([Fixed([bad, good])], merge=True).propose([0], 1)) == 6   # no budget: everything


def test_recycle_window_refreshes_successors_from_every_window_row(monkeypatch):
    """With recycle_window the successor table learns from every row a windowed step fed (lower
    window levels too), without it only from the input, last-level and tree rows."""
    from lookahead_core import DecodeLimits, LookaheadConfig, decode
    from experiments.models.tiny import tiny_random_model

    model = tiny_random_model("llama", seed=3)
    prompt = torch.randint(0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    seen: list[int] = []
    update = RecycleSource.update
    monkeypatch.setattr(RecycleSource, "update", lambda self, outcome: (seen.append(len(outcome.row_tokens)),
                                                                       update(self, outcome))[1])
    base = LookaheadConfig(window=4, ngram=4, guess=2, tree=True, sources={"recycle": 2})
    sizes = {}
    for flag in (False, True):
        seen.clear()
        out = decode(model, prompt, dataclasses.replace(base, recycle_window=flag), DecodeLimits(max_new_tokens=16))
        sizes[flag] = (list(seen), out.stats.step_tokens, out.tokens)
    rows, fed, tokens = sizes[True]
    assert rows == fed                                     # every fed row refreshed the table
    rows_off, fed_off, tokens_off = sizes[False]
    assert tokens == tokens_off                            # both lossless on the same prompt
    warm = [i for i, k in enumerate(fed_off) if i >= base.ngram - 2]
    assert all(rows_off[i] < fed_off[i] for i in warm)    # lower levels' rows were not kept


def test_best_size_is_the_brute_force_argmax_of_tokens_per_cost():
    """Against every m by hand, on random scores and curves (non-monotone ones too, as on CPUs)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, rows = int(torch.randint(0, 8, (1,), generator=gen)), int(torch.randint(1, 4, (1,), generator=gen))
        scores = torch.rand(n, generator=gen).tolist()
        costs = (1 + 3 * torch.rand(rows + n, generator=gen)).tolist()
        room = int(torch.randint(0, n + 1, (1,), generator=gen))
        top = sorted(scores, reverse=True)
        values = [(1 + sum(top[:m])) / costs[rows + m - 1] for m in range(room + 1)]
        assert best_size(scores, costs, rows, room) == values.index(max(values))


def test_cost_aware_proposer_feeds_nothing_when_drafts_do_not_pay():
    """A steep curve (every extra token costs a whole step) makes any tree a loss; a flat one keeps
    the whole budget; the pruned tree is what prune_tree keeps for that size."""
    drafts_of = lambda context: [Draft((7, 8, 9), ("pool",) * 3), Draft((7, 5), ("pool",) * 2)]
    source = type("Fixed", (), {"topk": 0, "propose": staticmethod(drafts_of), "update": lambda self, o: None})()
    steep = Proposer([source], merge=True, budget=5, step_costs=(1.0, 2.0, 3.0, 4.0, 5.0))
    flat = Proposer([source], merge=True, budget=5, step_costs=(1.0,) * 5)
    assert len(steep.propose([1, 7], window_rows=1)) == 0
    assert len(flat.propose([1, 7], window_rows=1)) == 4          # 7, 8, 9, 5: all four nodes
    tight = Proposer([source], merge=True, budget=3, step_costs=(1.0,) * 3)
    assert tight.propose([1, 7], window_rows=1).tokens == (7, 8)  # the budget still caps it


def test_siblings_never_promise_more_than_one_accepted_token():
    """At most one child of a node is accepted (the model's next token is one token), so the scores
    of siblings sum to at most their parent's, however their rates were estimated. The attack: four
    unmeasured one-token drafts at a coin flip's 0.5 each, on a CPU curve where a 5-token step costs
    2.5 one-token steps. Scored apart they promise 1 + 4 x 0.5 = 3 tokens for 2.5 steps and are fed;
    as one token's alternatives they promise at most 2 and a step feeds the input token alone."""
    drafts = [Draft((t,), ("pool",)) for t in (4, 5, 6, 7)]
    source = type("Fixed", (), {"topk": 0, "propose": staticmethod(lambda context: drafts),
                                "update": lambda self, o: None})()
    proposer = Proposer([source], merge=True, budget=5, step_costs=(1.0, 1.98, 2.2, 2.4, 2.5))
    tree = build_tree(drafts)
    scores = proposer.scores(tree)
    assert [round(score, 6) for score in scores] == [0.25] * 4      # 0.5 each, scaled by 1 / 2
    assert len(proposer.propose([1], window_rows=1)) == 0
    # a chain is one path: its nodes keep their rates (0.5, then 0.25 given the first)
    chain = build_tree([Draft((4, 5), ("pool", "pool"))])
    assert proposer.scores(chain)[0] == pytest.approx(0.5)
    assert proposer.scores(chain)[1] <= proposer.scores(chain)[0]
    # a coherent estimate is left as it is: two children at 0.3 and 0.6 sum to 0.9
    pair = build_tree([Draft((4,), ("a",)), Draft((5,), ("b",))])
    proposer.stats.estimate = lambda tags, depth: ({"a": 0.3, "b": 0.6}[tags[0]], tags[0])
    assert proposer.scores(pair) == [0.3, 0.6]


@pytest.mark.parametrize("costs,naps", [((1.0, 1.2, 1.4), True), ((1.0, 1.0, 1.0), False)])
def test_when_no_draft_pays_a_step_feeds_one_token_and_the_source_naps(costs, naps):
    """``auto``'s cost-aware cut on a synthetic source whose every draft is rejected (it proposes
    the token after greedy's next, then another): once the acceptance is learnt (steps that feed
    only the input token), the source is asked ever more rarely (naps of 1, 2, 4, ... steps), the
    output stays greedy's. Where every step costs alike (a flat curve) any draft pays, so it is fed
    and asked every step: the control."""
    from experiments.models.loader import load_model
    from lookahead_core import decode
    from lookahead_core.config import DecodeLimits, LookaheadConfig
    from lookahead_core.sources import register_source, unregister_source

    model, _ = load_model("tiny-llama")
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    limits = DecodeLimits(120, ())
    greedy = decode(model, prompt, None, limits).tokens
    text = prompt + greedy
    asked: list[int] = []

    @register_source("wrong", label="wrong")
    class Wrong:
        topk = 0

        @classmethod
        def from_config(cls, config, size, context):
            return cls()

        def propose(self, context):
            asked.append(len(context))
            bad = (text[len(context)] + 1) % vocab if len(context) < len(text) else 0
            return [Draft((bad, bad), ("wrong:x", "wrong:x"))]

        def update(self, outcome):
            pass

    try:
        config = LookaheadConfig(window=1, ngram=3, guess=0, pool_only=True, tree=True, sources={"wrong": 1},
                                 depth=2, budget=3, step_costs=costs)
        result = decode(model, prompt, config, limits)
    finally:
        unregister_source("wrong")
    fed = result.stats.step_tokens
    assert result.tokens == greedy and sum(result.stats.accepted) + 1 == len(greedy)
    if not naps:
        assert len(asked) == result.stats.steps and all(t == 3 for t in fed)
        return
    learnt = max(i for i, t in enumerate(fed) if t > 1) + 1            # steps until no draft is fed
    assert learnt <= 20 and all(t == 1 for t in fed[learnt:]) and len(fed) - learnt >= 80
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert len(asked) <= learnt + Proposer.IDLE_STEPS + 8                # 1 + 2 + 4 + ... + 64 > 100 steps
    assert gaps[-3:] == sorted(gaps[-3:]) and gaps[-1] >= 16             # the naps double
