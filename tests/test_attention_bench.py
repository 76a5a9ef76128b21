"""experiments.tools.attention: per-step latency under eager, SDPA and flex_attention, end to end on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.config.errors import ConfigError
from experiments.data.datasets import repo_root
from experiments.tools import app
from experiments.tools import attention as bench


def main(overrides: list[str]) -> None:
    """The tool on ``overrides`` (conf/attention.yaml), as ``python -m experiments.tools.attention`` runs it."""
    print(bench.run(app.settings("attention", ["model=tiny_llama", *overrides], bench.check)))


def test_the_latency_preset_measures_every_cell_interleaved_and_resumes(tmp_path: Path):
    threads = torch.get_num_threads()
    args = ["kv=[16,140]", "sizes=[1,3]", "rounds=2", f"out={tmp_path}"]
    try:
        main(args)
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
        main([*args[:-2], "rounds=3", f"out={tmp_path}"])      # a rerun adds only round 2
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
            main(["kv=[16]", "sizes=[1,3]", "rounds=1", f"out={tmp_path}"])
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    assert not (tmp_path / "rows.csv").exists()


@pytest.mark.parametrize("override, key", [("rounds=0", "rounds"), ("kv=[0,16]", "kv"), ("threads=two", "threads"),
                                           ("window=3", "window"), ("model.linear=both", "model.linear")])
def test_a_bad_key_or_value_is_refused_naming_the_key(override: str, key: str, tmp_path: Path):
    with pytest.raises(ConfigError, match=rf"\b{key}\b"):
        app.settings("attention", ["model=tiny_llama", override, f"out={tmp_path}"], bench.check)


def test_the_command_line_refuses_a_bad_value_in_one_line_before_torch_loads(tmp_path: Path):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "experiments.tools.attention", "model=tiny_llama",
                           "sizes=[4,0]", f"out={tmp_path}"], cwd=repo_root(), capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and errors == ["error: sizes: must be a non-empty list of ints >= 1, got [4, 0]"]
    assert not any(line.rstrip().endswith(" torch") for line in done.stderr.splitlines())
    assert not (tmp_path / "rows.csv").exists()
