"""The one markdown-table writer of every report, view and preset."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd


def markdown(table: pd.DataFrame, columns: Sequence[str] | None = None, *, floatfmt: str = ".3g",
             drop_empty: bool = False, empty: str = "(no results)") -> str:
    """A GitHub markdown table of ``columns`` (default: all) that exist in ``table``; with
    ``drop_empty``, only those that hold a value. Floats are written with ``floatfmt``; cells that
    are already strings (pre-formatted, e.g. ``1.23x``) are written as they are."""
    if table.empty:
        return empty
    wanted = [c for c in (columns or table.columns) if c in table.columns]
    if drop_empty:
        wanted = [c for c in wanted if table[c].notna().any()]
    def text(value: object) -> str:
        if isinstance(value, float):
            return "" if pd.isna(value) else format(value, floatfmt)
        return "" if value is None or value is pd.NA else str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(str, wanted)) + " |", "|" + "---|" * len(wanted)]
    lines += ["| " + " | ".join(text(v) for v in row) + " |" for row in table[wanted].itertuples(index=False)]
    return "\n".join(lines)


def cell(value: object, spec: str) -> str:
    """``value`` formatted with ``spec``, or an empty cell for a missing value."""
    return "" if value is None or (not isinstance(value, str) and pd.isna(value)) else format(value, spec)
