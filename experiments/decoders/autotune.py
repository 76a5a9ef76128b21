"""``decoding=auto``: calibrate on prompts that are not evaluated, pick (W, N, G), remember the pick.

The choice itself is :func:`lookahead_core.cost.choose_config`; this module runs it for the
harness and the benchmark and stores its record (latency curve, every candidate's S and predicted
speedup, the pick) as JSON beside the results. A rerun of the same command reloads that record
instead of calibrating again, so a resumed run keeps decoding with the config it started with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from lookahead_core import cost as cm
from lookahead_core import decode
from lookahead_core.config import DecodeLimits, LookaheadConfig, SamplingConfig, config_label
from lookahead_core.drafts import DraftStats

FINALISTS = 3              # configs calibrated in full after the screen
SCREEN_MIN_TOKENS = 8      # the screen decodes max(this, calibration tokens / 2) tokens per prompt
# Half, not a quarter: a 16-token screen (of 64) cannot see what a 10-deep suffix draft copies; on
# Qwen2.5-Coder CNN/DM it screened 1-match depth-10 at S 2.25 where prompt lookup k = 10 reaches 5.1
# over 128 tokens (results/benchmark/trees/README.md, "auto2").


def calibrate(
    model,
    prompts: list[list[int]],
    limits: DecodeLimits,
    path: Path,
    *,
    grid: Sequence[LookaheadConfig] | None = None,
    always: Sequence[LookaheadConfig] = (),
    sampling: SamplingConfig | None = None,
    finalists: int = FINALISTS,
    cost_aware: bool = False,
) -> dict:
    """Run ``choose_config`` (or reload its record from ``path``) and return the record.

    ``grid`` defaults to the cost model's default grid; configs in ``always`` are calibrated even
    when their upper bound says they cannot win, so that each gets a prediction to check. Every
    config is first screened on half the calibration tokens; the ``finalists`` best are
    then calibrated in full. ``cost_aware``: see ``choose_config``.
    """
    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    grid = list(cm.default_grid() if grid is None else grid)
    grid += [c for c in always if c not in grid]
    with tqdm(desc="decoding=auto: calibrating", total=None, leave=False) as bar:
        chosen, report = cm.choose_config(
            model, prompts, limits, grid, always_calibrate=list(always), sampling=sampling,
            progress=lambda message: (bar.set_postfix_str(message), bar.update(1)),
            screen_tokens=max(SCREEN_MIN_TOKENS, limits.max_new_tokens // 2), finalists=finalists,
            cost_aware=cost_aware,
        )
    record = {
        "chosen": config_label(chosen),
        # Every field but the seed, which the run that uses the pick supplies.
        "chosen_config": None if chosen is None else {k: v for k, v in asdict(chosen).items() if k != "seed"},
        "calibration_prompts": len(prompts),
        "calibration_tokens": limits.max_new_tokens,
        "calibration_seconds": report.seconds,
        "latency": report.cost_model.to_rows(),
        "candidates": report.rows(),
        # The survey's acceptance per (tag, depth), the prior of the pick's decodes (cost-aware only).
        "draft_prior": None if report.drafts is None else report.drafts.table(by_source=False),
        "markdown": "#### decoding=auto / cost model calibration\n\n" + report.to_markdown()
                    + "\n\nForward latency t(k)/t(1) on this device: "
                    + ", ".join(f"{k}: {r:.2f}" for k, r in report.cost_model.relative()),
    }
    _write(path, record)
    return record


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(record, indent=1, default=str) + "\n")
    partial.replace(path)


def calibrate_batch(model, prompts: list[list[int]], limits: DecodeLimits, path: Path, record: dict, batch: int,
                    *, grid: Sequence[LookaheadConfig] | None = None, sampling: SamplingConfig | None = None,
                    repeats: int = 3) -> dict:
    """The pick for batches of ``batch`` sequences, added to ``record`` (the B = 1 calibration,
    saved again at ``path``) as ``record["batch"]``; a record that has it is returned as it is.

    The B = 1 calibration's finalists (status ``calibrated``) decode each calibration prompt again
    for their per-step records; t(B, k) is the record's own curve at B = 1 and is measured at
    B = ``batch`` on the same sizes and KV length; :func:`lookahead_core.cost.choose_for_batch`
    predicts each finalist's speedup over batched greedy for a batch made of those sequences;
    greedy wins where none is predicted above 1.
    """
    if "batch" in record:
        return record
    calibrated = {row["decoder"] for row in record["candidates"] if row["status"] == "calibrated"}
    configs = {config_label(c): c for c in (cm.default_grid() if grid is None else grid)
               if config_label(c) in calibrated}
    alone = cm.CostModel.from_rows(record["latency"])
    costs = {1: alone, batch: cm.measure_latency(model, alone.tokens, kv_length=alone.kv_length, repeats=repeats,
                                                 batch=batch)}
    calibration = {}
    for label, config in tqdm(configs.items(), desc=f"decoding=auto: per-step records for B={batch}", leave=False):
        outs = [decode(model, prompt, config, limits, sampling).stats for prompt in prompts]
        calibration[label] = (config, [(stats.step_tokens, stats.accepted) for stats in outs])
    pick, predicted = cm.choose_for_batch(costs, calibration, batch)
    chosen = calibration[pick][0] if pick != "greedy" else None
    record = {**record, "batch": {
        "batch_size": batch, "chosen": pick, "predicted": predicted,
        "chosen_config": None if chosen is None else {k: v for k, v in asdict(chosen).items() if k != "seed"},
        "latency": [row for c in costs.values() for row in c.to_rows()],
    }}
    record["markdown"] += (f"\n\nFor batches of {batch}: **{pick}** (predicted speedup over batched greedy: "
                           + ", ".join(f"{k} {v:.2f}x" for k, v in predicted.items()) + ")")
    _write(path, record)
    return record


def chosen_config(record: dict, seed: int = 0) -> LookaheadConfig | None:
    """The pick of a calibration record (for batches, when it has one); ``None`` means greedy was
    predicted fastest."""
    chosen = record["batch"]["chosen_config"] if "batch" in record else record["chosen_config"]
    return None if chosen is None else LookaheadConfig(**chosen, seed=seed)


def draft_prior(record: dict) -> DraftStats | None:
    """The acceptance the calibration's survey measured (``None``: no survey, or an older record)."""
    rows = record.get("draft_prior")
    return None if rows is None else DraftStats.from_table(rows)


def chosen_label(record: dict) -> str:
    return record["batch"]["chosen"] if "batch" in record else record["chosen"]


def write_tables(record: dict, folder: Path) -> None:
    """``latency.csv`` and ``calibration.csv`` of a record, for plots and notebooks."""
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(record["latency"]).to_csv(folder / "latency.csv", index=False)
    pd.DataFrame(record["candidates"]).to_csv(folder / "calibration.csv", index=False)
