"""Seconds to grade HumanEval completions with this checkout's sandbox against an earlier commit's.

    python scripts/grading_throughput.py --before 67af3f0 results/grading/raw/humaneval/smollm2_135m/*.csv.gz

Before: ``experiments/grading/sandbox.py`` (and ``integrity.py`` where that commit has one) read
from git at ``--before`` into a temporary folder; after: this checkout's. Each is timed one
completion after the other (as the runner grades) and with ``run_jobs`` on 2 workers, in
interleaved rounds (before, after, before, after, ...), after a warm-up round; the median of
``--rounds`` is printed with every round and the verdicts of both are compared.
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


def sandbox_at(commit: str, folder: Path):
    """The sandbox module of ``commit``, loaded from files written into ``folder``."""
    for name in ("sandbox.py", "integrity.py"):
        shown = subprocess.run(["git", "show", f"{commit}:experiments/grading/{name}"], capture_output=True, text=True)
        if shown.returncode == 0:
            (folder / name).write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(f"sandbox_{commit}", folder / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", type=Path)
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    outputs = [o for o in outputs_from_csv(args.csv) if o.dataset == "humaneval"]
    extras = {item.item_id: item.extra for item in get_dataset("humaneval").load(default_data_root())}
    with tempfile.TemporaryDirectory() as tmp:
        modules = {"before": sandbox_at(args.before, Path(tmp)), "after": sandbox}
        jobs = {}
        for label, module in modules.items():
            jobs[f"{label}, sequential"] = lambda m=module: [m.check_humaneval(extras[o.item_id], o.code) for o in outputs]
            jobs[f"{label}, run_jobs workers=2"] = lambda m=module: m.run_jobs(
                [functools.partial(m.check_humaneval, extras[o.item_id], o.code) for o in outputs], 2)
        order = [name for pair in zip(list(jobs)[:2], list(jobs)[2:]) for name in pair]   # before/after interleaved
        seconds: dict[str, list[float]] = {name: [] for name in order}
        verdicts: dict[str, list[bool]] = {}
        for round_ in range(args.rounds + 1):
            for name in order:
                start = time.perf_counter()
                results = jobs[name]()
                if round_:                                   # round 0 is the warm-up
                    seconds[name].append(time.perf_counter() - start)
                verdicts[name] = [r.passed for r in results]
    print(f"{len(outputs)} HumanEval completions, {args.rounds} rounds after a warm-up; before = {args.before}")
    print("| grader | median | rounds |\n|---|---|---|")
    for name in order:
        print(f"| {name} | {statistics.median(seconds[name]):.1f} s | {', '.join(f'{v:.1f}' for v in seconds[name])} |")
    for mode in ("sequential", "run_jobs workers=2"):
        ratio = statistics.median(seconds[f"after, {mode}"]) / statistics.median(seconds[f"before, {mode}"])
        print(f"after / before, {mode}: {ratio:.3f}")
    same = verdicts["before, sequential"] == verdicts["after, sequential"]
    print(f"verdicts identical: {same} ({sum(verdicts['after, sequential'])} passed)")


if __name__ == "__main__":
    main()
