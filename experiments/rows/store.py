"""The job's CSV store: append-only, resumable, torn-write safe."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from experiments.rows.schema import COLUMNS


class ResultStore:
    """The job's CSV: finished items are read back, rows of unfinished items are dropped.

    ``plan`` maps each item id of this job to its expected (turn, decoder) keys. Rows of items
    outside the plan (another subset of the same settings) are kept as they are. Each item's rows
    are appended in one write and flushed, so a crash loses at most the item in progress; a row
    torn by a crash mid-write is detected (no final newline) and dropped with its item. A file
    written with fewer columns (an older version) is rewritten with today's, the new ones empty.
    """

    def __init__(self, path: Path, plan: dict[str, frozenset[tuple[str, str]]]) -> None:
        self.path = path
        self._torn = self._outdated = False
        rows = self._read() if path.exists() else []
        keys: dict[str, set[tuple[str, str]]] = {}
        for row in rows:
            keys.setdefault(row["item_id"], set()).add((row["turn"], row["decoder"]))
        self.finished = {item for item, expected in plan.items() if expected <= keys.get(item, set())}
        kept = [row for row in rows if row["item_id"] not in plan or row["item_id"] in self.finished]
        if not path.exists() or len(kept) != len(rows) or self._torn or self._outdated:
            self._rewrite(kept)

    def _read(self) -> list[dict[str, str]]:
        text = self.path.read_text(encoding="utf-8")
        self._torn = bool(text) and not text.endswith("\n")
        records = list(csv.reader(io.StringIO(text)))
        if not records:
            return []
        header, body = tuple(records[0]), records[1:]
        unknown = [column for column in header if column not in COLUMNS]
        if unknown:
            raise RuntimeError(f"{self.path} has columns this version does not write ({', '.join(unknown)}); "
                               "move it away to start afresh")
        self._outdated = header != COLUMNS
        if self._torn:
            body = body[:-1]
        return [{**dict.fromkeys(COLUMNS, ""), **dict(zip(header, record))} for record in body]

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".csv.partial")
        partial.write_text(_render(rows, header=True), encoding="utf-8")
        os.replace(partial, self.path)

    def append(self, rows: list[dict[str, Any]]) -> None:
        with open(self.path, "a", encoding="utf-8", newline="") as handle:
            handle.write(_render(rows))
            handle.flush()
            os.fsync(handle.fileno())


def _render(rows: list[dict[str, Any]], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="raise")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
