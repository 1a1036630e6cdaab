"""How the file source reads a file's range on an executor: JSON lines, CSV and Parquet.

Each reader takes ``where`` (the source's description, for errors) and gives
the items with where each came from (its line, or its row), so that a dead
letter names its file and line; :class:`_Origin` keeps that for a partition.
"""

from __future__ import annotations

import array
import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from sparkjet.contrib.files.common import _pyarrow_parquet


def _read_jsonl(
    where: str, fs: Any, path: str, begin: int, end: int, lines: array.array[int]
) -> tuple[int, list[Any]]:
    """The items of the lines starting in ``[begin, end)``, and where the first starts.

    ``lines`` gets each item's line, counted from 0 at that first line.
    """
    items = []
    with fs.open(path, "rb") as fh:
        pos = begin
        if begin > 0:  # the line starting before `begin` belongs to the range before
            fh.seek(begin - 1)
            pos = begin - 1 + len(fh.readline())
        start = pos
        n = -1
        while pos < end:
            line = fh.readline()
            if not line:
                break
            at = pos
            pos += len(line)
            n += 1
            text = line.strip()
            if not text:
                continue
            try:
                items.append(json.loads(text))
            except ValueError as exc:
                raise ValueError(
                    f"{where}: file {path} line {_line_number(fs, path, at)}: "
                    f"malformed JSON: {exc}: {text[:80]!r}"
                ) from exc
            lines.append(n)
    return start, items


def _read_csv(where: str, fs: Any, path: str, lines: array.array[int]) -> list[Any]:
    """The rows of a CSV file as dicts by its header; ``lines`` gets each row's line."""
    with fs.open(path, "rb") as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
        reader = csv.reader(text, strict=True)
        rows = []
        try:
            header = next(reader, None)
            if header is None:
                return []
            while True:
                first_line = reader.line_num + 1
                row = next(reader, None)
                if row is None:
                    break
                if not row:
                    continue
                if len(row) != len(header):
                    raise ValueError(
                        f"{where}: file {path} line {reader.line_num}: "
                        f"{len(row)} fields, the header has {len(header)}"
                    )
                rows.append(dict(zip(header, row, strict=True)))
                lines.append(first_line)
        except csv.Error as exc:
            raise ValueError(
                f"{where}: file {path} line {reader.line_num}: malformed CSV: {exc}"
            ) from exc
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{where}: file {path} near line {reader.line_num}: not UTF-8: {exc}"
            ) from exc
    return rows


def _read_parquet(where: str, fs: Any, path: str, begin: int, end: int) -> tuple[int, list[Any]]:
    """The rows of row groups ``[begin, end)``, and the file's row number of the first."""
    pq = _pyarrow_parquet(where)
    try:
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            first_row = sum(pf.metadata.row_group(g).num_rows for g in range(begin))
            groups = list(range(begin, end))
            if not groups:
                return first_row, []
            return first_row, list(pf.read_row_groups(groups).to_pylist())
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(
            f"{where}: file {path} is not a readable Parquet file: {exc}"
        ) from exc


#: How many descriptors' item origins a source keeps on an executor (for dead
#: letters, asked right after the read).
_ORIGINS_KEPT = 64


@dataclass
class _Origin:
    """Where a run of a partition's items came from: one file's range."""

    #: The index of the run's first item in the partition's items.
    first: int
    name: str
    path: str
    #: JSON lines: the byte the range's first line starts at (its line numbers
    #: in ``lines`` count from there); None: ``lines`` are the file's own.
    start: int | None
    #: Each item's line (JSON lines, CSV); None for Parquet.
    lines: array.array[int] | None
    #: Parquet: the file's row number of the run's first row.
    first_row: int = 0
    #: JSON lines: the line number of ``start``, once counted.
    base: int | None = None


def _descriptor_key(descriptor: Any) -> str:
    """A partition descriptor (a list of ``[file, begin, end]``) as a dictionary key."""
    return json.dumps(descriptor)


def _line_number(fs: Any, path: str, at: int) -> int:
    """The 1-based number of the line starting at byte ``at`` (on the error path only)."""
    with fs.open(path, "rb") as fh:
        return int(fh.read(at).count(b"\n")) + 1
