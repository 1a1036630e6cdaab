"""Writing to a stream: appends, publishes over the partitions, and micro-batch sinks' batches.

A chunk is created with a create-only write under the name of its first
offset, so concurrent publishers never overwrite or interleave: one who
loses the race for an offset looks again and takes the next one. A plain
publisher's chunk carries a random token; an exactly-once writer's carries
``@<batch token>``, is appended once per token (its split into partitions
written ahead, so a replay appends the same items) and registered
(:mod:`~sparkjet.core.store.stream_registry`).
"""

from __future__ import annotations

import json
import pickle
import random
import secrets
from collections.abc import Iterable
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store import notify
from sparkjet.core.store.naming import PICKLE_PROTOCOL, json_loads
from sparkjet.core.store.stream_chunks import _BATCH, _HEADER
from sparkjet.core.store.stream_follow import StreamEnds
from sparkjet.core.store.stream_registry import StreamRegistry


class StreamWriting(StreamEnds, StreamRegistry):
    """Appending chunks to a stream's partitions."""

    def append(self, partition: int, items: list[Any], token: str = "",
               payload: bytes | None = None) -> int:
        """Append ``items`` as one chunk; returns its first offset.

        ``token`` names an exactly-once writer's batch (see :meth:`find_token`);
        without one the chunk gets a random token of its own. ``payload`` is
        ``items`` pickled already (see :meth:`publish_all`). This process's
        waiters (:meth:`wait_for_append`) wake once the chunk landed; for a
        batch's chunk (:meth:`append_batch`) once it is registered instead.
        """
        if not items:
            return self.end_offset(partition)
        if payload is None:
            payload = self._pickled(items, range(len(items)))
        encoded = (token or f"~{secrets.token_hex(8)}").encode()
        data = _HEADER.pack(len(items), len(encoded)) + encoded + payload
        while True:
            start = self.end_offset(partition)
            path = self.paths.chunk(partition, start)
            if self.store.create_exclusive(path, data):
                if not token.startswith(_BATCH):
                    notify.signal(self.paths.folder)
                return start
            # Another publisher took this offset: look again.

    def publish_all(self, items: Iterable[Any], partition_of: Any = None) -> None:
        """Spread ``items`` over the partitions, one chunk per partition touched.

        Without ``partition_of`` items go round-robin from a random partition.
        """
        batch = list(items)
        n = self._partitions_now()
        buckets: list[list[Any]] = [[] for _ in range(n)]
        places: list[list[int]] = [[] for _ in range(n)]
        first = random.randrange(n)
        for i, item in enumerate(batch):
            p = (first + i) % n if partition_of is None else partition_of(item) % n
            buckets[p].append(item)
            places[p].append(i)
        # Every chunk pickled before the first is written: an item that cannot
        # be pickled fails the call having written nothing.
        payloads = [self._pickled(bucket, places[p]) if bucket else b""
                    for p, bucket in enumerate(buckets)]
        for partition, bucket in enumerate(buckets):
            if bucket:
                self.append(partition, bucket, payload=payloads[partition])

    def _pickled(self, items: list[Any], indexes: Iterable[int]) -> bytes:
        """``items`` pickled; an item that cannot be is named by its index and type.

        ``indexes`` are the items' places in what the caller passed.
        """
        try:
            return pickle.dumps(items, protocol=PICKLE_PROTOCOL)
        except Exception as exc:
            for place, item in zip(indexes, items, strict=False):
                try:
                    pickle.dumps(item, protocol=PICKLE_PROTOCOL)
                except Exception as item_exc:
                    kind = type(item)
                    raise TypeError(
                        f"stream {self.name!r}: nothing was published: item {place} (of type "
                        f"{kind.__module__}.{kind.__qualname__}) cannot be pickled: "
                        f"{type(item_exc).__name__}: {item_exc}"
                    ) from item_exc
            raise TypeError(f"stream {self.name!r}: nothing was published: the items cannot "
                            f"be pickled: {type(exc).__name__}: {exc}") from exc

    def writer_starts(self, writer: str) -> list[int]:
        """The end offsets ``writer`` recorded before its last batch (zeros if none).

        An idempotent writer's last batch starts at or after them, so a replay
        looks for its chunks from there (see :meth:`find_token`).
        """
        try:
            raw = self.store.read_bytes(self.paths.writer_index(writer))
        except FileNotFoundError:
            return [0] * self.partitions
        starts: list[int] = self.store.decode(
            self.paths.writer_index(writer), raw, json_loads, f"stream {self.name!r}: writer index",
            keys=("ends",))["ends"]
        return starts

    def record_writer_starts(self, writer: str) -> None:
        """Record the current end offsets as where ``writer``'s next batch starts."""
        self.store.write_bytes(
            self.paths.writer_index(writer), json.dumps({"ends": self.end_offsets()}).encode()
        )

    def find_token(self, partition: int, token: str, from_offset: int) -> int | None:
        """The offset of the first chunk at or after ``from_offset`` that carries ``token``.

        A batch's chunk carries ``@<token>`` (see :meth:`append_batch`); one
        written before batch chunks were registered carries ``token`` itself.
        """
        for start in self.chunk_starts(partition):
            if start >= from_offset and self._header(partition, start)[1] in (
                    _BATCH + token, token):
                return start
        return None

    def append_buckets(self, buckets: list[list[Any]], writer: str, token: str | None) -> None:
        """Append ``buckets[p]`` to partition ``p``, as a sink's commit does.

        With a ``token``, once per token (see :meth:`append_batch`); without one,
        as plain appends of the non-empty buckets.
        """
        if token:
            self.append_batch(writer, token, buckets)
            return
        for partition, bucket in enumerate(buckets):
            if bucket:
                self.append(partition, bucket)

    def append_batch(self, writer: str, token: str, buckets: list[list[Any]]) -> None:
        """Append one batch's items, ``buckets[p]`` to partition ``p``, once per ``token``.

        For a sink replaying a micro-batch: partitions whose chunk with
        ``token`` landed already are skipped. The split into partitions is
        written ahead (``writers/<writer>.<token>.pending``) before the first
        append, and a replay uses that split, not its own: the order in which
        a replay sees its items (after a shuffle, fetch order) may differ, so
        splitting again could append another item set to the partitions that
        had not landed yet, losing some items and doubling others.
        """
        if len(buckets) != self._partitions_now():
            raise StoreError(
                f"stream {self.name!r}: {len(buckets)} buckets for {self.partitions} partitions "
                "(was the stream deleted and made anew with other partitions?)"
            )
        pending = self.paths.pending(writer, token)
        starts = self.writer_starts(writer)
        landed = [
            standing if (standing := self.registered(p, token)) is not None
            else self.find_token(p, token, starts[p])
            for p in range(self.partitions)
        ]
        if all(offset is None for offset in landed):
            # Remember where this batch starts, so a replay after a crash in the
            # middle finds the chunks that landed.
            self.record_writer_starts(writer)
            data = pickle.dumps(buckets, protocol=PICKLE_PROTOCOL)
            if not self.store.create_exclusive(pending, data):
                buckets = self._pending(pending)  # an earlier attempt's split stands
        else:
            try:
                buckets = self._pending(pending)
            except FileNotFoundError:
                return  # every partition landed; the split was forgotten after
        for partition, bucket in enumerate(buckets):
            if not bucket:
                continue
            offset = landed[partition]
            if offset is None:
                offset = self.append(partition, bucket, _BATCH + token)
            self.register(partition, token, offset)  # no-op where it stands already
            # Woken now, a reader finds the chunk registered (it would wait for that).
            notify.signal(self.paths.folder)
        self.store.remove(pending)

    def _pending(self, path: str) -> list[list[Any]]:
        buckets: list[list[Any]] = self.store.read_pickle(
            path, f"stream {self.name!r}: pending batch")
        return buckets
