"""Draft tables from result rows: acceptance per source and depth, and the reliability diagram of
the estimates the token tree's cuts were made with (``DraftStats.counts.table()`` and
``DraftStats.reliability.rows()``, as the rows' ``draft_acceptance`` and ``draft_reliability``
JSON columns)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd


def _summed(df: pd.DataFrame, column: str, key: str, counts) -> dict[tuple[str, str, int], Counter]:
    """Per (decoder, source, ``key``) of the rows' JSON ``column``: ``counts(entry)`` summed over rows."""
    totals: dict[tuple[str, str, int], Counter] = {}
    records = df[column] if column in df else pd.Series(dtype=object)
    for decoder, record in zip(df["decoder"], records):
        if isinstance(record, str) and record:
            for r in json.loads(record):
                totals.setdefault((decoder, r["source"], int(r[key])), Counter()).update(counts(r))
    return totals


def draft_acceptance(df: pd.DataFrame) -> pd.DataFrame:
    """Per core decoder, draft source and depth: nodes fed, tried (the walk reached their parent)
    and accepted, summed over prompts, and acceptance = accepted / tried (the rows'
    ``draft_acceptance``: ``DraftStats.counts.table()`` as JSON)."""
    totals = _summed(df, "draft_acceptance", "depth", lambda r: {k: r[k] for k in ("fed", "tried", "accepted")})
    return pd.DataFrame([{"decoder": d, "source": s, "depth": k, **c,
                          "acceptance": c["accepted"] / c["tried"] if c["tried"] else None}
                         for (d, s, k), c in totals.items()])


def draft_reliability(df: pd.DataFrame) -> pd.DataFrame:
    """Per core decoder, draft source and decile of the estimate a tried node was fed under: nodes
    tried, their mean estimate (predicted) and the share accepted (observed), summed over prompts
    (the rows' ``draft_reliability``: ``DraftStats.reliability.rows()`` as JSON)."""
    totals = _summed(df, "draft_reliability", "bin", lambda r: {
        "tried": r["tried"], "predicted": r["predicted"] * r["tried"], "accepted": r["observed"] * r["tried"]})
    return pd.DataFrame([{"decoder": d, "source": s, "bin": b, "tried": c["tried"],
                          "predicted": c["predicted"] / c["tried"], "observed": c["accepted"] / c["tried"]}
                         for (d, s, b), c in sorted(totals.items()) if c["tried"]])


def plot_reliability(table: pd.DataFrame, path: Path, title: str) -> None:
    """A reliability diagram per draft source: observed against predicted acceptance per decile of
    the estimate (marker area: nodes tried), one line per decoder, the diagonal = calibrated."""
    from matplotlib.figure import Figure            # outside pyplot: no backend switch, nothing global

    sources = sorted(table["source"].unique())
    fig = Figure(figsize=(3.6 * len(sources), 3.6), layout="tight")
    axes = fig.subplots(1, len(sources), squeeze=False, sharey=True)
    for ax, source in zip(axes[0], sources):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for decoder, part in table[table["source"] == source].groupby("decoder"):
            ax.plot(part["predicted"], part["observed"], marker="o", lw=1, label=decoder, alpha=0.8)
            ax.scatter(part["predicted"], part["observed"], s=8 + 60 * part["tried"] / table["tried"].max(), alpha=0.4)
        ax.set(title=source, xlabel="predicted acceptance (given the parent)", xlim=(0, 1), ylim=(0, 1))
        ax.legend(fontsize=6, loc="upper left")
    axes[0][0].set_ylabel("observed acceptance")
    fig.suptitle(f"{title}: draft estimates, predicted vs observed", fontsize=9)
    fig.savefig(path, dpi=120)
