"""Convert ``rows.csv`` files of the old ``experiments.presets.benchmark`` schema (before issue #12) to the
harness's one row schema, in place, so that ``benchmark report`` / ``collect`` read them:

    python scripts/upgrade_benchmark_rows.py results/benchmark/*/rows.csv

``matches_hf_greedy`` becomes ``matches_greedy`` against the baseline ``hf_greedy``; the core's own
loop times (``core_*``) and ``matches_core_greedy`` are dropped (every decoder is compared on the
hook-timed ``decode_s``); ``params`` is rebuilt from N, W, G, prompt_pool and pool_only. Files
already in the new schema are left alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.rows.schema import COLUMNS  # noqa: E402


def _params(row: pd.Series) -> str:
    if row["family"] != "core":
        return json.dumps({"k": int(float(row["prompt_lookup"]))} if row["prompt_lookup"] else {})
    if row["N"] == "":
        return "null"
    if row.get("lookahead"):            # token-tree rows: every LookaheadConfig field, tree fields included
        return json.dumps(json.loads(row["lookahead"]), sort_keys=True)
    pool_only = row["pool_only"] == "True"
    return json.dumps({"window": 1 if pool_only else int(float(row["W"])), "ngram": int(float(row["N"])),
                       "guess": int(float(row["G"])), "prompt_pool": row["prompt_pool"] == "True" or pool_only,
                       "pool_only": pool_only, "keep_pool": True}, sort_keys=True)


def upgrade(path: Path) -> bool:
    """Rewrite ``path`` in the new schema; False if it already was."""
    old = pd.read_csv(path, dtype=str, keep_default_na=False)
    if "matches_hf_greedy" not in old:
        return False
    new = pd.DataFrame({column: old[column] if column in old else "" for column in COLUMNS})
    is_baseline = old["decoder"] == "hf_greedy"
    new["experiment"], new["turn"], new["seed"] = old["dataset"], "1", "0"
    new["device"], new["dtype"], new["temperature"] = "cpu", "float32", "0.0"
    new["config"], new["settings"] = "benchmark", "hlegacy"
    new["baseline"] = is_baseline.map({True: "True", False: "False"})
    new["matches_greedy"] = old["matches_hf_greedy"].where(~is_baseline, "")
    new["prefill_tokens"] = old.get("prompt_tokens", "")
    new["params"] = old.apply(_params, axis=1)
    new.to_csv(path, index=False)
    return True


def main(paths: list[str]) -> None:
    for name in paths:
        print(("upgraded: " if upgrade(Path(name)) else "already in the new schema: ") + name)


if __name__ == "__main__":
    main(sys.argv[1:])
