"""The file source, :class:`FileSource`: its options, the Source API, and reading on executors.

The driver's side has modules of its own: :mod:`~sparkjet.contrib.files.listing`
lists the folder and decides which files are settled (a source's
:class:`~sparkjet.contrib.files.listing.FolderWatch`), and
:mod:`~sparkjet.contrib.files.planning` moves the offsets past each
micro-batch's file ranges and packs them into partitions. An executor reads
a range (with the readers of :mod:`sparkjet.contrib.files.reading`) and says
where an item came from.
"""

from __future__ import annotations

import array
import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sparkjet.contrib.files.common import FORMATS, _open_fs
from sparkjet.contrib.files.listing import FolderWatch, Listing, list_folder
from sparkjet.contrib.files.planning import advance, fingerprint, pack, row_groups
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
)


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
    offsets_count_items = False  # offsets name files and byte positions, not items

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
        #: Driver-only memory: the folder's listings and settled files (see FolderWatch).
        self._watch = FolderWatch()
        # Executor-only memory: where the items of the partitions read last came
        # from, for dead letters (see offset_of).
        self._origins: dict[str, list[_Origin]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_watch", "_origins"):
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

    def _list(self, missing_ok: bool = True) -> Listing:
        """Every matching file, listed afresh (see :func:`.list_folder`)."""
        return list_folder(self.url, self.storage_options, self.glob, self.recursive,
                           self.describe(), missing_ok)

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
        listing, settled = self._watch.look(self._list, self.settle_seconds, self.poll_seconds)
        self._watch.warn_changed(start["done"], settled, self.describe(), context.stage)
        return advance(
            start, listing, settled, format=self.format,
            max_files_per_batch=self.max_files_per_batch,
            max_bytes_per_batch=self.max_bytes_per_batch, late_seconds=self.late_seconds,
            where=self.describe(), stage=context.stage,
        )

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: the micro-batch's file ranges, packed into partitions."""
        if end["after"] != fingerprint(start):
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
            if end.get("after") != fingerprint(start):
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
        """Pieces of at most ``split_bytes`` in partitions (see :func:`.pack`)."""
        return pack(batch, format=self.format, split_bytes=self.split_bytes,
                    parallelism=context.parallelism,
                    row_groups=lambda name: row_groups(self.url, self.storage_options, name,
                                                       self.split_bytes, self.describe()))

    def watermark_partition(self, descriptor: Any) -> str:
        """The whole folder is one partition: files are read in order of time."""
        return "files"

    def watermark_partitions(self, offsets: Any) -> Sequence[str]:
        """The one partition :meth:`watermark_partition` names, whatever the offsets."""
        return ["files"]

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
