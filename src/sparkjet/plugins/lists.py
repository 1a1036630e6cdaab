"""The list source and sink: named lists in the store (Jet's IList)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sparkjet.plugin import (
    ALL_GUARANTEES,
    BatchedItems,
    CommitLogAccess,
    CommitLogSink,
    InputSize,
    JobContext,
    Source,
    StoreAccess,
    TaskContext,
    hookimpl,
)


class ListSource(Source):
    """Reads a list: the store's list ``name``, or ``items`` given inline.

    With ``items`` (``Pipeline.from_list(name, items)``) the items are shipped
    from this process and ``name`` only names the source; without, the list
    ``name`` is read from the store as it is when the job starts.
    """

    kind = "list"
    guarantees = ALL_GUARANTEES

    def __init__(self, name: str, items: Iterable[Any] | None = None) -> None:
        super().__init__(name)
        self.items = None if items is None else list(items)

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: inline chunks, or the stored list's parts in order."""
        if self.items is not None:
            return [
                ("inline", BatchedItems(chunk))
                for chunk in _chunks(self.items, context.parallelism)
            ]
        log = context.store.list_log(self.name)
        parts: list[tuple[str, Any]] = []
        for record in log.live_records():
            parts.extend(record.parts)
        return parts

    def estimated_size(self, context: JobContext) -> InputSize | None:
        """Runs on the driver: how many items the list holds (bytes unknown).

        Inline items are counted; a stored list is counted from its commit
        log's records, which carry small batches inline: a list with a part
        in a segment file (counted only by reading it) is None (unknown).
        """
        if self.items is not None:
            return InputSize(len(self.items), None)
        count = 0
        for record in context.store.list_log(self.name).live_records():
            for kind, value in record.parts:
                if kind != "items":
                    return None
                count += len(value)
        return InputSize(count, None)

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: the items of one part."""
        kind, value = partition
        if kind == "inline":
            return value.items  # type: ignore[no-any-return]
        if kind == "items":
            return value  # type: ignore[no-any-return]
        return context.store.list_log(self.name).read_segment(value)

    def __getstate__(self) -> dict[str, Any]:
        # Executors get their items through partitions, not through the source.
        return {"name": self.name, "items": None}


class ListSink(CommitLogSink):
    """Appends the job's output to the store's list ``name``, in order, in one commit."""

    kind = "list"
    guarantees = ALL_GUARANTEES
    record_op = "append"

    def log(self, store: StoreAccess) -> CommitLogAccess:
        """Runs on the driver and on executors: the list's commit log."""
        return store.list_log(self.name)


def _chunks(items: list[Any], parts: int) -> list[list[Any]]:
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


@hookimpl
def register_sources(register: Any) -> None:
    """Register the list source."""
    register(ListSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the list sink."""
    register(ListSink)
