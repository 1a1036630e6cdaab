"""The file source's plans, on the driver: which file ranges a micro-batch reads, in partitions.

The offsets (kept in the job's checkpoint) say which files are done, how far
the open file was read, and which ranges the next micro-batch reads:
:func:`advance` moves them past the next micro-batch within its caps, and
:func:`pack` cuts the ranges into pieces of about ``split_bytes`` (JSON
lines by bytes, Parquet by row groups, :func:`row_groups`) and deals them
into partitions. Pure but for reading a Parquet file's footer.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkjet.contrib.files.common import _open_fs, _pyarrow_parquet
from sparkjet.contrib.files.listing import Listing


def fingerprint(offsets: Any) -> str:
    """A short hash of ``offsets``: a micro-batch's offsets name the ones they follow."""
    return hashlib.sha1(json.dumps(offsets, sort_keys=True).encode()).hexdigest()[:16]


def advance(
    start: Any, listing: Listing, stable: Listing, *, format: str, max_files_per_batch: int,
    max_bytes_per_batch: int | None, late_seconds: float, where: str, stage: str,
) -> Any:
    """The offsets after the next micro-batch from ``start``: ``start`` itself if none.

    ``listing``: every matching file; ``stable``: those settled. A file is
    done only once its last byte was planned: the open file (read up to a
    position) waits, and the micro-batch with it, until it is settled in
    this driver's listing (a new driver has settled nothing yet); it is
    then read on from its position to its size, so bytes appended while it
    was open are read too. An open file that is gone or shorter than its
    position is an error: its rest cannot be read, and is never skipped.
    ``where``: the source's description, ``stage`` its stage (for errors).
    """
    floor = start["floor"]
    done = {d[1]: d[0] for d in start["done"]}
    opened = start["open"]
    pending = [
        f for f in stable
        if f[1] not in done and (floor is None or f[0] >= floor)
        and not (opened and f[1] == opened[0])
    ]
    by_name = {f[1]: f for f in stable}
    if opened is not None:
        name, position = opened[0], opened[1]
        listed = next((f for f in listing if f[1] == name), None)
        read_to = (f"{where}, stage {stage!r}: file {name}, read up to byte "
                   f"{position},")
        if listed is None:
            raise FileNotFoundError(
                f"{read_to} is gone (deleted or renamed before its rest was read)")
        if listed[2] < position:
            raise ValueError(
                f"{read_to} is now {listed[2]} bytes, shorter than what was read "
                "(truncated or replaced while it was being read)")
        if name not in by_name:
            return start  # not settled here (yet): wait rather than guess its size
        pending.insert(0, by_name[name])
    budget = max_bytes_per_batch
    batch: list[list[Any]] = []
    new_done = [list(d) for d in start["done"]]
    new_open = None
    for files, (mtime, name, size) in enumerate(pending):
        if files >= max_files_per_batch or (budget is not None and budget <= 0):
            break
        begin = opened[1] if opened is not None and name == opened[0] else 0
        end = size
        if (budget is not None and format == "jsonl" and end - begin > budget
                and batch):
            break  # a big file starts the next micro-batch
        if budget is not None and format == "jsonl" and end - begin > budget:
            end = begin + budget
        if budget is not None:
            budget -= end - begin
        batch.append([name, begin, end])
        if end < size:
            new_open = [name, end, mtime]
        else:
            new_done.append([mtime, name])
    if not batch:
        return start
    newest = max(d[0] for d in new_done) if new_done else None
    new_floor = floor
    if newest is not None:
        candidate = newest - int(late_seconds * 1_000_000)
        if new_open is not None:
            candidate = min(candidate, new_open[2])
        new_floor = candidate if floor is None else max(floor, candidate)
        new_done = [d for d in new_done if d[0] >= new_floor]
    return {"floor": new_floor, "done": sorted(new_done), "open": new_open,
            "batch": batch, "after": fingerprint(start)}


def pack(
    batch: Sequence[Sequence[Any]], *, format: str, split_bytes: int, parallelism: int,
    row_groups: Callable[[str], list[tuple[str, int, int, int]]],
) -> list[Any]:
    """Pieces of at most ``split_bytes`` (JSON lines by bytes, Parquet by row groups).

    ``batch``: ``(file, begin, end)`` ranges; ``row_groups(file)``: a Parquet
    file's pieces (see :func:`row_groups`). Dealt into at least
    ``parallelism`` partitions, each about as big as the others.
    """
    pieces: list[tuple[str, int, int, int]] = []  # (file, begin, end, size)
    for name, begin, end in batch:
        if format == "jsonl" and end - begin > split_bytes:
            for at in range(begin, end, split_bytes):
                stop = min(at + split_bytes, end)
                pieces.append((name, at, stop, stop - at))
        elif format == "parquet":
            pieces.extend(row_groups(name))
        else:
            pieces.append((name, begin, end, end - begin))
    if not pieces:
        return []
    total = sum(p[3] for p in pieces)
    count = min(len(pieces), max(parallelism, math.ceil(total / split_bytes)))
    share = total / count
    partitions: list[list[tuple[str, int, int]]] = [[]]
    filled = 0.0
    for name, begin, end, size in pieces:
        if partitions[-1] and filled + size > share and len(partitions) < count:
            partitions.append([])
            filled = 0.0
        partitions[-1].append((name, begin, end))
        filled += size
    return partitions


def row_groups(
    url: str, storage_options: Mapping[str, Any], name: str, split_bytes: int, where: str,
) -> list[tuple[str, int, int, int]]:
    """A Parquet file's pieces ``(file, first group, end group, bytes)``, from its footer.

    Consecutive row groups up to about ``split_bytes`` each.
    """
    pq = _pyarrow_parquet(where)
    fs, root = _open_fs(url, storage_options)
    path = f"{root}/{name}"
    try:
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{where}: file {path} was listed but is gone"
        ) from exc
    except Exception as exc:
        raise ValueError(
            f"{where}: file {path} is not a readable Parquet file: {exc}"
        ) from exc
    groups = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
    if not groups:
        return []
    pieces, begin, size = [], 0, 0
    for i, group in enumerate(groups):
        size += group
        if size >= split_bytes or i == len(groups) - 1:
            pieces.append((name, begin, i + 1, size))
            begin, size = i + 1, 0
    return pieces
