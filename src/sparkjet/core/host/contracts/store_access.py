"""The job's store as plugins see it: its files, and the logs of its lists, maps and streams.

Protocols only, never the store's classes (which are internal and may
change): :class:`FileStore` (the plugin API's one file protocol, opened on
any URL by :func:`open_file_store`; a listing's files are
:class:`ListedFile`), :class:`CommitLogAccess` and :class:`LogRecord` (a
list's or map's commit log), :class:`StreamLogAccess` (a stream), and
:class:`StoreAccess`, the store that holds them, opened on any URL by
:func:`open_store`. Also the wrapper plugins are handed,
:class:`PluginStore`, which shows a store as a :class:`StoreAccess` and
nothing else.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from sparkjet.core.store.fs import Store


class FileStore(Protocol):
    """Files under one fsspec URL: fresh reads and listings, atomic and create-only writes.

    The one file-I/O protocol of the plugin API: :func:`open_file_store`
    opens one on any URL (the built-in snapshot backends keep snapshots in
    one), and ``context.store.files`` (:attr:`StoreAccess.files`) is the
    job's store's. Picklable, so executor code may capture it.
    Paths are absolute paths in the filesystem (build them with :meth:`path`);
    nothing outside the root is touched. Listings and existence checks ask the
    storage afresh, never a cache another process's writes could have
    outdated. Errors are :class:`~sparkjet.errors.StoreError` naming the path,
    secrets masked; a missing file is :class:`FileNotFoundError`.
    """

    @property
    def shown_url(self) -> str:
        """The URL as it may be printed (secrets masked)."""

    @property
    def root(self) -> str:
        """The root path inside the filesystem (opens the filesystem)."""

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, for what this facade leaves out (streamed reads and writes)."""

    @property
    def conditional_writes(self) -> bool:
        """Whether :meth:`create_exclusive` is atomic here (two racing creators: one wins)."""

    def path(self, *parts: str) -> str:
        """``parts`` joined under the root."""

    def read_bytes(self, path: str) -> bytes:
        """A whole file, read afresh; FileNotFoundError if absent."""

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file: readers see the old or the new content, never a mix."""

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if it does not exist; False if it already does.

        A create that the filesystem client retried after it had landed is
        recognised by reading the file back: one holding exactly ``data``
        counts as this call's (True), so make payloads unique.
        """

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists, asked afresh."""

    def size(self, path: str) -> int:
        """The size of the file ``path`` in bytes, asked afresh; FileNotFoundError if absent."""

    def listdir(self, path: str) -> list[str]:
        """Base names of the entries in ``path`` (empty if it does not exist), listed afresh."""

    def find(self, path: str) -> Mapping[str, Mapping[str, Any]]:
        """Every file under ``path``, recursively: its absolute path to fsspec's details of it."""

    def entries(self, path: str) -> Mapping[str, ListedFile]:
        """The files in the folder ``path`` by base name, with sizes and times, in one listing.

        Listed afresh; empty if ``path`` does not exist. One request on S3
        and GCS, where a :meth:`size` or :meth:`modified` per file costs one
        each.
        """

    def modified(self, path: str) -> float | None:
        """When ``path`` was last written, in seconds since the epoch by the storage's clock.

        Asked afresh. None when the filesystem keeps no modification times;
        FileNotFoundError if ``path`` does not exist. Compare it with
        :meth:`now`, never with this machine's clock.
        """

    def now(self) -> float | None:
        """The storage's clock now, in seconds since the epoch: what :meth:`modified` is read on.

        Measured by writing a probe file and reading its modification time
        back (then advanced by this process's monotonic clock, and probed
        again now and then); the probe is removed. It may run behind the
        storage by a write's latency, never ahead. None when the storage
        keeps no modification times; this machine's clock while the storage
        takes no writes and no probe has succeeded yet. Liveness and gc ages
        in sparkjet rest on it.
        """

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (a whole folder with ``recursive``)."""


class ListedFile(Protocol):
    """A file as a folder's listing (:meth:`FileStore.entries`) shows it."""

    @property
    def size(self) -> int:
        """Its size in bytes."""

    @property
    def modified(self) -> float | None:
        """When it was last written, in seconds since the epoch by the storage's clock, or None."""


def open_file_store(
    url: str,
    options: Mapping[str, Any] | None = None,
    redact: Callable[[str], str] | None = None,
) -> FileStore:
    """A :class:`FileStore` on the fsspec ``url`` (a local path, ``s3://...``, ``memory://...``).

    ``options`` go to the fsspec filesystem (credentials, endpoints); ``redact``
    masks secrets in error messages. Nothing is opened before the first use.
    """
    return Store(url, dict(options or {}), redact)


class LogRecord(Protocol):
    """One committed change of a list's or map's commit log, as a plugin reads it."""

    @property
    def op(self) -> str:
        """Lists: ``"append"``, ``"clear"``; maps: ``"put"``, ``"remove"``, ``"clear"``."""

    @property
    def parts(self) -> Sequence[tuple[str, Any]]:
        """The record's items in order: ``("items", [...])`` inline, ``("segment", path)`` a file.

        Read a segment with :meth:`CommitLogAccess.read_segment`.
        """


class CommitLogAccess(Protocol):
    """The commit log of a list or a map, as the list and map plugins use it.

    Executors :meth:`stage` their partition's items; the driver commits one
    record naming every partition's parts, so a commit is visible at once or
    never. A *part* is ``("items", [...])`` (small batches, inline) or
    ``("segment", path)`` (a file nobody reads until a record names it).
    Picklable, like the store it comes from.
    """

    def live_records(self) -> Sequence[LogRecord]:
        """The records after the newest ``clear``, oldest first (runs on the driver)."""

    def read_segment(self, path: str) -> Sequence[Any]:
        """The items of a ``("segment", path)`` part, in order."""

    def stage(self, items: Iterable[Any], writer: str) -> list[tuple[str, Any]]:
        """Runs on executors: the parts for ``items`` (segments written under token ``writer``)."""

    def commit(
        self,
        op: str,
        parts: list[tuple[str, Any]],
        *,
        writer: str,
        producer: str | None = None,
        batch: int | None = None,
    ) -> int:
        """Runs on the driver: append one record atomically; returns its sequence number.

        Records are numbered 1, 2, ... without gaps. With ``producer`` and
        ``batch`` (as :meth:`commit_once` takes them) every reader skips the
        record when that producer's batch was committed before: a second
        commit of one batch, by a driver fenced off but not yet aware, is
        never seen twice.
        """

    def commit_once(
        self,
        op: str,
        parts: list[tuple[str, Any]],
        *,
        token: str,
        writer: str,
        producer: str | None = None,
        batch: int | None = None,
    ) -> int | None:
        """Runs on the driver: commit unless a record with ``token`` exists (then None).

        ``producer`` and ``batch`` (:attr:`JobContext.producer_id` and
        ``batch_id``) let readers skip a batch committed twice by racing drivers.
        """

    def discard(self, parts: Iterable[tuple[str, Any]]) -> None:
        """Delete the segment files of parts that will never be committed."""

    def discard_writer(self, writer: str) -> None:
        """Delete every segment staged under the ``writer`` token, also by tasks still running."""

    def fold(self) -> int | None:
        """Runs on the driver: fold the log into one base now; the record number it folds up to.

        Committers fold a log on their own every 100 records, so readers read
        one base and the records after it; a plugin that has just committed
        many records may fold sooner. None when there was nothing new to
        fold, or another process folded the same records first. Safe beside
        readers, committers and other folds: a reader sees every record
        once, folded or not.
        """


class StreamLogAccess(Protocol):
    """A stream in the store: partitions of items with offsets, as the stream plugins use it.

    Picklable, like the store it comes from.
    """

    @property
    def partitions(self) -> int:
        """The number of partitions (the stream must exist)."""

    def exists(self) -> bool:
        """Whether the stream has been created."""

    def create(self, partitions: int) -> bool:
        """Create the stream with ``partitions`` partitions; False if it already existed."""

    def end_offsets(self) -> list[int]:
        """The offset after the last item of every partition."""

    def start_offsets(self) -> list[int]:
        """The first offset every partition still holds (above 0 once trimmed by retention)."""

    def read(self, partition: int, start: int, end: int) -> list[Any]:
        """The items of ``partition`` at offsets ``[start, end)``, in order."""

    def range_bytes(self, starts: Sequence[int], ends: Sequence[int]) -> int | None:
        """The bytes reading offsets ``[starts[p], ends[p])`` of each partition fetches; no read.

        The sizes of the chunks holding them, from what this process saw when
        it last listed the partitions (:meth:`end_offsets` lists them all).
        None where that does not tell and finding out would cost a request
        (on S3 or GCS), or for offsets trimmed before or of another shape.
        On a local or in-memory store a chunk not seen yet is stat'ed.
        """

    def append(self, partition: int, items: list[Any]) -> int:
        """Append ``items`` to ``partition`` at once; returns the new end offset."""

    def append_batch(self, writer: str, token: str, buckets: list[list[Any]]) -> None:
        """Append ``buckets[p]`` to each partition ``p``, once per ``token`` even when replayed.

        ``writer`` (:attr:`JobContext.writer_id`) names the writer whose
        batches these are; the split into partitions is written ahead, so a
        replayed call appends the recorded split where the token is missing.
        """

    def append_buckets(self, buckets: list[list[Any]], writer: str, token: str | None) -> None:
        """A sink's commit: :meth:`append_batch` with a ``token``, plain appends without one.

        ``token`` is :attr:`JobContext.commit_token` (None outside micro-batches).
        """

    def wait_for_append(self, ends: Sequence[int], timeout: float) -> bool:
        """Wait until items may be past the end offsets ``ends`` (True), at most ``timeout`` s.

        False when ``timeout`` passed with nothing new. True means "may be
        there" (it can be spurious): list with :meth:`end_offsets` to see.
        Appends in this process wake it at once; on a local store appends by
        other processes within milliseconds; on an object store it returns
        True after its poll interval. Never spins.
        """


class StoreAccess(Protocol):
    """The job's store as plugins see it: its files, and its lists, maps and streams.

    Not a second file protocol: the files are :attr:`files`, a
    :class:`FileStore`; the rest are the store's data structures, whose logs
    carry a commit protocol of their own (:class:`CommitLogAccess`,
    :class:`StreamLogAccess`). Picklable, so executor code may capture it.
    """

    @property
    def shown_url(self) -> str:
        """The store's URL as it may be printed (secrets masked)."""

    @property
    def files(self) -> FileStore:
        """The store's files (rooted at the store's URL), for a plugin's own files."""

    def list_log(self, name: str) -> CommitLogAccess:
        """The commit log of the list ``name`` (stage on executors, commit on the driver)."""

    def map_log(self, name: str) -> CommitLogAccess:
        """The commit log of the map ``name``."""

    def stream_log(self, name: str) -> StreamLogAccess:
        """The stream ``name``: offsets, appends with tokens, reads by range."""


def open_store(
    url: str,
    options: Mapping[str, Any] | None = None,
    redact: Callable[[str], str] | None = None,
) -> StoreAccess:
    """The sparkjet store at the fsspec ``url``, as plugins see it: a :class:`StoreAccess`.

    What ``context.store`` is in a job on that store: its files and the logs
    of its lists, maps and streams. For a plugin's unit tests (contexts built
    on a real store) and tools that work beside jobs. ``options`` and
    ``redact`` as for :func:`open_file_store`; nothing is opened before the
    first use. Picklable.
    """
    return Store(url, dict(options or {}), redact)


#: What FileStore offers, reached on ``context.store`` itself before ``files`` existed.
_FILE_MEMBERS = frozenset({
    "root", "fs", "conditional_writes", "path", "read_bytes", "write_bytes",
    "create_exclusive", "exists", "size", "listdir", "find", "remove",
})


class PluginStore:
    """The :class:`StoreAccess` plugins are handed: the store's files and logs, nothing else.

    Wraps the store the job runs against (the contexts wrap it on creation).
    Calling a :class:`FileStore` method on it directly (``context.store.read_bytes``),
    as before ``files`` existed, still works in this release, with a
    DeprecationWarning naming ``context.store.files``.
    """

    __slots__ = ("_store",)

    def __init__(self, store: Any) -> None:
        self._store = store

    @property
    def shown_url(self) -> str:
        """The store's URL as it may be printed (secrets masked)."""
        return str(self._store.shown_url)

    @property
    def files(self) -> FileStore:
        """The store's files, rooted at its URL."""
        files: FileStore = self._store
        return files

    def list_log(self, name: str) -> CommitLogAccess:
        """The commit log of the list ``name``."""
        log: CommitLogAccess = self._store.list_log(name)
        return log

    def map_log(self, name: str) -> CommitLogAccess:
        """The commit log of the map ``name``."""
        log: CommitLogAccess = self._store.map_log(name)
        return log

    def stream_log(self, name: str) -> StreamLogAccess:
        """The stream ``name``."""
        log: StreamLogAccess = self._store.stream_log(name)
        return log

    def __getattr__(self, name: str) -> Any:
        if name in _FILE_MEMBERS:
            warnings.warn(
                f"context.store.{name} is deprecated and goes in the next release: use "
                f"context.store.files.{name} (a FileStore, the plugin API's one file protocol)",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(self._store, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> Any:
        return (self._store,)  # a tuple: never falsy, so __setstate__ always runs

    def __setstate__(self, state: Any) -> None:
        (self._store,) = state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PluginStore) and other._store is self._store

    def __hash__(self) -> int:
        return id(self._store)

    def __repr__(self) -> str:
        return f"PluginStore({self.shown_url!r})"


def plugin_store(store: Any) -> StoreAccess:
    """``store`` as plugins see it (a :class:`PluginStore`; one already is stays as it is)."""
    return store if isinstance(store, PluginStore) else PluginStore(store)
