"""Reading a stream partition's offsets: its chunks fetched, checked and their items returned.

Reading checks what the offsets promise: chunk ``n`` of a partition must
start where chunk ``n-1`` ends, and hold as many items as its header says.
A gap (a missing or overstated chunk) or a truncated chunk is an error
naming the file, never a silent loss; offsets below a trimmed partition's
start are an error saying so; a batch chunk that does not count
(:mod:`~sparkjet.core.store.stream_registry`) is skipped. On S3 or GCS a
range's chunks are fetched at once, or taken from the read-ahead
(:func:`~sparkjet.core.store.stream_chunks._kept`).
"""

from __future__ import annotations

import bisect
import contextlib
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store.naming import loads
from sparkjet.core.store.stream_chunks import _BATCH, _HEADER, _kept
from sparkjet.core.store.stream_follow import StreamEnds, _first
from sparkjet.core.store.stream_registry import StreamRegistry


class StreamReading(StreamEnds, StreamRegistry):
    """Reading a range of a stream partition's offsets."""

    def read(self, partition: int, start: int, end: int) -> list[Any]:
        """Items at offsets ``start`` (inclusive) to ``end`` (exclusive) of ``partition``.

        Exactly ``end - start`` items, or a StoreError naming the chunk that
        breaks the promise (missing, truncated, or counted wrong).
        """
        if end <= start:
            return []
        known = self._seen(partition)
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
            listed = self._seen(partition)
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
        """The chunks at ``starts``: those a look kept, the rest fetched at once if several.

        A kept copy is taken here (taking it removes it from the read-ahead),
        so the read uses it; one chunk alone is left to :meth:`_items`.
        """
        listed = self._seen(partition)
        sizes = listed[1] if listed is not None else {}
        found: dict[str, bytes] = {}
        wanted: list[str] = []
        for start in starts:
            path = self.paths.chunk(partition, start)
            raw = _kept(self._ahead, path, sizes.get(start))
            if raw is None:
                wanted.append(path)
            else:
                found[path] = raw
        if len(wanted) > 1:
            found.update(self.store.read_many(wanted))
        return found

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
            return loads(chunk[_HEADER.size + token_len :])

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
