"""The commit log: the record format of the store's lists and maps, and how it is read.

Lists and maps are *commit logs*: a folder of numbered records, each created
with a create-only write, so a commit (a sink's whole output, an ``add_all``)
appears entirely or not at all, and concurrent writers never overwrite one
another. Large payloads go to segment files first; the record that names them
is written last. A ``clear`` is a record too, so readers start after the
newest one. Where the files lie is
:class:`~sparkjet.core.store.layout.CommitLogPaths`.
"""

from __future__ import annotations

import itertools
import json
import logging
import pickle
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store import upkeep
from sparkjet.core.store.layout import CommitLogPaths
from sparkjet.core.store.naming import PICKLE_PROTOCOL, json_loads, loads
from sparkjet.core.store.protocol import StoreFiles

log = logging.getLogger("sparkjet.store")

#: Batches up to this many items travel inline in a commit record.
INLINE_LIMIT = 10_000


@dataclass(frozen=True)
class Record:
    """One committed change in a commit log."""

    seq: int
    op: str  # lists: "append", "clear"; maps: "put", "remove", "clear"
    #: In order: ("items", [...]) carried inline, or ("segment", path) in a file.
    parts: list[tuple[str, Any]]
    writer: str
    #: For a micro-batch sink's commit: who commits (job, stage and checkpoint)
    #: and the batch. A producer's batches land in order, each once: readers
    #: skip a record whose batch is not after its producer's last one.
    producer: str | None = None
    batch: int | None = None


@dataclass
class LogCursor:
    """How far a reader of a :class:`CommitLog` has read.

    ``seq`` is the last record it applied; ``producers`` each micro-batch
    producer's last batch, so a replayed batch's second record is skipped.
    """

    seq: int = 0
    producers: dict[str, int] = field(default_factory=dict)


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
    """Checks a writer index (``{"seq": <int>}``)."""
    int(index["seq"])


#: A commit log is folded into a base once this many records follow the newest one.
FOLD_EVERY = 100


def _record_payload(
    op: str, parts: list[tuple[str, Any]], writer: str, producer: str | None, batch: int | None
) -> bytes:
    # The nonce makes the payload this call's own, so a create that the
    # filesystem client retried after it landed is recognised as ours.
    return pickle.dumps(
        {"op": op, "parts": parts, "writer": writer, "time": time.time(),
         "nonce": uuid.uuid4().hex, "producer": producer, "batch": batch},
        protocol=PICKLE_PROTOCOL,
    )


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

    def new_segment_path(self, writer: str) -> str:
        """A fresh path for a segment that ``writer`` stages."""
        return self.paths.new_segment(writer)

    def write_segment(self, path: str, items: list[Any]) -> None:
        """Write a segment file (called on executors by sinks)."""
        self.store.write_bytes(path, pickle.dumps(items, protocol=PICKLE_PROTOCOL))

    def read_segment(self, path: str) -> list[Any]:
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

    def sequences(self) -> list[int]:
        """The numbers of the records in the log, oldest first (listed afresh)."""
        found = (self.paths.record_number(e) for e in self.store.listdir(self.paths.log))
        return sorted(seq for seq in found if seq is not None)

    def bases(self) -> list[int]:
        """The record numbers the log's complete bases fold up to, oldest first."""
        found = (self.paths.base_number(e) for e in self.store.listdir(self.paths.bases))
        return sorted(seq for seq in found if seq is not None)

    def exists(self) -> bool:
        """Whether anything was ever committed to the log (a record, or a fold of records).

        A list or map exists from its first commit on, also one that committed
        nothing but a ``clear`` or a batch job's empty output; a name nothing
        was ever committed to does not.
        """
        return bool(self.bases() or self.sequences())

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
        payload = _record_payload(op, parts or [], writer, producer, batch)
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
        after = 0 if raw is None else int(self.store.decode(
            index, raw, json_loads, f"{self.label}: writer index", check=_seq_is_int)["seq"])
        payload = _record_payload(op, parts, token, producer, batch)
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
            own = self._read_record(after) if after > floor else None
        if after > floor and own is None and self._newest_base() < after:
            # The writer's last record is neither in the log nor folded: the index
            # is damaged. Committing after it would leave a gap no reader passes.
            raise StoreError(self.store.redact(
                f"{self.label}: writer index {index!r} is damaged ({len(raw or b'')} bytes) "
                f"in store {self.store.shown_url!r}: it names record {after}, which the log "
                f"does not hold (its records end at {self._last_sequence()}); nothing was "
                "committed"))
        if own is not None:
            # From the writer's own last record on: a replay finds its batch's
            # record whether or not the index was updated after it.
            last = after - 1
            records: Iterator[Record] = itertools.chain([own], self._tail(after))
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

    def _newest_base(self) -> int:
        """The record number the newest base folds up to, listed afresh (0: none)."""
        bases = self.bases()
        return bases[-1] if bases else 0

    def _last_sequence(self) -> int:
        """The newest record's number, or the newest base's when the log has no record."""
        seqs = self.sequences()
        return seqs[-1] if seqs else self._newest_base()

    def _read_record(self, seq: int) -> Record | None:
        path = self.paths.record(seq)
        try:
            data = self.store.read_bytes(path)
        except FileNotFoundError:
            return None
        raw = self.store.decode(path, data, loads, f"{self.label}: record",
                                keys=("op", "parts", "writer"))
        return Record(seq, raw["op"], raw["parts"], raw["writer"], raw.get("producer"),
                      raw.get("batch"))

    def _tail(self, after: int) -> Iterator[Record]:
        """The records after ``after``, read by number until the first missing one."""
        seq = after + 1
        while (record := self._read_record(seq)) is not None:
            yield record
            seq += 1

    def _read_base(self, seq: int) -> dict[str, Any] | None:
        path = self.paths.base(seq)
        try:
            raw = self.store.read_bytes(path)
        except FileNotFoundError:
            return None  # replaced by a newer fold meanwhile
        def folds_up_to_seq(base: dict[str, Any]) -> None:
            if base["seq"] != seq:
                raise ValueError(f"it says it folds up to record {base['seq']}")

        base: dict[str, Any] = self.store.decode(
            path, raw, loads, f"{self.label}: base", keys=("seq", "records", "producers"),
            check=folds_up_to_seq)
        return base

    def _from_base(self, cursor: LogCursor) -> Iterator[Record]:
        """A ``clear`` and the newest base's records; moves ``cursor`` to the base."""
        for _ in range(100):
            bases = self.bases()
            if not bases:
                return
            base = self._read_base(bases[-1])
            if base is None:
                continue  # folded again while read: the newer base
            cursor.seq = base["seq"]
            cursor.producers = dict(base["producers"])
            yield Record(cursor.seq, "clear", [], "")
            for op, parts in base["records"]:
                yield Record(cursor.seq, op, parts, "")
            return
        raise StoreError(self.store.redact(
            f"{self.label}: the log was folded again each time it was read (100 times)"))

    def read(self, cursor: LogCursor) -> Iterator[Record]:
        """The records after ``cursor``, oldest first, moving ``cursor`` along.

        Starts with a ``clear`` and the newest base's records when the base
        is past ``cursor`` (a new reader, or one that a fold overtook), so a
        reader that applies what it is given in order stays right. Skips a
        micro-batch producer's record whose batch is not after its last.
        """
        bases = self.bases()
        if bases and bases[-1] > cursor.seq:
            yield from self._from_base(cursor)
        seqs = [s for s in self.sequences() if s > cursor.seq]
        for seq in seqs:
            record = self._read_record(seq) if seq == cursor.seq + 1 else None
            if record is None:
                # A gap, or a record gone since it was listed: a fold removed
                # them after writing a base past them.
                bases = self.bases()
                if not bases or bases[-1] <= cursor.seq:
                    raise StoreError(self.store.redact(
                        f"{self.label}: record {self.paths.record(cursor.seq + 1)!r} is missing "
                        f"(was the log deleted while it was read?)"
                    ))
                yield from self.read(cursor)
                return
            cursor.seq = seq
            if record.producer is not None and record.batch is not None:
                if record.batch <= cursor.producers.get(record.producer, -1):
                    continue  # a batch committed twice by racing drivers: the first stands
                cursor.producers[record.producer] = record.batch
            yield record

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

    def payload(self, record: Record) -> Iterable[Any]:
        """The items a record carries, in order."""
        for kind, value in record.parts:
            if kind == "items":
                yield from value
            else:
                yield from self.read_segment(value)

    def stage(self, items: Iterable[Any], writer: str) -> list[tuple[str, Any]]:
        """Prepare ``items`` for a later :meth:`commit` (runs on executors).

        Small batches travel inline in the commit message; larger ones are
        written to a segment file now, which stays invisible until a record
        names it.
        """
        batch = items if isinstance(items, list) else list(items)
        if not batch:
            return []
        if len(batch) <= INLINE_LIMIT:
            return [("items", batch)]
        path = self.new_segment_path(writer)
        self.write_segment(path, batch)
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

