"""The scaling law from result rows: step compression S against log2(tokens fed per step).

The paper's claim is that S grows linearly in the log of the FLOPs a step spends. Here a step's
FLOPs are measured as the tokens it feeds (the rows' ``step_tokens_mean``), so each run setup
(model, experiment, decoder settings) is one point, and each series (the linear branches at one N,
with or without the prompt pool, or the token trees) gets a least-squares line
S = intercept + slope * log2(fed) with its R^2.

    python -m experiments.reporting.scaling results/scaling/<set>... --out results/scaling/report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from experiments.reporting.report import load_results
from experiments.reporting.tables import markdown

# A panel is one model in one dtype on one data set (a dtype rounds the model differently, so its S
# is its own); a point is one decoder setup within a panel.
PANEL = ["model", "dtype", "experiment"]
SETUP = [*PANEL, "decoder", "N", "W", "G", "prompt_pool", "tree"]

# The paper's own points, drawn beside ours in the panels of their data set: LLaMA-2-7B-chat on
# MT-Bench at W = G = 15, N = 5 (a step feeds 1 + 2 * 15 * 4 = 121 tokens), as the paper's
# evaluation is quoted (not re-measured, nor checked against the paper's PDF here). Its
# scaling-law figure gives no table to read.
PAPER = pd.DataFrame([
    {"experiment": "mtbench", "label": "paper: LLaMA-2-7B-chat W15 N5", "fed": 121.0, "S": 1.96, "marker": "*"},
    {"experiment": "mtbench", "label": "paper: LLaMA-2-7B-chat W15 N5 +pool", "fed": 121.0, "S": 2.05,
     "marker": "P"},
])


def _series(row: pd.Series) -> str:
    """The series a setup belongs to: its branch kind at its N."""
    kind = "tree" if bool(row["tree"]) else "window"
    return f"{kind} N{int(row['N'])}" + (" +pool" if bool(row["prompt_pool"]) else "")


def scaling_points(df: pd.DataFrame) -> pd.DataFrame:
    """One point per run setup of a core decoder (rows with an N): S = new tokens / steps and
    fed = tokens fed per step, both summed over the setup's rows (a long item weighs by its steps,
    as in the step compression); ``near_tie`` and ``mismatch``: its rows whose output left greedy's,
    by the verdict on the first differing token."""
    df = df.copy()
    df["tree"] = [bool((json.loads(p) or {}).get("tree", False)) if isinstance(p, str) and p else False
                  for p in df.get("params", pd.Series([None] * len(df), index=df.index))]
    df = df[(df["steps"].fillna(0) > 0) & df["N"].notna()]  # core decoders' rows: those with an N
    df["prompt_pool"] = df["prompt_pool"].fillna(False).astype(bool)
    df["fed_total"] = df["step_tokens_mean"] * df["steps"]
    verdict = df["diff_verdict"] if "diff_verdict" in df else pd.Series(None, index=df.index, dtype=object)
    df["near_tie"], df["mismatch"] = (verdict == "near_tie").astype(int), (verdict == "mismatch").astype(int)
    grouped = df.groupby(SETUP, dropna=False).agg(
        items=("item_id", "nunique"), rows=("item_id", "size"), new_tokens=("new_tokens", "sum"),
        steps=("steps", "sum"), fed_total=("fed_total", "sum"), near_tie=("near_tie", "sum"),
        mismatch=("mismatch", "sum")).reset_index()
    grouped["S"] = grouped["new_tokens"] / grouped["steps"]
    grouped["fed"] = grouped["fed_total"] / grouped["steps"]
    grouped["log2_fed"] = np.log2(grouped["fed"])
    grouped["series"] = grouped.apply(_series, axis=1)
    # a point from fewer items than its panel's others is a run still under way: drawn, not fitted
    grouped["complete"] = grouped["items"] == grouped.groupby(PANEL)["items"].transform("max")
    return grouped.drop(columns="fed_total").sort_values([*PANEL, "series", "fed"], ignore_index=True)


def fit_lines(points: pd.DataFrame) -> pd.DataFrame:
    """Per panel (model, dtype, experiment) and series, with at least 3 distinct budgets among its
    complete points (as many items as the panel's fullest point): the least-squares line of S on
    log2(fed), its R^2 and the range it was fitted over."""
    fits = []
    for (model, dtype, experiment, series), group in points[points["complete"]].groupby([*PANEL, "series"]):
        x, y = group["log2_fed"].to_numpy(float), group["S"].to_numpy(float)
        if len(np.unique(x)) < 3:
            continue
        slope, intercept = np.polyfit(x, y, 1)
        residual = float(((y - (intercept + slope * x)) ** 2).sum())
        total = float(((y - y.mean()) ** 2).sum())
        fits.append({"model": model, "dtype": dtype, "experiment": experiment, "series": series, "points": len(group),
                     "slope": float(slope), "intercept": float(intercept),
                     "r2": 1.0 - residual / total if total > 0 else float("nan"),
                     "fed_min": float(group["fed"].min()), "fed_max": float(group["fed"].max())})
    return pd.DataFrame(fits, columns=[*PANEL, "series", "points", "slope", "intercept", "r2",
                                       "fed_min", "fed_max"])


def _fit(fits: pd.DataFrame, panel: tuple, series: str) -> pd.Series | None:
    """The fitted line of ``series`` in ``panel`` (a (model, dtype, experiment) key), if it has one."""
    found = fits[(fits[PANEL] == pd.Series(panel, index=PANEL)).all(axis=1) & (fits["series"] == series)]
    return None if found.empty else found.iloc[0]


def plot(points: pd.DataFrame, fits: pd.DataFrame, path: Path) -> Figure:
    """One panel per (model, dtype, experiment), a row per model and dtype and a column per
    experiment: S against tokens fed per step (log2 axis), points and fits (hollow: a point still
    under way, left out of the fit), and the paper's points of that experiment (black marks); a
    figure outside pyplot, as the report draws its own."""
    runs = sorted(points.groupby(["model", "dtype"]).groups)
    experiments = sorted(points["experiment"].unique())
    # one color a series, the same in every panel
    colors = {series: f"C{i % 10}" for i, series in enumerate(sorted(points["series"].unique()))}
    fig = Figure(figsize=(6 * len(experiments), 4.5 * len(runs)), layout="tight")
    axes = fig.subplots(len(runs), len(experiments), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)                       # a model not run on a set leaves its panel empty
    for (model, dtype, experiment), group in points.groupby(PANEL):
        ax = axes[runs.index((model, dtype)), experiments.index(experiment)]
        ax.set_visible(True)
        for series, line in group.groupby("series"):
            done, running = line[line["complete"]], line[~line["complete"]]
            ax.plot(done["fed"], done["S"], "o", color=colors[series], label=series)
            ax.plot(running["fed"], running["S"], "o", color=colors[series], markerfacecolor="none")
            f = _fit(fits, (model, dtype, experiment), series)
            if f is not None:
                xs = np.linspace(np.log2(f["fed_min"]), np.log2(f["fed_max"]), 20)
                ax.plot(2 ** xs, f["intercept"] + f["slope"] * xs, "-", color=colors[series], alpha=0.6)
        for _, ref in PAPER[PAPER["experiment"] == experiment].iterrows():
            ax.plot([ref["fed"]], [ref["S"]], ref["marker"], color="black", label=ref["label"])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens fed per step")
        ax.set_ylabel("S (tokens per step)")
        ax.set_title(f"{model} {dtype} / {experiment}")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return fig


def tables(points: pd.DataFrame, fits: pd.DataFrame) -> str:
    """Markdown, one table per panel: S of each series at each W (a point still under way says on how
    many items), and the series' fitted slope per doubling, R^2 and number of fitted points; under it,
    how many of the panel's rows left greedy's output, and by which verdict."""
    blocks = []
    for key, panel in points.groupby(PANEL):
        ws = sorted(int(w) for w in panel["W"].unique())
        table = []
        for series, line in panel.groupby("series"):
            row = {"series": series} | {f"W{w}": "-" for w in ws}
            for _, point in line.iterrows():
                row[f"W{int(point['W'])}"] = f"{point['S']:.2f}" + (
                    "" if point["complete"] else f" ({int(point['items'])} items)")
            fit = _fit(fits, key, series)
            row |= ({"slope per doubling": "-", "R^2": "-", "points": "-"} if fit is None else
                    {"slope per doubling": f"{fit['slope']:.3f}", "R^2": f"{fit['r2']:.3f}",
                     "points": str(int(fit["points"]))})
            table.append(row)
        rows, near, bad = (int(panel[c].sum()) for c in ("rows", "near_tie", "mismatch"))
        blocks.append(f"{' '.join(key[:2])} / {key[2]} ({int(panel['items'].max())} items a point unless marked)"
                      f"\n\n{markdown(pd.DataFrame(table))}\n\nRows equal to greedy: {rows - near - bad} of "
                      f"{rows}; left it at a near-tie: {near}; at a confident token (a bug): {bad}.")
    return "\n\n".join(blocks) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="result directories (their CSVs are read)")
    parser.add_argument("--out", type=Path, required=True, help="where points.csv, fits.csv, tables.md, scaling.png go")
    args = parser.parse_args(argv)
    points = scaling_points(load_results(args.dirs))
    fits = fit_lines(points)
    args.out.mkdir(parents=True, exist_ok=True)
    points.to_csv(args.out / "points.csv", index=False)
    fits.to_csv(args.out / "fits.csv", index=False)
    plot(points, fits, args.out / "scaling.png")
    (args.out / "tables.md").write_text(tables(points, fits))
    print(fits.to_string(index=False))


if __name__ == "__main__":
    main()
