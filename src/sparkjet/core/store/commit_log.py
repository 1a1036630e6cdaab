"""The commit log: the store's lists and maps, committed record by record, and folded.

Lists and maps are *commit logs*: a folder of numbered records, each created
with a create-only write, so a commit (a sink's whole output, an ``add_all``)
appears entirely or not at all, and concurrent writers never overwrite one
another. Large payloads go to segment files first; the record that names them
is written last. A ``clear`` is a record too, so readers start after the
newest one. Where the files lie is
:class:`~sparkjet.core.store.layout.CommitLogPaths`.

:class:`CommitLog` is the one entry. It commits records (plainly, or once
per token for a micro-batch sink, through the writer's index) and folds the
log into bases; the rest has modules of its own:

- :mod:`.commit_records`: the record format, and the records and bases
  listed and read back in order (:class:`.LogReader`, :class:`Record`,
  :class:`LogCursor`);
- :mod:`.commit_segments`: the parts a record carries, staged inline or in
  segment files, read back and discarded (:class:`.Segments`).

The names other modules and tests use are re-exported here.
"""

from __future__ import annotations

import itertools
import json
import logging
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store import upkeep
from sparkjet.core.store.commit_records import LogCursor as LogCursor
from sparkjet.core.store.commit_records import LogReader, record_payload
from sparkjet.core.store.commit_records import Record as Record
from sparkjet.core.store.commit_segments import INLINE_LIMIT as INLINE_LIMIT
from sparkjet.core.store.commit_segments import Segments
from sparkjet.core.store.layout import CommitLogPaths
from sparkjet.core.store.naming import PICKLE_PROTOCOL, json_loads
from sparkjet.core.store.protocol import StoreFiles

log = logging.getLogger("sparkjet.store")


@dataclass(frozen=True)
class _Own:
    """A writer's last record committed through :meth:`CommitLog.commit_once` here."""

    #: The record, without its parts: a later commit looks only at its number and writer.
    record: Record
    #: The newest base as listed right after the record was created.
    floor: int


#: The record each writer (by writer index path) committed last through
#: :meth:`CommitLog.commit_once` in this process: its next commit need not
#: read it back, nor list the bases first (a micro-batch sink's commit is
#: two requests cheaper).
_OWN: dict[tuple[str, str], _Own] = {}


def _seq_is_int(index: Any) -> None:
    """Checks a writer index (``{"seq": <int>}``): a record's number, never below 0."""
    seq = index["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise ValueError(f"'seq' must be a record number (0 or more), not {seq!r}")


#: A commit log is folded into a base once this many records follow the newest one.
FOLD_EVERY = 100


class CommitLog:
    """An append-only sequence of records in ``folder/log``; payloads in ``folder/data``.

    Used by lists (records of appended items) and maps (records of upserts).

    Exactly once per micro-batch: a sink's commit names its producer (job,
    stage, checkpoint) and batch. :meth:`commit_once` looks for the batch
    before committing, and every reader skips a record whose batch is not
    after its producer's last one. So two drivers racing to commit one batch
    (one of them fenced off but not yet aware) leave at most one visible
    record, whatever the timing: the commit is conditional where it counts,
    at the reader, as a broker's idempotent producer is.

    Bounded: every :data:`FOLD_EVERY` records, the committer folds the log
    into ``folder/base/<seq>.pkl`` (a list's live parts, or a map's entries,
    as of record ``seq``, with each producer's last batch) and removes the
    records it replaces, so reading a long-lived log reads one base and at
    most about :data:`FOLD_EVERY` records. A reader that loses a race with a
    fold (a record gone between listing and reading) starts again from the
    new base. Segment files that no base or record names any more are left
    for ``sparkjet gc``, whose grace period protects readers still reading
    them.
    """

    def __init__(self, store: StoreFiles, folder: str, label: str, kind: str = "list") -> None:
        self.store = store
        #: Where the log's files lie.
        self.paths = CommitLogPaths(folder)
        self.label = label
        #: "list" or "map": what a fold keeps of the records.
        self.kind = kind
        #: The records and bases, listed and read back (:mod:`.commit_records`).
        self.reader = LogReader(store, self.paths, label)
        #: The parts records carry, inline or in segment files (:mod:`.commit_segments`).
        self.segments = Segments(store, self.paths, label)

    # --- segments (see Segments) ----------------------------------------------

    def new_segment_path(self, writer: str) -> str:
        """A fresh path for a segment that ``writer`` stages."""
        return self.segments.new_path(writer)

    def write_segment(self, path: str, items: list[Any]) -> None:
        """Write a segment file (called on executors by sinks)."""
        self.segments.write(path, items)

    def read_segment(self, path: str) -> list[Any]:
        """The items of the segment ``path`` that a committed record names."""
        return self.segments.read(path)

    def payload(self, record: Record) -> Iterable[Any]:
        """The items a record carries, in order."""
        return self.segments.payload(record)

    def stage(self, items: Iterable[Any], writer: str) -> list[tuple[str, Any]]:
        """Prepare ``items`` for a later :meth:`commit` (runs on executors).

        Small batches travel inline in the commit message; larger ones are
        written to a segment file now, which stays invisible until a record
        names it (see :meth:`.Segments.stage`).
        """
        return self.segments.stage(items, writer)

    def discard(self, parts: Iterable[tuple[str, Any]]) -> None:
        """Delete the segment files of parts that will never be committed."""
        self.segments.discard(parts)

    def discard_writer(self, writer: str) -> None:
        """Delete every segment staged by ``writer`` (see :meth:`.Segments.discard_writer`)."""
        self.segments.discard_writer(writer)

    # --- listing and reading (see LogReader) ----------------------------------

    def sequences(self) -> list[int]:
        """The numbers of the records in the log, oldest first (listed afresh)."""
        return self.reader.sequences()

    def bases(self) -> list[int]:
        """The record numbers the log's complete bases fold up to, oldest first."""
        return self.reader.bases()

    def exists(self) -> bool:
        """Whether anything was ever committed to the log (a record, or a fold of records).

        A list or map exists from its first commit on, also one that committed
        nothing but a ``clear`` or a batch job's empty output; a name nothing
        was ever committed to does not.
        """
        return bool(self.bases() or self.sequences())

    def read(self, cursor: LogCursor) -> Iterator[Record]:
        """The records after ``cursor``, oldest first, moving ``cursor`` along.

        Starts with a ``clear`` and the newest base's records when the base
        is past ``cursor`` (a new reader, or one that a fold overtook), so a
        reader that applies what it is given in order stays right. Skips a
        micro-batch producer's record whose batch is not after its last.
        """
        return self.reader.read(cursor)

    def records(self, after: int = 0) -> Iterator[Record]:
        """Records with sequence numbers greater than ``after``, oldest first.

        A fresh reader's view (see :meth:`read`); ``after`` a record number
        it has seen.
        """
        yield from self.read(LogCursor(after))

    def live_records(self) -> list[Record]:
        """The records after the newest ``clear``."""
        live: list[Record] = []
        for record in self.read(LogCursor()):
            if record.op == "clear":
                live = []
            else:
                live.append(record)
        return live

    # --- committing -----------------------------------------------------------

    def commit(
        self,
        op: str,
        parts: list[tuple[str, Any]] | None = None,
        *,
        writer: str = "client",
        after: int | None = None,
        producer: str | None = None,
        batch: int | None = None,
    ) -> int:
        """Append one record atomically; returns its sequence number.

        Records are numbered without gaps, each created only if absent. The
        first number tried follows ``after`` (a number known to be taken), or
        the newest in a listing of the log; a number another writer took
        first is followed by the next, so a commit costs one create, not a
        listing, when the caller knows where the log ends. A number at or
        below the newest base (freed by a fold) is never used: readers start
        after the base and would not see it.
        """
        payload = record_payload(op, parts or [], writer, producer, batch)
        bases = self.bases()
        if after is None:
            seqs = self.sequences()
            after = seqs[-1] if seqs else 0
        return self._append(payload, after, bases[-1] if bases else 0)

    def _append(self, payload: bytes, after: int, floor: int) -> int:
        """Create the record ``payload`` after ``after`` and the newest base ``floor``."""
        return self._settle(payload, self._create_from(payload, max(after, floor) + 1))[0]

    def _create_from(self, payload: bytes, seq: int) -> int:
        """Create ``payload`` as the first free record number from ``seq`` on; that number."""
        while not self.store.create_exclusive(self.paths.record(seq), payload):
            seq += 1  # another writer took that number: the next one
        return seq

    def _settle(self, payload: bytes, seq: int) -> tuple[int, int]:
        """Record ``seq`` was created: past any fold made meanwhile; its number and the floor.

        A fold made meanwhile that covers the number would hide the record
        (readers start after the newest base): it is committed again after
        the base. Folds the log when :data:`FOLD_EVERY` records follow the base.
        """
        while True:
            bases = self.bases()
            floor = bases[-1] if bases else 0
            if floor < seq:
                break
            self.store.remove(self.paths.record(seq))
            seq = self._create_from(payload, floor + 1)
        if seq - floor >= FOLD_EVERY:
            # On a micro-batch's thread, after the batch (see upkeep); else now.
            upkeep.later(("fold", type(getattr(self.store, "fs", None)).__name__,
                          self.paths.folder), self._fold_quietly, f"folding {self.label}")
        return seq, floor

    def _fold_quietly(self) -> None:
        """:meth:`fold`, a failure logged: the commit stands, and the next commit folds."""
        try:
            self.fold()
        except Exception as exc:
            log.warning("%s: folding the log failed (the next commit tries again): %s",
                        self.label, self.store.redact(str(exc)))

    def commit_once(
        self,
        op: str,
        parts: list[tuple[str, Any]],
        *,
        token: str,
        writer: str,
        producer: str | None = None,
        batch: int | None = None,
    ) -> int | None:
        """Commit unless a record with ``token`` already exists; None if it did.

        For replayed micro-batches: ``writers/<writer>.json`` remembers the
        sequence number of the writer's last commit, so only the records
        written since are read (one by one, by number: no listing of the
        whole log) to look for the token, and the commit starts after the
        last of them. A micro-batch's commit so costs a few requests however
        long the log is. With ``producer`` and ``batch``, a batch that a fold
        has absorbed is found in the base, and a second record that a racing
        driver writes anyway is skipped by every reader (see the class).
        """
        index = self.paths.writer_index(writer)
        raw: bytes | None
        try:
            raw = self.store.read_bytes(index)
        except FileNotFoundError:
            raw = None
        except Exception as exc:  # named as what it is, like a corrupt one below
            cause = exc.__cause__ or exc
            raise StoreError(self.store.redact(
                f"{self.label}: writer index {index!r} cannot be read in store "
                f"{self.store.shown_url!r}: {type(cause).__name__}: {cause}; nothing was "
                "committed")) from exc
        after = 0 if raw is None else int(self.store.decode(
            index, raw, json_loads, f"{self.label}: writer index", check=_seq_is_int)["seq"])
        payload = record_payload(op, parts, token, producer, batch)
        # The record this process committed last for the writer, if the index
        # still names it: records never change, so it is not read again.
        kept = _OWN.get(self._own_key(index))
        mine = kept.record if kept is not None and kept.record.seq == after else None
        if kept is not None and mine is not None and after > kept.floor:
            if mine.writer == token:
                return None  # this batch's record, committed here before
            # The steady case: the next number, created only if free. Free, no
            # record follows the writer's own, so none of them holds the token.
            if self.store.create_exclusive(self.paths.record(after + 1), payload):
                return self._indexed(index, *self._settle(payload, after + 1),
                                     Record(0, op, [], token, producer, batch))
        bases = self.bases()
        floor = bases[-1] if bases else 0
        cursor = LogCursor()
        if after > floor and mine is not None:
            own: Record | None = mine
        else:
            own = self.reader.record(after) if after > floor else None
        if after > floor and own is None and self.reader.newest_base() < after:
            # The writer's last record is neither in the log nor folded: the index
            # is damaged. Committing after it would leave a gap no reader passes.
            raise StoreError(self.store.redact(
                f"{self.label}: writer index {index!r} is damaged ({len(raw or b'')} bytes) "
                f"in store {self.store.shown_url!r}: it names record {after}, which the log "
                f"does not hold (its records end at {self.reader.last_sequence()}); nothing was "
                "committed"))
        if own is not None:
            # From the writer's own last record on: a replay finds its batch's
            # record whether or not the index was updated after it.
            last = after - 1
            records: Iterator[Record] = itertools.chain([own], self.reader.tail(after))
        else:
            # No index yet (a first commit, or a crash before the index was
            # written), or the writer's records were folded: read the log.
            last = 0
            records = self.read(cursor)
        for record in records:
            if record.writer == token:
                self.store.write_bytes(index, json.dumps({"seq": record.seq}).encode())
                return None
            last = record.seq
        if producer is not None and batch is not None and (
                batch <= cursor.producers.get(producer, -1)):
            return None  # committed before and folded into the base since
        seq = self._create_from(payload, max(last, floor) + 1)
        return self._indexed(index, *self._settle(payload, seq),
                             Record(0, op, [], token, producer, batch))

    def _indexed(self, index: str, seq: int, floor: int, record: Record) -> int:
        """Record ``seq`` stands: the writer's index names it; kept as this process's own."""
        self.store.write_bytes(index, json.dumps({"seq": seq}).encode())
        _OWN[self._own_key(index)] = _Own(replace(record, seq=seq), floor)
        return seq

    def _own_key(self, index: str) -> tuple[str, str]:
        """Where :data:`_OWN` keeps a writer's last record: its filesystem and index path."""
        return type(getattr(self.store, "fs", None)).__name__, index

    # --- folding --------------------------------------------------------------

    def fold(self) -> int | None:
        """Fold the log into a new base and remove the records it replaces.

        Returns the record number the base folds up to, or None when there
        was nothing new to fold (or another process folded the same records
        first). Safe beside readers, committers and other folds: the base is
        created only if absent and complete before anything is removed.
        """
        cursor = LogCursor()
        live: list[Record] = []
        for record in self.read(cursor):
            if record.op == "clear":
                live = []
            else:
                live.append(record)
        bases = self.bases()
        if cursor.seq == 0 or (bases and bases[-1] >= cursor.seq):
            return None
        if self.kind == "map":
            entries: dict[Any, Any] = {}
            for record in live:
                if record.op == "put":
                    entries.update(self.payload(record))
                elif record.op == "remove":
                    for key in self.payload(record):
                        entries.pop(key, None)
            folded: list[tuple[str, list[tuple[str, Any]]]] = (
                [("put", [("items", list(entries.items()))])] if entries else [])
        else:
            parts: list[tuple[str, Any]] = []
            for record in live:
                for kind, value in record.parts:
                    if kind == "items" and parts and parts[-1][0] == "items":
                        parts[-1] = ("items", [*parts[-1][1], *value])
                    else:
                        parts.append((kind, value))
            folded = [("append", parts)] if parts else []
        data = pickle.dumps({"seq": cursor.seq, "records": folded,
                             "producers": cursor.producers}, protocol=PICKLE_PROTOCOL)
        if not self.store.create_exclusive(self.paths.base(cursor.seq), data):
            return None
        self.store.remove_many(
            [self.paths.record(seq) for seq in self.sequences() if seq <= cursor.seq]
            + [self.paths.base(seq) for seq in bases])
        return cursor.seq
