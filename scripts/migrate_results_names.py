"""One-off (issue 60): rename every committed result to its name under the identity of
experiments/config/identity.py, from the config beside it.

For each ``results/**/<name>.yaml`` written by a job (beside its ``<name>.csv.gz``):

1. the config's old source keys (``suffix: 4``, ``recycle: 4``; refused now) become ``sources: {...}``,
   in the config and in the command of its header;
2. the config is composed as ``run.py --config-dir <folder> --config-name <name>`` composes it, on
   the chip its rows record, and names its file;
3. every file of the result (``<name>.*``: rows, config, auto's records) takes the new name, the
   rows' ``settings`` and ``config`` columns the new hash and readable name, the header the new name;
4. the old names are replaced by the new ones in results/, docs/, notebooks/, scripts/runs/ and tests/.

Run once from the repository root: ``python scripts/migrate_results_names.py``.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import os
import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.config.schema import register_configs  # noqa: E402
from experiments.config.settings import check_parallel_backend, to_settings  # noqa: E402
from experiments.rows.store import sidecar  # noqa: E402

ALIASES = ("suffix", "recycle")
HEADER = "defaults:\n  - run_schema\n  - _self_\n"


def sized(entry):
    """A decoder node without its old source keys, their nonzero sizes in ``sources``."""
    if not isinstance(entry, dict) or not any(k in entry for k in ALIASES):
        return entry
    entry = dict(entry)
    sizes = {k: entry.pop(k) for k in ALIASES if k in entry}
    sizes = {k: v for k, v in sizes.items() if v}
    if sizes:
        entry["sources"] = {**sizes, **(entry.get("sources") or {})}
    return entry


def command_sized(line: str) -> str:
    """The header's command with ``suffix:N``/``recycle:N`` of each decoders entry under ``sources``."""
    def entry(match: re.Match) -> str:
        text = match.group(0)
        nested = re.sub(r"\{[^{}]*\}", lambda m: "\0" * len(m.group(0)), text[1:-1])
        found = [(m.start(), m.end(), m.group(1), m.group(2))
                 for m in re.finditer(r"(?<![\w.])(suffix|recycle):\s*(\d+)\s*,?", nested)]
        if not found:
            return text
        body = text[1:-1]
        for start, end, _, _ in reversed(found):
            body = body[:start] + body[end:]
        body = body.rstrip(", ")
        sizes = ",".join(f"{name}:{size}" for _, _, name, size in found if int(size))
        if sizes:
            if re.search(r"sources:\s*\{", body):
                body = re.sub(r"sources:\s*\{", "sources:{" + sizes + ",", body, count=1)
            else:
                body += ",sources:{" + sizes + "}"
        return "{" + body + "}"

    line = re.sub(r"\{(?:[^{}]|\{[^{}]*\})*\}", entry, line)
    return re.sub(r"(?<![+\w])decoding\.(suffix|recycle)=", r"+decoding.sources.\1=", line)


def rows_renamed(path: Path, fingerprint: str, tag: str) -> bytes:
    with gzip.open(path, "rt", newline="") as handle:
        reader = csv.DictReader(handle)
        rows, columns = list(reader), reader.fieldnames
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "settings": fingerprint, "config": tag})
    return gzip.compress(buffer.getvalue().encode("utf-8"), mtime=0)


def migrate(config: Path) -> tuple[str, str] | None:
    results = config.with_name(config.stem + ".csv.gz")
    text = config.read_text(encoding="utf-8")
    if not text.startswith("# The config of") or not results.exists():
        return None
    header, body = text.split(HEADER, 1)
    cfg = OmegaConf.to_container(OmegaConf.create(body), resolve=False)
    cfg["decoding"] = sized(cfg.get("decoding"))
    if cfg.get("decoders"):
        cfg["decoders"] = [sized(entry) for entry in cfg["decoders"]]
    config.write_text(header + HEADER + OmegaConf.to_yaml(OmegaConf.create(cfg)), encoding="utf-8")
    with initialize_config_dir(config_dir=str(config.parent), version_base="1.3"):
        composed = compose(config.stem)
    with gzip.open(results, "rt", newline="") as handle:
        rows = list(csv.DictReader(handle))
    (chip,) = {row["device_name"] for row in rows}
    os.environ["WORLD_SIZE"] = str(max(int(row["lp_ranks"] or 1) for row in rows))
    settings = dataclasses.replace(to_settings(composed, device="cpu"), device_name=chip)
    if settings.ranks > 1:
        settings = dataclasses.replace(settings, backend=check_parallel_backend(settings))
    os.environ.pop("WORLD_SIZE")
    old, new = config.stem, sidecar(settings.results_path(), "").name
    results.write_bytes(rows_renamed(results, settings.fingerprint(), settings.config_tag))
    lines = header.splitlines()
    lines = [line.replace(old, new) for line in lines[:2]] + [command_sized(line) for line in lines[2:]]
    config.write_text("\n".join(lines) + "\n" + HEADER + OmegaConf.to_yaml(OmegaConf.create(cfg)), encoding="utf-8")
    if new != old:
        for path in sorted(config.parent.glob(old + ".*")):
            path.rename(path.with_name(new + path.name[len(old):]))
    return old, new


def main() -> None:
    register_configs()
    renamed = dict(filter(None, (migrate(config) for config in sorted((ROOT / "results").rglob("*.yaml")))))
    texts = [p for folder in ("results", "docs", "notebooks", "scripts/runs", "tests") for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in (".md", ".json", ".yaml", ".sh", ".py", ".ipynb", ".txt")]
    pattern = re.compile("|".join(map(re.escape, sorted(renamed, key=len, reverse=True))))
    for path in texts:
        text = path.read_text(encoding="utf-8")
        new = pattern.sub(lambda m: renamed[m.group(0)], text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"references updated: {path.relative_to(ROOT)}")
    longest = max(len(new) for new in renamed.values()) + len(".csv.gz")
    print(f"{len(renamed)} results renamed; the longest file name is now {longest} characters")


if __name__ == "__main__":
    main()
