"""What a commit log's records carry: parts staged inline or in segment files, and their cleanup.

A part is ``("items", [...])``, carried inline in the record (batches up to
:data:`INLINE_LIMIT` items), or ``("segment", path)``, a file in
``folder/data`` that an executor wrote before the commit and that nobody
reads until a record names it. :class:`Segments` stages parts, reads a
record's items back, and deletes segments that will never be committed: a
failed job's, also those its tasks still running write after the abort.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store.commit_records import Record
from sparkjet.core.store.layout import CommitLogPaths
from sparkjet.core.store.naming import PICKLE_PROTOCOL, loads
from sparkjet.core.store.protocol import StoreFiles

#: Batches up to this many items travel inline in a commit record.
INLINE_LIMIT = 10_000


class Segments:
    """The parts one commit log's records carry: staged, read back and discarded."""

    def __init__(self, store: StoreFiles, paths: CommitLogPaths, label: str) -> None:
        self.store = store
        self.paths = paths
        self.label = label

    def new_path(self, writer: str) -> str:
        """A fresh path for a segment that ``writer`` stages."""
        return self.paths.new_segment(writer)

    def write(self, path: str, items: list[Any]) -> None:
        """Write a segment file (called on executors by sinks)."""
        self.store.write_bytes(path, pickle.dumps(items, protocol=PICKLE_PROTOCOL))

    def read(self, path: str) -> list[Any]:
        """The items of the segment ``path`` that a committed record names."""
        try:
            raw = self.store.read_bytes(path)
        except FileNotFoundError as exc:
            raise StoreError(
                self.store.redact(
                    f"{self.label}: segment {path!r} named by a committed record is missing"
                )
            ) from exc
        items: list[Any] = self.store.decode(path, raw, loads, f"{self.label}: segment")
        return items

    def payload(self, record: Record) -> Iterable[Any]:
        """The items a record carries, in order."""
        for kind, value in record.parts:
            if kind == "items":
                yield from value
            else:
                yield from self.read(value)

    def stage(self, items: Iterable[Any], writer: str) -> list[tuple[str, Any]]:
        """Prepare ``items`` for a later commit (runs on executors).

        Small batches travel inline in the commit message; larger ones are
        written to a segment file now, which stays invisible until a record
        names it.
        """
        batch = items if isinstance(items, list) else list(items)
        if not batch:
            return []
        if len(batch) <= INLINE_LIMIT:
            return [("items", batch)]
        path = self.new_path(writer)
        self.write(path, batch)
        if self.store.exists(self.paths.abort_marker(writer)):
            # The job failed and aborted this writer while this task still ran:
            # the abort may have listed the folder before this file existed.
            self.store.remove(path)
        return [("segment", path)]

    def discard(self, parts: Iterable[tuple[str, Any]]) -> None:
        """Delete the segment files of parts that will never be committed."""
        for kind, value in parts:
            if kind == "segment":
                self.store.remove(value)

    def discard_writer(self, writer: str) -> None:
        """Delete every segment staged by ``writer`` (a token no commit has used).

        Catches segments of partitions that succeeded while the job failed, whose
        commit messages never reached the driver. Tasks of the failed job may
        still be running: the abort marker, written first, makes each of them
        delete its own segment once written (see :meth:`stage`).
        """
        self.store.write_bytes(self.paths.abort_marker(writer), b"")
        for entry in self.store.listdir(self.paths.data):
            if self.paths.is_writers_segment(entry, writer):
                self.store.remove(self.paths.data_file(entry))
