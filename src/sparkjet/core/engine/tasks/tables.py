"""Hash joins' build tables: made on the driver, kept in the store, loaded once per process.

A join stage's build sides are collected on the driver and turned into
tables (:func:`sparkjet.core.pipeline.joins.build_table`). Each table is
pickled once and named by the SHA-256 of its bytes (its *digest*), written
create-only to ``jobs/<job>/tables/<digest>.pkl`` in the store, where any
worker of any engine can read it; a :class:`TableRef` (the path and the
digest) is what travels in a task's closure, never the table. A process
loads a digest once and keeps it (:data:`_CACHE`, a few tables by recency),
so every task of a worker shares one copy, and the driver, which made the
table, never reads it back.

A streaming job's micro-batch plan records its joins' digests, so a batch
replayed after a crash joins against the tables its first try used, even
when the build side has changed since (a new run of the loop reads the
build sides anew).
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkjet.core.errors import JobFailedError
from sparkjet.core.host.contracts import FileStore
from sparkjet.core.pipeline.joins import JoinClause, Table, build_table
from sparkjet.core.store.layout import StoreLayout
from sparkjet.core.store.naming import PICKLE_PROTOCOL

__all__ = ["TableRef", "TableSet", "load_tables", "make_table"]

#: How many tables a process keeps loaded (the least recently used goes first).
CACHED_TABLES = 8

_CACHE: OrderedDict[str, Table] = OrderedDict()
_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class TableRef:
    """Where a task finds one build table: the store and the file, checked by digest."""

    files: FileStore
    path: str
    digest: str

    def __call__(self) -> Table:
        return _load(self)


@dataclass(frozen=True, slots=True)
class TableSet:
    """A join stage's tables, one per build side: what its probe calls for on first use."""

    refs: tuple[TableRef, ...]

    def __call__(self) -> Sequence[Table]:
        return [ref() for ref in self.refs]


def make_table(
    items: Iterable[Any],
    clause: JoinClause,
    *,
    stage: str,
    side: str,
    files: FileStore,
    job_id: str,
    max_bytes: int,
    write: bool = True,
) -> TableRef:
    """Build, size-check, store (create-only, if ``write``) and cache one build table.

    Raises JobFailedError naming the join stage and its build side when a
    clause's function raises, a key is unhashable, or the table's pickle is
    over ``max_bytes``.
    """
    try:
        table = build_table(items, clause)
    except Exception as exc:
        raise JobFailedError(
            f"stage '{stage}': building the table of its build side '{side}' failed: "
            f"{type(exc).__name__}: {exc}",
            stage,
        ) from exc
    try:
        data = pickle.dumps(table, protocol=PICKLE_PROTOCOL)
    except Exception as exc:
        raise JobFailedError(
            f"stage '{stage}': the table of its build side '{side}' cannot be pickled: "
            f"{type(exc).__name__}: {exc}",
            stage,
        ) from exc
    if len(data) > max_bytes:
        raise JobFailedError(
            f"stage '{stage}': the table of its build side '{side}' is {len(data):,} bytes "
            f"pickled ({len(table):,} keys), over the {max_bytes:,} bytes a hash join may "
            "hold ([engine] join_table_max_bytes): filter or project the build side, or "
            "raise the limit",
            stage,
        )
    digest = hashlib.sha256(data).hexdigest()
    path = table_path(files, job_id, digest)
    if write and not files.exists(path):
        files.create_exclusive(path, data)  # False: the same bytes are there already
    _remember(digest, table)
    return TableRef(files, path, digest)


def table_path(files: FileStore, job_id: str, digest: str) -> str:
    """Where the table ``digest`` of the job ``job_id`` is kept in the store."""
    return f"{StoreLayout(files.root).job(job_id)}/tables/{digest}.pkl"


def load_tables(files: FileStore, job_id: str, digests: Sequence[str]) -> TableSet:
    """The tables a micro-batch's plan names, by digest (loaded when a task first probes)."""
    return TableSet(tuple(TableRef(files, table_path(files, job_id, d), d) for d in digests))


def _remember(digest: str, table: Table) -> None:
    with _LOCK:
        _CACHE[digest] = table
        _CACHE.move_to_end(digest)
        while len(_CACHE) > CACHED_TABLES:
            _CACHE.popitem(last=False)


def _load(ref: TableRef) -> Table:
    with _LOCK:
        table = _CACHE.get(ref.digest)
        if table is not None:
            _CACHE.move_to_end(ref.digest)
            return table
    # Read outside the lock: two tasks of a process may read one table at once
    # (both get equal tables; one is kept), but a read never blocks other tables.
    try:
        data = ref.files.read_bytes(ref.path)
    except FileNotFoundError as exc:
        raise JobFailedError(
            f"the hash join table {ref.path} is missing from the store (a micro-batch's plan "
            "names it: was the job's folder tidied by hand?)") from exc
    if hashlib.sha256(data).hexdigest() != ref.digest:
        raise JobFailedError(
            f"the hash join table {ref.path} does not match its digest: the file is damaged")
    loaded: Table = pickle.loads(data)
    _remember(ref.digest, loaded)
    return loaded
