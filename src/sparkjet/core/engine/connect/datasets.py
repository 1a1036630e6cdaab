"""A plan's work as Spark Connect DataFrames: the Connect engine's ``Datasets``.

See :class:`~sparkjet.core.engine.tasks.runs.Datasets` for the protocol.

The driver side of a run is :mod:`sparkjet.core.engine.tasks.runs`'s, the tasks
are :mod:`sparkjet.core.engine.tasks`', as on classic Spark; here they become
DataFrame work that Connect can run (no RDD, no SparkContext, no
accumulator):

- a dataset is a DataFrame of pickled chunks by partition
  (:mod:`.arrow`), with how many partitions it has;
- a source's descriptors become ``range(n)`` over ``n`` Spark partitions,
  partition ``i`` emitting descriptor ``i`` (no shuffle), when they are small
  (offset ranges); descriptors that carry data (a list source's items) go as
  a table of one row each, so a task gets its own partition's data, not
  every partition's;
- a task is a ``mapInArrow`` (:class:`~.arrow.ArrowTask`);
- a shuffle (to the state tasks, a batch reduce, a range sort) tags each
  record with its partition in a ``mapInArrow`` and repartitions by a route
  column that lands each partition in a Spark partition of its own;
- what the tasks report comes back as rows with the data (:mod:`.reports`);
- a shared flow, and a reduce's or sort's input, are persisted for the run.

A keyed stage's map-side partials are reduced on the driver when they are few,
as on classic Spark.
"""

from __future__ import annotations

import functools
import itertools
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from sparkjet.core.engine.connect.arrow import (
    REPORT,
    ArrowTask,
    Descriptors,
    HashPartition,
    PartitionOfOrigin,
    RestoreOrder,
    RouteTask,
    SampleKeys,
    Unindexed,
    route_values,
)
from sparkjet.core.engine.connect.reports import ConnectReports
from sparkjet.core.engine.tasks import passes
from sparkjet.core.engine.tasks.failures import spark_failure_summary
from sparkjet.core.engine.tasks.passes import (
    RangePartition,
    ReduceTask,
    SortTask,
    range_bounds,
    sample_fraction,
)
from sparkjet.core.engine.tasks.pickling import unpicklable
from sparkjet.core.engine.tasks.runs import PartitionTask
from sparkjet.core.state.keygroups import KeyGroupPartition

__all__ = ["ConnectData", "ConnectDatasets"]

_first = itemgetter(0)

#: Up to this many pickled bytes, a source's descriptors travel inside the
#: function that emits them (no shuffle); above, as a table of rows.
INLINE_DESCRIPTOR_BYTES = 64 << 10


@functools.cache
def _schemas() -> tuple[Any, Any]:
    """The rows of a dataset, and of one on its way through a shuffle, as Spark types.

    Types, not DDL strings: the server would parse a string on every
    ``mapInArrow``, a round trip each.
    """
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    rows = StructType([StructField("part", IntegerType()), StructField("n", IntegerType()),
                       StructField("item", BinaryType())])
    return rows, StructType([*rows.fields, StructField("route", IntegerType())])


def _dumps(value: Any) -> bytes:
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


@dataclass(frozen=True)
class ConnectData:
    """A dataset on Connect: its DataFrame (see :mod:`.arrow`) and how many partitions it has."""

    df: Any
    parts: int


class ConnectDatasets:
    """Datasets as DataFrames on the Connect session ``spark``; see the module docstring.

    ``parallelism`` is asked when a batch reduce or sort needs it.
    """

    on_driver = False

    def __init__(self, spark: Any, parallelism: Callable[[], int]) -> None:
        self.spark = spark
        self._parallelism = parallelism
        self._calls = itertools.count()
        self._persisted: list[Any] = []
        self._reports: ConnectReports | None = None

    def parallelism(self) -> int:
        return max(1, self._parallelism())

    def reports(
        self, *, counts: bool, event_times: bool, dead_letters: bool, state_ranges: bool
    ) -> ConnectReports:
        self._reports = ConnectReports(counts=counts, event_times=event_times,
                                       dead_letters=dead_letters, state_ranges=state_ranges)
        return self._reports

    def source(self, descriptors: list[Any], stage: str) -> ConnectData:
        blobs = [self._dump([d], stage) for d in descriptors]
        n = max(1, len(blobs))
        if sum(len(b) for b in blobs) <= INLINE_DESCRIPTOR_BYTES:
            df = self.spark.range(0, n, 1, n).mapInArrow(Descriptors(blobs), _schemas()[0])
            return ConnectData(df, n)
        # One row per partition, so each partition's rows are together whichever
        # Spark partition the table's scan puts it in: no shuffle.
        import pyarrow as pa  # type: ignore[import-untyped]

        table = pa.table({"part": pa.array(range(n), pa.int32()),
                          "n": pa.array([1] * n, pa.int32()),
                          "item": pa.array(blobs, pa.binary())})
        return ConnectData(self.spark.createDataFrame(table, _schemas()[0]), n)

    def map_partitions(
        self, data: ConnectData, task: PartitionTask, emitter: str | None, via: str = ""
    ) -> ConnectData:
        run = ArrowTask(task, next(self._calls), emitter, via, self._reports)
        return ConnectData(data.df.mapInArrow(run, _schemas()[0]), data.parts)

    def union(self, parts: list[ConnectData]) -> ConnectData:
        from pyspark.sql import functions as F

        frames = []
        offset = 0
        for data in parts:
            df = data.df
            if offset:
                part = F.col("part")
                df = df.withColumn("part", F.when(part >= 0, part + offset).otherwise(part))
            frames.append(df)
            offset += data.parts
        return ConnectData(functools.reduce(lambda a, b: a.union(b), frames), max(1, offset))

    def share(self, data: ConnectData) -> ConnectData:
        return self._persist(data)

    def shuffle_to_tasks(
        self, data: ConnectData, tasks: int, groups: int, stage: str
    ) -> ConnectData:
        return self._route(data, KeyGroupPartition(groups, tasks), tasks, stage, markers=True)

    def reduce(
        self, mapped: ConnectData, task: ReduceTask, partitions: int, by_position: bool
    ) -> ConnectData:
        """Reduce map-side partials keyed by key; the result is in encounter order.

        When the partials are few the driver reduces them; otherwise they are
        routed to ``partitions`` reducers by key, and the outputs put back in
        order (by position, or by a second route to their partition of origin).
        """
        mapped = self._persist(mapped)
        if self._count(mapped) <= passes.DRIVER_REDUCE_LIMIT:
            outputs = sorted(task(iter(self.collect(mapped))), key=_first)
            items = [item for _, item in outputs]
            slices = self.parallelism() if len(items) > passes.DRIVER_REDUCE_LIMIT // 10 else 1
            return self._parallelize(items, slices, task.stage)
        routed = self._route(mapped, HashPartition(partitions), partitions, None, markers=True)
        reduced = self.map_partitions(routed, Unindexed(task), task.stage)
        if by_position:
            return self.sort(reduced, SortTask(task.stage, None), partitions, task.stage)
        origin = self._route(reduced, PartitionOfOrigin(), mapped.parts, None, markers=False)
        return self.map_partitions(origin, Unindexed(RestoreOrder()), None)

    def sort(self, keyed: ConnectData, task: SortTask, partitions: int, stage: str) -> ConnectData:
        keyed = self._persist(keyed)
        bounds = self._range_bounds(keyed, partitions, stage)
        ranged = self._route(keyed, RangePartition(bounds), len(bounds) + 1, None,
                             markers=False)
        return self.map_partitions(ranged, Unindexed(task), None)

    def collect(self, data: ConnectData) -> list[Any]:
        table = data.df.toArrow()
        parts = table.column("part").to_pylist()
        items = table.column("item").to_pylist()
        out: list[Any] = []
        reports = self._reports
        for part, blob in zip(parts, items, strict=True):
            if part == REPORT:
                if reports is not None:
                    reports.ingest(*pickle.loads(blob))
            elif blob is not None:
                out.extend(pickle.loads(blob))
        return out

    def release(self) -> None:
        for df in self._persisted:
            df.unpersist()
        self._persisted = []

    def failure(self, exc: BaseException) -> str:
        return f"the job failed on Spark Connect: {spark_failure_summary(exc)}"

    # --- helpers -----------------------------------------------------------------

    def _dump(self, value: Any, stage: str) -> bytes:
        try:
            return _dumps(value)
        except Exception:
            failure = unpicklable(stage, value, _dumps)
            if failure is None:
                raise
            raise failure from None

    def _persist(self, data: ConnectData) -> ConnectData:
        # A persist, not a local checkpoint (which would save sending the plan
        # again): PySpark binds a checkpointed DataFrame to the process's active
        # session, not to the one that made it, so in a process with two
        # sessions its next query goes to the wrong one (DATAFRAME_NOT_FOUND).
        df = data.df.persist()
        self._persisted.append(df)
        return ConnectData(df, data.parts)

    def _count(self, data: ConnectData) -> int:
        from pyspark.sql import functions as F

        row = data.df.where(F.col("part") >= 0).agg(F.sum("n").alias("n")).collect()[0]
        return int(row["n"] or 0)

    def _route(self, data: ConnectData, to: Callable[[Any], int], n: int, emitter: str | None,
               *, markers: bool) -> ConnectData:
        """``data``'s records, each in partition ``to(key)`` of ``n`` (see :mod:`.arrow`)."""
        routes = route_values(n)
        tagged = data.df.mapInArrow(RouteTask(to, n, routes, emitter, markers), _schemas()[1])
        return ConnectData(tagged.repartition(n, "route").sortWithinPartitions("part"), n)

    def _parallelize(self, items: list[Any], slices: int, stage: str) -> ConnectData:
        """``items`` (on the driver) as a dataset of ``slices`` partitions, in order."""
        slices = max(1, slices)
        step = -(-len(items) // slices) if items else 0
        parts: list[int] = []
        ns: list[int] = []
        blobs: list[bytes | None] = []
        for s in range(slices):
            chunk = items[s * step:(s + 1) * step]
            for i in range(0, len(chunk), 512):
                piece = chunk[i:i + 512]
                parts.append(s)
                ns.append(len(piece))
                blobs.append(self._dump(piece, stage))
            parts.append(s)  # a marker: the partition exists
            ns.append(0)
            blobs.append(None)
        return self._placed(parts, ns, blobs, slices)

    def _placed(self, parts: list[int], ns: list[int], blobs: list[bytes | None],
                n: int) -> ConnectData:
        """Rows from the driver as a dataset of ``n`` partitions, each row in its own, in order."""
        import pyarrow as pa

        routes = route_values(n)
        table = pa.table({
            "part": pa.array(parts, pa.int32()), "n": pa.array(ns, pa.int32()),
            "item": pa.array(blobs, pa.binary()),
            "route": pa.array([routes[p] for p in parts], pa.int32()),
            "pos": pa.array(range(len(parts)), pa.int64()),
        })
        df = (self.spark.createDataFrame(table).repartition(n, "route")
              .sortWithinPartitions("part", "pos").select("part", "n", "item"))
        return ConnectData(df, n)

    def _range_bounds(self, keyed: ConnectData, partitions: int, stage: str) -> list[Any]:
        """Bounds splitting ``(key, item)`` records into ``partitions`` ranges of keys.

        From a sample of about 30 keys per range; a key that does not compare
        fails as ``stage``'s.
        """
        total = self._count(keyed) if partitions > 1 else 0
        if total <= 1:
            return []
        sampling = SampleKeys(sample_fraction(total, partitions), 17)
        sample = self.collect(ConnectData(keyed.df.mapInArrow(sampling, _schemas()[0]),
                                          keyed.parts))
        return range_bounds(sample, partitions, stage)

