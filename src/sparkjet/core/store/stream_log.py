"""Named streams in the store: append-only, partitioned logs with offsets.

A stream is a folder ``streams/<name>/`` with ``meta.json`` (partition count)
and one folder per partition holding *chunks*. A chunk is created with a
create-only write under the name of its first offset, so concurrent
publishers never overwrite or interleave: one who loses the race for an offset
looks again and takes the next one. A chunk file is::

    8 bytes   item count (big-endian)
    2 bytes   length of the writer token
    n bytes   writer token (utf-8; empty for plain publishers)
    rest      pickle of the list of items

The token lets an exactly-once writer (a sink replaying a micro-batch) find
out whether its chunk already landed; a plain publisher's token is a random
``~<hex>``, so no two publishers' chunks are ever byte-equal (a create that
the filesystem client retried is recognised by its content, see
:meth:`sparkjet.core.store.fs.Store.create_exclusive`). A micro-batch sink's
chunk carries ``@<batch token>`` and counts only where
``registry/p<partition>/<token>`` (created only if absent, holding an
offset) says: a second chunk of a batch, appended by a driver that was fenced
off but not yet aware, is skipped by every reader (see :meth:`StreamLog.register`).
Offsets still count its items, so ``size()`` may exceed what readers return.

Reading checks what the offsets promise: chunk ``n`` of a partition must
start where chunk ``n-1`` ends, and hold as many items as its header says.
A gap (a missing or overstated chunk) or a truncated chunk is an error naming
the file, never a silent loss. Where the files lie is
:class:`~sparkjet.core.store.layout.StreamPaths`.

Finding the end: on S3 or GCS a partition is listed (the listing carries the
chunks' sizes). On a local or in-memory store, where a listing costs a stat
per chunk, a partition this process has seen is *followed*: chunks are only
ever created at the end offset, so the header of the chunk named by the
known end says whether one came and where it ends (see
:meth:`StreamLog.end_offset`).

Retention (:meth:`StreamLog.trim`) removes a partition's oldest chunks, so
the partition starts later; offsets below its start are *trimmed*, and a read
of them is an error saying so. When every chunk goes, a start marker
``<offset>.start`` keeps the partition's end offset (offsets are never handed
out twice): a partition starts at its first chunk, or at its highest marker
when it has none.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import pickle
import random
import secrets
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.naming import PICKLE_PROTOCOL, json_loads
from sparkjet.core.store import notify
from sparkjet.core.store.files import StoreFiles

_HEADER = struct.Struct(">QH")
#: A micro-batch sink's chunk carries its batch token after this prefix; it
#: counts only at the offset the token's registration names.
_BATCH = "@"
#: How long a reader waits for a batch chunk's registration before making it.
PENDING_WAIT_SECONDS = 30.0
_MAX_PARTITIONS = 4096
#: On an object store (S3, GCS), how long :meth:`StreamLog.wait_for_append`
#: first waits before saying data may be there (other processes' appends are
#: seen only by listing): the default of ``[engine] stream_poll_seconds``.
REMOTE_POLL_SECONDS = 0.05
#: While a stream stays idle, the remote poll interval grows up to this:
#: the default of ``[engine] idle_poll_max_seconds``.
IDLE_POLL_MAX_SECONDS = 5.0
#: Each look that finds nothing makes the next interval this many times as long
#: (0.05 s, 0.2, 0.8, 3.2, then the most: at the most after 4.25 idle seconds).
BACKOFF_FACTOR = 4.0
#: How long a store handle (a client's) trusts a stream's ``meta.json`` (its
#: partition count) before reading it again.
META_SECONDS = 60.0
#: On a local store, how often a waiter stats the partition folders for
#: appends by other processes (a chunk's create changes its folder's mtime).
LOCAL_STAT_SECONDS = 0.005
#: How long a chunk kept by a header's read serves the read of its items: the
#: read a look is for comes within a micro-batch; a copy older than this (or
#: of another size than the newest listing says) is fetched again, as a stream
#: deleted and made anew by another process has new chunks under old names.
READ_AHEAD_SECONDS = 2.0
#: How much of a chunk the look for its header fetches (one ranged GET either
#: way): a chunk that fits is kept for the read of its items that follows.
HEAD_BYTES = 16 << 10
#: A folder's mtime is the kernel's coarse clock: a change within this long of
#: it may leave it as it was, so a waiter that saw one this recent lists again
#: once this much time has passed.
_MTIME_SETTLE_NS = 20_000_000


@dataclass(frozen=True)
class PollSettings:
    """How often a waiter on an object store lists a stream's partitions.

    The first look comes ``first`` seconds after the last; each look that
    finds nothing new makes the interval :data:`BACKOFF_FACTOR` times as
    long, up to ``most``; data (the
    caller's offsets moved, or an append in this process) starts it over.
    """

    first: float = REMOTE_POLL_SECONDS
    most: float = IDLE_POLL_MAX_SECONDS


def poll_settings(store: Any) -> PollSettings:
    """The poll settings a store carries (a client's configuration), or the defaults."""
    settings = getattr(store, "poll", None)
    return settings if isinstance(settings, PollSettings) else PollSettings()


def _partitions_of(meta: Any) -> None:
    """Checks a stream's meta.json (``{"partitions": <int>, ...}``)."""
    if int(meta["partitions"]) < 1:
        raise ValueError(f"partitions must be at least 1, got {meta['partitions']!r}")


class StreamLog:
    """One stream's files; picklable (executors read chunks directly)."""

    def __init__(self, store: StoreFiles, name: str) -> None:
        self.store = store
        self.name = name
        #: Where the stream's files lie.
        self.paths = store.layout.stream_paths(name)
        self._partitions: int | None = None
        #: Registrations read or made here: (partition, token) -> offset.
        self._registry: dict[tuple[int, str], int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "name": self.name, "paths": self.paths,
                "_partitions": self._partitions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._registry = {}

    # --- metadata -------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the stream has been created."""
        return self.store.exists(self.paths.meta)

    def create(self, partitions: int) -> bool:
        """Create the stream with ``partitions`` partitions; False if it already exists."""
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not (
            1 <= partitions <= _MAX_PARTITIONS
        ):
            raise StoreError(
                f"stream {self.name!r}: partitions must be an int from 1 to {_MAX_PARTITIONS}, "
                f"got {partitions!r}"
            )
        meta = json.dumps({"format": 1, "partitions": partitions}).encode()
        self._meta_cache.pop(self.paths.meta, None)
        return self.store.create_exclusive(self.paths.meta, meta)

    @property
    def _meta_cache(self) -> dict[str, tuple[int, float]]:
        """The partition counts this store handle read, on S3 or GCS (elsewhere reads are free)."""
        cache = getattr(self.store, "stream_meta", None)
        return cache if isinstance(cache, dict) and self._where() == "remote" else {}

    @property
    def _ahead(self) -> dict[str, tuple[bytes, float]]:
        """Whole chunks a header's read fetched on S3 or GCS, kept on the store handle.

        See :data:`HEAD_BYTES`; elsewhere a read is free, and nothing is kept.
        """
        cache = getattr(self.store, "read_ahead", None)
        return cache if isinstance(cache, dict) and self._where() == "remote" else {}

    @property
    def partitions(self) -> int:
        """Number of partitions; StoreError naming the stream if it does not exist."""
        if self._partitions is None:
            known = self._meta_cache.get(self.paths.meta)
            if known is not None and time.monotonic() - known[1] < META_SECONDS:
                self._partitions = known[0]
                return known[0]
            try:
                meta = self.store.read_json(
                    self.paths.meta, f"stream {self.name!r}: meta", check=_partitions_of)
            except FileNotFoundError:
                raise StoreError(
                    f"stream {self.name!r} does not exist in store {self.store.shown_url!r}: "
                    "create it with client.get_stream(name, partitions=N) first"
                ) from None
            self._partitions = int(meta["partitions"])
            self._meta_cache[self.paths.meta] = (self._partitions, time.monotonic())
        return self._partitions

    def _partitions_now(self) -> int:
        """The partition count read afresh, for a write.

        A count cached by this handle or its store (:data:`META_SECONDS`) may
        be older than the stream: another process may have deleted it and
        made it anew with other partitions, and items split by the old count
        would land in folders no reader lists. A write pays one read.
        """
        self._meta_cache.pop(self.paths.meta, None)
        self._partitions = None
        return self.partitions

    def chunk_starts(self, partition: int) -> list[int]:
        """The first offsets of ``partition``'s chunks, in order (listed afresh)."""
        return self._listing(partition)[0]

    def _listing(self, partition: int) -> tuple[list[int], list[int]]:
        """``partition``'s chunk starts and start markers, each in order, from one listing."""
        starts, marks, _ = self._sized_listing(partition)
        return starts, marks

    def _sized_listing(
        self, partition: int
    ) -> tuple[list[int], list[int], dict[int, int] | None]:
        """:meth:`_listing`, with the chunks' sizes where the listing has them at no cost.

        An object store's listing (S3, GCS) carries every file's size in the
        same request; a local or in-memory one would stat (build the details
        of) every chunk, so it lists names only (sizes None).
        """
        folder = self.paths.partition(partition)
        if self._where() != "remote":
            names: Iterable[str] = self.store.listdir(folder)
            sizes: dict[int, int] | None = None
        else:
            entries = self.store.entries(folder)
            names, sizes = entries, {}
        starts, marks = [], []
        for entry in names:
            if (start := self.paths.chunk_start(entry)) is not None:
                starts.append(start)
                if sizes is not None:
                    sizes[start] = entries[entry].size
            elif (mark := self.paths.start_mark_offset(entry)) is not None:
                marks.append(mark)
        return sorted(starts), sorted(marks), sizes

    def _corrupt(self, path: str, why: str) -> StoreError:
        return StoreError(self.store.redact(f"stream {self.name!r}: chunk {path!r} {why}"))

    def _header(self, partition: int, start: int) -> tuple[int, str]:
        path = self.paths.chunk(partition, start)
        remote = self._where() == "remote"
        head = self.store.read_range(path, 0, HEAD_BYTES if remote else _HEADER.size + 512)
        if remote and len(head) < HEAD_BYTES:  # the whole chunk: its read need not fetch it
            _read_ahead(self._ahead, path, head)
        if len(head) < _HEADER.size:
            raise self._corrupt(path, f"is truncated ({len(head)} bytes, no header)")
        count, token_len = _HEADER.unpack_from(head)
        if len(head) < _HEADER.size + token_len:
            raise self._corrupt(path, "is truncated (its writer token is cut off)")
        token = head[_HEADER.size : _HEADER.size + token_len].decode("utf-8", "replace")
        return count, token

    # --- offsets --------------------------------------------------------------

    def end_offset(self, partition: int) -> int:
        """The offset after the last item of ``partition``.

        On a local or in-memory store, a partition this process listed before
        is followed instead of listed again (:meth:`_followed_end`): a listing
        costs a stat per chunk there, and a long-lived stream has thousands.
        """
        if self._where() != "remote":
            end = self._followed_end(partition)
            if end is not None:
                return end
        return self._listed_with_end(partition)[2]

    def _followed_end(self, partition: int) -> int | None:
        """``partition``'s end offset from what this process last saw of it, or None.

        Chunks are created only at the partition's end offset, under its name,
        and never change, so the chunks past a known end are found by reading
        the header of the chunk named by the end, then of the one after it,
        until one is absent: a read per new chunk and one more, whatever the
        partition holds. What was seen is checked first: its newest chunk
        must still be there, with the writer token it had (a folder removed
        and written again is not taken for the one seen), or, when a trim
        removed every chunk, the start marker at the end must be. None (list
        the partition) when it is not, when nothing was seen yet, or when a
        trim removes a chunk while this reads.
        """
        folder = self.paths.partition(partition)
        known = _CHUNKS.get(folder)
        if known is None:
            return None
        starts, sizes, end, newest = known
        seen = notify.generation(self.paths.folder)  # before looking: see wait_for_append
        at = time.time_ns()
        stamp = _stamp(folder) if self._where() == "local" else None
        try:
            if starts:
                count, token = self._header(partition, starts[-1])
                if token != newest or starts[-1] + count != end:
                    return None
            elif end and not self.store.exists(self.paths.start_mark(partition, end)):
                return None
            found: list[int] = []
            while True:
                try:
                    count, newest = self._header(partition, end)
                except FileNotFoundError:
                    break
                found.append(end)
                end += count
        except FileNotFoundError:
            return None  # trimmed while this read: list it
        _LISTED[folder] = (end, seen, stamp, at)
        _CHUNKS[folder] = (starts + found, sizes, end, newest) if found else known
        return end

    def _listed_with_end(self, partition: int) -> tuple[list[int], list[int], int]:
        """``partition``'s chunk starts, start markers and end offset.

        Listed again if a trim removed the newest chunk before its header was
        read (a marker carries the end offset then).
        """
        while True:
            folder = self.paths.partition(partition)
            seen = notify.generation(self.paths.folder)  # before listing: see wait_for_append
            at = time.time_ns()
            stamp = _stamp(folder) if self._where() == "local" else None
            starts, marks, sizes = self._sized_listing(partition)
            if self._where() == "remote":
                _POLLED_AT[(self.paths.folder, threading.get_ident())] = time.monotonic()
            try:
                end, newest = self._end(partition, starts, marks, _CHUNKS.get(folder), sizes)
                _LISTED[folder] = (end, seen, stamp, at)
                _remember_chunks(folder, starts, sizes, end, newest)
                return starts, marks, end
            except FileNotFoundError:
                if self._listing(partition) == (starts, marks):
                    raise  # not a trim: the chunk is missing
                continue

    def _end(
        self, partition: int, starts: list[int], marks: list[int],
        known: tuple[list[int], dict[int, int], int, str] | None = None,
        sizes: dict[int, int] | None = None,
    ) -> tuple[int, str]:
        """The end offset of a partition listed as ``starts`` and ``marks``, and its token.

        The token: the newest chunk's writer token ("" without chunks).
        ``known``: what this process last saw of the partition; when its
        newest chunk is the listing's newest too (chunks never change once
        written), its end stands without reading the chunk's header again:
        on S3 and GCS, where the listing's size of it must match too (a
        stream removed and created again is not taken for the one seen).
        """
        mark = marks[-1] if marks else 0
        if not starts:
            return mark, ""
        newest = starts[-1]
        if (known is not None and known[0] and known[0][-1] == newest and known[3]
                and sizes is not None and newest in sizes
                and known[1].get(newest) == sizes[newest]):
            return max(known[2], mark), known[3]
        count, token = self._header(partition, starts[-1])
        return max(starts[-1] + count, mark), token

    def end_offsets(self) -> list[int]:
        """The end offset of every partition."""
        return [self.end_offset(p) for p in range(self.partitions)]

    def size(self) -> int:
        """How many items were appended, over every partition."""
        return sum(self.end_offsets())

    def range_bytes(self, starts: Sequence[int], ends: Sequence[int]) -> int | None:
        """The bytes reading offsets ``[starts[p], ends[p])`` of every partition ``p`` fetches.

        The sizes of the chunks holding those offsets (a read fetches whole
        chunks), from what this process saw when it last listed or followed
        each partition (:meth:`end_offsets` looks at every one). On S3 or GCS
        the listing carries the sizes, and nothing more is asked: None when it
        does not cover a range (listed before the range's end, or never in
        this process), since finding out would cost a request per partition.
        On a local or in-memory store a chunk's size is stat'ed once (chunks
        never change), and a partition not listed up to the range's end is
        listed. None also for offsets of another shape than one int per
        partition, or offsets trimmed before the listing.
        """
        if (len(starts) != len(ends)
                or not all(type(o) is int for o in (*starts, *ends))):
            return None
        where = self._where()
        remote = where == "remote"
        total = 0
        for partition, (start, end) in enumerate(zip(starts, ends, strict=True)):
            if end <= start:
                continue
            folder = self.paths.partition(partition)
            known = _CHUNKS.get(folder)
            if (known is None or known[2] < end) and not remote:
                self._listed_with_end(partition)
                known = _CHUNKS.get(folder)
            if known is None:
                return None
            chunks, sizes, listed_end, _ = known
            first = bisect.bisect_right(chunks, start) - 1  # the chunk holding ``start``
            if listed_end < end or first < 0:
                return None  # not listed up to the end yet, or trimmed below ``start``
            for chunk in chunks[first : bisect.bisect_left(chunks, end)]:
                size = sizes.get(chunk)
                if size is None:
                    if remote:
                        return None
                    path = self.paths.chunk(partition, chunk)
                    try:  # a local os.stat is a tenth of fsspec's info
                        size = (os.stat(path).st_size if where == "local"
                                else int(self.store.info(path)["size"]))
                    except FileNotFoundError:
                        return None  # trimmed since the listing
                    sizes[chunk] = size
                total += size
        return total

    def start_offset(self, partition: int) -> int:
        """The first offset ``partition`` still holds (0 until it was trimmed)."""
        return _first(*self._listing(partition))

    def start_offsets(self) -> list[int]:
        """The first offset every partition still holds."""
        return [self.start_offset(p) for p in range(self.partitions)]

    # --- retention ------------------------------------------------------------

    def chunks(self, partition: int) -> tuple[int, list[tuple[int, int, int, float | None]]]:
        """Where ``partition`` starts, and ``(start, end, bytes, written)`` of each chunk.

        Chunks oldest first; ``written``: the store's modification time (None
        where it keeps none). One listing of the partition and one read of the
        newest chunk's header (listed again if a trim removed that chunk first).
        """
        for _ in range(100):
            try:
                return self._chunks(partition)
            except FileNotFoundError:
                continue  # trimmed between the listing and the header's read
        return self._chunks(partition)

    def _chunks(self, partition: int) -> tuple[int, list[tuple[int, int, int, float | None]]]:
        listed = {}
        marks = []
        for name, entry in self.store.entries(self.paths.partition(partition)).items():
            start = self.paths.chunk_start(name)
            if start is not None:
                listed[start] = entry
            elif (mark := self.paths.start_mark_offset(name)) is not None:
                marks.append(mark)
        starts = sorted(listed)
        out = []
        for i, start in enumerate(starts):
            if i + 1 < len(starts):
                end = starts[i + 1]
            else:
                end = start + self._header(partition, start)[0]
            out.append((start, end, listed[start].size, listed[start].modified))
        return _first(starts, sorted(marks)), out

    def trim(self, partition: int, before: int) -> int:
        """Delete the chunks of ``partition`` whose items all lie below offset ``before``.

        Whole chunks go, oldest first, so a reader finds the partition starting
        later, never a gap. When every chunk goes (``before`` at or past the
        end), a start marker at the end offset is written first: it carries the
        end offset the newest chunk carried, so offsets are never handed out
        twice. Markers below the new start go last. Returns the offset the
        partition starts at now (see :func:`trimmed_start`).
        """
        starts, marks, end = self._listed_with_end(partition)
        after = trimmed_start(starts, end, before)
        if starts and after >= end and end not in marks:
            self.store.create_exclusive(self.paths.start_mark(partition, end), b"")
        for start in starts:
            if start >= after:
                break
            self.store.remove(self.paths.chunk(partition, start))
        for mark in marks:
            if mark < after:
                self.store.remove(self.paths.start_mark(partition, mark))
        _CHUNKS.pop(self.paths.partition(partition), None)  # list it afresh next time
        return after

    # --- writing --------------------------------------------------------------

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

    # --- registered batch chunks ---------------------------------------------------
    #
    # Two drivers may append one batch's chunk to a partition (one of them fenced
    # off but not yet aware): both looked and found none, both appended. The
    # batch's chunk that counts is the one *registered*: after appending, the
    # writer creates registry/p<partition>/<token> holding the chunk's offset,
    # create-only, so the first registration stands. Readers skip a batch chunk
    # at any other offset. A chunk not yet registered (its writer is between
    # the two writes, or died there) is waited for, and registered by the
    # reader itself after PENDING_WAIT_SECONDS: whoever registers first decides,
    # and every reader sees the same one.

    def registered(self, partition: int, token: str) -> int | None:
        """The offset of ``token``'s registered chunk in ``partition``, or None."""
        known = self._registry.get((partition, token))
        if known is not None:
            return known
        try:
            raw = self.store.read_bytes(self.paths.registration(partition, token))
        except FileNotFoundError:
            return None
        try:
            offset = int(raw)
        except ValueError as exc:
            raise StoreError(self.store.redact(
                f"stream {self.name!r}: registration "
                f"{self.paths.registration(partition, token)!r} is corrupt: {raw[:40]!r}"
            )) from exc
        self._registry[(partition, token)] = offset  # registrations never change
        return offset

    def register(self, partition: int, token: str, offset: int) -> int:
        """Register ``offset`` as ``token``'s chunk unless another is; the one that stands."""
        data = str(offset).encode()
        if self.store.create_exclusive(self.paths.registration(partition, token), data):
            self._registry[(partition, token)] = offset
            return offset
        standing = self.registered(partition, token)
        if standing is None:
            raise StoreError(self.store.redact(
                f"stream {self.name!r}: registration "
                f"{self.paths.registration(partition, token)!r} exists but cannot be read"))
        return standing

    def _counts(self, partition: int, token: str, start: int) -> bool:
        """Whether the batch chunk of ``token`` at ``start`` is the one that counts."""
        waited = 0.0
        nap = 0.002  # its writer registers right after appending: look again soon
        while (standing := self.registered(partition, token)) is None:
            if waited >= PENDING_WAIT_SECONDS:
                # Its writer died between appending and registering (a replay
                # would register the first chunk it finds, this one).
                standing = self.register(partition, token, start)
                break
            time.sleep(nap)
            waited += nap
            nap = min(nap * 2, 0.05)
        return standing == start

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

    # --- waiting for data -----------------------------------------------------

    def wait_for_append(self, ends: Sequence[int], timeout: float) -> bool:
        """Wait until items may be past ``ends`` (True) or ``timeout`` seconds pass (False).

        ``ends``: the end offsets the caller knows, one per partition. True
        means "may be there": the caller lists (:meth:`end_offsets`) to see.
        Appends in this process wake it at once (:mod:`.notify`). Appends by
        other processes: on a local store it stats the partition folders every
        :data:`LOCAL_STAT_SECONDS` (a few microseconds each); on an object
        store it cannot tell without a listing, so it returns True once this
        caller's (thread's) poll interval has passed since its last look,
        False at an earlier ``timeout``; the interval backs off while the
        stream is idle (:meth:`_poll_due`, :class:`PollSettings`). Never spins.

        What this process saw when it last listed a partition (its end offset,
        the generation of the stream's wake-ups, the folder's stamp, all taken
        before the listing) is the baseline where it matches ``ends``;
        otherwise the wait takes a baseline and lists once.
        """
        deadline = time.monotonic() + max(timeout, 0.0)
        key = self.paths.folder
        kind = self._where()
        folders = [self.paths.partition(p) for p in range(len(ends))]
        known = [_LISTED.get(folder) for folder in folders]
        if folders and all(k is not None and k[0] == end
                           for k, end in zip(known, ends, strict=True)):
            seen = min(k[1] for k in known if k is not None)
            stamps = [k[2] for k in known if k is not None]
            relist = _relist_at([(k[2], k[3]) for k in known if k is not None])
            fresh = False
        else:
            seen = notify.generation(key)
            at = time.time_ns()
            stamps = [_stamp(f) for f in folders] if kind == "local" else [None] * len(folders)
            relist = _relist_at([(stamp, at) for stamp in stamps])
            fresh = True
        with notify.Waiter(key, seen) as waiter:
            if kind == "remote":
                return self._poll_due(waiter, ends, deadline)
            if fresh and self._past(ends):
                return True
            if kind == "memory":  # every writer is in this process, so every append signals
                return waiter.wait(deadline - time.monotonic())
            while True:
                rest = deadline - time.monotonic()
                if rest <= 0:
                    return False
                if waiter.wait(min(rest, LOCAL_STAT_SECONDS)):
                    return True
                if [_stamp(f) for f in folders] != stamps:
                    return True
                if relist is not None and time.monotonic() >= relist:
                    relist = None
                    if self._past(ends):
                        return True

    def _poll_due(self, waiter: notify.Waiter, ends: Sequence[int], deadline: float) -> bool:
        """On an object store: wait until this caller's next look is due (True) or ``deadline``.

        A caller is a thread (a job's loop): one waiting in short slices (a
        loop asking several sources in turn) lists once per interval, not
        once per slice. The interval backs off while the stream stays idle
        (:class:`PollSettings`): it starts at ``first`` after the caller's
        offsets moved (data came) or an append in this process woke it, and
        grows :data:`BACKOFF_FACTOR`-fold after each look that found nothing,
        up to ``most``. Any
        listing of the stream by the caller (:meth:`end_offsets`) counts as
        a look.
        """
        settings = poll_settings(self.store)
        caller = (self.paths.folder, threading.get_ident())
        now = time.monotonic()
        last = _POLLED_AT.setdefault(caller, now)
        interval, seen = _BACKOFF.get(caller, (settings.first, None))
        if seen is not None and seen != list(ends):
            interval = settings.first  # data came since the last look
        _BACKOFF[caller] = (interval, list(ends))
        due = last + interval
        if waiter.wait(min(deadline, due) - now):
            _BACKOFF[caller] = (settings.first, list(ends))  # an append here: look now
            _POLLED_AT[caller] = time.monotonic()
            return True
        if time.monotonic() < due:
            return False
        _POLLED_AT[caller] = time.monotonic()
        _BACKOFF[caller] = (min(max(interval * BACKOFF_FACTOR, settings.first), settings.most),
                            list(ends))
        return True

    def _past(self, ends: Sequence[int]) -> bool:
        """Whether the stream's end offsets are other than ``ends`` now (one listing)."""
        return self.end_offsets() != list(ends)

    def _where(self) -> str:
        """``"local"`` (a folder here), ``"memory"`` (this process's) or ``"remote"``."""
        fs = getattr(self.store, "fs", None)
        protocol = getattr(fs, "protocol", None)
        protocols = protocol if isinstance(protocol, tuple) else (protocol,)
        if "file" in protocols or "local" in protocols:
            return "local"
        if "memory" in protocols:
            return "memory"
        return "remote"

    # --- reading --------------------------------------------------------------

    def read(self, partition: int, start: int, end: int) -> list[Any]:
        """Items at offsets ``start`` (inclusive) to ``end`` (exclusive) of ``partition``.

        Exactly ``end - start`` items, or a StoreError naming the chunk that
        breaks the promise (missing, truncated, or counted wrong).
        """
        if end <= start:
            return []
        known = _CHUNKS.get(self.paths.partition(partition))
        if known is not None and known[0] and known[0][0] <= start and known[2] >= end:
            # Listed or followed up to ``end`` already (on S3 or GCS: the
            # driver's look for data listed it): the chunks holding the range
            # are known. A trim since removes some: then list.
            with contextlib.suppress(FileNotFoundError):
                return self._read_chunks(partition, known[0], start, end)
        starts, marks = self._listing(partition)
        held_from = _first(starts, marks)
        if start < held_from:
            raise StoreError(self.store.redact(
                f"stream {self.name!r} partition {partition}: offsets {start} to "
                f"{held_from - 1} were trimmed (retention); the partition starts at offset "
                f"{held_from} now"
            ))
        return self._read_chunks(partition, starts, start, end)

    def _read_chunks(self, partition: int, starts: list[int], start: int, end: int) -> list[Any]:
        """:meth:`read` of the range, from ``partition``'s chunks listed as ``starts``."""
        out: list[Any] = []
        skipped = 0
        expected = None  # where the next chunk must start
        first = max(bisect.bisect_right(starts, start) - 1, 0)  # the chunk holding ``start``
        fetched = self._fetch(partition, [
            c for i, c in enumerate(starts[first:], first)
            if c < end and (i + 1 == len(starts) or starts[i + 1] > start)])
        for i in range(first, len(starts)):
            chunk_start = starts[i]
            chunk_end = starts[i + 1] if i + 1 < len(starts) else None
            if chunk_end is not None and chunk_end <= start:
                continue
            if chunk_start >= end:
                break
            path = self.paths.chunk(partition, chunk_start)
            if expected is not None and chunk_start != expected:
                raise self._corrupt(
                    path, f"starts at offset {chunk_start}, but the chunk before it ends at "
                    f"{expected}: offsets {expected} to {chunk_start - 1} are missing"
                )
            listed = _CHUNKS.get(self.paths.partition(partition))
            size = listed[1].get(chunk_start) if listed is not None else None
            items, token = self._items(path, partition, chunk_start, chunk_end, size,
                                       fetched.get(path))
            lo = max(start - chunk_start, 0)
            hi = min(end - chunk_start, len(items))
            if token.startswith(_BATCH) and not self._counts(
                    partition, token[len(_BATCH):], chunk_start):
                skipped += max(hi - lo, 0)  # a batch's second chunk: it landed before
            else:
                out.extend(items[lo:hi])
            expected = chunk_start + len(items)
        if len(out) + skipped != end - start:
            shown = (self.paths.chunk(partition, starts[0]) if starts
                     else self.paths.partition(partition))
            raise StoreError(self.store.redact(
                f"stream {self.name!r} partition {partition}: offsets {start} to {end - 1} were "
                f"promised but {len(out)} items were found (first chunk {shown!r}); "
                "a chunk is missing or was deleted"
            ))
        return out

    def read_held(self, partition: int, end: int | None = None) -> list[Any]:
        """The items of ``partition`` from the first offset it still holds up to ``end``.

        ``end`` None: up to its end. A trim that moves the start while this
        reads is followed (the read starts again from the new start); a
        range not yet published, or a chunk missing in the middle, is still
        the error :meth:`read` raises.
        """
        while True:
            first = self.start_offset(partition)
            stop = self.end_offset(partition) if end is None else end
            try:
                return self.read(partition, first, stop)
            except (StoreError, FileNotFoundError):
                if self.start_offset(partition) <= first:
                    raise
                # Trimmed while reading: read what is held now.

    def _fetch(self, partition: int, starts: list[int]) -> dict[str, bytes]:
        """The chunks at ``starts`` not kept from a look, fetched at once (see ``read_many``)."""
        listed = _CHUNKS.get(self.paths.partition(partition))
        sizes = listed[1] if listed is not None else {}
        paths = [self.paths.chunk(partition, c) for c in starts]
        wanted = [path for c, path in zip(starts, paths, strict=True)
                  if _kept(self._ahead, path, sizes.get(c)) is None]
        return self.store.read_many(wanted) if len(wanted) > 1 else {}

    def _items(
        self, path: str, partition: int, start: int, next_start: int | None,
        size: int | None = None, raw: bytes | None = None,
    ) -> tuple[list[Any], str]:
        """One chunk's items and token, checked against its header and the next chunk's offset.

        ``size``: the chunk's size in bytes as the newest listing of its
        folder gave it. A copy kept by a header's read (:func:`_read_ahead`)
        is used only when it has that size and is younger than
        :data:`READ_AHEAD_SECONDS`: a stream deleted and made anew by another
        process has new chunks under the old names.
        """
        if raw is None:
            raw = _kept(self._ahead, path, size)
        if raw is None:
            raw = self.store.read_bytes(path)
        if len(raw) < _HEADER.size:
            raise self._corrupt(path, f"is truncated ({len(raw)} bytes, no header)")
        count, token_len = _HEADER.unpack_from(raw)

        def items_after_header(chunk: bytes) -> Any:
            return pickle.loads(chunk[_HEADER.size + token_len :])

        items = self.store.decode(path, raw, items_after_header, f"stream {self.name!r}: chunk")
        if not isinstance(items, list) or len(items) != count:
            got = len(items) if isinstance(items, list) else type(items).__name__
            raise self._corrupt(path, f"says it holds {count} items but holds {got}")
        if next_start is not None and next_start != start + count:
            gap = (
                f"offsets {start + count} to {next_start - 1} are missing"
                if next_start > start + count else "the two overlap"
            )
            raise self._corrupt(
                path, f"holds offsets {start} to {start + count - 1}, but the next chunk of "
                f"partition {partition} starts at {next_start}: {gap}"
            )
        return items, raw[_HEADER.size : _HEADER.size + token_len].decode("utf-8", "replace")


#: What this process saw when it last listed a partition folder: its end
#: offset, and, taken before the listing, the stream's wake-up generation,
#: the folder's stamp and the wall time (see :meth:`StreamLog.wait_for_append`).
_LISTED: dict[str, tuple[int, int, tuple[int, int] | None, int]] = {}
#: The chunks this process saw when it last listed or followed a partition
#: folder: their starts, in order, their sizes in bytes where known, the end
#: offset and the newest chunk's writer token. A chunk never changes once
#: written (create-only, and offsets are never handed out twice), so a size
#: once seen stays right.
_CHUNKS: dict[str, tuple[list[int], dict[int, int], int, str]] = {}


#: How many whole chunks a store handle keeps for reads to come (the oldest go).
_READ_AHEAD_MOST = 256


def _read_ahead(cache: dict[str, tuple[bytes, float]], path: str, data: bytes) -> None:
    """Keep a whole chunk a header's read fetched, until its items are read once.

    Chunks never change once written; a trim removes only what readers passed.
    The loop and the tasks it runs in the driver share the cache: the oldest
    entry's eviction may meet another thread's pop, which is no harm.
    """
    if len(cache) >= _READ_AHEAD_MOST:
        with contextlib.suppress(RuntimeError, StopIteration):
            cache.pop(next(iter(cache)), None)
    cache[path] = (data, time.monotonic())


def _kept(cache: dict[str, tuple[bytes, float]], path: str, size: int | None) -> bytes | None:
    """The copy of ``path`` :func:`_read_ahead` kept, if it has ``size`` bytes and is recent."""
    kept = cache.pop(path, None)
    if kept is None or size is None:
        return None
    data, at = kept
    return data if len(data) == size and time.monotonic() - at < READ_AHEAD_SECONDS else None


def _remember_chunks(
    folder: str, starts: list[int], sizes: dict[int, int] | None, end: int, newest: str
) -> None:
    """Keep a listing's chunks for :meth:`StreamLog.range_bytes`.

    ``sizes`` None (a local or in-memory listing): the sizes stat'ed before,
    of chunks still listed, are kept.
    """
    if sizes is None:
        before = _CHUNKS.get(folder)
        known = before[1] if before is not None else {}
        sizes = {start: known[start] for start in starts if start in known}
    _CHUNKS[folder] = (starts, sizes, end, newest)


#: On an object store, when (monotonic) each caller (stream folder, thread)
#: last looked (listed, or was told data may be there): its next look is due
#: an interval later.
_POLLED_AT: dict[tuple[str, int], float] = {}
#: On an object store, each caller's poll interval now and the offsets it
#: waited past then (:meth:`StreamLog._poll_due`).
_BACKOFF: dict[tuple[str, int], tuple[float, list[int] | None]] = {}



def _relist_at(stamps: list[tuple[tuple[int, int] | None, int]]) -> float | None:
    """When (monotonic) to list again because a folder's stamp cannot be trusted, or None.

    ``stamps``: each folder's stamp and the wall time (ns) it was taken. A
    folder's mtime comes from the kernel's coarse clock: a create in the same
    tick as the one that set it leaves it as it was. A stamp taken that close
    to its mtime may hide a create that came after the look; once the tick
    has passed any create changes it, so one listing then closes the gap.
    """
    close = [stamp[0] for stamp, at in stamps
             if stamp is not None and at - stamp[0] < _MTIME_SETTLE_NS]
    if not close:
        return None
    settled = max(close) + _MTIME_SETTLE_NS - time.time_ns()
    return time.monotonic() + max(settled, 0) / 1e9


def _stamp(folder: str) -> tuple[int, int] | None:
    """A local folder's mtime and inode (a chunk created in it changes them); None if absent."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_ino


def _first(starts: list[int], marks: list[int]) -> int:
    """Where a partition listed as chunk ``starts`` and start ``marks`` starts."""
    if starts:
        return starts[0]
    return marks[-1] if marks else 0


def trimmed_start(starts: list[int], end: int, before: int) -> int:
    """Where a partition starts once trimmed below ``before``.

    ``starts``: its chunks' first offsets, in order; ``end``: its end offset.
    What :meth:`StreamLog.trim` keeps: every chunk from the first one holding
    an offset at or above ``before``; none if ``before`` is at or past ``end``
    (the partition then starts at its end). A partition without chunks starts
    at its end already.
    """
    if not starts or before >= end:
        return end
    for i, start in enumerate(starts[:-1]):
        if starts[i + 1] > before:
            return start
    return starts[-1]
