"""(c) Projection: the speedup each mission shape would get, from S and the tokens fed per step of
the committed CPU rows of real models (results/) priced on this device's t(k) and host cost."""

from __future__ import annotations

import csv
import glob
import gzip
import json
import os
from collections import Counter
from dataclasses import fields
from pathlib import Path

from lookahead_core import LookaheadConfig
from lookahead_core import cost as cm

from .record import Run
from .shapes import FAMILIES

ROOT = Path(__file__).resolve().parents[3]       # the repository: results/ is read from here

# (c): where S comes from: (what, glob under the repository, which rows), rows of real models on the
# CPU. Which rows: decoder names; a draft source's name as a string (the core rows whose config drafts
# from it); None, every core decoder's rows (``--project GLOB`` adds ("rows", GLOB, None)).
SOURCES: tuple[tuple[str, str, tuple[str, ...] | str | None], ...] = (
    ("paper", "results/scaling/*/*/w16_n5+*.csv.gz", ("w16_n5", "w16_n5_pool")),
    ("auto", "results/auto_stream/*/*/*.csv.gz", ("auto",)),
    ("eagle", "results/eagle/*/*/*/*.csv.gz", "eagle"),
)


def _config(row: dict) -> LookaheadConfig | None:
    params = row.get("params") or row.get("lookahead") or ""
    if not params or params == "null":
        return None
    known = {f.name for f in fields(LookaheadConfig)}
    try:
        return LookaheadConfig(**{k: v for k, v in json.loads(params).items() if k in known})
    except (ValueError, TypeError):
        return None


def read_sources(root: Path = ROOT, sources=SOURCES) -> list[dict]:
    """Per (what, file, decoder): S and the tokens fed per step of the committed CPU rows of real
    models (each row's per-step record, else its histogram of tokens fed)."""
    groups: dict[tuple, dict] = {}
    for what, pattern, decoders in sources:
        for path in sorted(glob.glob(str(root / pattern))):
            opened = gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")
            with opened as handle:
                for row in csv.DictReader(handle):
                    config = _config(row)
                    if isinstance(decoders, tuple):
                        wanted = row.get("decoder") in decoders
                    else:                                                     # core rows (no greedy baseline)
                        wanted = row.get("family") == "core" and config is not None and \
                            (decoders is None or decoders in dict(config.sources))
                    if not wanted or not row.get("steps"):
                        continue
                    key = (what, path, row["decoder"])
                    if key not in groups:
                        groups[key] = {
                            "what": what, "file": os.path.relpath(path, root), "model": row.get("model", ""),
                            "dataset": row.get("dataset", ""), "decoder": row["decoder"], "dtype": row.get("dtype", ""),
                            "config": config, "rows": 0, "committed": 0, "steps": 0, "fed": Counter(),
                            "commits": set(), "equal": 0}
                    g = groups[key]
                    g["rows"] += 1
                    g["steps"] += int(row["steps"])
                    g["commits"].add(row.get("git_commit") or "unknown")
                    g["equal"] += row.get("matches_greedy") == "True"
                    log = json.loads(row["step_log"]) if row.get("step_log") else None
                    if log and "fed" in log:
                        g["fed"].update(log["fed"])
                        g["committed"] += sum(log.get("accepted") or []) or int(row["new_tokens"]) - 1
                    else:
                        hist = json.loads(row.get("step_tokens_hist") or "{}")
                        g["fed"].update({int(k): int(v) for k, v in hist.items()})
                        g["committed"] += int(row["new_tokens"]) - 1
    out = []
    for g in groups.values():
        g["S"] = g["committed"] / g["steps"] if g["steps"] else 1.0
        g["fed_per_step"] = sum(k * v for k, v in g["fed"].items()) / max(sum(g["fed"].values()), 1)
        g["commits"] = " ".join(sorted(g["commits"]))
        out.append(g)
    return out


def projected(source: dict, cost: cm.CostModel, host: float | None, host_greedy: float | None) -> float:
    """Summed time: committed tokens x a greedy step over the source's steps priced on ``cost``
    (each step's tokens fed, its logit rows), with the host time per step when given."""
    config = source["config"]
    h, h0 = (host or 0.0), (host_greedy or 0.0)
    steps = sum(count * (cost.latency(k, cm.logit_rows_for(config, k) if config else None) + h)
                for k, count in source["fed"].items())
    return source["committed"] * (cost.latency(1) + h0) / steps if steps else 1.0


def project(run: Run, curves: dict, tiny: bool) -> None:
    if not run.sources:
        return
    hosts = {}
    for row in run.host:
        if "error" not in row:
            kind = "greedy" if row["decoder"] == "greedy" else "paper" if "paper" in row["decoder"] else \
                "auto" if row["decoder"].startswith("auto") else "eagle" if row["decoder"].startswith("eagle") else None
            if kind:
                hosts[(row["model"], kind)] = row["host_ms_per_step"] / 1e3
    rows = []
    for source in run.sources:
        for (key, attention, kv), cost in curves.items():
            host, host0 = hosts.get((key, source["what"])), hosts.get((key, "greedy"))
            rows.append({
                "shape": f"{FAMILIES[key].name} shape" + (" (tiny)" if tiny else ""), "model_key": key,
                "attention": attention, "kv_length": kv, "config_from": source["what"], "decoder": source["decoder"],
                "S_from": f"{source['model']} {source['dataset']}", "S_file": source["file"],
                "S_commits": source["commits"], "S_rows": source["rows"], "S": source["S"],
                "fed_per_step": source["fed_per_step"], "fed_max": max(source["fed"], default=1),
                "extrapolated": max(source["fed"], default=1) > cost.tokens[-1],
                "projected_forward_only": projected(source, cost, None, None),
                "projected_with_host": projected(source, cost, host, host0) if host is not None and host0 is not None
                else None,
            })
    run.projection = rows

