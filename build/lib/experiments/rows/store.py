"""The job's CSV store: append-only, resumable, torn-write safe, plain or gzip (``.csv.gz``)."""

from __future__ import annotations

import csv
import gzip
import io
import os
import zlib
from pathlib import Path
from typing import Any

from experiments.rows.schema import COLUMNS


def sidecar(results: Path, suffix: str) -> Path:
    """A file kept beside a results file, named by its stem: ``x.csv`` or ``x.csv.gz`` -> ``x<suffix>``
    (``.yaml``: the job's config; ``.auto.json``: auto's calibration record)."""
    name = results.name
    for ending in (".csv.gz", ".csv"):
        if name.endswith(ending):
            return results.with_name(name[:-len(ending)] + suffix)
    return results.with_name(name + suffix)


class ResultStore:
    """The job's CSV: finished items are read back, rows of unfinished items are dropped.

    ``plan`` maps each item id of this job to its expected (turn, decoder) keys. Rows of items
    outside the plan (another subset of the same settings) are kept as they are. Each item's rows
    are appended in one write and flushed, so a crash loses at most the item in progress; a row
    torn by a crash mid-write is detected (no final newline) and dropped with its item. A file
    written with fewer columns (an older version) is rewritten with today's, the new ones empty.

    A ``.csv.gz`` path (committed results are kept compressed) is read and resumed the same way:
    each append adds one gzip member (gzip readers, pandas included, read the members as one
    stream), and a member torn by a crash is dropped with its items.
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

    @property
    def _gzip(self) -> bool:
        return self.path.suffix == ".gz"

    def _read(self) -> list[dict[str, str]]:
        text, torn_member = _inflate(self.path.read_bytes()) if self._gzip else (self.path.read_text(encoding="utf-8"), False)
        torn_row = bool(text) and not text.endswith("\n")
        self._torn = torn_row or torn_member
        records = list(csv.reader(io.StringIO(text)))
        if not records:
            return []
        header, body = tuple(records[0]), records[1:]
        unknown = [column for column in header if column not in COLUMNS]
        if unknown:
            raise RuntimeError(f"{self.path} has columns this version does not write ({', '.join(unknown)}); "
                               "move it away to start afresh")
        self._outdated = header != COLUMNS
        if torn_row:
            body = body[:-1]
        return [{**dict.fromkeys(COLUMNS, ""), **dict(zip(header, record))} for record in body]

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_bytes(self._encode(_render(rows, header=True)))
        os.replace(partial, self.path)

    def append(self, rows: list[dict[str, Any]]) -> None:
        with open(self.path, "ab") as handle:
            handle.write(self._encode(_render(rows)))
            handle.flush()
            os.fsync(handle.fileno())

    def _encode(self, text: str) -> bytes:
        data = text.encode("utf-8")
        return gzip.compress(data, mtime=0) if self._gzip else data


def _inflate(data: bytes) -> tuple[str, bool]:
    """The text of a multi-member gzip file and whether its last member was torn by a crash (that
    member is dropped: its items then lack rows and are decoded again)."""
    text, rest = [], data
    while rest:
        member = zlib.decompressobj(wbits=31)
        try:
            chunk = member.decompress(rest)
        except zlib.error:
            return "".join(text), True
        if not member.eof:
            return "".join(text), True
        text.append(chunk.decode("utf-8"))
        rest = member.unused_data
    return "".join(text), False


def _render(rows: list[dict[str, Any]], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="raise")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
