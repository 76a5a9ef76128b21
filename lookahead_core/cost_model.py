"""A cost model of lookahead decoding on the current device, and ``decoding=auto`` on top of it.

Lookahead decoding trades fewer sequential steps for bigger steps. Its speedup over greedy is

    speedup(W, N, G) = S(W, N, G) * t_step(greedy) / t_step(W, N, G)

where S is the step compression (tokens committed per step, a property of the model and the text,
the same on every device because the output is lossless) and t_step is the wall time of one step
(the forward of ``k`` tokens, plus the decode loop's own host work). On a GPU a forward of 64 tokens
costs about what one token costs, so any S > 1 pays; on a CPU it costs several times more
(MODELS.md, "This CPU"), so only small steps or high acceptance pay.

Three pieces, each usable alone:

* :func:`measure_latency` times ``CausalLM.forward`` against tokens per forward on the device the
  model lives on, with a realistic KV length, and returns a :class:`CostModel`.
* :class:`CostModel` interpolates that curve (``latency``), knows how many tokens and logit rows a
  config feeds per step (from :func:`~lookahead_core.layout.step_layout`), and predicts speedups
  from an S (``predict``) or from a calibration run's per-step record (``predict_steps``).
* :func:`choose_config` calibrates S for a grid of configs on a few short prompts, predicts each
  one's speedup with the cost model and returns the best, or ``None`` (greedy) when nothing is
  predicted to beat greedy. Greedy is always a candidate at speedup 1.0, so auto is never
  *predicted* slower than greedy.
"""

from __future__ import annotations

import bisect
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from .config import DecodeLimits, LookaheadConfig, SamplingConfig
from .decoder import DecodeState, DecodeStats, decode
from .drafts import DraftStats
from .layout import causal_layout, step_layout
from .model_io import CausalLM, Feed, truncate_kv

DEFAULT_SIZES: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)

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
    return LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True, tree=True, suffix=4, recycle=recycle,
                           depth=depth, budget=budget)


def default_grid() -> list[LookaheadConfig]:
    grid = [LookaheadConfig(window=w, ngram=n, guess=g, prompt_pool=pool)
            for n, w, g in DEFAULT_LOOKAHEAD_GRID for pool in (False, True)]
    grid += [LookaheadConfig(window=1, ngram=n, guess=g, pool_only=True) for n, g in DEFAULT_POOL_ONLY_GRID]
    grid += [LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, suffix=m, depth=d, budget=b)
             for m, d, b in DEFAULT_SUFFIX_ONLY_TREES]
    grid += [tree_config(b) for b in DEFAULT_TREE_BUDGETS]
    grid += [tree_config(b, recycle=0) for b in DEFAULT_SUFFIX_TREE_BUDGETS]
    grid.append(LookaheadConfig(window=7, ngram=5, guess=7, prompt_pool=True, tree=True, suffix=4, recycle=4,
                                depth=6, budget=LookaheadConfig(window=7, ngram=5, guess=7).max_tokens_per_step))
    return grid


def config_label(config: LookaheadConfig | None) -> str:
    """A short name: ``greedy``, ``la_N5W15G15``, ``la_N5W15G15_pool``, ``pool_N4G3``, and for
    token trees and the other sources ``..._tree_sfx4_rc4_d6_k8`` (suffix drafts, recycled top-k,
    ``_rw`` for recycle_window, draft depth, token budget, ``_ca`` for step_costs; each only when set)."""
    if config is None:
        return "greedy"
    if config.pool_only:
        label = f"pool_N{config.ngram}G{config.guess}"
    else:
        label = f"la_N{config.ngram}W{config.window}G{config.guess}" + ("_pool" if config.prompt_pool else "")
    for flag, value in (("_tree", config.tree), ("_sfx", config.suffix), ("_rc", config.recycle),
                        ("_rw", config.recycle_window), ("_d", config.depth), ("_k", config.budget),
                        ("_ca", bool(config.step_costs))):
        if value is True:
            label += flag
        elif value:
            label += f"{flag}{value}"
    return label


# ---------------------------------------------------------------------------------------------
# Step shapes


def _bare_logit_rows(config: LookaheadConfig) -> int:
    """Logit rows of a warmed-up step without draft tokens: the input token's and the last level's
    (with ``recycle_window``: every window row's)."""
    if config.pool_only:
        return 1
    return int(step_layout(config.window, config.ngram - 1, (), config.recycle_window).logit_rows.numel())


def step_shape(config: LookaheadConfig | None, candidates: int | None = None) -> tuple[int, int]:
    """(tokens fed, logit rows kept) of one warmed-up step with ``candidates`` pool candidates of
    N-1 tokens (at most G), or, by default, the most the config feeds (its budget, if it has one)."""
    if config is None:
        return 1, 1
    if candidates is None:
        nodes = config.max_tokens_per_step - config.window_rows
    else:
        nodes = min(candidates, config.guess) * (config.ngram - 1)
    return config.window_rows + nodes, _bare_logit_rows(config) + nodes


def logit_rows_for(config: LookaheadConfig | None, tokens: int) -> int:
    """Logit rows of a step that fed ``tokens`` tokens: every draft token's row is kept.

    During the N-2 warm-up steps the window is not full yet; those rows are approximated by the
    last level's W rows plus the input token.
    """
    if config is None:
        return 1
    if config.pool_only or config.recycle_window:
        return tokens                       # every row predicts a draft token or the bonus / keeps its logits
    if tokens < config.window_rows:
        return min(tokens, config.window + 1)
    return _bare_logit_rows(config) + tokens - config.window_rows


# ---------------------------------------------------------------------------------------------
# The cost model


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys); linear extrapolation from the last two points above."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    i = min(bisect.bisect_left(xs, x), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class CostModel:
    """Forward latency against tokens per forward on one device, plus the loop's host cost per step.

    tokens: the measured sizes, ascending, starting at 1.
    seconds: median latency of a forward of that many tokens keeping every row's logits.
    seconds_one_logit: the same keeping one row's logits (the LM head's share is linear in the rows
        kept, so the two curves bracket any step); ``None`` = use ``seconds`` for every step.
    host_seconds: time per step the decode loop spends outside ``CausalLM.forward`` (pool, verify,
        KV commit); added to every step, greedy's too.
    """

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    seconds_one_logit: tuple[float, ...] | None = None
    host_seconds: float = 0.0
    device: str = "cpu"
    kv_length: int = 0
    batch: int = 1               # sequences per forward

    def __post_init__(self) -> None:
        if not self.tokens or self.tokens[0] != 1 or list(self.tokens) != sorted(set(self.tokens)):
            raise ValueError(f"tokens must be ascending, distinct and start at 1, got {self.tokens}")
        for name in ("seconds", "seconds_one_logit"):
            values = getattr(self, name)
            if values is not None and (len(values) != len(self.tokens) or min(values) <= 0):
                raise ValueError(f"{name} needs one positive value per size, got {values}")

    def latency(self, tokens: float, logit_rows: float | None = None) -> float:
        """Seconds of one forward of ``tokens`` tokens keeping ``logit_rows`` logits (default all)."""
        full = _interpolate(self.tokens, self.seconds, tokens)
        if logit_rows is None or self.seconds_one_logit is None or tokens <= 1:
            return full
        one = _interpolate(self.tokens, self.seconds_one_logit, tokens)
        share = (min(logit_rows, tokens) - 1) / (tokens - 1)
        return one + (full - one) * share

    def step_seconds(self, config: LookaheadConfig | None, candidates: int | None = None) -> float:
        """Seconds of one warmed-up step of ``config`` (``None`` = greedy) with that many candidates."""
        return self.latency(*step_shape(config, candidates)) + self.host_seconds

    def predict(self, config: LookaheadConfig | None, compression: float, candidates: int | None = None) -> float:
        """Speedup over greedy of ``config`` at step compression S = ``compression``, every step
        carrying ``candidates`` candidates (default G: the most expensive step)."""
        if config is None:
            return 1.0
        return compression * self.step_seconds(None) / self.step_seconds(config, candidates)

    def step_costs(self, config: LookaheadConfig, host_seconds: float | None = None) -> tuple[float, ...]:
        """``config.step_costs`` for this device: a k-token step of ``config`` (its logit rows, plus
        the loop's host time) relative to a greedy step, for k = 1 .. its budget."""
        host = self.host_seconds if host_seconds is None else host_seconds
        one = self.step_seconds(None)
        return tuple((self.latency(k, logit_rows_for(config, k)) + host) / one for k in range(1, config.budget + 1))

    def cost_aware(self, config: LookaheadConfig) -> LookaheadConfig:
        """``config`` with this device's ``step_costs`` if it is a tree with a budget, else as is."""
        if not (config.tree and config.budget):
            return config
        return replace(config, step_costs=self.step_costs(config))

    def predict_steps(self, config: LookaheadConfig | None, step_tokens: Sequence[int], accepted: Sequence[int],
                      host_seconds: float | None = None) -> float:
        """Speedup over greedy predicted from a run's per-step record (``DecodeStats.step_tokens``
        and ``.accepted``): committed tokens x greedy step time / the steps' predicted time.
        ``host_seconds``: this config's host time per step, if measured (default: greedy's)."""
        if len(step_tokens) != len(accepted):
            raise ValueError("step_tokens and accepted must have one entry per step")
        if not step_tokens:
            return 1.0
        host = self.host_seconds if host_seconds is None else host_seconds
        forward = sum(self.latency(k, logit_rows_for(config, k)) for k in step_tokens)
        return sum(accepted) * self.step_seconds(None) / (forward + host * len(step_tokens))

    def best_cut(self, committed: Sequence[int], host_seconds: float | None = None) -> float:
        """Speedup over greedy had every step fed only what it committed: its input token and the
        drafts it accepted, a chain of c tokens for c committed (every row keeps its logits),
        padded to the cheapest measured size that holds it (the curve need not be monotone). A
        step commits at most what it feeds, so no cut of the same steps' drafts does better on
        this device. ``committed``: tokens committed per step (``DecodeStats.accepted``)."""
        if not committed:
            return 1.0
        host = self.host_seconds if host_seconds is None else host_seconds

        def cheapest(c: int) -> float:
            return min(self.latency(k) for k in (c, *(t for t in self.tokens if t > c)))

        return sum(committed) * self.step_seconds(None) / sum(cheapest(c) + host for c in committed)

    def relative(self) -> list[tuple[int, float]]:
        """(tokens, t(k)/t(1)) with every logit kept: the shape of the curve."""
        return [(k, s / self.seconds[0]) for k, s in zip(self.tokens, self.seconds)]

    def to_rows(self) -> list[dict]:
        ones = self.seconds_one_logit or (None,) * len(self.tokens)
        return [{"tokens": k, "seconds": s, "seconds_one_logit": o, "ratio": s / self.seconds[0],
                 "host_seconds": self.host_seconds, "device": self.device, "kv_length": self.kv_length,
                 "batch": self.batch}
                for k, s, o in zip(self.tokens, self.seconds, ones)]

    @classmethod
    def from_rows(cls, rows: Sequence[dict]) -> CostModel:
        rows = sorted(rows, key=lambda r: int(r["tokens"]))
        ones = [r.get("seconds_one_logit") for r in rows]
        has_ones = all(o not in (None, "") and o == o for o in ones)   # o == o: not NaN
        return cls(
            tokens=tuple(int(r["tokens"]) for r in rows),
            seconds=tuple(float(r["seconds"]) for r in rows),
            seconds_one_logit=tuple(float(o) for o in ones) if has_ones else None,
            host_seconds=float(rows[0].get("host_seconds") or 0.0),
            device=str(rows[0].get("device") or "cpu"),
            kv_length=int(rows[0].get("kv_length") or 0),
            batch=int(rows[0].get("batch") or 1),
        )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def measure_latency(
    model: torch.nn.Module | CausalLM,
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    kv_length: int = 256,
    repeats: int = 5,
    one_logit: bool = True,
    seed: int = 0,
    batch: int = 1,
    extra_rounds: int = 20,
    tolerance: float = 0.02,
) -> CostModel:
    """Time ``CausalLM.forward`` of k random tokens after a ``kv_length``-token cache, for each k
    (``batch`` > 1: a batched forward of that many sequences, k tokens each, the curve t(B, k)).

    Each size is timed ``repeats`` times and the fastest time is kept (on a shared machine other jobs
    only ever add time, and a few interfered rounds bend a median-based curve enough to flip
    ``choose_config``'s pick), after one untimed round; the sizes are visited in
    a rotating order so that slow drifts of a shared machine spread over all sizes. Under sustained
    load even the fastest of a few rounds can be inflated for one size: a curve where some k > 1
    costs less than one token (more than ``tolerance`` below t(1)) is physically wrong, and
    :func:`bent_sizes` finds it. Then up to ``extra_rounds`` more rounds are timed until the curve
    is no longer bent; if it still is, a ``RuntimeWarning`` says so. The cache is cut
    back to ``kv_length`` after every forward. Timing is wall clock with the device synchronized,
    i.e. what the decode loop sees (host-device copies included). The k tokens are fed as a causal
    chain, as greedy and one-candidate steps run (the model builds the mask); steps that branch
    also build our mask on the host, which the calibration's host time per step accounts for.
    """
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    sizes = sorted(set(int(k) for k in sizes) | {1})
    vocab = lm.model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    cache = lm.new_cache()
    prefix = torch.randint(0, vocab, (max(kv_length, 1),), generator=gen).tolist()
    offsets, _ = causal_layout(len(prefix))
    lm.forward_batch(cache, [Feed(prefix, offsets, None, 0, torch.tensor([len(prefix) - 1]))] * batch)
    past = len(prefix)
    variants = [False, True] if one_logit else [False]
    times: dict[tuple[int, bool], list[float]] = {(k, v): [] for k in sizes for v in variants}
    keys = list(times)

    def timed_round(round_index: int) -> None:
        shift = round_index % len(keys)
        for k, single in keys[shift:] + keys[:shift]:
            tokens = torch.randint(0, vocab, (k,), generator=gen).tolist()
            offsets, _ = causal_layout(k)
            rows = torch.tensor([k - 1]) if single else torch.arange(k)
            _synchronize(lm.device)
            start = time.perf_counter()
            lm.forward_batch(cache, [Feed(tokens, offsets, None, past, rows)] * batch)
            _synchronize(lm.device)
            elapsed = time.perf_counter() - start
            truncate_kv(cache, past)
            if round_index:
                times[(k, single)].append(elapsed)

    def curves() -> tuple[tuple[float, ...], tuple[float, ...] | None, list[int]]:
        """The fastest-time curves so far and the sizes that bend either of them."""
        full = tuple(min(times[(k, False)]) for k in sizes)
        ones = tuple(min(times[(k, True)]) for k in sizes) if one_logit else None
        bent = set(bent_sizes(sizes, full, tolerance)) | set(bent_sizes(sizes, ones, tolerance) if ones else ())
        return full, ones, sorted(bent)

    for round_index in range(repeats + 1):
        timed_round(round_index)
    full, ones, bent = curves()
    extra = 0
    while bent and extra < extra_rounds:
        extra += 1
        timed_round(repeats + extra)
        full, ones, bent = curves()
    if bent:
        warnings.warn(f"latency curve still bent after {extra} extra rounds: t(k) < t(1) for k = {bent} "
                      "(load inflated t(1), or the curve is flat within timing noise, as on GPUs and tiny "
                      "models; predictions from this curve favour those sizes)",
                      RuntimeWarning, stacklevel=2)
    return CostModel(tuple(sizes), full, ones, device=str(lm.device), kv_length=past, batch=batch)


def bent_sizes(sizes: Sequence[int], seconds: Sequence[float], tolerance: float = 0.02) -> list[int]:
    """The sizes k > 1 whose forward is more than ``tolerance`` faster than one token's.

    A forward of k tokens does all the work of one token and more, so such a point means t(1) was
    inflated by load in every timed round (the fastest time is an upper bound, never too low)."""
    one = seconds[list(sizes).index(1)]
    return [k for k, t in zip(sizes, seconds) if k > 1 and t < one * (1 - tolerance)]


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
            "decoder": config_label(config),
            "N": None if config is None else config.ngram,
            "W": None if config is None or config.pool_only else config.window,
            "G": None if config is None else config.guess,
            "prompt_pool": None if config is None else config.prompt_pool,
            "pool_only": None if config is None else config.pool_only,
            "status": self.status, "upper_bound": self.upper_bound, "steps": self.steps,
            "S": self.compression, "step_tokens_mean": self.step_tokens_mean,
            "host_ms_per_step": 1e3 * self.host_seconds, "decode_seconds": self.decode_seconds,
            "predicted_speedup": self.predicted, "calibration_measured_speedup": self.measured,
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

    @property
    def drafts(self) -> DraftStats | None:
        """The survey's acceptance per (tag, depth): the prior of cost-aware decodes (``None``: no survey)."""
        return next((c.drafts for c in self.candidates if c.status == "survey"), None)

    def rows(self) -> list[dict]:
        return [c.row() for c in self.candidates]

    def to_markdown(self) -> str:
        lines = [
            f"decoding=auto chose **{config_label(self.chosen)}** on {self.cost_model.device} "
            f"(calibration: {self.calibration_prompts} prompts x {self.calibration_tokens} new tokens, "
            f"{self.seconds:.0f} s).",
            "",
            "| config | status | S | tokens/step | host ms/step | upper bound | predicted | measured (calib.) |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def fmt(value, spec=".2f"):
            return "" if value is None else format(value, spec)

        for c in sorted(self.candidates, key=lambda c: -(c.predicted or 0.0)):
            lines.append(f"| {config_label(c.config)} | {c.status} | {fmt(c.compression)} | "
                         f"{fmt(c.step_tokens_mean, '.1f')} | {1e3 * c.host_seconds:.2f} | {c.upper_bound:.2f} | "
                         f"{fmt(c.predicted)} | {fmt(c.measured)} |")
        return "\n".join(lines)


def upper_bound(cost: CostModel, config: LookaheadConfig, host_seconds: float | None = None) -> float:
    """The best speedup ``config`` could reach: a step without drafts commits 1 token, one with a
    single draft of D tokens at most D + 1 (the draft and the model's own next token), D being the
    deepest draft the config proposes within its budget."""
    host = cost.host_seconds if host_seconds is None else host_seconds
    greedy = cost.step_seconds(None)
    bare_tokens, bare_rows = step_shape(config, 0)
    bare = cost.latency(bare_tokens, bare_rows) + host
    depth = (config.ngram - 1) if config.guess else 0
    if config.suffix or config.recycle:
        depth = max(depth, config.draft_depth)
    if config.budget:
        depth = min(depth, config.budget - bare_tokens)
    with_one = cost.latency(bare_tokens + depth, bare_rows + depth) + host if depth else float("inf")
    return max(greedy / bare, (depth + 1) * greedy / with_one)


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

    >>> deep = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, suffix=1, depth=16,
    ...                        budget=17, step_costs=(1.0,) * 17)
    >>> wide = replace(tree_config(8), step_costs=(1.0,) * 8)            # pool G4, 4 suffix, recycle 4, 6 deep
    >>> config_label(survey_config([deep, wide, tree_config(64)]))      # the k64 tree has no step costs
    'pool_N4G4_tree_sfx4_rc4_d16_k17'
    """
    trees = [c for c in grid if c.step_costs]
    if not trees:
        return None
    widest = {name: max(getattr(c, name) for c in trees) for name in ("ngram", "guess", "suffix", "recycle", "budget")}
    return LookaheadConfig(window=1, pool_only=True, tree=True, depth=max(c.draft_depth for c in trees), **widest)


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
    cost_aware: bool = False,
) -> tuple[LookaheadConfig | None, ChoiceReport]:
    """Pick the config of ``grid`` (default :func:`default_grid`) predicted fastest on this device.

    1. Latency curve: ``cost_model``, or measured now with a KV length of the prompts' mean plus
       half the generation budget.
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

    With ``cost_aware``, every token tree with a budget gets this device's ``step_costs`` (after
    step 2, so they include greedy's host time): each of its steps then feeds only the nodes that
    pay for themselves, from none up to the budget (``drafts.best_size``), judged by acceptance
    rates measured first: a survey (:func:`survey_config`, fed without step costs) decodes every
    calibration prompt, and its per-(tag, depth) acceptance is the prior of every cost-aware
    decode after it (``DecodeState.drafts``), the calibration's and, via ``ChoiceReport.drafts``,
    the evaluated ones'. Without it a step cuts by guesses, and what a guess undervalues is never
    fed, so never measured.

    S grows with the length of the text (the pool fills up), so S from short calibrations is a
    slight underestimate for long generations. With ``sampling``, every calibration decode samples
    with it (acceptance under sampling is lower than under greedy). Returns
    ``(config or None, ChoiceReport)``.
    """
    if not calibration_prompts:
        raise ValueError("choose_config needs at least one calibration prompt")
    say = progress or (lambda message: None)
    started = time.perf_counter()
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    grid = list(default_grid() if grid is None else grid)
    if cost_model is None:
        if kv_length is None:
            mean_prompt = statistics.fmean(len(p) for p in calibration_prompts)
            kv_length = int(mean_prompt + limits.max_new_tokens / 2)
        say(f"measuring forward latency (KV length {kv_length})")
        cost_model = measure_latency(lm, kv_length=kv_length)

    say("calibrating greedy")
    decode(lm, calibration_prompts[0], None, replace(limits, max_new_tokens=min(8, limits.max_new_tokens)))  # warm-up
    states = prefilled(lm, calibration_prompts)
    greedy_stats, greedy_seconds = _run_prompts(lm, calibration_prompts, None, limits, sampling, states)
    greedy_host = max(0.0, greedy_stats.decode_seconds - greedy_stats.model_seconds) / max(greedy_stats.steps, 1)
    cost_model = replace(cost_model, host_seconds=greedy_host)
    greedy_per_token = greedy_seconds / max(sum(greedy_stats.accepted), 1)
    greedy = Calibration(None, "calibrated", 1.0, greedy_stats.steps, sum(greedy_stats.accepted),
                         1.0, greedy_host, greedy_seconds, 1.0, 1.0)
    survey = None
    if cost_aware:
        grid = [cost_model.cost_aware(c) for c in grid]
        always_calibrate = [cost_model.cost_aware(c) for c in always_calibrate]
        survey = survey_config(list(grid) + list(always_calibrate))

    def calibrate(config: LookaheadConfig, run_limits: DecodeLimits, status: str, bound: float) -> Calibration:
        say(f"{status.replace('calibrated', 'calibrating')} {config_label(config)}")
        stats, seconds = _run_prompts(lm, calibration_prompts, config, run_limits, sampling, states)
        host = max(0.0, stats.decode_seconds - stats.model_seconds) / max(stats.steps, 1)
        predicted = cost_model.predict_steps(config, stats.step_tokens, stats.accepted, host_seconds=host)
        per_token = seconds / max(sum(stats.accepted), 1)
        return Calibration(
            config, status, bound, stats.steps, sum(stats.accepted),
            statistics.fmean(stats.step_tokens) if stats.step_tokens else 0.0, host, seconds,
            predicted, greedy_per_token / per_token if per_token else None, stats.drafts,
        )

    ranked = sorted(grid, key=lambda c: -upper_bound(cost_model, c))
    results = [greedy]
    if survey is not None:
        results.append(calibrate(survey, limits, "survey", upper_bound(cost_model, survey)))
        states = [replace(state, drafts=results[-1].drafts) for state in states]   # every decode below starts from it
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
                          time.perf_counter() - started)
    return chosen, report


# ---------------------------------------------------------------------------------------------
# Batches: t(B, k), the time of one batched decode, and auto per batch size


def batch_latency(costs: Mapping[int, CostModel], batch: int, tokens: float, logit_rows: float | None = None) -> float:
    """Seconds of one forward of ``batch`` sequences of ``tokens`` tokens each (padding included),
    from curves measured at several batch sizes (``costs[B]``), piecewise linear in B."""
    sizes = sorted(costs)
    return _interpolate(sizes, [costs[b].latency(tokens, logit_rows) for b in sizes], batch)


def batch_seconds(costs: Mapping[int, CostModel], config: LookaheadConfig | None,
                  step_tokens: Sequence[Sequence[int]]) -> float:
    """Predicted seconds of the steps of one batched decode from each sequence's per-step record
    (``DecodeStats.step_tokens``): step s feeds every sequence that takes more than s steps, each
    padded to the largest of them, as ``decode_batch`` runs it."""
    total = 0.0
    for s in range(max(map(len, step_tokens), default=0)):
        live = [record[s] for record in step_tokens if len(record) > s]
        k = max(live)
        total += batch_latency(costs, len(live), k, logit_rows_for(config, k))
    return total


def predict_batch(costs: Mapping[int, CostModel], config: LookaheadConfig | None,
                  step_tokens: Sequence[Sequence[int]], accepted: Sequence[Sequence[int]]) -> float:
    """Speedup over batched greedy of one batch, from its sequences' per-step records: greedy takes
    one step per token each sequence's steps committed."""
    greedy = [[1] * sum(a) for a in accepted]
    return batch_seconds(costs, None, greedy) / batch_seconds(costs, config, step_tokens)


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
