"""Seconds to grade committed completions with this checkout's sandbox against an earlier commit's.

    python scripts/grading_throughput.py --before 3daddc7 results/grading/raw/*/*/*.csv.gz

Before: ``experiments/grading/sandbox.py`` (and ``integrity.py`` where that commit has one) read
from git at ``--before`` into a temporary folder; after: this checkout's. Each grades every
HumanEval and MBPP completion of the files one after the other (as the runner grades) and with
``run_jobs`` on 2 workers, in interleaved rounds (before, after, before, after, ...), after a
warm-up round; the median of ``--rounds`` is printed per dataset and in all, with every round, and
the verdicts of both are compared.
"""

import argparse
import functools
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.data.datasets import default_data_root, get_dataset  # noqa: E402
from experiments.grading import sandbox  # noqa: E402
from experiments.grading.agreement import outputs_from_csv  # noqa: E402

DATASETS = ("humaneval", "mbpp")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sandbox_at(commit: str, folder: Path):
    """The sandbox module of ``commit``, loaded from files written into ``folder`` (its
    ``integrity.py``, where it has one, is what its host side imports)."""
    for name in ("sandbox.py", "integrity.py"):
        shown = subprocess.run(["git", "show", f"{commit}:experiments/grading/{name}"], capture_output=True, text=True)
        if shown.returncode == 0:
            (folder / name).write_text(shown.stdout)
    if (folder / "integrity.py").exists():
        _load("experiments.grading.integrity", folder / "integrity.py")
    return _load(f"sandbox_{commit}", folder / "sandbox.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", type=Path)
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    outputs = [o for o in outputs_from_csv(args.csv) if o.dataset in DATASETS]
    extras = {(name, item.item_id): item.extra for name in DATASETS
              for item in get_dataset(name).load(default_data_root())}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {"before": sandbox_at(args.before, Path(tmp)), "after": sandbox}

        def calls(module, dataset):
            check = module.check_humaneval if dataset == "humaneval" else module.check_mbpp
            return [functools.partial(check, extras[dataset, o.item_id], o.code) for o in outputs if o.dataset == dataset]

        jobs = {}
        for label, module in modules.items():
            for dataset in DATASETS:
                jobs[f"{label}, {dataset}, sequential"] = lambda m=module, d=dataset: [c() for c in calls(m, d)]
                jobs[f"{label}, {dataset}, run_jobs workers=2"] = lambda m=module, d=dataset: m.run_jobs(calls(m, d), 2)
        half = len(jobs) // 2
        order = [name for pair in zip(list(jobs)[:half], list(jobs)[half:]) for name in pair]  # before/after interleaved
        seconds: dict[str, list[float]] = {name: [] for name in order}
        verdicts: dict[str, list[bool]] = {}
        for round_ in range(args.rounds + 1):
            for name in order:
                start = time.perf_counter()
                results = jobs[name]()
                if round_:                                   # round 0 is the warm-up
                    seconds[name].append(time.perf_counter() - start)
                verdicts[name] = [r.passed for r in results]
                print(f"round {round_}: {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    counts = {d: sum(o.dataset == d for o in outputs) for d in DATASETS}
    print(f"{sum(counts.values())} completions ({counts}), {args.rounds} rounds after a warm-up; before = {args.before}")
    print("| grader | dataset | mode | median | per item | rounds |\n|---|---|---|---|---|---|")
    for name in order:
        label, dataset, mode = name.split(", ")
        median = statistics.median(seconds[name])
        print(f"| {label} | {dataset} | {mode} | {median:.1f} s | {1000 * median / counts[dataset]:.0f} ms | "
              f"{', '.join(f'{v:.1f}' for v in seconds[name])} |")
    for mode in ("sequential", "run_jobs workers=2"):
        total = {label: sum(statistics.median(seconds[f"{label}, {d}, {mode}"]) for d in DATASETS) for label in modules}
        print(f"after / before, {mode}, all {sum(counts.values())}: {total['after'] / total['before']:.3f} "
              f"({total['before']:.1f} s -> {total['after']:.1f} s)")
    same = all(verdicts[f"before, {d}, sequential"] == verdicts[f"after, {d}, sequential"] for d in DATASETS)
    passed = sum(sum(verdicts[f"after, {d}, sequential"]) for d in DATASETS)
    print(f"verdicts identical: {same} ({passed} passed)")


if __name__ == "__main__":
    main()
