"""A commit log's records and bases as files: their format, listed afresh, read back in order.

A record is a pickled dict (op, parts, writer, time, nonce, producer and
batch) in ``log/<seq>.rec``; a base, ``base/<seq>.pkl``, is a fold of the
records up to ``seq`` with each producer's last batch. :class:`LogReader`
lists both and reads them back as :class:`Record` objects, oldest first,
from the newest base on, skipping a micro-batch producer's record whose
batch is not after its last one. Committing and folding are
:class:`~sparkjet.core.store.commit_log.CommitLog`'s.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store.layout import CommitLogPaths
from sparkjet.core.store.naming import PICKLE_PROTOCOL, loads
from sparkjet.core.store.protocol import StoreFiles


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
    """How far a reader of a :class:`~sparkjet.core.store.commit_log.CommitLog` has read.

    ``seq`` is the last record it applied; ``producers`` each micro-batch
    producer's last batch, so a replayed batch's second record is skipped.
    """

    seq: int = 0
    producers: dict[str, int] = field(default_factory=dict)


def record_payload(
    op: str, parts: list[tuple[str, Any]], writer: str, producer: str | None, batch: int | None
) -> bytes:
    """The bytes of a record that a commit creates."""
    # The nonce makes the payload this call's own, so a create that the
    # filesystem client retried after it landed is recognised as ours.
    return pickle.dumps(
        {"op": op, "parts": parts, "writer": writer, "time": time.time(),
         "nonce": uuid.uuid4().hex, "producer": producer, "batch": batch},
        protocol=PICKLE_PROTOCOL,
    )


class LogReader:
    """One commit log's records and bases: listed afresh, read one by one or in order.

    A reader that loses a race with a fold (a record gone between listing
    and reading) starts again from the new base.
    """

    def __init__(self, store: StoreFiles, paths: CommitLogPaths, label: str) -> None:
        self.store = store
        self.paths = paths
        self.label = label

    def sequences(self) -> list[int]:
        """The numbers of the records in the log, oldest first (listed afresh)."""
        found = (self.paths.record_number(e) for e in self.store.listdir(self.paths.log))
        return sorted(seq for seq in found if seq is not None)

    def bases(self) -> list[int]:
        """The record numbers the log's complete bases fold up to, oldest first."""
        found = (self.paths.base_number(e) for e in self.store.listdir(self.paths.bases))
        return sorted(seq for seq in found if seq is not None)

    def newest_base(self) -> int:
        """The record number the newest base folds up to, listed afresh (0: none)."""
        bases = self.bases()
        return bases[-1] if bases else 0

    def last_sequence(self) -> int:
        """The newest record's number, or the newest base's when the log has no record."""
        seqs = self.sequences()
        return seqs[-1] if seqs else self.newest_base()

    def record(self, seq: int) -> Record | None:
        """Record number ``seq``; None if the log does not hold it."""
        path = self.paths.record(seq)
        try:
            data = self.store.read_bytes(path)
        except FileNotFoundError:
            return None
        raw = self.store.decode(path, data, loads, f"{self.label}: record",
                                keys=("op", "parts", "writer"))
        return Record(seq, raw["op"], raw["parts"], raw["writer"], raw.get("producer"),
                      raw.get("batch"))

    def tail(self, after: int) -> Iterator[Record]:
        """The records after ``after``, read by number until the first missing one."""
        seq = after + 1
        while (record := self.record(seq)) is not None:
            yield record
            seq += 1

    def _base(self, seq: int) -> dict[str, Any] | None:
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
            base = self._base(bases[-1])
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
            record = self.record(seq) if seq == cursor.seq + 1 else None
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
