"""Seconds to grade one item: this checkout's grader against an earlier commit's, item by item.

    python scripts/grading_throughput.py --before f2da3e2 --solutions humaneval mbpp classeval
    python scripts/grading_throughput.py --before 3daddc7 results/grading/raw/*/*/*.csv.gz

Each design grades in a worker process of its own: ``before`` imports the ``experiments`` package of
the commit ``--before`` (``git archive`` into a temporary folder: its sandbox, launcher and channel
together), ``after`` this checkout's. Both grade the same items, one at a time as the runner grades:
the committed completions of the CSV files, or the benchmarks' canonical solutions
(``--solutions``). Every item is graded by both in turn, the order alternating item by item, after
a warm-up (each worker grades each dataset's first item twice, untimed); ``--rounds`` passes. Each
worker times its own ``check_*`` call. Printed per dataset: the median seconds per item of each, the
ratio of the summed times (each item's median over rounds), the spread of the per-item ratios, and
whether the verdicts agree.
"""

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("humaneval", "mbpp", "classeval")


def serve(root: str) -> None:
    """The worker: grade ``[dataset, extra, code]`` lines from stdin with the grader under ``root``,
    answer ``[seconds, passed]``."""
    sys.path.insert(0, root)
    answer = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr                                    # whatever else prints stays off the answers
    from experiments.grading import sandbox

    if not Path(sandbox.__file__).resolve().is_relative_to(Path(root).resolve()):
        raise SystemExit(f"the worker for {root} imported {sandbox.__file__}")
    checks = {"humaneval": sandbox.check_humaneval, "mbpp": sandbox.check_mbpp,
              "classeval": getattr(sandbox, "check_classeval", None)}  # fmt: skip
    for line in sys.stdin:
        dataset, extra, code = json.loads(line)
        start = time.perf_counter()
        result = checks[dataset](extra, code)
        answer.write(json.dumps([time.perf_counter() - start, result.passed]) + "\n")
        answer.flush()


class Worker:
    def __init__(self, root: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen([sys.executable, __file__, "--serve", str(root)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip

    def grade(self, dataset: str, extra: dict, code: str) -> tuple[float, bool]:
        self.process.stdin.write(json.dumps([dataset, extra, code]) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"a worker ended (exit code {self.process.wait()})")
        seconds, passed = json.loads(line)
        return seconds, passed

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def archived(commit: str, folder: Path) -> str:
    """The ``experiments`` package of ``commit``, written into ``folder``; the commit's short hash."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "experiments"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as archive:
        archive.extractall(folder, filter="data")
    return _git("rev-parse", "--short", commit)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def items(args: argparse.Namespace) -> list[tuple[str, str, dict, str]]:
    """(dataset, item id, the item's extra, the code to grade) for every item graded."""
    sys.path.insert(0, str(ROOT))
    from experiments.data.datasets import default_data_root, get_dataset
    from experiments.grading.agreement import outputs_from_csv, solutions

    if args.solutions:
        outputs = [o for o in solutions(args.solutions, default_data_root()) if o.model == "solution"]
    else:
        outputs = outputs_from_csv(args.csv)
    names = sorted({o.dataset for o in outputs})
    extras = {(n, item.item_id): item.extra for n in names for item in get_dataset(n).load(default_data_root())}
    chosen = [(o.dataset, o.item_id, extras[o.dataset, o.item_id], o.code) for o in outputs]
    if args.limit:
        chosen = [c for n in names for c in [c for c in chosen if c[0] == n][:args.limit]]
    return chosen


def _host() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="*", type=Path, help="result CSVs whose completions are graded")
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--solutions", nargs="+", choices=DATASETS, help="grade these benchmarks' own solutions")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="at most this many items a dataset (0: all)")
    args = parser.parse_args()
    if bool(args.csv) == bool(args.solutions):
        parser.error("give result CSVs or --solutions, not both")
    graded = items(args)
    after = _git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if _git("status", "--porcelain") else "")
    with tempfile.TemporaryDirectory() as tmp:
        before = archived(args.before, Path(tmp))
        workers = {"before": Worker(Path(tmp)), "after": Worker(ROOT)}
        for dataset in sorted({g[0] for g in graded}):                       # the warm-up, untimed
            first = next(g for g in graded if g[0] == dataset)
            for worker in (*workers.values(), *workers.values()):
                worker.grade(dataset, first[2], first[3])
        seconds = {label: [[] for _ in graded] for label in workers}
        verdicts = {label: [None] * len(graded) for label in workers}
        for round_ in range(args.rounds):
            for index, (dataset, item_id, extra, code) in enumerate(graded):
                order = ("before", "after") if (index + round_) % 2 == 0 else ("after", "before")
                for label in order:
                    took, passed = workers[label].grade(dataset, extra, code)
                    seconds[label][index].append(took)
                    verdicts[label][index] = passed
            print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr, flush=True)
        for worker in workers.values():
            worker.close()
    median = {label: [statistics.median(s) for s in seconds[label]] for label in workers}
    print(f"before = {before} (`--before {args.before}`), after = {after}; {_host()}; load average "
          f"{os.getloadavg()[0]:.2f} at the end; {args.rounds} round(s), items interleaved, after a warm-up\n")
    print("| dataset | items | before, per item (median) | after, per item (median) | after / before (sum) | "
          "per-item ratio: median [10%-90%] | verdicts agree | passed (after) |\n|---|---|---|---|---|---|---|---|")
    for dataset in [*sorted({g[0] for g in graded}), "all"]:
        rows = [i for i, g in enumerate(graded) if dataset in ("all", g[0])]
        total = {label: sum(median[label][i] for i in rows) for label in workers}
        ratios = sorted(median["after"][i] / median["before"][i] for i in rows)
        deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
        agree = sum(verdicts["before"][i] == verdicts["after"][i] for i in rows)
        print(f"| {dataset} | {len(rows)} | {1000 * statistics.median(median['before'][i] for i in rows):.0f} ms | "
              f"{1000 * statistics.median(median['after'][i] for i in rows):.0f} ms | "
              f"**{total['after'] / total['before']:.3f}** ({total['before']:.1f} s -> {total['after']:.1f} s) | "
              f"{statistics.median(ratios):.2f} [{deciles[0]:.2f}-{deciles[-1]:.2f}] | {agree} of {len(rows)} | "
              f"{sum(verdicts['after'][i] for i in rows)} |")
    differ = [f"{g[0]} {g[1]}: before {verdicts['before'][i]}, after {verdicts['after'][i]}"
              for i, g in enumerate(graded) if verdicts["before"][i] != verdicts["after"][i]]
    print("\n" + ("verdicts that differ: " + "; ".join(differ) if differ else "the verdicts are identical"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        main()
