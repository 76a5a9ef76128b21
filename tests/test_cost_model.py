"""The cost model on hand-computed latency curves, and decoding=auto on synthetic devices."""

from __future__ import annotations

import time
import warnings
from collections import Counter

import pytest
import torch

from lookahead_core import DecodeLimits, LookaheadConfig, decode
from experiments.config.labels import config_label
from experiments.reporting.calibration import calibration_markdown
from lookahead_core.cost import (
    CostModel,
    bent_sizes,
    choose_config,
    default_grid,
    logit_rows_for,
    measure_latency,
    prefilled,
    step_shape,
    upper_bound,
)
from lookahead_core.model_io import CausalLM
from experiments.models.tiny import tiny_random_model

# The worked example of docs/algorithm.md: W=4, N=3, G=2 feeds 1 + 3 + 4 + 2*2 = 12 tokens; logits are
# needed for the input row, the 4 last-level rows and the 4 candidate rows.
EXAMPLE = LookaheadConfig(window=4, ngram=3, guess=2)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_latency_interpolates_and_extrapolates():
    cost = CostModel(tokens=(1, 2, 4), seconds=(1.0, 2.0, 3.0))
    assert cost.latency(1) == 1.0
    assert cost.latency(0.5) == 1.0                  # clamped below the first size
    assert cost.latency(3) == pytest.approx(2.5)
    assert cost.latency(8) == pytest.approx(5.0)     # the last segment's slope, 0.5 per token
    assert cost.relative() == [(1, 1.0), (2, 2.0), (4, 3.0)]


def test_latency_scales_the_lm_head_share_with_logit_rows():
    cost = CostModel(tokens=(1, 2, 4), seconds=(1.0, 2.0, 3.0), seconds_one_logit=(1.0, 1.5, 2.0))
    assert cost.latency(4) == pytest.approx(3.0)
    assert cost.latency(4, logit_rows=1) == pytest.approx(2.0)
    assert cost.latency(4, logit_rows=2) == pytest.approx(2.0 + 1.0 / 3)
    assert cost.latency(1, logit_rows=1) == 1.0


@pytest.mark.parametrize("tokens, seconds", [((2, 4), (1.0, 2.0)), ((1, 4, 2), (1.0, 2.0, 3.0)), ((1, 2), (1.0, 0.0))])
def test_invalid_curves_are_refused(tokens, seconds):
    with pytest.raises(ValueError):
        CostModel(tokens=tokens, seconds=seconds)


def test_step_shapes_follow_the_layout():
    assert step_shape(None) == (1, 1)
    assert step_shape(EXAMPLE) == (12, 9)
    assert step_shape(EXAMPLE, candidates=0) == (8, 5)
    assert step_shape(EXAMPLE, candidates=5) == (12, 9)               # never more than G
    assert step_shape(LookaheadConfig(window=1, ngram=4, guess=3, pool_only=True)) == (10, 10)
    assert step_shape(LookaheadConfig(window=1, ngram=4, guess=3, pool_only=True), 0) == (1, 1)
    assert logit_rows_for(EXAMPLE, 10) == 7                          # one candidate
    assert logit_rows_for(EXAMPLE, 4) == 4                           # warm-up step: min(k, W + 1)
    assert logit_rows_for(LookaheadConfig(window=1, ngram=4, guess=3, pool_only=True), 4) == 4
    # recycle_window keeps every row's logits: the window's 8 rows (W4 N3) plus input and drafts.
    every = LookaheadConfig(window=4, ngram=3, guess=2, sources={"recycle": 2}, recycle_window=True)
    assert step_shape(every, candidates=0) == (8, 8) and logit_rows_for(every, 10) == 10
    assert config_label(every) == "la_N3W4G2_rc2_rw"


def test_predict_by_hand():
    cost = CostModel(tokens=(1, 12), seconds=(1.0, 2.1))
    assert cost.predict(None, 3.0) == 1.0
    assert cost.predict(EXAMPLE, 2.1) == pytest.approx(1.0)
    assert cost.predict(EXAMPLE, 3.0) == pytest.approx(3.0 / 2.1)
    # one candidate: 10 tokens, interpolated 1 + 1.1 * 9/11 = 1.9 s
    assert cost.predict(EXAMPLE, 1.9, candidates=1) == pytest.approx(1.0)
    with_host = CostModel(tokens=(1, 12), seconds=(1.0, 2.1), host_seconds=0.1)
    assert with_host.predict(EXAMPLE, 2.0) == pytest.approx(2.0 * 1.1 / 2.2)


def test_predict_steps_by_hand():
    cost = CostModel(tokens=(1, 12), seconds=(1.0, 2.1))
    # steps of 1 and 12 tokens committing 1 and 3: 4 tokens in 3.1 s against 4 greedy seconds
    assert cost.predict_steps(EXAMPLE, [1, 12], [1, 3]) == pytest.approx(4 / 3.1)
    assert cost.predict_steps(EXAMPLE, [1, 12], [1, 3], host_seconds=0.45) == pytest.approx(4 / 4.0)
    assert cost.predict_steps(EXAMPLE, [], []) == 1.0
    with pytest.raises(ValueError):
        cost.predict_steps(EXAMPLE, [1], [1, 2])


def test_best_cut_pads_each_step_to_the_cheapest_size_that_holds_it():
    # t(3) > t(4), as on this project's CPU: a step committing 2 or 3 is priced at t(4)
    cost = CostModel(tokens=(1, 3, 4, 8), seconds=(1.0, 3.0, 1.6, 2.0))
    assert cost.best_cut([1, 3, 4, 2]) == pytest.approx(10 / (1.0 + 1.6 + 1.6 + 1.6))
    # greedy's step carries the curve's host time (0.1), the cut steps the config's own (0.2)
    with_host = CostModel(tokens=(1, 3, 4, 8), seconds=(1.0, 3.0, 1.6, 2.0), host_seconds=0.1)
    assert with_host.best_cut([1, 3, 4, 2], host_seconds=0.2) == pytest.approx(10 * 1.1 / (5.8 + 4 * 0.2))
    assert cost.best_cut([6]) == pytest.approx(6 / 1.8)            # interpolated t(6) < t(8)
    assert cost.best_cut([1, 1]) == 1.0 and cost.best_cut([]) == 1.0
    # never below feeding exactly the c committed tokens, at any size
    for c in range(1, 9):
        assert cost.best_cut([c]) >= c / cost.latency(c) - 1e-12


def test_upper_bound_by_hand():
    cost = CostModel(tokens=(1, 12), seconds=(1.0, 2.1))
    # best case: each step with one candidate (10 tokens, 1.9 s) commits N = 3 tokens
    assert upper_bound(cost, EXAMPLE) == pytest.approx(3 / 1.9)


def test_rows_round_trip():
    cost = CostModel(tokens=(1, 2, 4), seconds=(1.0, 2.0, 3.0), seconds_one_logit=(1.0, 1.5, 2.0),
                     host_seconds=0.01, device="cpu", kv_length=64, attention="flex_attention")
    assert CostModel.from_rows(cost.to_rows()) == cost
    plain = CostModel(tokens=(1, 2), seconds=(1.0, 2.0))
    assert CostModel.from_rows(plain.to_rows()) == plain


def test_labels_and_grid():
    assert config_label(None) == "greedy"
    assert config_label(LookaheadConfig(window=15, ngram=5, guess=15, prompt_pool=True)) == "la_N5W15G15_pool"
    assert config_label(LookaheadConfig(window=1, ngram=4, guess=3, pool_only=True)) == "pool_N4G3"
    labels = [config_label(c) for c in default_grid()]
    assert len(labels) == len(set(labels)) and any(label.startswith("pool_") for label in labels)
    # suffix-only trees, down to the depth prompt lookup k = 10 copies (one step: 11 tokens)
    assert {"pool_N4G0_tree_sfx1_d3_k4", "pool_N4G0_tree_sfx1_d10_k11", "pool_N4G0_tree_sfx4_d10_k12",
            "pool_N4G0_tree_sfx1_d16_k17", "pool_N4G0_tree_sfx4_d16_k16"} <= set(labels)


# ---------------------------------------------------------------------------------------------
# On a tiny model


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model("llama", seed=1)


def repetitive_prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    prompts = []
    for _ in range(2):
        motif = torch.randint(0, vocab, (6,), generator=gen).tolist()
        noise = torch.randint(0, vocab, (12,), generator=gen).tolist()
        prompts.append(motif + noise[:6] + motif + noise[6:])
    return prompts


def test_measure_latency_on_a_tiny_model(tiny):
    cost = measure_latency(tiny, sizes=(1, 4, 16), kv_length=8, repeats=1)
    assert cost.tokens == (1, 4, 16) and cost.kv_length == 8 and cost.attention == "sdpa"
    assert all(s > 0 for s in cost.seconds) and all(s > 0 for s in cost.seconds_one_logit)


def test_bent_sizes_flags_only_sizes_faster_than_one_token():
    assert bent_sizes((1, 2, 4), (1.0, 1.5, 0.99)) == []          # within the 2 % tolerance
    assert bent_sizes((1, 2, 4), (1.0, 0.9, 1.2)) == [2]
    assert bent_sizes((1, 2, 4), (1.0, 0.5, 0.7), tolerance=0.4) == [2]
    assert bent_sizes((1, 3, 8), (1.0, 3.0, 1.4)) == []           # non-monotone above t(1) is real on CPUs


# The fake device's sleeps are scaled by this (t(1) = 10 ms unloaded): a starved scheduler adds a
# few ms to every sleep, which must not erase the 1-vs-4-token gap the test reads.
SLEEP = 4.0


def loaded_device(tiny, loaded_calls: int):
    """A CausalLM whose forward sleeps 2 ms + 0.5 ms per token, and whose first ``loaded_calls``
    one-token forwards (after the prefill) also wait 6 ms, as if another job held the core each time
    t(1) was timed: the fastest of those rounds is still inflated and t(4) looks cheaper than t(1)."""
    lm = CausalLM(tiny)
    seen = {"one": 0}

    def forward_batch(cache, feeds):
        k = len(feeds[0].tokens)
        delay = SLEEP * (0.002 + 0.0005 * k)
        if k == 1:
            seen["one"] += 1
            if seen["one"] <= loaded_calls:
                delay += SLEEP * 0.006
        time.sleep(delay)
        return []

    lm.forward_batch = forward_batch
    return lm


def test_measure_latency_retimes_a_curve_bent_by_load(tiny):
    repeats = 3
    loaded = 2 * (repeats + 1)            # every one-token forward of the normal rounds, both variants
    with pytest.warns(RuntimeWarning, match="still bent"):
        bent = measure_latency(loaded_device(tiny, loaded), sizes=(1, 4), kv_length=8, repeats=repeats,
                               extra_rounds=0)
    assert bent.seconds[1] < bent.seconds[0]          # without the guard the curve says 4 tokens < 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = measure_latency(loaded_device(tiny, loaded), sizes=(1, 4), kv_length=8, repeats=repeats)
    assert fixed.seconds[0] < fixed.seconds[1] and fixed.seconds_one_logit[0] < fixed.seconds_one_logit[1]
    assert fixed.seconds[0] < SLEEP * 0.0045          # the unloaded t(1) (2.5 ms x SLEEP), not the loaded 8.5


def test_cost_aware_trees_get_this_devices_step_costs(tiny):
    cost = CostModel(tokens=(1, 4, 8), seconds=(1.0, 1.6, 2.0), host_seconds=0.25)
    tree = LookaheadConfig(ngram=4, guess=4, pool_only=True, tree=True, sources={"suffix": 4}, budget=8)
    aware = cost.cost_aware(tree)
    assert aware.step_costs[0] == pytest.approx(1.0) and len(aware.step_costs) == 8
    assert aware.step_costs[3] == pytest.approx((1.6 + 0.25) / 1.25)          # 4 tokens, host included
    assert config_label(aware) == config_label(tree) + "_ca"
    assert cost.cost_aware(EXAMPLE) is EXAMPLE                              # linear branches: unchanged
    chosen, report = choose_config(tiny, repetitive_prompts(tiny.config.vocab_size), DecodeLimits(16),
                                   grid=[tree], cost_model=cost, prune=False)
    assert [(c.status, c.config.step_costs != ()) for c in report.candidates if c.config is not None] == [
        ("survey", False), ("calibrated", True)]                           # the survey is never a pick


def test_cost_aware_calibration_surveys_acceptance_first_and_cuts_every_tree_by_it(tiny, monkeypatch):
    """A cost-aware step cuts by acceptance estimates; the survey measures them before any cut, and
    every cost-aware decode after it (the calibration's here, the evaluated ones via
    ``report.drafts``) starts from them instead of guesses."""
    import lookahead_core.cost.choice as cm

    calls = []

    def spy(model, prompt, config, limits, sampling=None, *, state=None):
        out = decode(model, prompt, config, limits, sampling, state=state)
        calls.append((config, None if state is None else state.drafts, out.stats.drafts))
        return out

    monkeypatch.setattr(cm, "decode", spy)
    cost = CostModel(tokens=(1, 2, 16), seconds=(1.0, 1.9, 2.2))
    deep = LookaheadConfig(ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 1}, depth=12, budget=13)
    wide = LookaheadConfig(ngram=3, guess=2, pool_only=True, tree=True, sources={"suffix": 2, "recycle": 2},
                           depth=4, budget=8)
    prompts = repetitive_prompts(tiny.config.vocab_size)
    _, report = choose_config(tiny, prompts, DecodeLimits(16), grid=[deep, wide], cost_model=cost, prune=False)
    surveys = [c for c in calls if c[0] is not None and not c[0].step_costs]
    assert [config_label(c[0]) for c in surveys] == ["pool_N4G2_tree_sfx2_rc2_d12_k13"] * len(prompts)
    assert all(prior is None for _, prior, _ in surveys)                  # the survey itself starts cold
    assert report.drafts.counts.tried == sum((s[2].counts.tried for s in surveys), Counter())
    assert [c.status for c in report.candidates if c.drafts is report.drafts] == ["survey"]
    assert sum(report.drafts.counts.tried.values()) > 0
    aware = [c for c in calls if c[0] is not None and c[0].step_costs]
    assert len(aware) == 2 * len(prompts) and all(prior == report.drafts for _, prior, _ in aware)
    assert calls.index(surveys[-1]) < calls.index(aware[0])
    linear = LookaheadConfig(window=3, ngram=3, guess=2)
    plain, plain_report = choose_config(tiny, prompts, DecodeLimits(16), grid=[linear], cost_model=cost, prune=False)
    assert plain_report.drafts is None                                    # no cost-aware tree, no survey

    calls.clear()                                                         # acceptance measured before: no survey
    _, stored = choose_config(tiny, prompts, DecodeLimits(16), grid=[deep, wide], cost_model=cost, prune=False,
                              prior=report.drafts)
    assert [c.status for c in stored.candidates] == ["calibrated"] * 3 and stored.drafts is report.drafts
    assert all(c[0] is None or c[0].step_costs for c in calls)
    assert all(prior == report.drafts for config, prior, _ in calls if config is not None)


def test_calibration_prefills_each_prompt_once_and_decodes_as_a_fresh_prefill_would(tiny):
    prompts = repetitive_prompts(tiny.config.vocab_size)
    grid = [LookaheadConfig(ngram=3, guess=1, pool_only=True),
            LookaheadConfig(ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 2}, depth=5, budget=6)]
    sizes: list[int] = []
    hook = tiny.register_forward_pre_hook(lambda m, a, kw: sizes.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        _, report = choose_config(tiny, prompts, DecodeLimits(16), grid, cost_model=CostModel((1, 64), (1.0, 1.0)),
                                  prune=False)
    finally:
        hook.remove()
    # whole prompts fed: the warm-up, then each prompt once (not once per config and greedy: 1 + 2 * 3)
    assert sum(k >= len(prompts[0]) - 1 for k in sizes) == 1 + len(prompts)
    states = prefilled(tiny, prompts)
    for config in [None] + grid:
        for prompt, state in zip(prompts, states):
            fresh = decode(tiny, prompt, config, DecodeLimits(16))
            shared = decode(tiny, prompt, config, DecodeLimits(16), state=state.copy())
            assert shared.tokens == fresh.tokens and shared.stats.accepted == fresh.stats.accepted
    assert [c.accepted for c in report.candidates] == [
        sum(sum(decode(tiny, p, c, DecodeLimits(16)).stats.accepted) for p in prompts)
        for c in [None] + [r.config for r in report.candidates[1:]]]


def test_auto_picks_greedy_when_big_forwards_are_expensive(tiny):
    # A CPU caricature: a forward of k tokens costs k forwards of one. No step can win.
    steep = CostModel(tokens=(1, 256), seconds=(1.0, 256.0))
    # (min_speedup: host-time noise of a millisecond must not count as a win against 1 s forwards)
    chosen, report = choose_config(tiny, repetitive_prompts(tiny.config.vocab_size), DecodeLimits(24),
                                   cost_model=steep, min_speedup=1.01)
    assert chosen is None
    assert all(c.predicted is None or c.predicted <= 1.01 for c in report.candidates)
    assert sum(c.status == "pruned" for c in report.candidates) >= 8   # hopeless configs never ran
    assert "greedy" in report.summary() and "| greedy | calibrated |" in calibration_markdown(report)


def test_a_curve_of_another_attention_implementation_is_refused(tiny):
    """The curve belongs to the device under one attention implementation: an SDPA curve cannot
    choose for an eager model."""
    flat = CostModel(tokens=(1, 64), seconds=(1.0, 1.0), attention="eager")
    with pytest.raises(ValueError, match="measured under 'eager' attention, the model runs 'sdpa'"):
        choose_config(tiny, repetitive_prompts(tiny.config.vocab_size), DecodeLimits(8), cost_model=flat)


def test_auto_picks_lookahead_when_big_forwards_are_free(tiny):
    # A GPU caricature: a forward of 256 tokens costs what one costs, so any S > 1 wins.
    flat = CostModel(tokens=(1, 256), seconds=(1.0, 1.0))
    chosen, report = choose_config(tiny, repetitive_prompts(tiny.config.vocab_size), DecodeLimits(32),
                                   cost_model=flat, prune=False)
    assert isinstance(chosen, LookaheadConfig)
    best = max(report.candidates, key=lambda c: c.predicted or 0.0)
    assert best.config == chosen and best.predicted > 1.0 and best.compression > 1.0
    # host time is negligible at 1 s/step (5%: tens of ms a step on a starved machine still pass)
    assert best.predicted == pytest.approx(best.compression, rel=0.05)
    assert len(report.rows()) == len(default_grid()) + 2                   # + greedy, + the acceptance survey


def test_auto_screens_every_config_briefly_then_calibrates_the_best_few(tiny):
    flat = CostModel(tokens=(1, 256), seconds=(1.0, 1.0))
    grid = default_grid()
    chosen, report = choose_config(tiny, repetitive_prompts(tiny.config.vocab_size), DecodeLimits(32), grid,
                                   cost_model=flat, prune=False, screen_tokens=8, finalists=2)
    status = [c.status for c in report.candidates[1:]]
    assert status.count("calibrated") == 2 and status.count("screened") == len(grid) - 2
    finals = [c for c in report.candidates[1:] if c.status == "calibrated"]
    screened = [c for c in report.candidates[1:] if c.status == "screened"]
    assert chosen in [c.config for c in finals]
    # the finalists are the best of the screen; a screen decodes fewer tokens than a full run
    assert max(c.accepted for c in screened) < min(c.accepted for c in finals)


def test_tree_labels_and_shapes():
    tree = LookaheadConfig(ngram=4, guess=4, pool_only=True, tree=True, sources={"suffix": 4, "recycle": 4},
                           depth=6, budget=8)
    assert config_label(tree) == "pool_N4G4_tree_sfx4_rc4_d6_k8"
    assert step_shape(tree) == (8, 8) and step_shape(tree, 0) == (1, 1)
    cost = CostModel(tokens=(1, 256), seconds=(1.0, 1.0))
    assert upper_bound(cost, tree) == pytest.approx(7.0)      # one 6-token draft + bonus, within budget 8
    assert upper_bound(cost, LookaheadConfig(ngram=4, guess=4, pool_only=True, budget=3)) == pytest.approx(3.0)


def test_the_online_pick_is_the_widest_tree_of_the_grid_with_this_devices_step_costs():
    from lookahead_core.cost import widest_tree

    cost = CostModel(tokens=(1, 4, 64), seconds=(1.0, 1.5, 4.0), host_seconds=0.1)
    tree = widest_tree(cost)
    assert config_label(tree) == "pool_N5G7_tree_sfx4_rc4_d16_k64_ca"     # every source of the default grid's trees
    assert tree.step_costs == cost.step_costs(tree) and len(tree.step_costs) == tree.budget == 64
    assert widest_tree(cost, [LookaheadConfig(window=5, ngram=4, guess=5)]) is None    # no tree in the grid
