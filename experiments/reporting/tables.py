"""The one markdown-table writer of every report, view, preset and of the GPU command. Standard
library only: scripts/gpu_run.py writes its tables with it without pandas (a DataFrame is read
through its own methods)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def markdown(table, columns: Sequence[str] | None = None, *, floatfmt: str = ".3g", drop_empty: bool = False,
             empty: str = "(no results)", missing: str = "") -> str:
    """A GitHub markdown table of ``columns`` (default: all) that exist in ``table`` (a DataFrame, or
    rows as dicts); with ``drop_empty``, only those that hold a value. Floats are written with
    ``floatfmt``, missing values (None, NaN, NA) as ``missing``; cells that are already strings
    (pre-formatted, e.g. ``1.23x``) are written as they are."""
    rows, present = _records(table)
    if not rows:
        return empty
    wanted = [c for c in (columns or present) if c in present]
    if drop_empty:
        wanted = [c for c in wanted if any(not _missing(r.get(c)) for r in rows)]

    def text(value: object) -> str:
        if _missing(value):
            return missing
        if isinstance(value, float):
            return format(value, floatfmt)
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(str, wanted)) + " |", "|" + "---|" * len(wanted)]
    lines += ["| " + " | ".join(text(row.get(c)) for c in wanted) + " |" for row in rows]
    return "\n".join(lines)


def cell(value: object, spec: str) -> str:
    """``value`` formatted with ``spec``, or an empty cell for a missing value."""
    return "" if _missing(value) else format(value, spec)


def _records(table) -> tuple[list[dict], list]:
    """The rows of ``table`` as dicts, and its columns in order (a DataFrame's, else first seen)."""
    if hasattr(table, "to_dict") and hasattr(table, "columns"):          # a DataFrame
        return table.to_dict("records"), list(table.columns)
    rows = list(table)
    return rows, list(dict.fromkeys(key for row in rows for key in row))


def _missing(value: object) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    return type(value).__name__ == "NAType"          # pandas.NA, without importing pandas
