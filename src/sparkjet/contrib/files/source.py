"""The file source, :class:`FileSource`: listing a folder, offsets, planning and reading.

The driver lists the folder, decides which files are settled and plans each
micro-batch's file ranges; an executor reads a range (with the readers of
:mod:`sparkjet.contrib.files.reading`) and says where an item came from.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import fnmatch
import hashlib
import json
import logging
import math
import posixpath
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sparkjet.contrib.files.common import FORMATS, _open_fs, _pyarrow_parquet
from sparkjet.contrib.files.reading import (
    _ORIGINS_KEPT,
    _descriptor_key,
    _line_number,
    _Origin,
    _read_csv,
    _read_jsonl,
    _read_parquet,
)
from sparkjet.plugin import (
    ALL_GUARANTEES,
    InputSize,
    JobContext,
    Source,
    TaskContext,
    file_modified,
)

# The package's logger, as before the source had a module of its own.
log = logging.getLogger("sparkjet.contrib.files")


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
                    start, items = _read_jsonl(self.describe(), fs, path, begin, end, lines)
                    origins.append(_Origin(len(out), name, path, start, lines))
                elif self.format == "csv":
                    items = _read_csv(self.describe(), fs, path, lines)
                    origins.append(_Origin(len(out), name, path, None, lines))
                else:
                    first_row, items = _read_parquet(self.describe(), fs, path, begin, end)
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
