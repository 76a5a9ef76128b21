"""experiments.presets.attention: per-step latency under eager, SDPA and flex_attention, end to end on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.presets import attention as bench


def test_the_latency_preset_measures_every_cell_interleaved_and_resumes(tmp_path: Path):
    threads = torch.get_num_threads()
    args = ["--model", "tiny-llama", "--kv", "16", "140", "--sizes", "1", "3", "--rounds", "2", "--out", str(tmp_path)]
    try:
        bench.main(args)
        rows = pd.read_csv(tmp_path / "rows.csv")
        cells = 2 * 2 * len(bench.SHAPES)                   # kv x sizes x shapes
        assert len(rows) == 2 * cells * len(bench.IMPLEMENTATIONS)
        assert (rows.groupby(["round", "kv", "k", "shape"])["attention"].nunique() == 3).all()
        # Interleaved: the implementation that runs first in a cell rotates.
        firsts = rows.groupby(["round", "kv", "k", "shape"], sort=False)["attention"].first()
        assert firsts.nunique() == 3 and (rows["seconds"] > 0).all()
        meta = json.loads((tmp_path / "meta.json").read_text())
        assert meta["compile_s"][0] > 0 and meta["sizes"] == [1, 3]
        summary = (tmp_path / "summary.md").read_text()
        assert "### KV 140, tree steps" in summary and "flex_attention/sdpa" in summary
        assert (tmp_path / "latency.png").stat().st_size > 0
        bench.main([*args[:-4], "--rounds", "3", "--out", str(tmp_path)])      # a rerun adds only round 2
        again = pd.read_csv(tmp_path / "rows.csv")
        assert sorted(again["round"].unique()) == [0, 1, 2] and len(again) == 3 * cells * 3
    finally:
        torch.set_num_threads(threads)


def test_tree_steps_are_fixed_trees_of_earlier_parents():
    parents = bench.tree_parents(30)
    assert parents == bench.tree_parents(30) and len(parents) == 30
    assert all(-1 <= p < i for i, p in enumerate(parents)) and any(p >= 0 for p in parents)


def test_a_round_that_ran_uncompiled_flex_is_not_written(tmp_path: Path, monkeypatch):
    """Past torch's recompile limit flex runs uncompiled: those are not the kernel's timings."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(RuntimeError, match="ran uncompiled"):
            bench.main(["--model", "tiny-llama", "--kv", "16", "--sizes", "1", "3", "--rounds", "1",
                        "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    assert not (tmp_path / "rows.csv").exists()
