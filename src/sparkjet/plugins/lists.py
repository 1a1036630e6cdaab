"""The list source and sink: named lists in the store (Jet's IList)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sparkjet.plugin import (
    ALL_GUARANTEES,
    BatchedItems,
    JobContext,
    Sink,
    Source,
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


class ListSink(Sink):
    """Appends the job's output to the store's list ``name``, in order, in one commit."""

    kind = "list"
    guarantees = ALL_GUARANTEES

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver: a writer token naming this sink's staged segments."""
        return f"{context.job_id}-{uuid.uuid4().hex[:12]}"

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: stage this partition's items."""
        return context.store.list_log(self.name).stage(items, state)

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: one record naming every partition's items, in order."""
        parts = [part for message in messages for part in message]
        log = context.store.list_log(self.name)
        if context.commit_token is None:
            log.commit("append", parts, writer=context.job_id)
        else:  # a micro-batch: commit it once, even when replayed after a failure
            log.commit_once("append", parts, token=context.commit_token, writer=context.writer_id)

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: delete staged segment files, also of lost messages."""
        log = context.store.list_log(self.name)
        for message in messages:
            log.discard(message)
        log.discard_writer(state)


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
