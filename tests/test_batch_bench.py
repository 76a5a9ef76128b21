"""Batched cost model by hand, and the batch benchmark (run.py suite=batch, its t(B, k) tool and its
report) end to end on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.config.schema import register_configs
from experiments.config.settings import plan
from experiments.data.datasets import get_dataset, repo_root
from experiments.job import runner
from experiments.reporting import batch as batch_bench
from experiments.tools import app, batch_latency
from lookahead_core import LookaheadConfig
from lookahead_core import cost as cm
from experiments.config.labels import config_label

from conftest import DATA_ROOT  # the full data when present, else tests/fixtures/data

POOL = LookaheadConfig(window=1, ngram=3, guess=1, pool_only=True)
DATASETS = ("mtbench", "humaneval")
BATCH_SIZES = (1, 3)
PROMPTS = 3
BATCHES = 1                      # batches per (dataset, B)


def job(dataset: str, batch_size: int, limit: int, out: Path | None = None):
    """The composed run.py job ``suite=batch`` on the tiny model: ``limit`` first turns in batches of ``batch_size``."""
    register_configs()
    overrides = ["suite=batch", "model=tiny_llama", f"experiment={dataset}", f"batch_size={batch_size}",
                 f"dataset.limit={limit}", "experiment.max_new_tokens=10", f"data_root={DATA_ROOT}"]
    if out is not None:
        overrides.append(f"results_file={out / 'jobs' / f'{dataset}_B{batch_size}.csv'}")
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def lineup() -> dict[str, LookaheadConfig | None]:
    """conf/suite/batch.yaml's decoders by name, the baseline first (None: no lookahead)."""
    settings, _, _ = plan(job("mtbench", 1, 1))
    return {decoder.name: decoder.lookahead for decoder in settings.decoders}


def run_bench(out: Path) -> None:
    """What scripts/runs/batch/cpu.sh runs, small: t(B, k), one batch at every B, then the rest, the report."""
    batch_latency.run(app.settings("batch_latency", ["model=tiny_llama", f"batch_sizes={list(BATCH_SIZES)}",
                                                     "repeats=1", f"out={out}"], batch_latency.check))
    for first in (True, False):
        for dataset in DATASETS:
            for B in BATCH_SIZES:
                count = min(min(BATCHES, max(1, PROMPTS // B)) * B, PROMPTS)
                runner.run(job(dataset, B, min(B, count) if first else count, out))
    batch_bench.write(out)


def costs(per_token: float = 0.0):
    """t(B, k) = 10 ms + per_token x B x k (1 ms one-logit discount ignored): B = 1 and 4 measured."""
    sizes = (1, 2, 4, 8)
    return {B: cm.CostModel(sizes, tuple(0.010 + per_token * B * k for k in sizes), batch=B) for B in (1, 4)}


def test_batch_latency_interpolates_in_b_and_k():
    c = costs(0.001)
    assert cm.batch_latency(c, 1, 2) == pytest.approx(0.012)
    assert cm.batch_latency(c, 4, 8) == pytest.approx(0.042)
    assert cm.batch_latency(c, 2, 4) == pytest.approx(0.014 + (0.026 - 0.014) / 3)      # a third of the way to B = 4


def test_batch_seconds_pads_to_the_largest_and_drops_finished_sequences():
    c = costs(0.001)
    # Sequence 0 takes 3 steps of 3, 1, 2 tokens; sequence 1 one step of 2 tokens.
    seconds = cm.batch_seconds(c, POOL, [[3, 1, 2], [2]])
    two = lambda k: cm.batch_latency(c, 2, k)       # noqa: E731
    assert seconds == pytest.approx(two(3) + cm.batch_latency(c, 1, 1) + cm.batch_latency(c, 1, 2))


def test_predict_batch_and_auto_per_batch_size():
    # Flat curve (GPU-like): S is the speedup. Steep curve: nothing pays, auto falls back to greedy.
    # 30 and 20 tokens in 10 steps each; batched greedy needs 30 steps (the longer sequence).
    records = [([3] * 10, [3] * 10), ([3] * 10, [2] * 10)]
    flat, steep = costs(0.0), costs(0.05)
    assert cm.predict_batch(flat, POOL, [r[0] for r in records], [r[1] for r in records]) == pytest.approx(3.0)
    pick, predicted = cm.choose_for_batch(flat, {"pool_N3G1": (POOL, records)}, 4)
    assert pick == "pool_N3G1" and predicted["pool_N3G1"] == pytest.approx(3.0)
    pick, predicted = cm.choose_for_batch(steep, {"pool_N3G1": (POOL, records)}, 4)
    assert pick == "greedy" and predicted["pool_N3G1"] < 1


def test_decoder_names():
    """Drafting configs are named by config_label; the greedy decoders and the tree keep their names."""
    decoders = lineup()
    assert list(decoders) == ["hf_greedy", "core_greedy", "pool_N3G1", "la_N4W5G5_pool", "tree_k6"]
    assert decoders["pool_N3G1"] == POOL
    for name in ("pool_N3G1", "la_N4W5G5_pool"):
        assert config_label(decoders[name]) == name
    assert decoders["tree_k6"] == cm.tree_config(6)


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("batch")
    run_bench(out)
    torch.set_num_threads(threads)
    return out


def test_batch_bench_rows_report_and_resume(bench_dir: Path):
    rows = pd.read_csv(bench_dir / "rows.csv.gz")
    assert len(rows) == 2 * (1 + 3) * len(lineup())             # one row per sequence per decoder
    assert rows.matches_hf_greedy.all(), "a batched core decoder differed from batched generate"
    items = {dataset: [item.item_id for item in plan(job(dataset, 1, PROMPTS))[2]] for dataset in DATASETS}
    assert set(rows[rows.B == 3].composition) == {" ".join(items["mtbench"]), " ".join(items["humaneval"])}
    # Spread over MT-Bench's categories (its first items in file order are all writing).
    categories = {item.item_id: item.extra["category"] for item in get_dataset("mtbench").load(DATA_ROOT, source="local")}
    assert len({categories[item] for item in items["mtbench"]}) == 3
    summary = pd.read_csv(bench_dir / "summary.csv")
    assert (summary[summary.decoder == "hf_greedy"].speedup == 1).all() and (summary.tokens_per_s > 0).all()
    text = (bench_dir / "summary.md").read_text()
    assert "Where lookahead stops paying" in text and "auto per batch size" in text
    assert (bench_dir / "speedup_vs_batch.png").stat().st_size > 0
    threads = torch.get_num_threads()
    run_bench(bench_dir)
    torch.set_num_threads(threads)
    assert len(pd.read_csv(bench_dir / "rows.csv.gz")) == len(rows)            # resumed: nothing rerun


def test_roofline_projection_is_flat_then_compute_bound(bench_dir: Path):
    costs = batch_bench.roofline_costs(1e9, 1e12, 1e14, [1, 64])        # read 2 ms; compute 0.02 ms per token
    assert cm.batch_latency(costs, 1, 8) == pytest.approx(0.002)
    assert cm.batch_latency(costs, 64, 8) == pytest.approx(2 * 1e9 * 512 / 1e14)
    table = batch_bench.project_roofline(pd.read_csv(bench_dir / "rows.csv.gz"), costs)
    assert set(table.B) == {1, 64} and (table.projected > 0).all()
    batch_bench.main([str(bench_dir), "--roofline", "--batch-sizes", "1", "4"])
    assert "ASSUMED" in (bench_dir / "roofline.md").read_text()


def test_batch_latency_measures_one_kernel_and_refuses_both(tmp_path: Path):
    from experiments.config.errors import ConfigError

    with pytest.raises(ConfigError, match="model.linear: both runs every decoder of a run.py job on both kernels"):
        app.settings("batch_latency", ["model=tiny_llama", "model.linear=both", f"out={tmp_path}"], batch_latency.check)
