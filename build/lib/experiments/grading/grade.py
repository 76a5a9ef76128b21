"""What gets graded, and how: the one place that says which text of an output each benchmark scores."""

from __future__ import annotations

from typing import Any

from experiments.data.datasets import DatasetAdapter, Item, PromptFormat
from experiments.grading.metrics import extract_code, rouge_scores, truncate_at_stop
from experiments.grading.sandbox import check_classeval, check_humaneval, check_mbpp

SUMMARISATION = ("cnndm", "xsum")
# The sandbox check of each code benchmark, given the item's ``extra`` and the graded code.
CHECKS = {"humaneval": check_humaneval, "mbpp": check_mbpp, "classeval": check_classeval}


def graded_code(dataset: str, text: str, raw_prompt: str | None = None) -> str:
    """The program a code benchmark runs for a generated ``text``: HumanEval's completion cut at
    its stop strings; MBPP's code block; ClassEval's code block, or with a raw (completion) prompt
    that prompt followed by the completion."""
    if dataset == "humaneval":
        return truncate_at_stop(text)
    if dataset == "mbpp" or (dataset == "classeval" and raw_prompt is None):
        return extract_code(text)
    if dataset == "classeval":
        return raw_prompt + text
    raise ValueError(f"{dataset} is not a code benchmark")


def score(adapter: DatasetAdapter, item: Item, text: str, prompt_format: PromptFormat,
          mode: str = "bwrap") -> dict[str, Any]:
    """Quality columns of one output: ROUGE F-measures for summaries, ``passed`` (and the
    ``sandbox`` mode that ran it) for code."""
    name = adapter.name
    if name in SUMMARISATION:
        return {kind: values["mean"] for kind, values in rouge_scores([text], [item.reference or ""]).items()}
    if name in CHECKS:
        raw = adapter.raw_prompt(item) if name == "classeval" and prompt_format is PromptFormat.raw else None
        code = graded_code(name, text, raw)
        return {"passed": CHECKS[name](item.extra, code, mode=mode).passed, "sandbox": mode}
    return {}
