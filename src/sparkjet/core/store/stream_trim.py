"""Retention of a stream: a partition's chunks with their sizes and times, and trimming the oldest.

:meth:`StreamTrimming.trim` removes a partition's oldest chunks, so the
partition starts later; offsets below its start are *trimmed*. When every
chunk goes, a start marker ``<offset>.start`` keeps the partition's end
offset (offsets are never handed out twice): a partition starts at its first
chunk, or at its highest marker when it has none.
"""

from __future__ import annotations

from sparkjet.core.store.stream_follow import StreamEnds, _first


class StreamTrimming(StreamEnds):
    """What a stream's partitions hold, chunk by chunk, and removing the oldest chunks."""

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
        self._forget(partition)  # list it afresh next time
        return after


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
