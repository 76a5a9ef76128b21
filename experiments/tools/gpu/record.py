"""The run's record: every file rewritten as pieces finish (a kill keeps what was done), and the
budget's clock, started when this module is first imported (scripts/gpu_run.py imports it first)."""

from __future__ import annotations

import time

STARTED = time.monotonic()            # the budget counts from here, imports included

import csv  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from .report import summary  # noqa: E402

if TYPE_CHECKING:
    from .shapes import Plan

OUT_FILES = ("summary.md", "run.json", "log.txt", "correctness.csv", "latency.csv", "host.csv", "projection.csv")


class OutOfTime(BaseException):
    """The budget's alarm: not an ``Exception``, so that no ``except Exception`` swallows it."""



def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def csv_text(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    return buffer.getvalue()



class Run:
    def __init__(self, out: Path, budget: float | None) -> None:
        self.out = out
        self.budget = budget
        self.meta: dict = {}
        self.notes: list[str] = []          # skipped pieces and why
        self.failures: list[str] = []
        self.refusals: list[str] = []       # pieces whose attention backend is wrong on this host, with the cause
        self.correctness: list[dict] = []
        self.probes: list[dict] = []
        self.curves: list[dict] = []        # per curve: model, attention, kv, seconds, warnings
        self.latency: list[dict] = []       # per (curve, k)
        self.host: list[dict] = []
        self.projection: list[dict] = []
        self.sources: list[dict] = []
        self.pieces: list[dict] = []        # (section, model, attention) in run order, with status and seconds
        self.durations: dict[str, list[float]] = {}
        self.compiled: set[tuple] = set()   # flex_attention kernels compiled: (dtype, MHA or GQA)
        self.log_handle = open(out / "log.txt", "a", buffering=1)

    def sections(self) -> dict[str, str]:
        """Per section run: "done", or how many of its pieces were done."""
        out = {}
        for section, name in (("a", "correctness"), ("b", "timing")):
            mine = [p for p in self.pieces if p["section"] == section]
            done = sum(p["status"] == "done" for p in mine)
            refused = sum(p["status"] == "refused" for p in mine)
            if mine:
                out[name] = "done" if done == len(mine) else f"{done} of {len(mine)} pieces done" + \
                    (f", {refused} refused on this host" if refused else "")
        return out

    def elapsed(self) -> float:
        return time.monotonic() - STARTED

    def left(self) -> float:
        return float("inf") if self.budget is None else self.budget - self.elapsed()

    def estimate(self, kind: str, plan: Plan) -> float:
        """The last such piece's duration (the first of a kind carries one-time costs), else the plan's."""
        return (self.durations.get(kind) or [plan.estimates[kind]])[-1]

    def fits(self, kind: str, plan: Plan) -> bool:
        return self.left() >= self.estimate(kind, plan)

    def took(self, kind: str, seconds: float) -> None:
        self.durations.setdefault(kind, []).append(seconds)

    def say(self, message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{self.elapsed():5.0f}s] {message}"
        print(line, flush=True)
        self.log_handle.write(line + "\n")

    def skip(self, what: str, why: str) -> None:
        self.notes.append(f"{what}: skipped ({why})")
        self.say(f"SKIPPED {what}: {why}")

    def save(self) -> None:
        out = self.out
        write_atomic(out / "run.json", json.dumps({
            "meta": self.meta, "elapsed_s": self.elapsed(), "sections": self.sections(), "pieces": self.pieces,
            "notes": self.notes, "refusals": self.refusals,
            "failures": self.failures, "probes": self.probes, "correctness": self.correctness,
            "curves": self.curves, "host": self.host, "sources": self.sources, "durations_s": self.durations,
        }, indent=1, default=str) + "\n")
        for name, rows in (("correctness.csv", self.correctness), ("latency.csv", self.latency),
                           ("host.csv", self.host), ("projection.csv", self.projection)):
            if rows:
                write_atomic(out / name, csv_text(rows))
        try:
            text = summary(self)
        except Exception as error:  # noqa: BLE001 - the tables are in the other files; never lose the run to them
            text = f"# GPU run\n\nsummary.md could not be written ({type(error).__name__}: {error}); see run.json.\n"
        write_atomic(out / "summary.md", text)

