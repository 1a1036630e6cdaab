"""The functions Spark Connect runs on its Python workers: tasks over Arrow batches of pickles.

A dataset on Spark Connect is a DataFrame of rows ``(part int, n int, item
binary)`` (on its way through a shuffle, with a ``route int`` column too):

- ``part >= 0``: ``item`` is a pickled list of ``n`` items of partition
  ``part`` (a chunk), or None (a marker: the partition exists, with no items
  in this row). Partition indexes are the run's, as on Spark: one per source
  descriptor, one per state task; every partition's rows are in one Spark
  partition, together and in order.
- ``part == REPORT``: ``item`` is a pickled report ``(key, Reported)`` of one
  task over one partition (:mod:`.reports`). Report rows travel with the data
  to the driver, where :meth:`ConnectDatasets.collect` takes them out; every
  task passes the report rows it receives on untouched.

Connect has no RDDs, so no partition function: a shuffle routes each row to
the Spark partition of its ``part`` through a ``route`` column whose Spark
hash (Murmur3, seed 42, as ``repartition(n, col)`` hashes) lands in that
very partition (:func:`route_values`), so each state task still owns exactly
its range of key groups, and snapshots and rescaling keep their layout.

Everything here is module-level, so it pickles by reference plus its fields.
"""

from __future__ import annotations

import functools
import pickle
import random
from collections.abc import Callable, Iterable, Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any

from sparkjet.core.engine.tasks.pickling import unpicklable
from sparkjet.core.state.keygroups import stable_hash

__all__ = [
    "REPORT",
    "ArrowTask",
    "Descriptors",
    "HashPartition",
    "PartitionOfOrigin",
    "RestoreOrder",
    "RouteTask",
    "SampleKeys",
    "Unindexed",
    "murmur3_int",
    "route_values",
]

#: The ``part`` of a report row.
REPORT = -1
#: Items pickled together in one row.
CHUNK_ITEMS = 512
#: A record batch is sent once it holds this many rows or bytes.
BATCH_ROWS = 256
BATCH_BYTES = 4 << 20

_first = itemgetter(0)


def _dumps(value: Any) -> bytes:
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


class _Batches:
    """Rows gathered into Arrow record batches of a dataset's columns (plus ``route``)."""

    def __init__(self, routed: bool = False) -> None:
        self.routed = routed
        self._reset()

    def _reset(self) -> None:
        self.parts: list[int] = []
        self.ns: list[int] = []
        self.items: list[bytes | None] = []
        self.routes: list[int] = []
        self.size = 0

    def add(self, part: int, n: int, item: bytes | None, route: int = 0) -> Iterator[Any]:
        """Add a row; yields a record batch when one is full."""
        self.parts.append(part)
        self.ns.append(n)
        self.items.append(item)
        if self.routed:
            self.routes.append(route)
        self.size += len(item) if item is not None else 0
        if len(self.parts) >= BATCH_ROWS or self.size >= BATCH_BYTES:
            yield self.batch()

    def flush(self) -> Iterator[Any]:
        """The rows not sent yet, as a last record batch."""
        if self.parts:
            yield self.batch()

    def batch(self) -> Any:
        import pyarrow as pa  # type: ignore[import-untyped]

        arrays = [pa.array(self.parts, pa.int32()), pa.array(self.ns, pa.int32()),
                  pa.array(self.items, pa.binary())]
        names = ["part", "n", "item"]
        if self.routed:
            arrays.append(pa.array(self.routes, pa.int32()))
            names.append("route")
        batch = pa.RecordBatch.from_arrays(arrays, names=names)
        self._reset()
        return batch


def _rows(batches: Iterable[Any], reports: list[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    """``(part, item)`` of each data row; report rows are set aside in ``reports``."""
    for batch in batches:
        parts = batch.column("part").to_pylist()
        ns = batch.column("n").to_pylist()
        items = batch.column("item").to_pylist()
        for part, n, item in zip(parts, ns, items, strict=True):
            if part == REPORT:
                reports.append((n, item))
            else:
                yield part, item


def _items(rows: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """The items of a partition's rows (markers have none)."""
    for _, blob in rows:
        if blob is not None:
            yield from pickle.loads(blob)


def _dump_chunk(chunk: list[Any], emitter: str | None, via: str) -> bytes:
    """``chunk`` pickled; an item that cannot be is ``emitter``'s failure (found ``via``)."""
    try:
        return _dumps(chunk)
    except Exception:
        failure = None if emitter is None else unpicklable(emitter, chunk, _dumps, via)
        if failure is None:
            raise
        raise failure from None


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= CHUNK_ITEMS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class Descriptors:
    """A source's partitions: Spark partition ``i`` of ``range(n)`` emits descriptor ``i``.

    The descriptors travel pickled inside this function, so descriptor ``i``
    is partition ``i``'s with no shuffle; a source of none has one empty
    partition (as ``parallelize([], 1)`` on Spark).
    """

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        out = _Batches()
        for batch in batches:
            for i in batch.column("id").to_pylist():
                blob = self.blobs[i] if i < len(self.blobs) else None
                yield from out.add(int(i), 1 if blob is not None else 0, blob)
        yield from out.flush()


class Unindexed:
    """A task over one iterator (a reduce, a sort) as a task over ``(partition, items)``."""

    def __init__(self, task: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
        self.task = task
        self.stage = getattr(task, "stage", None)

    def __call__(self, pidx: int, items: Iterator[Any]) -> Iterator[Any]:
        return self.task(items)


class ArrowTask:
    """A partition task (``task(partition, items)``) over a dataset's rows, on a Python worker.

    Runs ``task`` once per partition whose rows reach it, in order; pickles
    what it yields in chunks (an item that cannot be pickled fails as
    ``emitter``'s, found ``via``); after each partition, sends what the task
    reported as a report row keyed ``(call, partition)``, so the driver
    counts it once however often the rows are read.
    """

    def __init__(self, task: Callable[[int, Iterator[Any]], Iterator[Any]], call: int,
                 emitter: str | None, via: str, reports: Any) -> None:
        self.task, self.call, self.emitter, self.via = task, call, emitter, via
        self.reports = reports

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        out = _Batches()
        passing: list[tuple[int, bytes]] = []
        for part, rows in groupby(_rows(batches, passing), key=_first):
            for chunk in _chunks(self.task(part, _items(rows))):
                yield from out.add(part, len(chunk), _dump_chunk(chunk, self.emitter, self.via))
            if self.reports is not None:
                report = ((self.call, part), self.reports.drain())
                yield from out.add(REPORT, 0, _dumps(report))
        for n, blob in passing:
            yield from out.add(REPORT, n, blob)
        yield from out.flush()



class RouteTask:
    """Tags each ``(key, part)`` record with the partition ``to(key)`` and that partition's route.

    ``to`` maps a record's key to a partition of ``n``. With ``markers``,
    every task also sends a marker row to each of the ``n`` partitions, so
    each runs even with no records (a state task still fires its timers).
    """

    via = ""

    def __init__(self, to: Callable[[Any], int], n: int, routes: list[int],
                 emitter: str | None, markers: bool) -> None:
        self.to, self.n, self.routes, self.emitter = to, n, routes, emitter
        self.markers = markers

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        out = _Batches(routed=True)
        routes, to = self.routes, self.to
        passing: list[tuple[int, bytes]] = []
        pending: dict[int, list[Any]] = {}
        for _, rows in groupby(_rows(batches, passing), key=_first):
            for record in _items(rows):
                target = to(record[0])
                chunk = pending.setdefault(target, [])
                chunk.append(record)
                if len(chunk) >= CHUNK_ITEMS:
                    blob = _dump_chunk(chunk, self.emitter, self.via)
                    yield from out.add(target, len(chunk), blob, routes[target])
                    pending[target] = []
        for target, chunk in pending.items():
            if chunk:
                blob = _dump_chunk(chunk, self.emitter, self.via)
                yield from out.add(target, len(chunk), blob, routes[target])
        if self.markers:
            for target in range(self.n):
                yield from out.add(target, 0, None, routes[target])
        for n, blob in passing:
            yield from out.add(REPORT, n, blob, routes[0])
        yield from out.flush()



class SampleKeys:
    """A sample of the keys of ``(key, item)`` records, ``fraction`` of them, seeded."""

    def __init__(self, fraction: float, seed: int) -> None:
        self.fraction, self.seed = fraction, seed

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        rng = random.Random(self.seed * 1_000_003 + (context.partitionId() if context else 0))
        keys = [record[0] for _, rows in groupby(_rows(batches, []), key=_first)
                for record in _items(rows) if rng.random() < self.fraction]
        out = _Batches()
        yield from out.add(0, len(keys), _dumps(keys))
        yield from out.flush()


class HashPartition:
    """A batch reduce's partition function: a key's stable hash modulo ``n``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, key: Any) -> int:
        return stable_hash(key) % self.n


class PartitionOfOrigin:
    """The partition a reduce output came from: the first field of its position."""

    def __call__(self, position: Any) -> int:
        return int(position[0])


class RestoreOrder:
    """Puts ``(position, output)`` records of one partition in order; yields the outputs."""

    def __call__(self, records: Iterator[tuple[Any, Any]]) -> Iterator[Any]:
        for _, output in sorted(records, key=_first):
            yield output


# --- routes -------------------------------------------------------------------------

_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3_x86_32.hashInt(value, seed)``: what ``hash(int)`` is in Spark SQL."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@functools.lru_cache(maxsize=256)
def route_values(n: int) -> list[int]:
    """Per partition ``p`` of ``n``, an int whose Spark hash partitioning puts it in ``p``.

    ``repartition(n, col)`` sends a row to ``pmod(murmur3(col), n)``; a row
    whose ``route`` is ``route_values(n)[p]`` lands in Spark partition ``p``.
    """
    found: dict[int, int] = {}
    candidate = 0
    while len(found) < n:
        found.setdefault(murmur3_int(candidate) % n, candidate)
        candidate += 1
    return [found[p] for p in range(n)]

