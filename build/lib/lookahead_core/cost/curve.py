"""The latency curve of a device and the speedups it predicts; ``choice`` builds ``auto`` on it.

Lookahead decoding trades fewer sequential steps for bigger steps. Its speedup over greedy is

    speedup(W, N, G) = S(W, N, G) * t_step(greedy) / t_step(W, N, G)

where S is the step compression (tokens committed per step, a property of the model and the text,
the same on every device because the output is lossless) and t_step is the wall time of one step
(the forward of ``k`` tokens, plus the decode loop's own host work). On a GPU a forward of 64 tokens
costs about what one token costs, so any S > 1 pays; on a CPU it costs several times more
(docs/models.md, "The CPU cost curve"), so only small steps or high acceptance pay.

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
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from ..config import LookaheadConfig
from ..sources import active
from ..layout import causal_layout, step_layout
from ..model_io import CausalLM, Feed, truncate_kv

# 5-7 and 12-13: where a streaming CPU kernel (lookahead_core/kernels) goes from one pass over the
# weights to two, and from two to PyTorch's GEMM; a curve interpolated across such a step misprices it.
DEFAULT_SIZES: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 24, 32, 48, 64, 96, 128)


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
    attention: str = "sdpa"      # the model's attention implementation: part of the device's curve

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
                 "batch": self.batch, "attention": self.attention}
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
            attention=str(rows[0].get("attention") or "sdpa"),
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
    return CostModel(tuple(sizes), full, ones, device=str(lm.device), kv_length=past, batch=batch,
                     attention=lm.attention)


def sizes_through(tokens: int, sizes: Sequence[int] = DEFAULT_SIZES) -> tuple[int, ...]:
    """``sizes`` up to the first that holds a step of ``tokens`` tokens.

    >>> sizes_through(10, (1, 2, 4, 8, 12, 16))
    (1, 2, 4, 8, 12)
    """
    return tuple(k for k in sizes if k < tokens) + (min((k for k in sizes if k >= tokens), default=tokens),)


def kv_bucket(kv_length: int) -> int:
    """The power of two at or above ``kv_length`` (at least 64): the KV length a curve is measured
    at, so that prompts whose lengths differ a little share it.

    >>> [kv_bucket(n) for n in (1, 64, 65, 300, 1000)]
    [64, 64, 128, 512, 1024]
    """
    return max(64, 1 << max(int(kv_length) - 1, 0).bit_length())


def bent_sizes(sizes: Sequence[int], seconds: Sequence[float], tolerance: float = 0.02) -> list[int]:
    """The sizes k > 1 whose forward is more than ``tolerance`` faster than one token's.

    A forward of k tokens does all the work of one token and more, so such a point means t(1) was
    inflated by load in every timed round (the fastest time is an upper bound, never too low)."""
    one = seconds[list(sizes).index(1)]
    return [k for k, t in zip(sizes, seconds) if k > 1 and t < one * (1 - tolerance)]


def upper_bound(cost: CostModel, config: LookaheadConfig, host_seconds: float | None = None) -> float:
    """The best speedup ``config`` could reach: a step without drafts commits 1 token, one with a
    single draft of D tokens at most D + 1 (the draft and the model's own next token), D being the
    deepest draft the config proposes within its budget."""
    host = cost.host_seconds if host_seconds is None else host_seconds
    greedy = cost.step_seconds(None)
    bare_tokens, bare_rows = step_shape(config, 0)
    bare = cost.latency(bare_tokens, bare_rows) + host
    depth = (config.ngram - 1) if config.guess else 0
    if active(config):                          # suffix, recycled, registered: draft_depth deep
        depth = max(depth, config.draft_depth)
    if config.budget:
        depth = min(depth, config.budget - bare_tokens)
    with_one = cost.latency(bare_tokens + depth, bare_rows + depth) + host if depth else float("inf")
    return max(greedy / bare, (depth + 1) * greedy / with_one)



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

