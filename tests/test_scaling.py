"""The scaling-law fit (experiments/reporting/scaling.py) on hand-made rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from experiments.reporting.scaling import fit_lines, plot, scaling_points


def _rows(series, tree=False, pool=False):
    """Two items per setup: S and fed per step chosen per W, steps differing per item."""
    rows = []
    for W, (S, fed) in series.items():
        for item, steps in (("a", 10), ("b", 30)):
            rows.append({"model": "m", "dtype": "float32", "experiment": "e", "decoder": "lookahead",
                         "baseline": "greedy", "item_id": item, "N": 5, "W": W, "G": W, "prompt_pool": pool,
                         "params": json.dumps({"tree": tree, "window": W}),
                         "steps": steps, "new_tokens": S * steps, "step_tokens_mean": fed})
    return rows


def test_a_line_in_log2_fed_is_recovered_exactly():
    series = {W: (1.0 + 0.4 * np.log2(4.0 * W), 4.0 * W) for W in (2, 4, 8, 16, 32)}
    baseline = {"model": "m", "dtype": "float32", "experiment": "e", "decoder": "greedy", "baseline": "greedy",
                "item_id": "a", "N": np.nan, "W": np.nan, "G": np.nan, "prompt_pool": None, "params": "null",
                "steps": 40, "new_tokens": 40, "step_tokens_mean": 1.0}
    points = scaling_points(pd.DataFrame(_rows(series) + [baseline]))
    assert list(points["series"].unique()) == ["window N5"]
    assert points["S"].tolist() == pytest.approx([series[W][0] for W in (2, 4, 8, 16, 32)])
    fit = fit_lines(points).iloc[0]
    assert fit["slope"] == pytest.approx(0.4) and fit["intercept"] == pytest.approx(1.0)
    assert fit["r2"] == pytest.approx(1.0) and fit["points"] == 5


def test_points_weigh_items_by_steps_and_series_are_kept_apart(tmp_path):
    rows = _rows({4: (2.0, 16.0)}) + _rows({4: (3.0, 16.0), 8: (3.5, 32.0), 16: (3.6, 64.0)}, tree=True, pool=True)
    rows[1]["new_tokens"] = 4.0 * rows[1]["steps"]  # item b of the window setup: S 4 over 30 steps
    points = scaling_points(pd.DataFrame(rows))
    window = points[points["series"] == "window N5"].iloc[0]
    assert window["S"] == pytest.approx((2.0 * 10 + 4.0 * 30) / 40)
    fits = fit_lines(points)
    assert fits["series"].tolist() == ["tree N5 +pool"], "a series with under 3 budgets is not fitted"
    assert 0 < fits.iloc[0]["r2"] < 1
    plot(points, fits, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_a_results_file_with_only_its_header_leaves_the_points_alone(tmp_path):
    """A job killed before its first item leaves a header alone; the sweep's report reads past it."""
    from experiments.reporting.report import load_results
    from experiments.rows.schema import COLUMNS

    rows = pd.DataFrame(_rows({4: (2.0, 16.0), 8: (2.5, 32.0)}))
    full = pd.DataFrame(columns=list(COLUMNS))
    pd.concat([full, rows], ignore_index=True).to_csv(tmp_path / "a.csv", index=False)
    full.to_csv(tmp_path / "b.csv", index=False)
    points = scaling_points(load_results([tmp_path]))
    assert points["S"].tolist() == pytest.approx([2.0, 2.5])


def test_a_point_from_fewer_items_is_drawn_but_not_fitted(tmp_path):
    """A sweep still under way leaves its last point on fewer items: it must not bend the line."""
    series = {W: (1.0 + 0.4 * np.log2(4.0 * W), 4.0 * W) for W in (2, 4, 8)}
    rows = _rows(series) + [r for r in _rows({16: (9.0, 64.0)}) if r["item_id"] == "a"]   # 1 of 2 items
    points = scaling_points(pd.DataFrame(rows))
    assert points["complete"].tolist() == [True, True, True, False]
    fit = fit_lines(points).iloc[0]
    assert fit["points"] == 3 and fit["slope"] == pytest.approx(0.4) and fit["fed_max"] == 32.0
    plot(points, fit_lines(points), tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_the_papers_points_are_drawn_in_the_panels_of_their_experiment(tmp_path):
    """The paper's own points sit beside ours where the data set is theirs (MT-Bench), nowhere else."""
    from experiments.reporting.scaling import PAPER

    series = {W: (1.0 + 0.3 * np.log2(4.0 * W), 4.0 * W) for W in (2, 4, 8)}
    rows = pd.DataFrame(_rows(series))
    rows = pd.concat([rows.assign(experiment="mtbench"), rows.assign(experiment="humaneval")], ignore_index=True)
    points = scaling_points(rows)
    fig = plot(points, fit_lines(points), tmp_path / "scaling.png")
    drawn = {ax.get_title(): {line.get_label(): (line.get_xdata()[0], line.get_ydata()[0])
                              for line in ax.get_lines() if len(line.get_xdata())}
             for ax in fig.axes}
    for _, ref in PAPER.iterrows():
        assert drawn["m float32 / mtbench"][ref["label"]] == (ref["fed"], ref["S"])
        assert ref["label"] not in drawn["m float32 / humaneval"]


def test_a_model_in_another_dtype_is_its_own_panel_and_line(tmp_path):
    """bfloat16 rounds the model differently from float32: its S never pools with the float32 rows."""
    fp32 = {W: (1.0 + 0.4 * np.log2(4.0 * W), 4.0 * W) for W in (2, 4, 8)}
    bf16 = {W: (1.5 + 0.2 * np.log2(4.0 * W), 4.0 * W) for W in (2, 4, 8, 16)}
    one_item = [r for r in _rows(fp32) if r["item_id"] == "a"]   # fewer items than the bfloat16 points
    rows = pd.DataFrame(one_item + [{**r, "dtype": "bfloat16"} for r in _rows(bf16)])
    points = scaling_points(rows)
    assert points.groupby("dtype")["W"].apply(list).to_dict() == {"bfloat16": [2, 4, 8, 16], "float32": [2, 4, 8]}
    assert points["complete"].all(), "a panel's fullest point is counted within its own dtype"
    fits = fit_lines(points).set_index("dtype")
    assert fits.loc["float32", "slope"] == pytest.approx(0.4) and fits.loc["bfloat16", "slope"] == pytest.approx(0.2)
    fig = plot(points, fit_lines(points), tmp_path / "scaling.png")
    assert sorted(ax.get_title() for ax in fig.axes) == ["m bfloat16 / e", "m float32 / e"]


def test_the_markdown_table_gives_each_series_its_s_per_w_and_its_fit():
    from experiments.reporting.scaling import tables

    series = {W: (1.0 + 0.4 * np.log2(4.0 * W), 4.0 * W) for W in (2, 4, 8)}
    rows = _rows(series) + [r for r in _rows({16: (9.0, 64.0)}) if r["item_id"] == "a"]
    rows += _rows({2: (2.5, 8.0)}, tree=True, pool=True)
    rows[0]["diff_verdict"], rows[2]["diff_verdict"] = "near_tie", "mismatch"
    points = scaling_points(pd.DataFrame(rows))
    text = tables(points, fit_lines(points))
    assert text.splitlines()[0] == "m float32 / e (2 items a point unless marked)"
    assert "| series | W2 | W4 | W8 | W16 | slope per doubling | R^2 | points |" in text
    assert "| window N5 | 2.20 | 2.60 | 3.00 | 9.00 (1 items) | 0.400 | 1.000 | 3 |" in text
    assert "| tree N5 +pool | 2.50 | - | - | - | - | - | - |" in text
    assert "Rows equal to greedy: 7 of 9; left it at a near-tie: 1; at a confident token (a bug): 1." in text
