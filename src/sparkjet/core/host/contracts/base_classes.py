"""The base classes of the plugins a pipeline's stages run, and what they declare.

:class:`Source`, :class:`Sink` (and :class:`CommitLogSink`, a sink built on a
store's commit log) and :class:`StatefulTransform`; the guarantees they may
declare (:data:`ALL_GUARANTEES`, :data:`AT_LEAST_ONCE_AT_MOST`); what a
source says of a read's size (:class:`InputSize`, :func:`source_lag`); and
:class:`BatchedItems`, for large inline data in partition descriptors.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

from sparkjet.core.host.contracts.contexts import JobContext, TaskContext
from sparkjet.core.host.contracts.store_access import CommitLogAccess, StoreAccess
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.store.naming import loads

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

    items: list[Any] = []
    for batch in batches:
        items.extend(loads(batch))
    return BatchedItems(items)


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
    Only for a source whose offsets count items (:attr:`Source.offsets_count_items`):
    :func:`lag_of` asks the source first.
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


def lag_of(source: Any, read: Any, available: Any) -> int | None:
    """How many items ``source`` has past ``read`` offsets up to ``available``; None if unknown.

    :func:`source_lag` for a source whose offsets count items
    (:attr:`Source.offsets_count_items`, the default); None for one that
    declares them opaque positions (bytes, timestamps, names), whatever
    their shape: a number that counts bytes is not a number of items.
    """
    if not getattr(source, "offsets_count_items", True):
        return None
    return source_lag(read, available)


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

    A streaming source's offsets (what :meth:`initial_offsets` and
    :meth:`latest_offsets` return) are JSON values of the source's own
    choosing, and it declares what they mean with
    :attr:`offsets_count_items`: item counts (the default: a number, or a
    list or dict of numbers, one per partition, that grows by one per item,
    as a stream's or Kafka's) or opaque positions (byte positions, times,
    file names). The job's lag (``sourceLag`` in its metrics, ``sparkjet
    jobs --follow``) and the default :meth:`range_size` count items from
    offsets only when they count items; opaque offsets show no lag and
    have no default size.

    Restoring a job from a snapshot holds the source to one more contract:
    every partition :meth:`watermark_partitions` names at the snapshot's
    offsets must be named by ``watermark_partitions(initial_offsets(...))``
    now (see :meth:`watermark_partitions`).
    """

    #: True for unbounded sources; such a pipeline runs as a streaming job.
    streaming: ClassVar[bool] = False
    #: True if :meth:`latest_offsets` takes ``start``, where the next micro-batch
    #: starts, to cap what one micro-batch reads (Spark's ``SupportsAdmissionControl``).
    #: sparkjet then always calls ``latest_offsets(context, start=...)``; otherwise
    #: ``latest_offsets(context)``. Checked against the method when the class registers.
    accepts_start: ClassVar[bool] = False
    #: What the offsets are: True (the default) if they count items, one per item
    #: in each partition (a number, or a list or dict of numbers, one per
    #: partition), so ``end - start`` is how many items a range holds; False if
    #: they are opaque positions (byte positions, times, names), which sparkjet
    #: only stores, compares for equality and hands back. Decides the job's
    #: lag (none is shown for opaque offsets) and the default :meth:`range_size`
    #: (None for opaque offsets); the source conformance kit checks it.
    offsets_count_items: ClassVar[bool] = True

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
        """Runs on the driver: where a job with no checkpoint starts reading.

        Name every partition the source has now (at its first offset: ``{"a.txt":
        0, "b.txt": 0}``, not ``{}``): a job restored from a snapshot compares
        ``watermark_partitions(initial_offsets(...))`` with the partitions of
        the snapshot's offsets, and refuses to start when one of those is not
        named (see :meth:`watermark_partitions`).
        """
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

        Not for windows only: starting a job from a snapshot (an upgrade, a
        restart from an exported snapshot) compares the partitions this names
        at the snapshot's offsets with those it names at
        ``initial_offsets(...)`` taken now. Every partition of the snapshot
        must be named now (new ones may come; they start at their initial
        offsets); one that is not counts as gone, and the job is refused
        unless told where the source starts (``source_starts``). So a source
        whose partitions are keys of its offsets returns them from
        :meth:`initial_offsets` too, each at its first offset; one that
        lists its partitions elsewhere (a folder, a topic's metadata) may
        name them here whatever ``offsets`` holds.
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

    def close(self, context: JobContext) -> None:
        """Runs on the driver each time the job stops running there: free what it holds.

        Called once the job's last micro-batch (or its batch run) is over and
        before its new status shows: completed, failed, cancelled, suspended,
        restarted by a failover, or taken over by another driver. Close what
        the driver-side methods opened (a consumer following a topic, a
        connection): a resumed job calls them again, so open lazily and
        leave the source ready for that. Executors' clients are theirs to
        keep or close. An error is logged, naming the stage, and changes
        nothing of the job's outcome. The default does nothing.
        """

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
        dict of numbers, one per partition (:func:`source_lag`), when the
        source declares its offsets count items (:attr:`offsets_count_items`);
        bytes unknown; None for other shapes and for opaque offsets.
        """
        items = lag_of(self, start, end)
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
