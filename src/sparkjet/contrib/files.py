"""Files in a folder or bucket prefix as a source and a sink (Jet's ``Sources.files``).

Any fsspec URL works: a local folder, ``s3://bucket/prefix``, ``gcs://bucket/prefix``
(with the ``s3`` or ``gcs`` extra). Formats: JSON lines (``json``), CSV (``csv``,
a header row, rows as dicts) and Parquet (pyarrow, the ``files`` extra, imported
only when Parquet is used; rows as dicts).

:class:`FileSource` reads every file of the folder once in a batch job; in a
streaming job it picks up new files as they land, in the order of their
modification time and name, a bounded number per micro-batch, and only once a
file has stopped changing. Its offsets (kept in the job's checkpoint, never in
the folder) say which files are done and how far the file being read is, so
every guarantee holds, EXACTLY_ONCE included.

:class:`FileSink` writes one file per micro-batch and partition, named after
the micro-batch, and then a commit marker ``_committed/<batch>.json`` naming
them: readers that honour the markers (:func:`committed_files`,
:func:`read_committed`) see whole micro-batches only, each once, even when a
micro-batch was written twice after a failure.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import csv
import fnmatch
import hashlib
import io
import json
import logging
import math
import posixpath
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from sparkjet.plugin import (
    ALL_GUARANTEES,
    InputSize,
    JobContext,
    Sink,
    Source,
    TaskContext,
    file_modified,
    hookimpl,
    open_file_store,
)

__all__ = [
    "FORMATS",
    "FileSink",
    "FileSource",
    "committed_files",
    "read_committed",
]

log = logging.getLogger(__name__)

#: The formats the source reads; the sink writes ``jsonl`` and ``parquet``.
FORMATS = ("jsonl", "csv", "parquet")
_SINK_FORMATS = ("jsonl", "parquet")
#: The folder of the sink's commit markers, under its URL.
MARKERS = "_committed"


def _pyarrow_parquet(what: str) -> Any:
    """``pyarrow.parquet``, imported on first use, or an error naming the extra."""
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - pyarrow is installed in tests
        raise ImportError(
            f"{what}: Parquet needs pyarrow: pip install 'sparkjet[files]'"
        ) from exc
    return pq


def _open_fs(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options))
    return fs, str(root).rstrip("/") or "/"


def _mtime_us(info: Mapping[str, Any]) -> int:
    """A listing entry's modification time in microseconds; 0 if the backend gives none."""
    return round((file_modified(info) or 0.0) * 1_000_000)


def _fingerprint(offsets: Any) -> str:
    return hashlib.sha1(json.dumps(offsets, sort_keys=True).encode()).hexdigest()[:16]


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


class FileSource(Source):
    """The files of a folder or bucket prefix, as items: JSON values, CSV rows or Parquet rows.

    ``url``: a local folder or an fsspec URL (``s3://bucket/prefix``). ``glob``:
    which files, matched against each file's path relative to ``url`` (default
    ``*.<format>``); names starting with ``.`` or ``_`` are never read (temporary
    files, the sink's markers). ``format``: ``"jsonl"``, ``"csv"`` or
    ``"parquet"``. ``recursive``: look in subfolders too. ``storage_options``:
    passed to fsspec (credentials, endpoint).

    Streaming (``streaming=True``, the default): new files are picked up in the
    order of (modification time, name), at most ``max_files_per_batch`` files
    and about ``max_bytes_per_batch`` bytes per micro-batch (a JSON-lines file
    larger than that is read over several micro-batches, at line boundaries).
    A file is read once its size and modification time have not changed for
    ``settle_seconds`` (0: as soon as it is listed, for writers that rename
    finished files into place). A file read over several micro-batches is
    done only once its last byte was read: a new driver waits until it has
    settled in its own listing and reads on from the position reached; a file
    gone or shorter than that position is an error. The folder is listed at
    most every ``poll_seconds``. A file that appears with a modification time more than
    ``late_seconds`` older than the newest file already read is not read.
    ``initial_position``: ``"oldest"`` (the files already there too) or
    ``"latest"`` (only files that land after the job starts).

    With ``streaming=False`` the source is bounded: a batch job reads every
    matching file once, as the folder is when the job starts.
    """

    kind = "files"
    guarantees = ALL_GUARANTEES
    streaming = True
    accepts_start = True  # latest_offsets caps files and bytes per micro-batch from start

    def __init__(
        self,
        url: str,
        glob: str | None = None,
        format: str = "jsonl",
        *,
        streaming: bool = True,
        recursive: bool = False,
        max_files_per_batch: int = 1000,
        max_bytes_per_batch: int | None = None,
        split_bytes: int = 64 * 1024 * 1024,
        settle_seconds: float = 1.0,
        poll_seconds: float = 1.0,
        late_seconds: float = 600.0,
        initial_position: str = "oldest",
        storage_options: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        url = str(url)
        super().__init__(name or url)
        where = f"FileSource({url!r})"
        if format not in FORMATS:
            raise ValueError(f"{where}: format must be one of {', '.join(FORMATS)}; got {format!r}")
        glob = f"*.{format}" if glob is None else glob
        if not isinstance(glob, str) or not glob or glob.startswith("/") or ".." in glob.split("/"):
            raise ValueError(
                f"{where}: glob must be a pattern relative to the folder, like '*.jsonl'; "
                f"got {glob!r}"
            )
        if not isinstance(max_files_per_batch, int) or max_files_per_batch < 1:
            raise ValueError(
                f"{where}: max_files_per_batch must be >= 1; got {max_files_per_batch!r}"
            )
        if max_bytes_per_batch is not None and max_bytes_per_batch < 1:
            raise ValueError(
                f"{where}: max_bytes_per_batch must be >= 1; got {max_bytes_per_batch!r}"
            )
        if split_bytes < 1:
            raise ValueError(f"{where}: split_bytes must be >= 1; got {split_bytes!r}")
        if initial_position not in ("oldest", "latest"):
            raise ValueError(
                f"{where}: initial_position must be 'oldest' or 'latest'; got {initial_position!r}"
            )
        for label, value in (("settle_seconds", settle_seconds), ("poll_seconds", poll_seconds),
                             ("late_seconds", late_seconds)):
            if value < 0:
                raise ValueError(f"{where}: {label} must be >= 0; got {value!r}")
        self.url = url
        self.glob = glob
        self.format = format
        self.streaming = streaming  # type: ignore[misc]  # bounded when False
        self.recursive = recursive
        self.max_files_per_batch = max_files_per_batch
        self.max_bytes_per_batch = max_bytes_per_batch
        self.split_bytes = split_bytes
        self.settle_seconds = settle_seconds
        self.poll_seconds = poll_seconds
        self.late_seconds = late_seconds
        self.initial_position = initial_position
        self.storage_options = dict(storage_options or {})
        self._reset()

    def _reset(self) -> None:
        # Driver-only memory: the previous listing (for "unchanged since") and
        # the settled files of the last one (listed at most every poll_seconds).
        self._seen: dict[str, tuple[int, int, float]] = {}
        self._listing: list[tuple[int, str, int]] = []
        self._settled: list[tuple[int, str, int]] | None = None
        self._listed_at = -math.inf
        self._warned: set[tuple[str, int]] = set()  # (file, mtime) changed after it was read
        # Executor-only memory: where the items of the partitions read last came
        # from, for dead letters (see offset_of).
        self._origins: dict[str, list[_Origin]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_seen", "_listing", "_settled", "_listed_at", "_warned", "_origins"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def describe(self) -> str:
        """``files:<name>``: the ``name`` given, else the url (stage names come from it)."""
        return f"files:{self.name}"

    def identity(self) -> Any:
        """What the source reads: the folder, the files' pattern and format (not the label)."""
        return {"url": self.url, "glob": self.glob, "format": self.format,
                "recursive": self.recursive}

    # --- listing (driver) ------------------------------------------------------

    def _list(self, missing_ok: bool = True) -> list[tuple[int, str, int]]:
        """Every matching file as (mtime in µs, path relative to the url, size), sorted.

        A folder that does not exist holds no files yet (a stream's folder may
        appear later); with ``missing_ok`` False it is an error naming it.
        """
        fs, root = _open_fs(self.url, self.storage_options)
        with contextlib.suppress(Exception):  # a filesystem without a listing cache
            fs.invalidate_cache(root)
        try:
            if self.recursive:
                entries = list(fs.find(root, detail=True).values())
            else:
                entries = fs.ls(root, detail=True)
        except FileNotFoundError as exc:
            if missing_ok:
                return []
            raise FileNotFoundError(
                f"{self.describe()}: folder {root} does not exist") from exc
        prefix = root.rstrip("/") + "/"
        found = []
        for info in entries:
            if info.get("type") not in ("file", None):
                continue
            path = str(info["name"])
            relative = path[len(prefix):] if path.startswith(prefix) else posixpath.basename(path)
            if _hidden(relative) or not fnmatch.fnmatchcase(relative, self.glob):
                continue
            found.append((_mtime_us(info), relative, int(info.get("size") or 0)))
        return sorted(found)

    def _stable(self, listing: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
        now = time.monotonic()
        seen: dict[str, tuple[int, int, float]] = {}
        stable = []
        for mtime, name, size in listing:
            had = self._seen.get(name)
            since = had[2] if had is not None and had[:2] == (size, mtime) else now
            seen[name] = (size, mtime, since)
            if now - since >= self.settle_seconds:
                stable.append((mtime, name, size))
        self._seen = seen
        return stable

    # --- offsets (driver) ------------------------------------------------------

    def initial_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: nothing read yet, or every file already there (``latest``)."""
        offsets: dict[str, Any] = {"floor": None, "done": [], "open": None, "batch": [],
                                   "after": ""}
        if self.initial_position == "latest":
            listing = self._list()
            offsets["done"] = [[mtime, name] for mtime, name, _ in listing]
            if listing:
                offsets["floor"] = listing[-1][0] - int(self.late_seconds * 1_000_000)
                offsets["done"] = [d for d in offsets["done"] if d[0] >= offsets["floor"]]
        return offsets

    def latest_offsets(self, context: JobContext, start: Any = None) -> Any:
        """Runs on the driver: the offsets after the next micro-batch's files.

        ``start``: where the next micro-batch starts (sparkjet passes it), so
        the caps apply to it; None: from :meth:`initial_offsets`. The folder
        is listed at most every ``poll_seconds``; in between the previous
        listing stands.
        """
        if start is None:
            start = self.initial_offsets(context)
        now = time.monotonic()
        if self._settled is None or now - self._listed_at >= self.poll_seconds:
            self._listing = self._list()
            self._settled = self._stable(self._listing)
            self._listed_at = now
        return self._advance(start, self._listing, self._settled, context.stage)

    def _advance(
        self, start: Any, listing: list[tuple[int, str, int]],
        stable: list[tuple[int, str, int]], stage: str,
    ) -> Any:
        """The offsets after the next micro-batch from ``start``: ``start`` itself if none.

        ``listing``: every matching file; ``stable``: those settled. A file is
        done only once its last byte was planned: the open file (read up to a
        position) waits, and the micro-batch with it, until it is settled in
        this driver's listing (a new driver has settled nothing yet); it is
        then read on from its position to its size, so bytes appended while it
        was open are read too. An open file that is gone or shorter than its
        position is an error: its rest cannot be read, and is never skipped.
        """
        floor = start["floor"]
        done = {d[1]: d[0] for d in start["done"]}
        opened = start["open"]
        self._warn_changed(done, stable, stage)
        pending = [
            f for f in stable
            if f[1] not in done and (floor is None or f[0] >= floor)
            and not (opened and f[1] == opened[0])
        ]
        by_name = {f[1]: f for f in stable}
        if opened is not None:
            name, position = opened[0], opened[1]
            listed = next((f for f in listing if f[1] == name), None)
            where = (f"{self.describe()}, stage {stage!r}: file {name}, read up to byte "
                     f"{position},")
            if listed is None:
                raise FileNotFoundError(
                    f"{where} is gone (deleted or renamed before its rest was read)")
            if listed[2] < position:
                raise ValueError(
                    f"{where} is now {listed[2]} bytes, shorter than what was read "
                    "(truncated or replaced while it was being read)")
            if name not in by_name:
                return start  # not settled here (yet): wait rather than guess its size
            pending.insert(0, by_name[name])
        budget = self.max_bytes_per_batch
        batch: list[list[Any]] = []
        new_done = [list(d) for d in start["done"]]
        new_open = None
        for files, (mtime, name, size) in enumerate(pending):
            if files >= self.max_files_per_batch or (budget is not None and budget <= 0):
                break
            begin = opened[1] if opened is not None and name == opened[0] else 0
            end = size
            if (budget is not None and self.format == "jsonl" and end - begin > budget
                    and batch):
                break  # a big file starts the next micro-batch
            if budget is not None and self.format == "jsonl" and end - begin > budget:
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
            candidate = newest - int(self.late_seconds * 1_000_000)
            if new_open is not None:
                candidate = min(candidate, new_open[2])
            new_floor = candidate if floor is None else max(floor, candidate)
            new_done = [d for d in new_done if d[0] >= new_floor]
        return {"floor": new_floor, "done": sorted(new_done), "open": new_open,
                "batch": batch, "after": _fingerprint(start)}

    def _warn_changed(
        self, done: Mapping[str, int], stable: list[tuple[int, str, int]], stage: str
    ) -> None:
        """Log, once per change, each file done at one modification time and listed at another.

        A file is read once: what was written to it after it was read (or
        after a job started at ``latest`` passed it by) is not read.
        """
        for mtime, name, _ in stable:
            read_at = done.get(name)
            if read_at is None or read_at == mtime or (name, mtime) in self._warned:
                continue
            self._warned.add((name, mtime))
            log.warning(
                "%s, stage %r: file %s changed after it was read (modified at %d µs, read "
                "at %d µs); a file is read once, so its new content is not read: write "
                "files under a hidden name and rename them into place when complete",
                self.describe(), stage, name, mtime, read_at)

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: the micro-batch's file ranges, packed into partitions."""
        if end["after"] != _fingerprint(start):
            raise RuntimeError(
                f"{self.describe()}: micro-batch {context.batch_id} was planned after "
                "other offsets than it starts from; the source's files are out of step "
                "with the checkpoint"
            )
        return self._pack([tuple(b) for b in end["batch"]], context)

    def range_size(self, start: Any, end: Any, context: JobContext) -> InputSize | None:
        """Runs on the driver: the bytes of the micro-batch's file ranges (items unknown).

        From the offsets alone (the listing that planned them knew the
        files' sizes): the bytes of each planned range, whole files for CSV
        and Parquet. A JSON-lines range also reads on to the end of its last
        line. None for offsets this source did not plan from ``start``.
        """
        if not isinstance(start, dict) or not isinstance(end, dict):
            return None
        try:
            if end.get("after") != _fingerprint(start):
                return None
            total = sum(int(stop) - int(begin) for _, begin, stop in end["batch"])
        except (KeyError, TypeError, ValueError):
            return None
        return InputSize(None, total)

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """Runs on the driver (batch jobs): every matching file, as it is now."""
        listing = self._list(missing_ok=False)  # a batch job reading nothing: a typo, say so
        return self._pack([(name, 0, size) for _, name, size in listing], context)

    def _pack(self, batch: Sequence[Sequence[Any]], context: JobContext) -> list[Any]:
        """Pieces of at most ``split_bytes`` (JSON lines by bytes, Parquet by row groups)."""
        pieces: list[tuple[str, int, int, int]] = []  # (file, begin, end, size)
        for name, begin, end in batch:
            if self.format == "jsonl" and end - begin > self.split_bytes:
                for at in range(begin, end, self.split_bytes):
                    stop = min(at + self.split_bytes, end)
                    pieces.append((name, at, stop, stop - at))
            elif self.format == "parquet":
                pieces.extend(self._row_groups(name))
            else:
                pieces.append((name, begin, end, end - begin))
        if not pieces:
            return []
        total = sum(p[3] for p in pieces)
        count = min(len(pieces), max(context.parallelism, math.ceil(total / self.split_bytes)))
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

    def _row_groups(self, name: str) -> list[tuple[str, int, int, int]]:
        pq = _pyarrow_parquet(self.describe())
        fs, root = _open_fs(self.url, self.storage_options)
        path = f"{root}/{name}"
        try:
            with fs.open(path, "rb") as fh:
                meta = pq.ParquetFile(fh).metadata
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"{self.describe()}: file {path} was listed but is gone"
            ) from exc
        except Exception as exc:
            raise ValueError(
                f"{self.describe()}: file {path} is not a readable Parquet file: {exc}"
            ) from exc
        groups = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
        if not groups:
            return []
        pieces, begin, size = [], 0, 0
        for i, group in enumerate(groups):
            size += group
            if size >= self.split_bytes or i == len(groups) - 1:
                pieces.append((name, begin, i + 1, size))
                begin, size = i + 1, 0
        return pieces

    def watermark_partition(self, descriptor: Any) -> str:
        """The whole folder is one partition: files are read in order of time."""
        return "files"

    # --- reading (executors) -----------------------------------------------------

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: the items of a partition's file ranges, in order."""
        fs, root = _open_fs(self.url, self.storage_options)
        out: list[Any] = []
        origins: list[_Origin] = []
        for name, begin, end in partition:
            path = f"{root}/{name}"
            lines = array.array("q")
            try:
                if self.format == "jsonl":
                    start, items = self._read_jsonl(fs, path, begin, end, lines)
                    origins.append(_Origin(len(out), name, path, start, lines))
                elif self.format == "csv":
                    items = self._read_csv(fs, path, lines)
                    origins.append(_Origin(len(out), name, path, None, lines))
                else:
                    first_row, items = self._read_parquet(fs, path, begin, end)
                    origins.append(_Origin(len(out), name, path, None, None, first_row))
            except FileNotFoundError as exc:
                raise FileNotFoundError(
                    f"{self.describe()}: file {path} was listed but is gone "
                    "(deleted or renamed before it was read)"
                ) from exc
            out.extend(items)
        if len(self._origins) >= _ORIGINS_KEPT:
            self._origins.clear()
        self._origins[_descriptor_key(partition)] = origins
        return out

    def offset_of(self, descriptor: Any, index: int) -> Any:
        """Runs on an executor: where the ``index``-th item of ``descriptor`` is in its file.

        ``{"file": name, "line": n}`` (JSON lines, CSV: the 1-based line the
        item starts on) or ``{"file": name, "row": n}`` (Parquet: the 0-based
        row). None for a descriptor not read by this executor's source.
        """
        origins = self._origins.get(_descriptor_key(descriptor))
        if not origins:
            return None
        at = bisect.bisect_right([o.first for o in origins], index) - 1
        if at < 0:
            return None
        origin = origins[at]
        i = index - origin.first
        if origin.lines is None:
            return {"file": origin.name, "row": origin.first_row + i}
        if origin.start is None:  # CSV: line numbers counted from the file's start
            return {"file": origin.name, "line": origin.lines[i]}
        if origin.base is None:  # JSON lines read from mid-file: count the lines before once
            fs, _ = _open_fs(self.url, self.storage_options)
            origin.base = _line_number(fs, origin.path, origin.start)
        return {"file": origin.name, "line": origin.base + origin.lines[i]}

    def _read_jsonl(
        self, fs: Any, path: str, begin: int, end: int, lines: array.array[int]
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
                        f"{self.describe()}: file {path} line {_line_number(fs, path, at)}: "
                        f"malformed JSON: {exc}: {text[:80]!r}"
                    ) from exc
                lines.append(n)
        return start, items

    def _read_csv(self, fs: Any, path: str, lines: array.array[int]) -> list[Any]:
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
                            f"{self.describe()}: file {path} line {reader.line_num}: "
                            f"{len(row)} fields, the header has {len(header)}"
                        )
                    rows.append(dict(zip(header, row, strict=True)))
                    lines.append(first_line)
            except csv.Error as exc:
                raise ValueError(
                    f"{self.describe()}: file {path} line {reader.line_num}: malformed CSV: {exc}"
                ) from exc
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{self.describe()}: file {path} near line {reader.line_num}: not UTF-8: {exc}"
                ) from exc
        return rows

    def _read_parquet(self, fs: Any, path: str, begin: int, end: int) -> tuple[int, list[Any]]:
        """The rows of row groups ``[begin, end)``, and the file's row number of the first."""
        pq = _pyarrow_parquet(self.describe())
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
                f"{self.describe()}: file {path} is not a readable Parquet file: {exc}"
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


# --- the sink -----------------------------------------------------------------------------


def _batch_name(token: str, batch_id: int | None) -> str:
    digest = hashlib.sha1(token.encode()).hexdigest()[:12]
    return f"batch-{batch_id:08d}-{digest}" if batch_id is not None else f"job-{digest}"


class FileSink(Sink):
    """Writes the job's output as files in a folder or bucket prefix, batch by batch.

    ``url``: a local folder or an fsspec URL. ``format``: ``"jsonl"`` (any
    JSON-serialisable item) or ``"parquet"`` (dict items; pyarrow). Each
    micro-batch writes ``part-<batch>-<attempt>-<partition>.<format>`` files,
    then its commit marker ``_committed/<batch>.json`` naming them: a
    micro-batch whose marker is absent is not there for readers (see
    :func:`committed_files`). A micro-batch committed a second time after a
    failure finds its marker and writes nothing more, so the sink keeps every
    guarantee. ``<attempt>`` is new with every ``prepare``: a replay, or a
    fenced driver's late tasks, never overwrite files a marker names.
    """

    kind = "files"
    guarantees = ALL_GUARANTEES

    def __init__(
        self,
        url: str,
        format: str = "jsonl",
        *,
        storage_options: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        url = str(url)
        super().__init__(name or url)
        if format not in _SINK_FORMATS:
            raise ValueError(
                f"FileSink({url!r}): format must be one of {', '.join(_SINK_FORMATS)}; "
                f"got {format!r}"
            )
        self.url = url
        self.format = format
        self.storage_options = dict(storage_options or {})

    def describe(self) -> str:
        """``files:<name>``: the ``name`` given, else the url (stage names come from it)."""
        return f"files:{self.name}"

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver: the name of this micro-batch's files (from its commit token)."""
        token = context.commit_token or f"{context.job_id}.{uuid.uuid4().hex}"
        fs, root = _open_fs(self.url, self.storage_options)
        fs.makedirs(root, exist_ok=True)
        return {"batch": _batch_name(token, context.batch_id), "token": token,
                "batch_id": context.batch_id, "job_id": context.job_id,
                "attempt": uuid.uuid4().hex[:8]}

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: this partition's file, under its final name; None if empty."""
        rows = list(items)
        if not rows:
            return None
        fs, root = _open_fs(self.url, self.storage_options)
        name = f"part-{state['batch']}-{state['attempt']}-{context.partition:05d}.{self.format}"
        if self.format == "jsonl":
            lines = []
            for i, item in enumerate(rows):
                try:
                    lines.append(json.dumps(item))
                except (TypeError, ValueError) as exc:
                    raise TypeError(
                        f"{self.describe()}: item {i} of partition {context.partition} is not "
                        f"JSON-serialisable: {exc}: {item!r:.80}"
                    ) from exc
            data = ("\n".join(lines) + "\n").encode()
        else:
            data = self._parquet_bytes(rows, context.partition)
        _put(fs, f"{root}/{name}", data)
        return {"file": name, "items": len(rows)}

    def _parquet_bytes(self, rows: list[Any], partition: int) -> bytes:
        pq = _pyarrow_parquet(self.describe())
        import pyarrow as pa

        for i, item in enumerate(rows):
            if not isinstance(item, dict):
                raise TypeError(
                    f"{self.describe()}: Parquet rows must be dicts; item {i} of partition "
                    f"{partition} is a {type(item).__name__}: {item!r:.80}"
                )
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise TypeError(
                f"{self.describe()}: partition {partition}'s rows do not make a Parquet table "
                f"(a column with mixed types?): {exc}"
            ) from exc
        out = io.BytesIO()
        pq.write_table(table, out)
        return out.getvalue()

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: write the commit marker, once per micro-batch.

        The marker is created only if absent (the filesystem's conditional
        create where it has one): a commit replayed after a failure, or by a
        second driver, finds it there, removes its own files and is a no-op.
        """
        files = open_file_store(self.url, self.storage_options)
        written = [m for m in messages if m is not None]
        record = {
            "token": state["token"], "job_id": state["job_id"], "batch_id": state["batch_id"],
            "files": [m["file"] for m in written], "items": sum(m["items"] for m in written),
            "committed_ms": int(time.time() * 1000),
        }
        files.fs.makedirs(files.path(MARKERS), exist_ok=True)
        if not files.create_exclusive(
            files.path(MARKERS, f"{state['batch']}.json"), json.dumps(record, indent=1).encode()
        ):  # committed before, by another attempt: no marker names this attempt's files
            for name in record["files"]:
                with contextlib.suppress(FileNotFoundError):
                    files.remove(files.path(name))

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: remove this attempt's files, but those a commit marker names."""
        fs, root = _open_fs(self.url, self.storage_options)
        marker = f"{root}/{MARKERS}/{state['batch']}.json"
        committed: set[str] = set()
        if fs.exists(marker):
            with fs.open(marker, "rb") as fh:
                committed = set(json.loads(fh.read())["files"])
        for path in fs.glob(f"{root}/part-{state['batch']}-{state['attempt']}-*"):
            if posixpath.basename(path) not in committed:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(path)


def _put(fs: Any, path: str, data: bytes) -> None:
    """Write a whole file; on a local disk through a temporary name and a rename."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        folder, base = posixpath.split(path)
        staged = f"{folder}/.{base}.{uuid.uuid4().hex[:8]}.tmp"
        with fs.open(staged, "wb") as fh:
            fh.write(data)
        fs.mv(staged, path)
    else:
        with fs.open(path, "wb") as fh:
            fh.write(data)


def committed_files(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The full paths of the files a :class:`FileSink` committed at ``url``, batch by batch.

    Only files named by a commit marker count: the files of a micro-batch
    still being written, or of one that failed, are left out. Markers are
    taken in the order of their names (a job's micro-batches in order).
    """
    fs, root = _open_fs(url, storage_options or {})
    try:
        markers = sorted(fs.glob(f"{root}/{MARKERS}/*.json"))
    except FileNotFoundError:
        return []
    out: list[str] = []
    for marker in markers:
        with fs.open(marker, "rb") as fh:
            record = json.loads(fh.read())
        out.extend(f"{root}/{name}" for name in record["files"])
    return out


def read_committed(
    url: str, format: str = "jsonl",
    storage_options: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Every item a :class:`FileSink` committed at ``url``, in order of its commit markers."""
    if format not in _SINK_FORMATS:
        raise ValueError(f"read_committed({url!r}): format must be one of "
                         f"{', '.join(_SINK_FORMATS)}; got {format!r}")
    fs, _ = _open_fs(url, storage_options or {})
    items: list[Any] = []
    for path in committed_files(url, storage_options):
        if format == "jsonl":
            with fs.open(path, "rb") as fh:
                items.extend(json.loads(line) for line in fh.read().splitlines() if line.strip())
        else:
            pq = _pyarrow_parquet(f"read_committed({url!r})")
            with fs.open(path, "rb") as fh:
                items.extend(pq.read_table(fh).to_pylist())
    return items


@hookimpl
def register_sources(register: Any) -> None:
    """Register the file source."""
    register(FileSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the file sink."""
    register(FileSink)
