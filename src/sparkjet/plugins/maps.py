"""The map source and sink: named maps in the store (Jet's IMap)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sparkjet.plugin import (
    ALL_GUARANTEES,
    CommitLogAccess,
    CommitLogSink,
    InputSize,
    JobContext,
    KeyedWindowResult,
    LogRecord,
    Source,
    StoreAccess,
    TaskContext,
    hookimpl,
)

_CHUNK = 50_000


class MapSource(Source):
    """Reads the store's map ``name`` as ``(key, value)`` items, in first-insertion order."""

    kind = "map"
    guarantees = ALL_GUARANTEES

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: the map's entries as of job start, in chunks."""
        log = context.store.map_log(self.name)
        entries: dict[Any, Any] = {}
        for record in log.live_records():
            if record.op == "put":
                for key, value in _items(log, record):
                    entries[key] = value
            elif record.op == "remove":
                for key in _items(log, record):
                    entries.pop(key, None)
        pairs = list(entries.items())
        size = max(_CHUNK, -(-len(pairs) // max(1, context.parallelism)))
        return [pairs[i : i + size] for i in range(0, len(pairs), size)]

    def estimated_size(self, context: JobContext) -> InputSize | None:
        """Runs on the driver: how many entries the map holds (bytes unknown).

        Counted from the commit log's records, replaying their keys; a map
        with a part in a segment file (known only by reading it) is None.
        """
        keys: set[Any] = set()
        for record in context.store.map_log(self.name).live_records():
            if any(kind != "items" for kind, _ in record.parts):
                return None
            if record.op == "put":
                keys.update(key for part in record.parts for key, _ in part[1])
            elif record.op == "remove":
                keys.difference_update(key for part in record.parts for key in part[1])
        return InputSize(len(keys), None)

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: one chunk of entries."""
        return partition  # type: ignore[no-any-return]


class MapSink(CommitLogSink):
    """Upserts ``(key, value)`` items into the store's map ``name`` in one commit.

    A ``KeyedWindowResult`` is stored as ``key -> result``.

    When a key occurs more than once, the last one in encounter order wins.
    """

    kind = "map"
    guarantees = ALL_GUARANTEES
    record_op = "put"

    def log(self, store: StoreAccess) -> CommitLogAccess:
        """Runs on the driver and on executors: the map's commit log."""
        return store.map_log(self.name)

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: check and stage this partition's pairs."""
        pairs = []
        for item in items:
            if isinstance(item, KeyedWindowResult):  # a map entry, as in Jet
                item = item.entry()
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise TypeError(
                    f"map sink '{self.name}' takes (key, value) pairs, got {item!r}"
                )
            key = item[0]
            try:
                hash(key)
            except TypeError:
                raise TypeError(
                    f"map sink '{self.name}': key {key!r} is not hashable"
                ) from None
            pairs.append((key, item[1]))
        return self.log(context.store).stage(pairs, state)


def _items(log: CommitLogAccess, record: LogRecord) -> Iterator[Any]:
    """The items a record carries, in order: inline, or read from its segment files."""
    for kind, value in record.parts:
        yield from value if kind == "items" else log.read_segment(value)


@hookimpl
def register_sources(register: Any) -> None:
    """Register the map source."""
    register(MapSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the map sink."""
    register(MapSink)
