"""``decoding=auto``: calibrate a grid of configs on a few prompts and pick the predicted fastest.

:func:`choose_config` calibrates S for a grid of configs on a few short prompts, predicts each
one's speedup with the cost model (``curve``) and returns the best, or ``None`` (greedy) when
nothing is predicted to beat greedy. Greedy is always a candidate at speedup 1.0, so auto is never
*predicted* slower than greedy. :func:`choose_for_batch` does the same per batch size.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from ..config import DecodeLimits, LookaheadConfig, SamplingConfig, config_fields
from ..decoder import DecodeState, DecodeStats, decode
from ..drafts import DraftStats
from ..model_io import CausalLM
from .curve import CostModel, measure_latency, predict_batch, upper_bound
from .grid import default_grid

# ---------------------------------------------------------------------------------------------
# decoding=auto


@dataclass
class Calibration:
    """One config's calibration on the prompts: its per-step record and what it predicts."""

    config: LookaheadConfig | None
    status: str                           # "calibrated", "screened" (short run only, not a finalist),
                                          # "pruned" (its upper bound could not win) or "survey"
                                          # (measures acceptance for cost-aware trees; never picked)
    upper_bound: float                    # speedup if every step accepted N tokens
    steps: int = 0
    accepted: int = 0                     # tokens committed by the decode steps
    step_tokens_mean: float = 0.0
    host_seconds: float = 0.0             # per step, outside the forward
    decode_seconds: float = 0.0
    predicted: float | None = None        # speedup over greedy from the cost model
    measured: float | None = None         # speedup measured on the calibration itself (noisy)
    drafts: DraftStats | None = field(default=None, repr=False)   # acceptance per (tag, depth)

    @property
    def compression(self) -> float | None:
        return self.accepted / self.steps if self.steps else None

    def row(self) -> dict:
        config = self.config
        return {
            "N": None if config is None else config.ngram,
            "W": None if config is None or config.pool_only else config.window,
            "G": None if config is None else config.guess,
            "prompt_pool": None if config is None else config.prompt_pool,
            "pool_only": None if config is None else config.pool_only,
            "status": self.status, "upper_bound": self.upper_bound, "steps": self.steps,
            "S": self.compression, "step_tokens_mean": self.step_tokens_mean,
            "host_ms_per_step": 1e3 * self.host_seconds, "decode_seconds": self.decode_seconds,
            "predicted_speedup": self.predicted, "calibration_measured_speedup": self.measured,
            # Every field but the seed (step costs included): what decodes as this row's config.
            "params": None if config is None else json.dumps(config_fields(config)),
        }


@dataclass
class ChoiceReport:
    """What ``choose_config`` measured and why it chose what it chose."""

    cost_model: CostModel
    chosen: LookaheadConfig | None
    candidates: list[Calibration] = field(default_factory=list)
    calibration_prompts: int = 0
    calibration_tokens: int = 0
    seconds: float = 0.0
    prior: DraftStats | None = field(default=None, repr=False)   # given to choose_config: no survey ran
    namer: Callable[[LookaheadConfig | None], str] = field(default=lambda c: described(c), repr=False)   # names a config

    @property
    def drafts(self) -> DraftStats | None:
        """The acceptance per (tag, depth) every cost-aware decode started from: the given prior or
        the survey's (``None``: neither, i.e. no cost-aware tree in the grid)."""
        return self.prior or next((c.drafts for c in self.candidates if c.status == "survey"), None)

    def rows(self) -> list[dict]:
        return [{"decoder": self.namer(c.config), **c.row()} for c in self.candidates]

    def summary(self) -> str:
        """One line: the pick, the device and what the calibration cost (the harness renders
        :meth:`rows` as its table)."""
        return (f"decoding=auto chose **{self.namer(self.chosen)}** on {self.cost_model.device} "
                f"(calibration: {self.calibration_prompts} prompts x {self.calibration_tokens} new tokens, "
                f"{self.seconds:.0f} s).")


def described(config: LookaheadConfig | None) -> str:
    """``greedy``, or the config's fields that differ from their defaults: how this module names a
    config unless its caller passes a namer."""
    if config is None:
        return "greedy"
    default = LookaheadConfig()
    return ", ".join(f"{k}={v}" for k, v in config_fields(config).items() if v != getattr(default, k)) or "defaults"


def prefilled(model, prompts: Sequence[list[int]]) -> list[DecodeState]:
    """Each prompt's KV, computed once: ``decode`` from a copy of one prefills only the prompt's
    last token, so a calibration of many configs pays each long prompt's prefill once, not once per
    config (on Qwen2.5-Coder-0.5B with ~960-token CNN/DM prompts the prefill was 9 s of a
    14 s screen decode)."""
    return [decode(model, prompt, None, DecodeLimits(max_new_tokens=1)).state for prompt in prompts]


def _run_prompts(model, prompts, config, limits, sampling=None,
                 states: Sequence[DecodeState] | None = None) -> tuple[DecodeStats, float]:
    """Decode every prompt (from a copy of its ``prefilled`` state, if given); returns the merged
    per-step record (draft acceptance included) and the wall seconds of the loops."""
    merged = DecodeStats()
    for i, prompt in enumerate(prompts):
        state = states[i].copy() if states is not None else None
        stats = decode(model, prompt, config, limits, sampling, state=state).stats
        merged.steps += stats.steps
        merged.step_tokens += stats.step_tokens
        merged.accepted += stats.accepted
        merged.decode_seconds += stats.decode_seconds
        merged.model_seconds += stats.model_seconds
        merged.drafts.merge(stats.drafts)
    return merged, merged.decode_seconds


def survey_config(grid: Sequence[LookaheadConfig]) -> LookaheadConfig | None:
    """One tree that drafts from every source the grid's cost-aware trees use, as deep and as wide
    as the widest of them, fed up to their largest budget without step costs, so that every
    (tag, depth) those trees can cut by gets measured; ``None`` if the grid has no cost-aware tree.

    >>> from lookahead_core.cost.grid import tree_config
    >>> deep = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 1},
    ...                        depth=16, budget=17, step_costs=(1.0,) * 17)
    >>> wide = replace(tree_config(8), step_costs=(1.0,) * 8)            # pool G4, 4 suffix, recycle 4, 6 deep
    >>> tree = survey_config([deep, wide, tree_config(64)])             # the k64 tree has no step costs
    >>> (tree.pool_only, tree.guess, tree.sources, tree.depth, tree.budget)
    (True, 4, (('recycle', 4), ('suffix', 4)), 16, 17)
    """
    trees = [c for c in grid if c.step_costs]
    if not trees:
        return None
    widest = {name: max(getattr(c, name) for c in trees) for name in ("ngram", "guess", "budget")}
    registered = {name for c in trees for name, _ in c.sources}
    sizes = {name: max(dict(c.sources).get(name, 0) for c in trees) for name in registered}
    return LookaheadConfig(window=1, pool_only=True, tree=True, depth=max(c.draft_depth for c in trees),
                           sources=sizes, **widest)


HOST_TOKENS = 32           # greedy steps timed for the loop's host time per step (after a warm-up of 4)


def step_costs(model: torch.nn.Module | CausalLM, sizes: Sequence[int], *, kv_length: int, batch: int = 1,
               one_logit: bool = True) -> CostModel:
    """:func:`measure_latency` of ``sizes`` at ``kv_length`` and ``batch``, with (at batch 1) the
    decode loop's host time per greedy step: the time outside ``CausalLM.forward`` of a greedy
    decode of ``HOST_TOKENS`` tokens after 16 random ones (the loop's own work, the same on any
    text). What :func:`widest_tree`'s step cuts price."""
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    curve = measure_latency(lm, sizes, kv_length=kv_length, batch=batch, one_logit=one_logit)
    if batch > 1:
        return curve
    prompt = torch.randint(0, lm.model.config.vocab_size, (16,), generator=torch.Generator().manual_seed(0)).tolist()
    decode(lm, prompt, None, DecodeLimits(4, ()))                                      # warm-up
    stats = decode(lm, prompt, None, DecodeLimits(HOST_TOKENS, ())).stats
    return replace(curve, host_seconds=max(0.0, stats.decode_seconds - stats.model_seconds) / max(stats.steps, 1))


def widest_tree(cost_model: CostModel, grid: Sequence[LookaheadConfig] | None = None) -> LookaheadConfig | None:
    """The online pick: one tree drafting from every source of ``grid``'s token trees (default
    :func:`default_grid`), as wide and as deep as the widest of them (:func:`survey_config`), with
    this device's ``step_costs``: each step feeds what its nodes' estimates say pays here, from
    nothing (a greedy step) to the largest budget, so the per-step cut does the choosing a
    calibrated grid does by decoding every candidate. ``None``: the grid has no token tree."""
    trees = [cost_model.cost_aware(c) for c in (default_grid() if grid is None else grid)]
    widest = survey_config(trees)
    return None if widest is None else cost_model.cost_aware(widest)


def choose_config(
    model: torch.nn.Module | CausalLM,
    calibration_prompts: list[list[int]],
    limits: DecodeLimits,
    grid: Sequence[LookaheadConfig] | None = None,
    *,
    cost_model: CostModel | None = None,
    prune: bool = True,
    always_calibrate: Sequence[LookaheadConfig] = (),
    min_speedup: float = 1.0,
    kv_length: int | None = None,
    sampling: SamplingConfig | None = None,
    progress: Callable[[str], None] | None = None,
    screen_tokens: int | None = None,
    finalists: int = 3,
    prior: DraftStats | None = None,
    namer: Callable[[LookaheadConfig | None], str] | None = None,
) -> tuple[LookaheadConfig | None, ChoiceReport]:
    """Pick the config of ``grid`` (default :func:`default_grid`) predicted fastest on this device.

    1. Latency curve: ``cost_model`` (measured under the model's attention implementation), or
       measured now with a KV length of the prompts' mean plus half the generation budget.
    2. Each calibration prompt is prefilled once (:func:`prefilled`); every decode below starts from
       a copy of its KV. Greedy on every calibration prompt, to measure the loop's host time per
       step.
    3. Configs in order of their upper bound (:func:`upper_bound`); with ``prune``, a config whose
       bound cannot beat the best prediction so far is skipped (never one in ``always_calibrate``).
       Each other config decodes every calibration prompt; its prediction is
       ``CostModel.predict_steps`` over its actual steps (so the real number of candidates per step
       counts, not G), with its own host time.
    4. With ``screen_tokens`` (fewer than ``limits.max_new_tokens``), step 3 is a short screen that
       decodes only that many tokens per prompt; then the ``finalists`` best screened configs (and
       every one in ``always_calibrate``) are calibrated in full, and only those can win.
    5. The best full prediction wins if it exceeds ``min_speedup``; otherwise greedy (``None``).

    Every token tree of ``grid`` with a budget gets this device's ``step_costs`` (after step 2, so
    they include greedy's host time): each of its steps then feeds only the nodes that pay for
    themselves, from none up to the budget (``drafts.best_size``), judged by acceptance rates
    measured first. They come from ``prior`` (e.g. what earlier jobs on this model and dataset
    measured), else from a survey (:func:`survey_config`, fed without step costs) that decodes
    every calibration prompt; either is the prior of every cost-aware decode after it
    (``DecodeState.drafts``), the calibration's and, via ``ChoiceReport.drafts``, the evaluated
    ones'. Without one a step cuts by guesses, and what a guess undervalues is never fed, so never
    measured. Configs in ``always_calibrate`` are calibrated as given (no step costs added).

    S grows with the length of the text (the pool fills up), so S from short calibrations is a
    slight underestimate for long generations. With ``sampling``, every calibration decode samples
    with it (acceptance under sampling is lower than under greedy). Returns
    ``(config or None, ChoiceReport)``; ``namer`` names a config in its progress messages and
    report (the harness passes its labels; default :func:`described`).
    """
    if not calibration_prompts:
        raise ValueError("choose_config needs at least one calibration prompt")
    say = progress or (lambda message: None)
    namer = namer or described
    started = time.perf_counter()
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    grid = list(default_grid() if grid is None else grid)
    if cost_model is None:
        if kv_length is None:
            mean_prompt = statistics.fmean(len(p) for p in calibration_prompts)
            kv_length = int(mean_prompt + limits.max_new_tokens / 2)
        say(f"measuring forward latency (KV length {kv_length})")
        cost_model = measure_latency(lm, kv_length=kv_length)
    elif cost_model.attention != lm.attention:
        raise ValueError(f"the latency curve was measured under {cost_model.attention!r} attention, the model "
                         f"runs {lm.attention!r}: the curve is the device's under one attention implementation")

    say("calibrating greedy")
    decode(lm, calibration_prompts[0], None, replace(limits, max_new_tokens=min(8, limits.max_new_tokens)))  # warm-up
    states = prefilled(lm, calibration_prompts)
    greedy_stats, greedy_seconds = _run_prompts(lm, calibration_prompts, None, limits, sampling, states)
    greedy_host = max(0.0, greedy_stats.decode_seconds - greedy_stats.model_seconds) / max(greedy_stats.steps, 1)
    cost_model = replace(cost_model, host_seconds=greedy_host)
    greedy_per_token = greedy_seconds / max(sum(greedy_stats.accepted), 1)
    greedy = Calibration(None, "calibrated", 1.0, greedy_stats.steps, sum(greedy_stats.accepted),
                         1.0, greedy_host, greedy_seconds, 1.0, 1.0)
    grid = [cost_model.cost_aware(c) for c in grid]
    survey = survey_config(grid) if prior is None else None

    def calibrate(config: LookaheadConfig, run_limits: DecodeLimits, status: str, bound: float) -> Calibration:
        say(f"{status.replace('calibrated', 'calibrating')} {namer(config)}")
        stats, seconds = _run_prompts(lm, calibration_prompts, config, run_limits, sampling, states)
        host = max(0.0, stats.decode_seconds - stats.model_seconds) / max(stats.steps, 1)
        predicted = cost_model.predict_steps(config, stats.step_tokens, stats.accepted, host_seconds=host)
        per_token = seconds / max(sum(stats.accepted), 1)
        return Calibration(
            config, status, bound, stats.steps, sum(stats.accepted),
            statistics.fmean(stats.step_tokens) if stats.step_tokens else 0.0, host, seconds,
            predicted, greedy_per_token / per_token if per_token else None, stats.drafts,
        )

    ranked = sorted(grid + [c for c in always_calibrate if c not in grid], key=lambda c: -upper_bound(cost_model, c))
    results = [greedy]
    if survey is not None:
        results.append(calibrate(survey, limits, "survey", upper_bound(cost_model, survey)))
        prior_used = results[-1].drafts
    else:
        prior_used = prior
    if prior_used is not None:                  # every decode below starts from it
        states = [replace(state, drafts=prior_used) for state in states]
    best = max(1.0, min_speedup)
    screening = screen_tokens is not None and screen_tokens < limits.max_new_tokens
    first_limits = replace(limits, max_new_tokens=screen_tokens) if screening else limits
    for config in ranked:
        bound = upper_bound(cost_model, config)
        if prune and bound <= best and config not in always_calibrate:
            results.append(Calibration(config, "pruned", bound))
            continue
        results.append(calibrate(config, first_limits, "screened" if screening else "calibrated", bound))
        best = max(best, results[-1].predicted)
    if screening:
        screened = sorted((c for c in results if c.status == "screened"), key=lambda c: -c.predicted)
        finals = {id(c) for c in screened[:finalists]} | {id(c) for c in screened if c.config in always_calibrate}
        results = [calibrate(c.config, limits, "calibrated", c.upper_bound) if id(c) in finals else c for c in results]

    winner = max((c for c in results if c.status == "calibrated"), key=lambda c: c.predicted)
    chosen = winner.config if winner.config is not None and winner.predicted > min_speedup else None
    report = ChoiceReport(cost_model, chosen, results, len(calibration_prompts), limits.max_new_tokens,
                          time.perf_counter() - started, prior, namer)
    return chosen, report



def choose_for_batch(costs: Mapping[int, CostModel],
                     calibration: Mapping[str, tuple[LookaheadConfig | None, Sequence[tuple[Sequence[int], Sequence[int]]]]],
                     batch: int) -> tuple[str, dict[str, float]]:
    """``auto`` for a batch of ``batch`` sequences: the calibrated config (label -> (config, per
    sequence (step_tokens, accepted) from calibration prompts)) with the best predicted speedup over
    batched greedy, for a batch made of the calibration sequences taken in turn; ``"greedy"`` when
    none is predicted above 1. Returns the pick and every prediction."""
    predicted = {"greedy": 1.0}
    for label, (config, records) in calibration.items():
        if config is None or not records:
            continue
        rows = [records[b % len(records)] for b in range(batch)]
        predicted[label] = predict_batch(costs, config, [r[0] for r in rows], [r[1] for r in rows])
    return max(predicted, key=predicted.get), predicted
