"""A plan's work as Spark RDDs: the :class:`~sparkjet.core.engine.tasks.runs.Datasets` of Spark.

The driver side of a run (walking the plan, sinks' prepare and commit, dead
letters, results) is :mod:`sparkjet.core.engine.tasks.runs`'s, the per-partition
tasks are :mod:`sparkjet.core.engine.tasks`'; here they become Spark work:

- a source's descriptors become ``parallelize(descriptors)``, one per
  partition, read on executors;
- a keyed stage's map-side partials are reduced on the driver when they are
  few, and otherwise shuffled by key and put back in order of first
  appearance (positions are ``(partition, index)``), so batch output is
  deterministic and matches plain Python;
- a micro-batch's partials are shuffled to the state task owning their key
  group;
- what the tasks report goes through accumulators (:mod:`.reports`).
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from sparkjet.core.engine.boundary import BatchWork, JobRun, RunHooks
from sparkjet.core.engine.spark.accumulators import SparkReports
from sparkjet.core.engine.spark.output import name_output, parallelize, partition_by
from sparkjet.core.engine.tasks import passes
from sparkjet.core.engine.tasks.failures import spark_failure_summary
from sparkjet.core.engine.tasks.passes import (
    RangePartition,
    ReduceTask,
    SortTask,
    range_bounds,
    sample_fraction,
)
from sparkjet.core.engine.tasks.runs import MicroBatchRun, PartitionTask, PlanRun
from sparkjet.core.state.keygroups import KeyGroupPartition

__all__ = ["SparkDatasets", "spark_batch", "spark_micro_batch"]

_first = itemgetter(0)


def _count_records(records: Iterator[Any]) -> Iterator[int]:
    n = 0
    for _ in records:
        n += 1
    yield n


def _to_partition_of_origin(record: tuple[Any, Any]) -> tuple[int, Any]:
    return (record[0][0], record)


def _identity_partition(pidx: int) -> int:
    return pidx


def _restore_order(records: Iterator[tuple[int, Any]]) -> Iterator[Any]:
    ordered = sorted((record for _, record in records), key=_first)
    for _, output in ordered:
        yield output


class SparkDatasets:
    """Datasets as RDDs on SparkContext ``sc``; see the module docstring."""

    on_driver = False

    def __init__(self, sc: Any) -> None:
        self.sc = sc
        self._persisted: list[Any] = []

    def parallelism(self) -> int:
        return max(1, int(self.sc.defaultParallelism))

    def reports(
        self, *, counts: bool, event_times: bool, dead_letters: bool, state_ranges: bool
    ) -> SparkReports:
        return SparkReports.make(self.sc, counts=counts, event_times=event_times,
                                 dead_letters=dead_letters, state_ranges=state_ranges)

    def source(self, descriptors: list[Any], stage: str) -> Any:
        return parallelize(self.sc, descriptors, max(1, len(descriptors)), stage)

    def map_partitions(
        self, data: Any, task: PartitionTask, emitter: str | None, via: str = ""
    ) -> Any:
        rdd = data.mapPartitionsWithIndex(task, True)
        return rdd if emitter is None else name_output(rdd, emitter, via)

    def union(self, parts: list[Any]) -> Any:
        return self.sc.union(parts)

    def share(self, data: Any) -> Any:
        return self._persist(data)

    def shuffle_to_tasks(self, data: Any, tasks: int, groups: int, stage: str) -> Any:
        return partition_by(data, tasks, KeyGroupPartition(groups, tasks), stage)

    def reduce(self, mapped: Any, task: ReduceTask, partitions: int, by_position: bool) -> Any:
        """Reduce map-side partials keyed by key; the result RDD is in encounter order.

        The map side runs once, cached. When its partials are few (the usual
        case for aggregations), the driver reduces them, which saves two
        shuffle stages; otherwise they are shuffled to ``partitions`` reducers
        and the results put back in order by a second shuffle.
        """
        from pyspark.rdd import portable_hash

        mapped = self._persist(mapped)
        if sum(mapped.mapPartitions(_count_records).collect()) <= passes.DRIVER_REDUCE_LIMIT:
            outputs = sorted(task(iter(mapped.collect())), key=_first)
            items = [item for _, item in outputs]
            slices = self.parallelism() if len(items) > passes.DRIVER_REDUCE_LIMIT // 10 else 1
            return parallelize(self.sc, items, slices, task.stage)
        reduced = partition_by(mapped, partitions, portable_hash, None).mapPartitions(task)
        if by_position:  # positions that are not (pidx, pos, j): a sort by them
            return self._by_position(reduced, partitions, task.stage)
        return self._reorder(reduced, mapped.getNumPartitions(), task.stage)

    def sort(self, keyed: Any, task: SortTask, partitions: int, stage: str) -> Any:
        keyed = self._persist(keyed)
        bounds = self._range_bounds(keyed, partitions, stage)
        ranged = partition_by(keyed, len(bounds) + 1, RangePartition(bounds), None)
        return ranged.mapPartitions(task, True)

    def collect(self, data: Any) -> list[Any]:
        return list(data.collect())

    def release(self) -> None:
        for rdd in self._persisted:
            rdd.unpersist()
        self._persisted = []

    def failure(self, exc: BaseException) -> str:
        return f"the job failed in Spark: {spark_failure_summary(exc)}"

    def _persist(self, rdd: Any) -> Any:
        from pyspark import StorageLevel

        rdd = rdd.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(rdd)
        return rdd

    def _by_position(self, tagged: Any, partitions: int, stage: str) -> Any:
        """``(position, item)`` records (``stage``'s output), their items in order of position.

        What ``sortByKey`` does, but ``sortByKey`` computes its input three
        times (a count, a sample, the shuffle), so the reduce side ran, and
        counted its output, three times. Here it runs once, persisted, and an
        item that cannot be pickled is named as ``stage``'s.
        """
        tagged = self._persist(name_output(tagged, stage))
        bounds = self._range_bounds(tagged, partitions, stage)
        ranged = partition_by(tagged, len(bounds) + 1, RangePartition(bounds), None)
        return ranged.mapPartitions(SortTask(stage, None), True)

    def _range_bounds(self, keyed: Any, partitions: int, stage: str) -> list[Any]:
        """Bounds splitting ``(key, item)`` records into ``partitions`` ranges of keys.

        From a sample of about 30 keys per range, as Spark's own range sort
        samples; a key that does not compare fails as ``stage``'s.
        """
        total = keyed.count() if partitions > 1 else 0
        if total <= 1:
            return []
        fraction = sample_fraction(total, partitions)
        sample = keyed.map(_first).sample(False, fraction, 17).collect()
        return range_bounds(sample, partitions, stage)

    def _reorder(self, tagged: Any, partitions: int, stage: str) -> Any:
        """Put ``((pidx, pos, j), item)`` records (``stage``'s output) back in encounter order."""
        origin = tagged.map(_to_partition_of_origin)
        return partition_by(origin, max(1, partitions), _identity_partition, stage).mapPartitions(
            _restore_order, True)


def spark_batch(sc: Any, job: JobRun, hooks: RunHooks) -> PlanRun:
    """A batch job's run on SparkContext ``sc``."""
    return PlanRun(SparkDatasets(sc), job, hooks)


def spark_micro_batch(sc: Any, job: JobRun, work: BatchWork, hooks: RunHooks) -> MicroBatchRun:
    """One micro-batch's run on SparkContext ``sc``."""
    return MicroBatchRun(SparkDatasets(sc), job, work, hooks)
