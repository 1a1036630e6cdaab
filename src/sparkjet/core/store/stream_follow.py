"""Finding a stream partition's end and start: listing it, or following what this process saw.

On S3 or GCS a partition is listed (the listing carries the chunks' sizes).
On a local or in-memory store, where a listing costs a stat per chunk, a
partition this process has seen is *followed*: chunks are only ever created
at the end offset, so the header of the chunk named by the known end says
whether one came and where it ends (:meth:`StreamEnds.end_offset`).

This module owns what this process saw of each partition: :data:`_LISTED`
(its end offset and the baselines a waiter starts from, see
:mod:`~sparkjet.core.store.stream_wait`), :data:`_CHUNKS` (its chunks and
their sizes, which reads and :meth:`StreamEnds.range_bytes` use) and
:data:`_POLLED_AT` (when each caller last listed a stream on an object
store). Other modules reach :data:`_CHUNKS` through :meth:`StreamEnds._seen`
and :meth:`StreamEnds._forget`.
"""

from __future__ import annotations

import bisect
import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from sparkjet.core.store import notify
from sparkjet.core.store.stream_chunks import StreamFiles


class StreamEnds(StreamFiles):
    """A stream's chunk listings and its partitions' start and end offsets."""

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

    def _seen(self, partition: int) -> tuple[list[int], dict[int, int], int, str] | None:
        """What this process last saw of ``partition``'s chunks (:data:`_CHUNKS`), or None."""
        return _CHUNKS.get(self.paths.partition(partition))

    def _forget(self, partition: int) -> None:
        """Forget what this process saw of ``partition``'s chunks: it is listed afresh next time."""
        _CHUNKS.pop(self.paths.partition(partition), None)

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
        return self._listed_with_end(partition, tail=True)[2]

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

    def _listed_with_end(
        self, partition: int, tail: bool = False
    ) -> tuple[list[int], list[int], int]:
        """``partition``'s chunk starts, start markers and end offset.

        Listed again if a trim removed the newest chunk before its header was
        read (a marker carries the end offset then). With ``tail`` (for the
        end offset alone), on S3 and GCS a partition seen before is listed
        from its second newest chunk on (:meth:`_newer_listing`): the
        markers returned are then only those past it.
        """
        while True:
            folder = self.paths.partition(partition)
            seen = notify.generation(self.paths.folder)  # before listing: see wait_for_append
            at = time.time_ns()
            stamp = _stamp(folder) if self._where() == "local" else None
            listed = self._newer_listing(partition) if tail else None
            starts, marks, sizes = (listed if listed is not None
                                    else self._sized_listing(partition))
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

    def _newer_listing(
        self, partition: int
    ) -> tuple[list[int], list[int], dict[int, int] | None] | None:
        """:meth:`_sized_listing` from what this process saw, listing only what follows.

        On S3 and GCS, a partition whose chunks this process listed before is
        listed after its second newest chunk seen (chunk names sort as their
        offsets): a page of the newest few, not of thousands. What was seen
        stands only if its newest chunk is listed again with the size it had
        (a partition trimmed or made anew since is listed whole). None: list
        it whole.
        """
        if self._where() != "remote":
            return None
        known = _CHUNKS.get(self.paths.partition(partition))
        if known is None or len(known[0]) < 2:
            return None
        starts, sizes, _, _ = known
        newest = starts[-1]
        if newest not in sizes:
            return None
        after = self.paths.chunk(partition, starts[-2]).rsplit("/", 1)[-1]
        entries = self.store.entries_after(self.paths.partition(partition), after)
        new_starts, marks, new_sizes = [], [], {}
        for entry, info in entries.items():
            if (start := self.paths.chunk_start(entry)) is not None:
                new_starts.append(start)
                new_sizes[start] = info.size
            elif (mark := self.paths.start_mark_offset(entry)) is not None:
                marks.append(mark)
        new_starts.sort()
        if not new_starts or new_starts[0] != newest or new_sizes[newest] != sizes[newest]:
            return None
        return [*starts[:-1], *new_starts], sorted(marks), {**sizes, **new_sizes}

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
        """The end offset of every partition.

        On S3 or GCS the partitions are listed at once (one listing each, in
        parallel), so a look at a stream waits one round trip, not one per
        partition; elsewhere one after the other (each is local I/O).
        """
        if self.partitions > 1 and self._where() == "remote":
            return _at_once(self.end_offset, range(self.partitions))
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

#: On an object store, when (monotonic) each caller (stream folder, thread)
#: last looked (listed, or was told data may be there): its next look is due
#: an interval later.
_POLLED_AT: dict[tuple[str, int], float] = {}


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


#: Threads that list a remote stream's partitions at once (see StreamEnds.end_offsets).
_LISTERS = ThreadPoolExecutor(8, thread_name_prefix="sparkjet-stream-list")


def _at_once(look: Callable[[int], int], partitions: Iterable[int]) -> list[int]:
    """``look(p)`` for every partition, in parallel; each counted as the caller's requests."""
    futures = [_LISTERS.submit(contextvars.copy_context().run, look, p) for p in partitions]
    return [future.result() for future in futures]
