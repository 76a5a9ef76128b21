"""One-off migration of the committed results to today's names and schema (issue 46, item 3).

Run once and deleted after (git history keeps it). For each committed rows file it takes the command
that wrote it, as recorded by its script or README (``--commands``: JSON records of run.py overrides,
each with the fingerprint the code before this change gave it, computed on a worktree of that
commit), and only where that old fingerprint equals the file's ``settings`` column (the command is
then provably the one that wrote it):

* composes the same overrides with today's code (``model.linear`` made explicit: the old default
  ``auto`` is no longer the default) and the chip of this host, which names the file now;
* checks that every core decoder of the rows ran exactly the config today's settings build (its
  ``params`` after ``suffix``/``recycle`` became sources), that the rows' decoders are the job's and
  their items among the items the command plans;
* writes the rows, with today's columns, ``settings`` = the new fingerprint, ``params`` in today's
  form and the ``device_name`` the rows predate, as ``<today's name>.csv.gz``, the job's config
  beside it (``<name>.yaml``, as run.py writes it) and auto's calibration record under the new stem;
* removes the old files.

Files whose command cannot be recovered are listed, not touched.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from hydra import compose, initialize_config_dir

from experiments.cli import job_config
from experiments.config.schema import register_configs
from experiments.config import settings as _settings
from experiments.config.settings import check_parallel_backend, chosen_decoders, plan, to_settings
from experiments.data.datasets import repo_root
from experiments.decoders.registry import CoreDecoder
from experiments.models.loader import device_name
from experiments.rows.schema import COLUMNS
from experiments.rows.store import sidecar
from lookahead_core.config import LookaheadConfig, config_fields

SOURCE_KEYS = ("suffix", "recycle")
DEFAULTS = json.loads(json.dumps(config_fields(LookaheadConfig()), default=list))


def today_fields(fields: dict) -> dict:
    """A saved config's fields with the suffix/recycle sizes moved into ``sources``."""
    out = dict(fields)
    sizes = {name: size for name, size in (out.get("sources") or [])}
    for key in SOURCE_KEYS:
        size = out.pop(key, 0)
        if size:
            sizes[key] = size
    out["sources"] = sorted([name, size] for name, size in sizes.items() if size)
    return out


def convert_configs(value):
    """Every saved config inside a JSON value (auto's records) in today's form."""
    if isinstance(value, dict):
        value = {k: convert_configs(v) for k, v in value.items()}
        return today_fields(value) if {"window", "ngram", "guess", *SOURCE_KEYS} <= set(value) else value
    if isinstance(value, list):
        return [convert_configs(v) for v in value]
    return value


def explicit(record: dict) -> list[str]:
    """The record's overrides with ``model.linear`` explicit (the old default ``auto`` is not today's)."""
    overrides = list(record["overrides"])
    if not any(o.startswith("model.linear=") for o in overrides):
        overrides.append(f"model.linear={record['linear']}")
    return overrides


def results_folder(overrides: list[str]) -> str:
    for override in overrides:
        if override.startswith(("results_dir=", "results_file=")):
            value = override.split("=", 1)[1]
            return value if override.startswith("results_dir=") else value.rsplit("/", 1)[0]
    return "results/raw"


def settings_of(overrides: list[str], ranks: int, chip: str):
    os.environ["WORLD_SIZE"] = str(ranks)
    try:
        with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        cfg = chosen_decoders(cfg, overrides)
        items = {item.item_id for item in plan(cfg)[2]}
        settings = replace(to_settings(cfg, device="cpu"), device_name=chip)
        if settings.ranks > 1:
            settings = replace(settings, backend=check_parallel_backend(settings))
        return cfg, settings, items
    finally:
        os.environ.pop("WORLD_SIZE", None)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def check(rows: list[dict[str, str]], settings) -> None:
    by_name = {d.name: d for d in settings.decoders}
    seen = {row["decoder"] for row in rows}
    assert seen <= set(by_name), f"decoders {sorted(seen - set(by_name))} are not the job's"
    for row in rows:
        decoder = by_name[row["decoder"]]
        config = decoder.config if isinstance(decoder, CoreDecoder) else None
        if config is not None and row.get("params", "") in ("", "null"):     # rows older than the params column
            assert [row.get(k) for k in ("W", "N", "G")] == [str(config.window), str(config.ngram), str(config.guess)], \
                f"{row['decoder']}: the rows ran W, N, G = {[row.get(k) for k in ('W', 'N', 'G')]}"
        elif config is not None:
            saved = today_fields(json.loads(row["params"]))
            built = json.loads(json.dumps(config_fields(decoder.config), default=list))
            # rows written before a field existed lack it: it must then be at its default today
            saved = {**{k: v for k, v in DEFAULTS.items() if k not in saved}, **saved}
            assert saved == built, f"{row['decoder']}: the rows ran {saved}, today's settings build {built}"
        assert row["max_new_tokens"] in ("", str(settings.limits.max_new_tokens)), "max_new_tokens differs"


def migrate(path: Path, record: dict, chip: str, dry: bool) -> Path:
    overrides = explicit(record)
    cfg, settings, items = settings_of(overrides, record.get("ranks", 1), chip)
    rows = read_rows(path)
    for row in rows:      # a decoder whose conf/decoding option has been renamed since (named in the record)
        row["decoder"] = record.get("rename", {}).get(row["decoder"], row["decoder"])
    check(rows, settings)
    assert {row["item_id"] for row in rows} <= items, f"{path}: rows of items the command does not plan"
    fingerprint = settings.fingerprint()
    target = settings.results_path()
    target = target.with_name(target.name.removesuffix(".gz") + ".gz")
    for row in rows:
        row["settings"] = fingerprint
        row["device_name"] = row.get("device_name") or chip
        if row.get("params") not in (None, "", "null"):
            row["params"] = json.dumps(today_fields(json.loads(row["params"])), sort_keys=True)
        row["config"] = settings.config_tag
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="raise", restval="")
    writer.writeheader()
    writer.writerows(rows)
    if dry:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(buffer.getvalue().encode("utf-8"), mtime=0))
    hydra = SimpleNamespace(mode=SimpleNamespace(name="RUN"), overrides=SimpleNamespace(task=overrides))
    sidecar(target, ".yaml").write_text(job_config(cfg, hydra, target), encoding="utf-8")
    for old in sorted(path.parent.glob(sidecar(path, ".*.json").name)):
        kind = old.name[len(sidecar(path, "").name):]                      # ".auto.json", ".auto_grid.json"
        new = sidecar(target, kind)
        new.write_text(json.dumps(convert_configs(json.loads(old.read_text())), indent=1) + "\n")
        subprocess.run(["git", "rm", "-q", str(old)], check=True)
    subprocess.run(["git", "rm", "-q", str(path)], check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", nargs="+", type=Path, required=True)
    parser.add_argument("--by-path", type=Path, default=None,
                        help="JSON {results file: {overrides, linear}}: files written by code older than the "
                             "commit whose fingerprints --commands carry (or by a preset), checked by their rows only")
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    register_configs()
    _settings.check_installed = lambda settings: None      # only names and items are computed: no model loads
    chip = device_name("cpu")
    records = collections.defaultdict(list)
    for source in args.commands:
        for record in json.loads(source.read_text()):
            if "fp" in record:
                records[record["fp"]].append(record)
    by_path = json.loads(args.by_path.read_text()) if args.by_path else {}
    files = subprocess.run(["git", "ls-files", "results"], capture_output=True, text=True, check=True).stdout.split()
    left = []
    for name in files:
        path = Path(name)
        if path.suffix != ".csv" or not path.exists():
            continue
        header = path.open(encoding="utf-8").readline().strip().split(",")
        if not {"item_id", "decoder", "settings"} <= set(header) or path.name == "summary.csv":
            continue
        fingerprints = {row["settings"] for row in read_rows(path)}
        if name in by_path:
            print(f"{name} -> {migrate(path, by_path[name], chip, args.dry)} (checked by its rows)")
            continue
        if len(fingerprints) != 1 or next(iter(fingerprints)) not in records:
            left.append((name, sorted(fingerprints)))
            continue
        # results_dir is not in the fingerprint: the command is the one whose folder holds the file
        candidates = [r for r in records[next(iter(fingerprints))] if name.startswith(results_folder(r["overrides"]) + "/")]
        assert len({json.dumps(explicit(r)) for r in candidates}) == 1, f"{name}: {len(candidates)} commands"
        record = candidates[0]
        print(f"{name} -> {migrate(path, record, chip, args.dry)}")
    for name, fingerprints in left:
        print(f"left: {name} {fingerprints}")


if __name__ == "__main__":
    main()
