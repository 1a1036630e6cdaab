"""The contracts between sparkjet and its plugins: base classes, contexts, the store's views.

Defined here so the core can use them without importing a public module;
plugin authors import them from :mod:`sparkjet.plugin`, whose docstring is
the guide.
"""

from __future__ import annotations

import builtins
import logging
import time
import uuid
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol

from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.store.fs import Store

#: Every guarantee: for participants that replay and commit idempotently.
ALL_GUARANTEES: frozenset[ProcessingGuarantee] = frozenset(ProcessingGuarantee)
#: NONE and AT_LEAST_ONCE: for participants that may repeat items after a failure.
AT_LEAST_ONCE_AT_MOST: frozenset[ProcessingGuarantee] = frozenset(
    {ProcessingGuarantee.NONE, ProcessingGuarantee.AT_LEAST_ONCE}
)


class BatchedItems:
    """Many items to ship inside a partition descriptor, pickled in batches.

    One pickle of a list of millions of objects keeps a memo entry per object
    and costs about three times as much as pickling the same list in slices of
    1024 (what PySpark's own serializer does). Wrap large inline data in this
    so it crosses to executors at PySpark's speed; ``.items`` is the list.
    """

    BATCH = 1024

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __reduce__(self) -> tuple[Any, ...]:
        import pickle

        step = self.BATCH
        batches = [
            pickle.dumps(self.items[i : i + step], protocol=5)
            for i in range(0, len(self.items), step)
        ]
        return (_unbatch, (batches,))


def _unbatch(batches: list[bytes]) -> BatchedItems:
    import pickle

    items: list[Any] = []
    for batch in batches:
        items.extend(pickle.loads(batch))
    return BatchedItems(items)


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

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (a whole folder with ``recursive``)."""


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

    def commit(self, op: str, parts: list[tuple[str, Any]], *, writer: str) -> int:
        """Runs on the driver: append one record atomically; returns its sequence number."""

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


@dataclass(frozen=True)
class JobContext:
    """What a plugin sees on the driver while a job is planned, started or committed."""

    #: The job's id.
    job_id: str
    #: The job's name, or None.
    job_name: str | None
    #: The store the job runs against (picklable: may be captured for executors).
    store: StoreAccess
    #: Spark's default parallelism: a good number of partitions to plan.
    parallelism: int
    #: This plugin's table from ``[plugins.<name>]`` in the configuration.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The guarantee the job runs with.
    processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.NONE
    #: In a streaming job, the micro-batch being committed (None in batch jobs).
    #: A sink that declares EXACTLY_ONCE must commit each batch id at most once.
    batch_id: int | None = None
    #: The name of the stage this context is for (sources, sinks, transforms).
    stage: str = ""
    #: Which checkpoint the batch ids count in: a job with NONE starts a new one
    #: (and counts from 0 again) when it restarts.
    checkpoint_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", plugin_store(self.store))

    @property
    def writer_id(self) -> str:
        """Identifies this job's stage as a writer: the same across its micro-batches."""
        return f"{self.job_id}.{self.stage}"

    @property
    def commit_token(self) -> str | None:
        """Identifies this stage's commit of this micro-batch, for idempotent commits.

        Unique per job, stage and batch, so two sinks of one job writing the
        same target never mistake each other's commits for their own.
        """
        if self.batch_id is None:
            return None
        return f"{self.producer_id}.b{self.batch_id}"

    @property
    def producer_id(self) -> str:
        """Identifies this stage's micro-batch commits in this checkpoint (with ``batch_id``).

        Batches of one producer land in order, each once: a commit log's
        readers skip a record whose batch is not after the producer's last.
        """
        return f"{self.writer_id}.{self.checkpoint_id}"

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the job."""
        return logging.getLogger(f"sparkjet.job.{self.job_name or self.job_id}")


@dataclass(frozen=True)
class TaskContext:
    """What a plugin sees on an executor while it reads or writes one partition."""

    job_id: str
    #: Index of the partition being read or written.
    partition: int
    store: StoreAccess
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The name of the stage being read or written (as ``JobContext.stage``).
    stage: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", plugin_store(self.store))


class InputSize(NamedTuple):
    """How big a source's planned read is, as far as the source knows without reading it.

    Either field may be None: unknown. :meth:`Source.range_size` and
    :meth:`Source.estimated_size` return one (or None when nothing is known).
    """

    #: How many items the read yields; None: unknown. Never fewer than it
    #: yields; more only where offsets count positions a reader skips (Kafka's
    #: transaction markers and compacted records, a stream's duplicate batch chunk).
    items: int | None
    #: How many bytes the read fetches from storage (what the source's files or
    #: chunks hold, before decoding); None: unknown.
    bytes: int | None


def source_lag(read: Any, available: Any) -> int | None:
    """How many items ``available`` offsets are past ``read`` ones; None if not countable.

    Offsets that are a number, a list of numbers (one per partition, as a
    stream's or Kafka's) or a dict of numbers count; a partition missing from
    ``read`` counts from 0. Any other shape of offsets has no lag to show.
    """
    if isinstance(available, bool):
        return None
    if isinstance(available, int):
        if isinstance(read, bool) or not isinstance(read, int):
            return None
        return max(available - read, 0)
    if isinstance(available, list):
        before = read if isinstance(read, list) else []
        pairs = [(before[i] if i < len(before) else 0, a) for i, a in enumerate(available)]
    elif isinstance(available, dict):
        before_map = read if isinstance(read, dict) else {}
        pairs = [(before_map.get(k, 0), a) for k, a in available.items()]
    else:
        return None
    if not all(type(r) is int and type(a) is int for r, a in pairs):
        return None
    return sum(max(int(a) - int(r), 0) for r, a in pairs)


class _Participant(ABC):
    #: Registered name: unique among all plugins of the same category.
    kind: ClassVar[str]
    #: The processing guarantees this participant can keep; checked at submit.
    guarantees: ClassVar[frozenset[ProcessingGuarantee]] = frozenset({ProcessingGuarantee.NONE})

    def describe(self) -> str:
        """A short description for stage names, error messages and ``sparkjet plugins``."""
        return self.kind


class Source(_Participant):
    """A batch or streaming source.

    A batch source is split into partitions on the driver; each partition is
    read on an executor. Partitions are read and concatenated in order, so a
    source's order is kept by the stages that keep order.
    """

    #: True for unbounded sources; such a pipeline runs as a streaming job.
    streaming: ClassVar[bool] = False
    #: True if :meth:`latest_offsets` takes ``start``, where the next micro-batch
    #: starts, to cap what one micro-batch reads (Spark's ``SupportsAdmissionControl``).
    #: sparkjet then always calls ``latest_offsets(context, start=...)``; otherwise
    #: ``latest_offsets(context)``. Checked against the method when the class registers.
    accepts_start: ClassVar[bool] = False

    def __init__(self, name: str) -> None:
        #: Name of the data this source reads; part of its stage name.
        self.name = name

    def describe(self) -> str:
        """``kind:name``, used in generated stage names and messages."""
        return f"{self.kind}:{self.name}"

    def identity(self) -> Any:
        """What this source reads (a JSON value): a stream's or topic's name, a folder.

        A snapshot records it, with the plugin's kind and the partition count,
        beside the source's offsets; starting a job from the snapshot refuses a
        source stage whose identity changed (its offsets would be applied to
        other data) unless told where it starts (``JobConfig.source_starts``).
        The default is :attr:`name`; a source whose ``name`` is only a label
        returns what it reads instead.
        """
        return self.name

    @abstractmethod
    def partitions(self, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: plan the read as picklable partition descriptors, in order.

        Batch sources only; streaming sources plan with :meth:`plan_range`.
        """

    @abstractmethod
    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: the items of one partition descriptor, in order."""

    # Streaming sources (``streaming = True``) also implement the three below.
    # Offsets are JSON-serialisable values; sparkjet records them in the job's
    # checkpoint before each micro-batch and replays the same range after a
    # failure, so a source that can re-read a range supports EXACTLY_ONCE.

    def initial_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: where a job with no checkpoint starts reading."""
        raise NotImplementedError(f"{type(self).__qualname__} is not a streaming source")

    def latest_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: the offsets up to which data is available now.

        A source that caps what one micro-batch reads sets
        :attr:`accepts_start` and defines ``latest_offsets(self, context,
        start=None)``: sparkjet then passes ``start=``, the offsets the next
        micro-batch starts from (the last committed or planned batch's end),
        and the source returns where that batch should end. Without the
        declaration ``start`` is never passed.
        """
        raise NotImplementedError(f"{type(self).__qualname__} is not a streaming source")

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: partition descriptors for the items in ``[start, end)``."""
        raise NotImplementedError(f"{type(self).__qualname__} is not a streaming source")

    def watermark_partition(self, descriptor: Any) -> str:
        """Runs on the driver: which of the source's partitions ``descriptor`` reads.

        The watermark is the lowest of the partitions' highest timestamps, so a
        streaming source whose partitions are out of step with one another
        names them here (a stream's partition number, a Kafka partition). The
        default treats the whole source as one partition.
        """
        return "0"

    def offset_of(self, descriptor: Any, index: int) -> Any:
        """Runs on an executor: the offset of the ``index``-th item ``descriptor`` reads.

        Shown in a dead letter (see ``Stage.on_error``), beside the partition
        (:meth:`watermark_partition`) and the index, so a bad item can be
        found in the source. None (the default): the source cannot tell.
        """
        return None

    def watermark_partitions(self, offsets: Any) -> Sequence[str]:
        """Runs on the driver: every partition the source has at ``offsets`` (its latest).

        A partition named here holds the watermark back until it sends an
        event or has been idle for the idle timeout (as in Jet), so a
        partition whose first events come late does not find them dropped.
        Must agree with :meth:`watermark_partition`; the default is its one
        partition.
        """
        return ["0"]

    def wait_for_data(self, offsets: Any, timeout: float, context: JobContext) -> bool:
        """Runs on the driver: wait until data may be past ``offsets``, at most ``timeout`` s.

        An idle streaming job calls it between looks at :meth:`latest_offsets`
        (``offsets`` is what that returned last, where the next micro-batch
        starts). Return True as soon as data may be there (a True may be
        spurious: the job then calls :meth:`latest_offsets` to see), False
        when ``timeout`` passed without any. Never spin: block in the client
        (a consumer's poll, a condition) or sleep. The job asks again after
        each return, with timeouts of at most 50 ms, so it still sees cancel
        and suspend requests in time.

        The default sleeps ``timeout`` and returns True: the job looks at
        :meth:`latest_offsets` every 50 ms, as it did before this hook. The
        stream source overrides it to wake within milliseconds of an append.
        """
        time.sleep(max(timeout, 0.0))
        return True

    def range_size(self, start: Any, end: Any, context: JobContext) -> InputSize | None:
        """Runs on the driver: how big the micro-batch ``[start, end)`` is, or None if unknown.

        ``start`` and ``end`` are offsets :meth:`latest_offsets` returned (what
        :meth:`plan_range` gets); the answer is about what reading every
        descriptor of ``plan_range(start, end, context)`` yields: its item
        count and the bytes those reads fetch, either None where unknown.
        sparkjet may run a small micro-batch in the driver's process instead
        of as a Spark job; a size it cannot tell runs on Spark, as always.

        Must be cheap: never read the data (use what the offsets and the
        source's listings already tell). A number must be right, not a
        guess (see :class:`InputSize`): say None for what is unknown. The
        default counts items from offsets shaped as a number, or a list or
        dict of numbers, one per partition (:func:`source_lag`); bytes
        unknown; None for other shapes.
        """
        items = source_lag(start, end)
        return None if items is None else InputSize(items, None)

    def estimated_size(self, context: JobContext) -> InputSize | None:
        """Runs on the driver, for a batch source: how big the whole read is, or None if unknown.

        About what reading every descriptor of :meth:`partitions` yields:
        items and bytes fetched, either None where unknown. sparkjet may run
        a small batch job in the driver's process instead of as Spark jobs.
        Must be cheap: never read the data (at most what the source has in
        memory or its listings hold). The default: None (unknown).
        """
        return None


class Sink(_Participant):
    """A sink: executors write partitions, the driver commits once.

    Modelled on pyspark's ``DataSourceWriter``: :meth:`write` returns a
    picklable commit message per partition; :meth:`commit` receives them all,
    in partition order, once every partition succeeded; :meth:`abort` is
    called instead when the job fails, so nothing becomes visible.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> str:
        """``kind:name``, used in generated stage names and messages."""
        return f"{self.kind}:{self.name}"

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver before the job writes: return picklable state for :meth:`write`."""
        return None

    @abstractmethod
    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: consume one partition's items; return a picklable message."""

    @abstractmethod
    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver once all partitions are written: make the output visible."""

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver when the job fails after :meth:`prepare`.

        ``messages`` may be incomplete: when the job fails, the messages of
        partitions that did write are lost with the failed Spark action. Clean
        up by what :meth:`prepare` returned (for example a unique prefix of
        the staged files), not only by the messages.
        """


class CommitLogSink(Sink):
    """A sink that stages partitions in a store's commit log and commits one record.

    The list and map sinks are built on it; a subclass says which log it
    writes (:meth:`log`) and which record it commits (:attr:`record_op`).
    Executors stage their partition's items (small batches inline in the
    message, larger ones as segment files nobody reads yet); the driver then
    commits one record naming every partition's items in order, so the
    output becomes visible at once or, if the job fails, never. In a
    micro-batch the record carries the batch's ``commit_token`` and is
    committed once, even when the batch is replayed.
    """

    #: The op of the record :meth:`commit` appends ("append" for lists, "put" for maps).
    record_op: ClassVar[str]
    #: Staged output commits once per micro-batch, so every guarantee holds.
    guarantees: ClassVar[frozenset[ProcessingGuarantee]] = ALL_GUARANTEES

    @abstractmethod
    def log(self, store: StoreAccess) -> CommitLogAccess:
        """Runs on the driver and on executors: the commit log this sink writes."""

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver: a writer token naming this sink's staged segments."""
        return f"{context.job_id}-{uuid.uuid4().hex[:12]}"

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: stage this partition's items; the message names them."""
        return self.log(context.store).stage(items, state)

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: one record naming every partition's items, in order."""
        parts = [part for message in messages for part in message]
        log = self.log(context.store)
        if context.commit_token is None:
            log.commit(self.record_op, parts, writer=context.job_id)
        elif parts:  # a micro-batch: commit it once, even when replayed after a failure
            # (an empty micro-batch writes no record: its replay is empty too)
            log.commit_once(
                self.record_op, parts, token=context.commit_token, writer=context.writer_id,
                producer=context.producer_id, batch=context.batch_id,
            )

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: delete staged segment files, also of lost messages."""
        log = self.log(context.store)
        for message in messages:
            log.discard(message)
        log.discard_writer(state)


class StatefulTransform(_Participant):
    """A keyed stateful transform, applied with ``stage.group_by(key_fn).apply(transform)``.

    For each key, sparkjet keeps a state object: it calls :meth:`create_state`
    for a key seen for the first time and then :meth:`process` with the key's
    items in encounter order (in a batch job once, with all of them). Both run
    on executors; the instance is shipped with cloudpickle.
    """

    @abstractmethod
    def create_state(self) -> Any:
        """Runs on an executor: the state of a key seen for the first time."""

    @abstractmethod
    def process(self, state: Any, key: Any, items: list[Any]) -> tuple[Any, Iterable[Any]]:
        """Runs on an executor: fold ``items`` into ``state``; return ``(new_state, outputs)``."""

    def state_signature(self) -> str:
        """Identifies the state's layout; a snapshot whose signature differs is refused."""
        return f"{type(self).__module__}.{type(self).__qualname__}"


class SnapshotBackend(ABC):
    """Where exported snapshots are kept, selected by ``[snapshots] backend = "<kind>"``.

    All methods run on the driver. Paths are relative to the backend's root,
    use ``/`` and never contain ``..``; a folder is just the common prefix of
    the files under it (``a/b`` holds ``a/b/c``, never ``a/bc``).

    Four methods are abstract: :meth:`write_bytes`, :meth:`read_bytes`,
    :meth:`list` and :meth:`delete`. The others have defaults built on them
    that are correct but may be slow; override them where the storage has
    something better. In particular the default :meth:`create_exclusive`
    checks, then writes, which two writers can race: a backend whose storage
    has a real create-only write overrides it and
    :attr:`create_only_enforced`. Snapshots stay whole either way (each export
    writes into a folder of its own), but a backend that enforces it is
    preferred, and the conformance suite
    (:class:`sparkjet.testing.SnapshotBackendConformance`) expects it.

    Errors about the storage itself (unreachable, refused, misconfigured) are
    :class:`~sparkjet.errors.SnapshotBackendError` naming :attr:`kind` and the
    URL; pass every message through :meth:`redact` so no secret is shown.
    A missing file is :class:`FileNotFoundError`.
    """

    #: The name this backend is selected by in ``[snapshots] backend``.
    kind: ClassVar[str]

    #: Words that mark an option as a secret: its values are masked in messages.
    SECRET_OPTION_WORDS: ClassVar[tuple[str, ...]] = (
        "key", "secret", "token", "password", "credential", "auth", "signature",
    )

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        #: Where the snapshots are kept (as configured; may hold a secret: show :attr:`shown_url`).
        self.url = url
        #: Storage options (credentials, endpoints); never shown as they are.
        self.options = dict(options or {})
        self._secrets: list[str] = []

    # --- secrets ------------------------------------------------------------

    def add_secrets(self, values: Iterable[str]) -> None:
        """Mask these values too in all this backend shows (sparkjet adds ``${env:...}`` values)."""
        known = self.__dict__.setdefault("_secrets", [])
        known.extend(v for v in values if isinstance(v, str) and v)

    def redact(self, text: str) -> str:
        """``text`` with every secret masked as ``***``.

        Secrets are the values added by :meth:`add_secrets` and the string
        values of every option whose name contains one of
        :attr:`SECRET_OPTION_WORDS` (``key``, ``secret``, ``token``, ...),
        nested tables included; of the latter, values shorter than four
        characters are left alone (masking every ``k`` in a message would
        make it unreadable and hide nothing worth hiding).
        """
        added: list[str] = self.__dict__.get("_secrets", [])
        options: Mapping[str, Any] = getattr(self, "options", {})
        named = (v for v in _secret_values(options, self.SECRET_OPTION_WORDS) if len(v) >= 4)
        secrets = [*added, *named]
        for secret in sorted(set(secrets), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    @property
    def shown_url(self) -> str:
        """The URL as it may be printed (secrets masked)."""
        return self.redact(self.url)

    def describe(self) -> str:
        """``snapshot backend '<kind>' at <url>``: how messages name this backend."""
        return f"snapshot backend {self.kind!r} at {self.shown_url}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown_url!r})"

    # --- the four every backend implements -------------------------------------

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file, replacing any old one."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Read a whole file; FileNotFoundError if absent."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every file under the folder ``prefix`` (``""``: all), recursively.

        Paths are relative to the backend's root (as the other methods take
        them), sorted; an absent folder is an empty list. Listed afresh:
        never from a cache another process's writes could have outdated.
        """

    @abstractmethod
    def delete(self, prefix: str) -> None:
        """Delete the file ``prefix``, or every file under the folder ``prefix``; absent is fine."""

    # --- with defaults ---------------------------------------------------------

    @property
    def create_only_enforced(self) -> bool:
        """Whether :meth:`create_exclusive` is atomic (two racing creators: exactly one wins).

        False for the default check-then-write; a backend that overrides
        :meth:`create_exclusive` with its storage's create-only write says True.
        """
        return False

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` only if it does not exist; False if it already does.

        A create that a client retried after it had landed finds the file
        there: the file is read back, and one holding exactly ``data`` counts
        as written by this call (True). So callers make payloads unique.

        The default checks, then writes (see :attr:`create_only_enforced`).
        """
        try:
            return self.read_bytes(path) == data
        except FileNotFoundError:
            pass
        self.write_bytes(path, data)
        return True

    def exists(self, path: str) -> bool:
        """Whether the file ``path`` exists, asked afresh (default: tries to read it)."""
        try:
            self.read_bytes(path)
        except FileNotFoundError:
            return False
        return True

    def size(self, path: str) -> int:
        """The size of the file ``path`` in bytes, asked afresh; FileNotFoundError if absent."""
        return len(self.read_bytes(path))

    def list_children(self, prefix: str) -> builtins.list[str]:
        """Names of the files and folders directly in the folder ``prefix`` (``""``: root), sorted.

        The default derives them from :meth:`list`; override it where the
        storage lists one level at a time (a delimiter listing).
        """
        start = f"{prefix.rstrip('/')}/" if prefix.strip("/") else ""
        return sorted({p[len(start):].split("/", 1)[0] for p in self.list(prefix)})

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        """Write a whole file from ``chunks``, replacing any old one.

        For large files; the default joins the chunks and calls
        :meth:`write_bytes`. A file whose write failed half-way may be left
        behind: sparkjet writes data files where no reader looks until the
        manifest that names them exists.
        """
        self.write_bytes(path, b"".join(chunks))

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The file ``path`` in chunks of at most ``chunk_size`` bytes; FileNotFoundError if absent.

        The default reads the whole file at once.
        """
        data = self.read_bytes(path)
        for start in range(0, len(data), chunk_size):
            yield data[start : start + chunk_size]


def _secret_values(options: Mapping[str, Any], words: tuple[str, ...]) -> Iterator[str]:
    """The string values of options whose name holds one of ``words``, nested tables included."""
    for name, value in options.items():
        secret = any(word in str(name).lower() for word in words)
        if isinstance(value, Mapping):
            if secret:
                yield from _all_strings(value)
            else:
                yield from _secret_values(value, words)
        elif secret:
            yield from _all_strings(value)


#: Values of secret-named options that name a way to authenticate, not a secret (gcsfs tokens).
_NOT_SECRETS = frozenset({"anon", "google_default", "cache", "browser", "cloud"})


def _all_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if value and value not in _NOT_SECRETS:
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _all_strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _all_strings(item)
