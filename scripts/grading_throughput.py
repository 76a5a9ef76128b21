"""Seconds to grade the 164 HumanEval completions of SmolLM2-135M, before (f89e943's sandbox) and after.

    python scripts/grading_throughput.py results/grading/raw/humaneval/smollm2_135m/*.csv

Before: the old ``experiments/grading/sandbox.py`` (unshare + setpriv + pids cgroup + Python guard), read
from git at f89e943, one completion after the other as the runner called it, and with its
``run_jobs`` on 2 threads. After: this checkout's bwrap sandbox, sequential and with ``run_jobs``
on 2 workers. Interleaved rounds, median of 3.
"""

import functools
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.grading import sandbox  # noqa: E402
from experiments.grading.agreement import outputs_from_csv  # noqa: E402
from experiments.data.datasets import default_data_root, get_dataset  # noqa: E402

old_path = Path("/tmp/sandbox_f89e943.py")
old_path.write_text(subprocess.run(["git", "show", "f89e943:experiments/grading/sandbox.py"], capture_output=True,
                                   text=True, check=True).stdout)
spec = importlib.util.spec_from_file_location("sandbox_f89e943", old_path)
old = importlib.util.module_from_spec(spec)
sys.modules["sandbox_f89e943"] = old
spec.loader.exec_module(old)

outputs = outputs_from_csv([Path(p) for p in sys.argv[1:]])
extras = {item.item_id: item.extra for item in get_dataset("humaneval").load(default_data_root())}
jobs = {
    "before, sequential": lambda: [old.check_humaneval(extras[o.item_id], o.code) for o in outputs],
    "before, run_jobs workers=2": lambda: old.run_jobs(
        [functools.partial(old.check_humaneval, extras[o.item_id], o.code) for o in outputs], 2),
    "after, sequential": lambda: [sandbox.check_humaneval(extras[o.item_id], o.code) for o in outputs],
    "after, run_jobs workers=2": lambda: sandbox.run_jobs(
        [functools.partial(sandbox.check_humaneval, extras[o.item_id], o.code) for o in outputs], 2),
}
seconds = {name: [] for name in jobs}
for _ in range(3):
    for name, job in jobs.items():
        start = time.perf_counter()
        results = job()
        seconds[name].append(time.perf_counter() - start)
        assert len(results) == len(outputs)
print(f"{len(outputs)} HumanEval completions")
for name, values in seconds.items():
    print(f"| {name} | {statistics.median(values):.1f} s | {', '.join(f'{v:.1f}' for v in values)} |")
