"""The stream source and sink: named streams in the store (Jet's event journal)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sparkjet.plugin import (
    ALL_GUARANTEES,
    InputSize,
    JobContext,
    Sink,
    Source,
    StreamLogAccess,
    TaskContext,
    hookimpl,
)

_POSITIONS = ("oldest", "latest")


class StreamSource(Source):
    """Reads the store's stream ``name`` as an unbounded source, replayable by offset.

    ``initial_position`` says where a job without a checkpoint starts:
    ``"oldest"`` (every item in the stream) or ``"latest"`` (only items
    published after the job started). A missing stream is created with
    ``partitions`` partitions (default: Spark's parallelism) when the job starts.
    """

    kind = "stream"
    guarantees = ALL_GUARANTEES
    streaming = True

    def __init__(
        self, name: str, initial_position: str = "oldest", partitions: int | None = None
    ) -> None:
        super().__init__(name)
        if initial_position not in _POSITIONS:
            raise ValueError(
                f"StreamSource({name!r}): initial_position must be 'oldest' or 'latest', "
                f"got {initial_position!r}"
            )
        self.initial_position = initial_position
        self.partitions_wanted = partitions

    def _log(self, context: JobContext | TaskContext) -> StreamLogAccess:
        return context.store.stream_log(self.name)

    def initial_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: the first offsets still held, or the current ends for ``latest``."""
        log = self._log(context)
        if not log.exists():
            log.create(self.partitions_wanted or context.parallelism)
        if self.initial_position == "latest":
            return log.end_offsets()
        return log.start_offsets()  # zeros, unless retention trimmed the stream

    def latest_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: the end offset of every partition."""
        return self._log(context).end_offsets()

    def wait_for_data(self, offsets: Any, timeout: float, context: JobContext) -> bool:
        """Runs on the driver: wake on an append past ``offsets`` (the stream log's wait).

        Within a millisecond for a publisher in the driver's process, a few
        for another process on a local store, the poll interval on S3 or GCS.
        """
        return self._log(context).wait_for_append(offsets, timeout)

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: ``(partition, start, end)`` for each partition with new items."""
        return [(p, s, e) for p, (s, e) in enumerate(zip(start, end, strict=True)) if e > s]

    def range_size(self, start: Any, end: Any, context: JobContext) -> InputSize | None:
        """Runs on the driver: the items between the offsets, and the bytes of their chunks.

        Items count as offsets do (a batch's second chunk, appended by a
        fenced-off driver, counts though readers skip it). Bytes come from
        the listing :meth:`latest_offsets` made (see
        :meth:`~sparkjet.plugin.StreamLogAccess.range_bytes`): None where it
        does not tell without another request.
        """
        if not (isinstance(start, list) and isinstance(end, list) and len(start) == len(end)):
            return None  # not this source's offsets (plan_range would refuse them)
        size = super().range_size(start, end, context)
        if size is None or not size.items:
            return None if size is None else InputSize(0, 0)
        return InputSize(size.items, self._log(context).range_bytes(start, end))

    def watermark_partition(self, descriptor: Any) -> str:
        """The stream partition a descriptor ``(partition, start, end)`` reads."""
        return str(descriptor[0])

    def offset_of(self, descriptor: Any, index: int) -> Any:
        """The stream offset of the ``index``-th item of ``(partition, start, end)``."""
        return descriptor[1] + index

    def watermark_partitions(self, offsets: Any) -> Sequence[str]:
        """Every partition of the stream (its offsets are one per partition)."""
        return [str(p) for p in range(len(offsets))]

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """A stream has no batch plan: streaming jobs call :meth:`plan_range`."""
        raise NotImplementedError("StreamSource is read by streaming jobs only")

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: the items of one partition's offset range."""
        p, start, end = partition
        return self._log(context).read(p, start, end)


class StreamSink(Sink):
    """Appends the job's output to the store's stream ``name``.

    In a streaming job each micro-batch is appended once, even when a batch is
    replayed after a failure: chunks carry the batch's token, the batch's split
    into partitions is written ahead, and a replayed commit appends the
    recorded split to the partitions that do not hold the token yet.
    """

    kind = "stream"
    guarantees = ALL_GUARANTEES

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: this partition's items, to publish at commit."""
        return list(items)

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: append each partition's share, idempotently per batch."""
        log = context.store.stream_log(self.name)
        if not log.exists():
            log.create(context.parallelism)
        items = [item for message in messages for item in message]
        n = log.partitions
        buckets = [items[partition::n] for partition in range(n)]
        log.append_buckets(buckets, context.writer_id, context.commit_token)


@hookimpl
def register_sources(register: Any) -> None:
    """Register the stream source."""
    register(StreamSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the stream sink."""
    register(StreamSink)
