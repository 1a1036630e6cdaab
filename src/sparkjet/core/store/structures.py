"""Client-side handles for the store's lists, maps and streams (Jet's IList, IMap, IStream)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store.commit_log import CommitLog, LogCursor
from sparkjet.core.store.fs import Store
from sparkjet.core.store.stream_log import StreamLog

__all__ = ["IList", "IMap", "IStream"]


class IList:
    """A named, ordered list in the store.

    Every change is one atomic commit: readers in any process see it whole or
    not at all. Reads are cached and only new commits are read again.
    """

    def __init__(self, store: Store, name: str) -> None:
        self.name = name
        self._log: CommitLog = store.list_log(name)
        self._cursor = LogCursor()
        self._items: list[Any] = []

    def __repr__(self) -> str:
        return f"IList({self.name!r})"

    def _refresh(self) -> list[Any]:
        for record in self._log.read(self._cursor):
            if record.op == "clear":
                self._items = []
            else:
                self._items.extend(self._log.payload(record))
        return self._items

    def get_all(self) -> list[Any]:
        """Every item, in order (a copy)."""
        return list(self._refresh())

    def size(self) -> int:
        """Number of items."""
        return len(self._refresh())

    def __len__(self) -> int:
        return self.size()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get_all())

    def add(self, item: Any) -> None:
        """Append one item."""
        self.add_all([item])

    def add_all(self, items: Iterable[Any]) -> None:
        """Append ``items`` in one atomic commit."""
        batch = list(items)
        if batch:
            self._log.commit("append", [("items", batch)])

    def clear(self) -> None:
        """Remove every item (one atomic commit)."""
        self._log.commit("clear")

    def exists(self) -> bool:
        """True once anything was committed to the list (items, a ``clear``, a sink's output).

        An existing list may be empty; a name nothing was ever written to does not exist.
        """
        return self._log.exists()


class IMap:
    """A named key -> value map in the store; keys are any hashable Python values."""

    def __init__(self, store: Store, name: str) -> None:
        self.name = name
        self._log: CommitLog = store.map_log(name)
        self._cursor = LogCursor()
        self._data: dict[Any, Any] = {}

    def __repr__(self) -> str:
        return f"IMap({self.name!r})"

    def _refresh(self) -> dict[Any, Any]:
        for record in self._log.read(self._cursor):
            if record.op == "clear":
                self._data = {}
            elif record.op == "put":
                for pair in self._log.payload(record):
                    key, value = pair
                    self._data[key] = value
            elif record.op == "remove":
                for key in self._log.payload(record):
                    self._data.pop(key, None)
        return self._data

    def get(self, key: Any, default: Any = None) -> Any:
        """The value for ``key``, or ``default``."""
        return self._refresh().get(key, default)

    def contains_key(self, key: Any) -> bool:
        """True if ``key`` is present."""
        return key in self._refresh()

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value``."""
        self.put_all([(key, value)])

    def put_all(self, entries: dict[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        """Upsert every entry in one atomic commit."""
        pairs = list(entries.items()) if isinstance(entries, dict) else list(entries)
        for pair in pairs:
            try:
                hash(pair[0])
            except TypeError as exc:
                raise StoreError(f"map {self.name!r}: key {pair[0]!r} is not hashable") from exc
        if pairs:
            self._log.commit("put", [("items", pairs)])

    def remove(self, key: Any) -> None:
        """Remove ``key`` if present."""
        self._log.commit("remove", [("items", [key])])

    def entry_set(self) -> list[tuple[Any, Any]]:
        """Every ``(key, value)`` pair, in first-insertion order."""
        return list(self._refresh().items())

    def key_set(self) -> list[Any]:
        """Every key."""
        return list(self._refresh())

    def values(self) -> list[Any]:
        """Every value."""
        return list(self._refresh().values())

    def size(self) -> int:
        """Number of entries."""
        return len(self._refresh())

    def __len__(self) -> int:
        return self.size()

    def clear(self) -> None:
        """Remove every entry (one atomic commit)."""
        self._log.commit("clear")

    def exists(self) -> bool:
        """True once anything was committed to the map (entries, a removal, a ``clear``).

        An existing map may be empty; a name nothing was ever written to does not exist.
        """
        return self._log.exists()


class IStream:
    """A named stream in the store: an append-only, partitioned log.

    Safe for several publishers at once, in any processes sharing the store:
    each ``publish_all`` lands whole, and no item is lost or duplicated.
    """

    def __init__(self, store: Store, name: str, partitions: int | None = None) -> None:
        self.name = name
        self._log: StreamLog = store.stream_log(name)
        if partitions is not None:
            self._log.create(partitions)
            if self._log.partitions != partitions:
                raise StoreError(
                    f"stream {name!r} already exists with {self._log.partitions} partitions, "
                    f"not {partitions}"
                )

    def __repr__(self) -> str:
        return f"IStream({self.name!r})"

    def exists(self) -> bool:
        """True once the stream has been created (by a publisher, a sink or a source)."""
        return self._log.exists()

    @property
    def partition_count(self) -> int:
        """Number of partitions (set when the stream was created)."""
        return self._log.partitions

    def publish(self, item: Any) -> None:
        """Append one item."""
        self._log.publish_all([item])

    def publish_all(self, items: Iterable[Any]) -> None:
        """Append ``items``: each partition receives its share as one atomic chunk."""
        self._log.publish_all(items)

    def size(self) -> int:
        """Number of items published so far."""
        return self._log.size()

    def __len__(self) -> int:
        return self.size()

    def end_offsets(self) -> list[int]:
        """Per partition, the offset the next published item gets (its item count)."""
        return self._log.end_offsets()

    def start_offsets(self) -> list[int]:
        """Per partition, the first offset it still holds (0 until ``sparkjet trim`` ran)."""
        return self._log.start_offsets()

    def read(self, partition: int, start: int | None = None, end: int | None = None) -> list[Any]:
        """The items of ``partition`` from offset ``start`` up to ``end`` (its end if None).

        ``start`` None: from the oldest item the partition still holds (where
        retention left it, see :meth:`start_offsets`). An explicit ``start``
        below that is a StoreError naming the stream, the partition and the
        offsets trimmed.
        """
        if start is None:
            return self._log.read_held(partition, end)
        if end is None:
            end = self._log.end_offset(partition)
        if start >= end:
            return []
        return self._log.read(partition, start, end)

    def read_all(self) -> list[Any]:
        """Every item still held, partition by partition (for tests and tools)."""
        out: list[Any] = []
        for partition in range(self._log.partitions):
            out.extend(self._log.read_held(partition))
        return out
