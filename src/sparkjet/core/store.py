"""The store: lists, maps and job records kept under one fsspec URL.

Hazelcast keeps IList and IMap in the cluster; sparkjet keeps them in a folder
that every process (driver and executors) can reach: a local path on a laptop,
an S3 or GCS prefix on a cluster.

Lists and maps are *commit logs*: a folder of numbered records, each created
with a create-only write, so a commit (a sink's whole output, an ``add_all``)
appears entirely or not at all, and concurrent writers never overwrite one
another. Large payloads go to segment files first; the record that names them
is written last. A ``clear`` is a record too, so readers start after the
newest one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from sparkjet.core.errors import StoreError
from sparkjet.core.memoryfs import ThreadSafeMemoryFileSystem
from sparkjet.core.naming import PICKLE_PROTOCOL, decode_name, encode_name, unpickle
from sparkjet.core.stream_log import StreamLog

log = logging.getLogger("sparkjet.store")

_SEQ_WIDTH = 20
_T = TypeVar("_T")
#: The checkpoint folders a job record may name (see JobRecords.checkpoint_path).
_CHECKPOINT_FOLDER = re.compile(r"checkpoint|scratch-[0-9a-f]{8}")
#: Batches up to this many items travel inline in a commit record.
INLINE_LIMIT = 10_000


def _no_secrets(text: str) -> str:
    return text


class Store:
    """One fsspec location holding lists, maps, streams and job records.

    Picklable: executors rebuild the filesystem from the URL and options.
    Options may hold credentials; they are never included in ``repr``.
    """

    def __init__(
        self,
        url: str,
        options: dict[str, Any] | None = None,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.url = url
        self.options = dict(options or {})
        #: Masks secrets (``${env:...}`` values) in anything shown to users.
        self.redact = redact or _no_secrets
        self._fs: Any = None
        self._root: str | None = None
        self._conditional: bool | None = None

    def _error(self, message: str) -> StoreError:
        return StoreError(self.redact(message))

    @property
    def shown_url(self) -> str:
        """The URL as it may be printed: resolved secrets masked."""
        return self.redact(self.url)

    def __repr__(self) -> str:
        return f"Store({self.shown_url!r})"

    def __getstate__(self) -> dict[str, Any]:
        # The redactor travels too, so errors raised on executors mask secrets.
        return {"url": self.url, "options": self.options, "redact": self.redact}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"], state.get("redact"))  # type: ignore[misc]

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (created on first use)."""
        if self._fs is None:
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **self.options)
            except (ImportError, ValueError) as exc:
                raise self._error(f"cannot open store {self.shown_url!r}: {exc}") from exc
            if _is_local(fs):
                root = os.path.abspath(root)
            elif type(fs) is MemoryFileSystem:
                fs = ThreadSafeMemoryFileSystem(**self.options)
            self._fs, self._root = fs, root.rstrip("/")
        return self._fs

    @property
    def root(self) -> str:
        """The store's root path inside its filesystem."""
        self.fs  # noqa: B018 - opens the filesystem, which sets the root
        assert self._root is not None
        return self._root

    def path(self, *parts: str) -> str:
        """Join ``parts`` under the root."""
        return "/".join([self.root, *parts])

    # --- primitive file operations, all errors naming the path ------------
    #
    # Object stores as they are: s3fs and gcsfs cache listings per process, and
    # another process (a publisher, a second driver, an executor) may have
    # written since. Every listing and existence check here asks the store
    # afresh; nothing is trusted from a cache.

    def _inside(self, path: str) -> str:
        """``path`` if it lies under the root; StoreError otherwise (never touch outside)."""
        root = self.root
        normal = posixpath.normpath(path)
        if not root:
            return normal
        if normal != root and not normal.startswith(root.rstrip("/") + "/"):
            raise self._error(
                f"refusing to touch {path!r}: it is outside store {self.shown_url!r}"
            )
        return normal

    def _fresh(self, path: str) -> None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def read_bytes(self, path: str) -> bytes:
        self._fresh(path)  # s3fs sizes a read from its (maybe stale) listing cache
        try:
            data: bytes = self.fs.cat_file(path)
            return data
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._error(f"cannot read {path!r} in store {self.shown_url!r}: {exc}") from exc

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of ``path`` (fewer if the file is shorter)."""
        self._fresh(path)
        try:
            data: bytes = self.fs.cat_file(path, start=start, end=end)
            return data
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._error(f"cannot read {path!r} in store {self.shown_url!r}: {exc}") from exc

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file; readers see the old or the new content, never a mix."""
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            if _is_local(self.fs):
                os.replace(_complete_temp_file(path, data), path)
            else:
                # A single-object PUT is atomic on S3, GCS and in memory.
                self.fs.pipe_file(path, data)
        except Exception as exc:
            raise self._error(f"cannot write {path!r} in store {self.shown_url!r}: {exc}") from exc

    @property
    def conditional_writes(self) -> bool:
        """Whether the store enforces create-only writes (probed once per process).

        Local folders always do (a hard link fails on an existing name). On
        other filesystems a probe file is created twice through the
        filesystem's create-only call (``pipe_file(mode="create")`` where the
        filesystem implements it, as s3fs and gcsfs do with ``If-None-Match``
        and ``ifGenerationMatch=0``; else ``open(mode="xb")``): the second
        create must be refused. Where it is not, :meth:`create_exclusive`
        falls back to check-then-write, which two writers can race, and
        EXACTLY_ONCE is refused at submit.
        """
        if self._conditional is None:
            self._conditional = _is_local(self.fs) or self._probe_conditional()
        return self._conditional

    def _create_only(self, path: str, data: bytes) -> None:
        """The filesystem's own create-only write; FileExistsError if ``path`` exists."""
        if _implements_pipe_file(self.fs):
            self.fs.pipe_file(path, data, mode="create")
        else:
            with self.fs.open(path, "xb") as fh:
                fh.write(data)

    def _probe_conditional(self) -> bool:
        path = self.path("_probe", f"create-only-{uuid.uuid4().hex}")
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            try:
                self._create_only(path, b"1")
            except (ValueError, NotImplementedError, TypeError):
                return False  # the filesystem has no create-only mode at all
            try:
                self._create_only(path, b"2")
            except FileExistsError:
                return True
            except (ValueError, NotImplementedError, TypeError):
                return False
            log.warning(
                "store %s does not enforce create-only writes (a probe file was created "
                "twice); EXACTLY_ONCE is refused on it", self.shown_url,
            )
            return False  # the second create went through: the server ignores the condition
        except Exception as exc:
            raise self._error(
                f"cannot probe store {self.shown_url!r} for create-only writes: {exc}"
            ) from exc
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if it does not exist; False if it already does.

        A create that the filesystem client retried after it had landed
        reports "already exists"; the file is then read back, and a file
        holding exactly ``data`` counts as written by this call. So callers
        whose payloads could collide with another writer's make them unique
        (a writer token or a nonce in the payload).
        """
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            if _is_local(self.fs):
                tmp = _complete_temp_file(path, data)
                try:
                    os.link(tmp, path)  # atomic, fails if path exists; content complete
                except FileExistsError:
                    return self._landed(path, data)  # the same rule on every filesystem
                finally:
                    os.unlink(tmp)
                return True
            if not self.conditional_writes:
                # Check, then write: documented as racy; EXACTLY_ONCE is refused here.
                if self.exists(path):
                    return False
                self.fs.pipe_file(path, data)
                return True
            try:
                self._create_only(path, data)
                return True
            except FileExistsError:
                return self._landed(path, data)
            finally:
                self._fresh(path)
        except StoreError:
            raise
        except Exception as exc:
            raise self._error(
                f"cannot create {path!r} in store {self.shown_url!r}: {exc}"
            ) from exc

    def _landed(self, path: str, data: bytes) -> bool:
        """After "already exists": True if the file holds ``data`` (our own retried write)."""
        try:
            return self.read_bytes(path) == data
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists, asked afresh."""
        self._fresh(path)
        try:
            return bool(self.fs.exists(path))
        except Exception as exc:
            raise self._error(f"cannot stat {path!r} in store {self.shown_url!r}: {exc}") from exc

    def size(self, path: str) -> int:
        """The size of ``path`` in bytes, asked afresh."""
        self._fresh(path)
        try:
            return int(self.fs.size(path))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._error(f"cannot stat {path!r} in store {self.shown_url!r}: {exc}") from exc

    def _listing(self, path: str, call: Callable[[], _T]) -> _T:
        """Run the listing ``call`` of ``path``; FileNotFoundError if the folder is absent."""
        try:
            return call()
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._error(f"cannot list {path!r} in store {self.shown_url!r}: {exc}") from exc

    def listdir(self, path: str) -> list[str]:
        """Base names of the entries in ``path`` (empty if it does not exist), listed afresh."""
        self._fresh(path)
        try:
            entries = self._listing(path, lambda: self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def find(self, path: str) -> dict[str, dict[str, Any]]:
        """Every file under the folder ``path`` with its details, listed afresh.

        FileNotFoundError if ``path`` does not exist.
        """
        self._fresh(path)
        found: dict[str, dict[str, Any]] = self._listing(
            path, lambda: self.fs.find(path, detail=True)
        )
        return found

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (a whole folder with ``recursive``); never anything outside the root."""
        target = self._inside(path)
        if recursive and target == self.root:
            raise self._error(f"refusing to delete the whole store {self.shown_url!r}")
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(target, recursive=recursive)
        self._fresh(target)

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` inside the store."""
        target = self._inside(dst)
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(self._inside(src), target)

    # --- data structures ---------------------------------------------------

    def list_log(self, name: str) -> CommitLog:
        return CommitLog(self, self.path("lists", encode_name("list", name)), f"list {name!r}")

    def map_log(self, name: str) -> CommitLog:
        return CommitLog(self, self.path("maps", encode_name("map", name)), f"map {name!r}",
                         "map")

    def stream_log(self, name: str) -> StreamLog:
        """The stream ``name``."""
        return StreamLog(self, name)

    def names(self, kind: str) -> list[str]:
        """Names of the data structures of ``kind`` ("lists", "maps")."""
        return [decode_name(n) for n in self.listdir(self.path(kind))]


def _complete_temp_file(path: str, data: bytes) -> str:
    """A uniquely named file beside ``path`` holding ``data``, to rename or link into place."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    return tmp


def _implements_pipe_file(fs: Any) -> bool:
    """Whether ``fs`` has a ``pipe_file`` of its own (fsspec's default checks, then writes)."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    if isinstance(fs, AsyncFileSystem) and type(fs)._pipe_file is not AsyncFileSystem._pipe_file:
        return True
    return type(fs).pipe_file is not AbstractFileSystem.pipe_file


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol


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

    def __init__(self, store: Store, folder: str, label: str, kind: str = "list") -> None:
        self.store = store
        self.folder = folder
        self.label = label
        #: "list" or "map": what a fold keeps of the records.
        self.kind = kind

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "folder": self.folder, "label": self.label,
                "kind": self.kind}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("kind", "list")

    @property
    def log_dir(self) -> str:
        return f"{self.folder}/log"

    @property
    def base_dir(self) -> str:
        return f"{self.folder}/base"

    def new_segment_path(self, writer: str) -> str:
        return f"{self.folder}/data/{writer}-{uuid.uuid4().hex}.pkl"

    def write_segment(self, path: str, items: list[Any]) -> None:
        """Write a segment file (called on executors by sinks)."""
        self.store.write_bytes(path, pickle.dumps(items, protocol=PICKLE_PROTOCOL))

    def read_segment(self, path: str) -> list[Any]:
        try:
            raw = self.store.read_bytes(path)
        except FileNotFoundError as exc:
            raise StoreError(
                self.store.redact(
                    f"{self.label}: segment {path!r} named by a committed record is missing"
                )
            ) from exc
        items: list[Any] = unpickle(raw, f"{self.label}: segment {path!r}",
                                    redact=self.store.redact)
        return items

    def sequences(self) -> list[int]:
        out = []
        for entry in self.store.listdir(self.log_dir):
            stem = entry.split(".", 1)[0]
            if entry.endswith(".rec") and stem.isdigit():
                out.append(int(stem))
        return sorted(out)

    def bases(self) -> list[int]:
        """The record numbers the log's complete bases fold up to, oldest first."""
        return sorted(
            int(e[:-4]) for e in self.store.listdir(self.base_dir)
            if e.endswith(".pkl") and e[:-4].isdigit()
        )

    def _record_path(self, seq: int) -> str:
        return f"{self.log_dir}/{seq:0{_SEQ_WIDTH}d}.rec"

    def _base_path(self, seq: int, suffix: str = ".pkl") -> str:
        return f"{self.base_dir}/{seq:0{_SEQ_WIDTH}d}{suffix}"

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
        seq = max(after, floor) + 1
        while True:
            while not self.store.create_exclusive(self._record_path(seq), payload):
                seq += 1  # another writer took that number: the next one
            bases = self.bases()
            if not bases or bases[-1] < seq:
                break
            # A fold made meanwhile covers this number: readers start after
            # it, so the record would never be seen. Commit it after the base.
            self.store.remove(self._record_path(seq))
            floor = bases[-1]
            seq = floor + 1
        if seq - floor >= FOLD_EVERY:
            try:
                self.fold()
            except Exception as exc:  # the commit stands; the next commit folds
                log.warning("%s: folding the log failed (the next commit tries again): %s",
                            self.label, self.store.redact(str(exc)))
        return seq

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
        index = f"{self.folder}/writers/{encode_name('writer', writer)}.json"
        try:
            after = int(json.loads(self.store.read_bytes(index))["seq"])
        except FileNotFoundError:
            after = 0
        bases = self.bases()
        floor = bases[-1] if bases else 0
        cursor = LogCursor()
        if after > floor:
            # From the writer's own last record on: a replay finds its batch's
            # record whether or not the index was updated after it.
            last = max(floor, after - 1)
            records: Iterator[Record] = self._tail(last)
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
        seq = self._append(_record_payload(op, parts, token, producer, batch), last, floor)
        self.store.write_bytes(index, json.dumps({"seq": seq}).encode())
        return seq

    def _read_record(self, seq: int) -> Record | None:
        path = self._record_path(seq)
        try:
            data = self.store.read_bytes(path)
        except FileNotFoundError:
            return None
        try:
            raw = pickle.loads(data)
        except MemoryError:  # too big for this process, not corrupt
            raise
        except Exception as exc:
            raise StoreError(
                self.store.redact(f"{self.label}: cannot read record {path!r}: {exc}")
            ) from exc
        return Record(seq, raw["op"], raw["parts"], raw["writer"], raw.get("producer"),
                      raw.get("batch"))

    def _tail(self, after: int) -> Iterator[Record]:
        """The records after ``after``, read by number until the first missing one."""
        seq = after + 1
        while (record := self._read_record(seq)) is not None:
            yield record
            seq += 1

    def _read_base(self, seq: int) -> dict[str, Any] | None:
        path = self._base_path(seq)
        try:
            raw = self.store.read_bytes(path)
        except FileNotFoundError:
            return None  # replaced by a newer fold meanwhile
        def folds_up_to_seq(base: dict[str, Any]) -> None:
            if base["seq"] != seq:
                raise ValueError(f"it says it folds up to record {base['seq']}")

        base: dict[str, Any] = unpickle(
            raw, f"{self.label}: base {path!r}", keys=("seq", "records", "producers"),
            check=folds_up_to_seq, redact=self.store.redact)
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
                        f"{self.label}: record {self._record_path(cursor.seq + 1)!r} is missing "
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
        if not self.store.create_exclusive(self._base_path(cursor.seq), data):
            return None
        for seq in self.sequences():
            if seq <= cursor.seq:
                self.store.remove(self._record_path(seq))
        for seq in bases:
            self.store.remove(self._base_path(seq))
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
        if self.store.exists(self._abort_marker(writer)):
            # The job failed and aborted this writer while this task still ran:
            # the abort may have listed the folder before this file existed.
            self.store.remove(path)
        return [("segment", path)]

    def _abort_marker(self, writer: str) -> str:
        return f"{self.folder}/data/aborted-{writer}"

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
        self.store.write_bytes(self._abort_marker(writer), b"")
        folder = f"{self.folder}/data"
        for entry in self.store.listdir(folder):
            if entry.startswith(f"{writer}-"):
                self.store.remove(f"{folder}/{entry}")


# --- job records -------------------------------------------------------------


class JobRecords:
    """Job records: ``jobs/<id>/job.json``, plus a control folder per job."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _dir(self, job_id: str) -> str:
        return self.store.path("jobs", encode_name("job id", job_id))

    def path(self, job_id: str, *parts: str) -> str:
        """A path in the job's folder."""
        return "/".join([self._dir(job_id), *parts])

    def write(self, record: dict[str, Any]) -> None:
        self.store.write_bytes(
            f"{self._dir(record['id'])}/job.json",
            json.dumps(record, indent=1, sort_keys=True).encode(),
        )

    def read(self, job_id: str) -> dict[str, Any] | None:
        """The job's record, or None; StoreError naming the file if it does not parse."""
        path = f"{self._dir(job_id)}/job.json"
        try:
            data = self.store.read_bytes(path)
        except FileNotFoundError:
            return None
        try:
            record = json.loads(data)
            if not isinstance(record, dict) or record.get("id") != job_id:
                raise ValueError(f"not the record of job {job_id}")
        except ValueError as exc:
            raise StoreError(self.store.redact(
                f"job record {path!r} is corrupt ({len(data)} bytes): {exc}"
            )) from exc
        return record

    def ids(self) -> list[str]:
        return [decode_name(n) for n in self.store.listdir(self.store.path("jobs"))]

    def all(self) -> list[dict[str, Any]]:
        """Every readable record; a corrupt one is logged (naming its file) and skipped."""
        out = []
        for job_id in self.ids():
            try:
                record = self.read(job_id)
            except StoreError as exc:
                log.warning("skipping a job: %s", exc)
                continue
            if record is not None:
                out.append(record)
        return out

    def checkpoint_path(self, record: dict[str, Any]) -> str | None:
        """The checkpoint folder a record names, checked to be one of the job's own.

        The field is read from a file anyone with write access to the store can
        edit; a value that is not ``checkpoint`` or ``scratch-<hex>`` is refused,
        so no crafted record steers a recursive delete outside the job's folder.
        """
        folder = record.get("checkpoint")
        if folder is None:
            return None
        if not isinstance(folder, str) or not _CHECKPOINT_FOLDER.fullmatch(folder):
            raise StoreError(self.store.redact(
                f"job {record.get('id')!r}: its record's checkpoint field {folder!r} is not a "
                "checkpoint folder of the job ('checkpoint' or 'scratch-<hex>'); refusing to "
                "use it (was the record edited?)"
            ))
        return self.path(str(record["id"]), folder)

    # Names: one active job per name, across processes, by a create-only lock file.

    def _name_lock(self, name: str) -> str:
        return self.store.path("job-names", encode_name("job name", name))

    def claim_name(self, name: str, job_id: str) -> str | None:
        """Take ``name`` for ``job_id``; returns the holder's id if another job has it."""
        path = self._name_lock(name)
        if self.store.create_exclusive(path, job_id.encode()):
            return None
        try:
            return self.store.read_bytes(path).decode()
        except FileNotFoundError:  # released meanwhile: try once more
            return None if self.store.create_exclusive(path, job_id.encode()) else "unknown"

    def release_name(self, name: str, job_id: str) -> None:
        """Give ``name`` up if ``job_id`` holds it."""
        path = self._name_lock(name)
        try:
            if self.store.read_bytes(path).decode() == job_id:
                self.store.remove(path)
        except FileNotFoundError:
            pass

    # Control requests: another process asks the job's driver to act.

    def request(self, job_id: str, action: str, payload: Any = None) -> None:
        path = f"{self._dir(job_id)}/control/{time.time_ns():020d}-{action}.req"
        self.store.write_bytes(path, json.dumps({"action": action, "payload": payload}).encode())

    def take_requests_with_payload(self, job_id: str) -> list[tuple[str, Any]]:
        """Take (read and delete) the job's pending control requests, oldest first.

        A file that does not parse is moved to ``control/quarantine/`` and
        logged with its name; it never stops the driver from taking the rest.
        """
        folder = f"{self._dir(job_id)}/control"
        taken = []
        for entry in self.store.listdir(folder):
            if not entry.endswith(".req"):
                continue
            path = f"{folder}/{entry}"
            try:
                raw = self.store.read_bytes(path)
            except FileNotFoundError:
                continue  # taken meanwhile
            try:
                request = json.loads(raw)
                action = entry[:-4].split("-", 1)[1]
                if not isinstance(request, dict) or request.get("action") != action:
                    raise ValueError("its action does not match its name")
            except (ValueError, IndexError) as exc:
                self.store.move(path, f"{folder}/quarantine/{entry}")
                log.warning(
                    "job %s: control request %r does not parse (%s); moved to %s/quarantine/",
                    job_id, path, exc, folder,
                )
                continue
            taken.append((action, request.get("payload")))
            self.store.remove(path)
        return taken

    def take_requests(self, job_id: str) -> list[str]:
        return [action for action, _ in self.take_requests_with_payload(job_id)]
