"""The map source and sink: named maps in the store (Jet's IMap)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sparkjet.plugin import (
    ALL_GUARANTEES,
    JobContext,
    Sink,
    Source,
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
                for key, value in log.payload(record):
                    entries[key] = value
            elif record.op == "remove":
                for key in log.payload(record):
                    entries.pop(key, None)
        pairs = list(entries.items())
        size = max(_CHUNK, -(-len(pairs) // max(1, context.parallelism)))
        return [pairs[i : i + size] for i in range(0, len(pairs), size)]

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: one chunk of entries."""
        return partition  # type: ignore[no-any-return]


class MapSink(Sink):
    """Upserts ``(key, value)`` items into the store's map ``name`` in one commit.

    When a key occurs more than once, the last one in encounter order wins.
    """

    kind = "map"
    guarantees = ALL_GUARANTEES

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver: a writer token naming this sink's staged segments."""
        return f"{context.job_id}-{uuid.uuid4().hex[:12]}"

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: check and stage this partition's pairs."""
        pairs = []
        for item in items:
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
        return context.store.map_log(self.name).stage(pairs, state)

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: one record upserting every partition's pairs, in order."""
        parts = [part for message in messages for part in message]
        log = context.store.map_log(self.name)
        if context.commit_token is None:
            log.commit("put", parts, writer=context.job_id)
        else:  # a micro-batch: commit it once, even when replayed after a failure
            log.commit_once("put", parts, token=context.commit_token, writer=context.writer_id)

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: delete staged segment files, also of lost messages."""
        log = context.store.map_log(self.name)
        for message in messages:
            log.discard(message)
        log.discard_writer(state)


@hookimpl
def register_sources(register: Any) -> None:
    """Register the map source."""
    register(MapSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the map sink."""
    register(MapSink)
