"""One micro-batch of a streaming job, as Spark work.

A micro-batch is a batch run (fused passes, map-side partial aggregation,
sinks committing at the end) with three differences:

- sources read the offset range the driver planned for this batch;
- keyed stages keep state across batches: partials are shuffled by a stable
  hash of the key to the state task owning the key's *key group* (the batch's
  plan fixes how many tasks there are), and each task loads its key groups'
  state as of the last committed batch from the checkpoint (or finds it still
  loaded from the batch before), folds the batch in (one state update per key
  per batch), writes what changed and emits the updated results;
- sinks commit with the batch id, so a replayed batch lands once.

The state's files and versions are :mod:`sparkjet.core.state_files`'; which
task owns a key is :mod:`sparkjet.core.keygroups`'; what a fold does to a key's
state is :mod:`sparkjet.core.keyed`'s. Each state task reports its range's
keys, bytes and file once, a :class:`~sparkjet.core.tasks.reports.RangeReport`
by :class:`~sparkjet.core.state_files.StateRange` (on Spark, through one
accumulator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from sparkjet.core import compaction
from sparkjet.core.contracts import JobContext
from sparkjet.core.engine import BatchResult, BatchSpec, MicroBatchSpec, StateSize
from sparkjet.core.graph import KeyedSpec, SourceSpec, Transform, state_ttl_ms
from sparkjet.core.keyed import KeyedFold, fold_into, group_parts
from sparkjet.core.keygroups import KeyGroupPartition, task_range
from sparkjet.core.runtime.batch import BatchRun, Flow
from sparkjet.core.runtime.output import partition_by
from sparkjet.core.state_cache import CACHE, CacheOwner
from sparkjet.core.state_files import RangeState, StatePaths, StateRange, StateVersion
from sparkjet.core.tasks.base import Task
from sparkjet.core.tasks.reports import RangeReport, Reports
from sparkjet.core.windowing import stage_fold

__all__ = ["MicroBatch", "StateTask"]


class StateTask(Task):
    """Reduce side of a keyed stage in a stream: partition ``p`` holds task ``p``'s key groups."""

    def __init__(
        self,
        fold: KeyedFold,
        stage: str,
        ttl_ms: int | None,
        paths: StatePaths,
        batch: int,
        committed: int,
        now_ms: int,
        reports: Reports | None,
        tasks: int,
        owner: CacheOwner | None = None,
    ) -> None:
        self.fold, self.stage, self.ttl_ms, self.paths = fold, stage, ttl_ms, paths
        self.batch, self.committed, self.now_ms = batch, committed, now_ms
        #: Where the task reports its outputs' count and its range (None: nowhere).
        self.reports = reports
        self.tasks = tasks
        #: The job the state is kept loaded for between batches (None: not kept).
        self.owner = owner

    def __call__(self, task: int, records: Iterator[tuple[Any, Any]]) -> Iterator[Any]:
        lo, hi = task_range(task, self.tasks, self.paths.key_groups)
        with self.attributing():
            try:
                outputs, keys, size, written = self._run(lo, hi, records)
            except MemoryError:
                CACHE.clear()  # give back what this worker kept loaded
                raise MemoryError(
                    f"the state of key groups [{lo}, {hi}) of {self.paths.key_groups} does not "
                    f"fit in this Python worker's memory; run the job with more state tasks "
                    f"(more cores; at most key_groups) or give the workers more memory "
                    f"(spark.executor.pyspark.memory)"
                ) from None
        self.count({self.stage: len(outputs)})
        if self.reports is not None:
            self.reports.state_range(
                {StateRange(self.stage, lo, hi): RangeReport(keys, size, written)})
        yield from outputs

    def _timed_work(self) -> bool:
        """Whether event time gives the fold work this batch (a window may be due)."""
        clock = getattr(self.fold, "clock", None) if self.fold.timed else None
        return clock is not None and (clock.current > clock.previous or clock.early)

    def _state(self, lo: int, hi: int, chain: list[StateVersion]) -> RangeState:
        """Key groups ``[lo, hi)`` as of the last committed batch (made of ``chain``).

        Kept loaded here (:mod:`sparkjet.core.state_cache`) and caught up, or read.
        Used only when its files lie on the chain a fresh listing gives for the
        batch the task starts from, brought up to it by the changelogs written
        since (PySpark gives a task whichever worker is free, so another worker
        may have run the range in between).
        """
        cached = CACHE.take((self.paths.root, self.stage, lo, hi))
        if cached is not None and cached.batch <= self.committed:
            # Kept from a batch this worker ran (committed since, or its files
            # would not be on the listed chain): caught up by the changelogs
            # of the batches other workers ran since, if any.
            state = self.paths.catch_up(self.stage, lo, hi, cached.state, chain)
            if state is not None:
                return state
        state = self.paths.read_chain(self.stage, lo, hi, chain)
        if self.owner is not None and self.owner.budget > 0:
            CACHE.loaded()
        return state

    def _keep(self, lo: int, hi: int, state: RangeState) -> None:
        """Keep the range's state as of this batch loaded for its next task here."""
        if self.owner is not None:
            CACHE.put((self.paths.root, self.stage, lo, hi), self.batch, state, self.owner)

    def _run(
        self, lo: int, hi: int, records: Iterator[tuple[Any, Any]]
    ) -> tuple[list[Any], int, int, str]:
        """The batch's outputs, the range's keys and bytes after it, and the file written ("")."""
        paths, stage = self.paths, self.stage
        groups = group_parts(records)
        versions = paths.versions(stage, lo, hi)
        chain = StatePaths.chain(versions, self.committed, lo, hi)
        # Files written by tasks of other ranges (the batch before ran with
        # another number of tasks): this batch writes a full copy of its own.
        own = all(v.lo == lo and v.hi == hi for v in chain)
        # Nothing to fold in, expire, emit or rewrite:
        if not groups and not self.ttl_ms and own and not self._timed_work():
            if not chain:
                return [], 0, 0, ""
            return [], chain[-1].keys, sum(paths.size(stage, v) for v in chain), ""
        state = self._state(lo, hi, chain)
        changed: list[Any] = []
        removed: list[Any] = []
        outputs = fold_into(
            self.fold, groups, state.values, state.touched, self.now_ms, self.ttl_ms,
            changed, removed,
        )
        if not changed and not removed and own and (state.chain or not state.values):
            # Nothing changed (a TTL with nothing to expire): no file for this batch.
            self._keep(lo, hi, state)
            return (outputs, len(state.values), sum(paths.size(stage, v) for v in state.chain),
                    "")
        background = compaction.shared(paths)
        after = paths.write(stage, lo, hi, self.batch, state, changed, removed, versions,
                            background=background)
        self._keep(lo, hi, after)
        if background and compaction.due(after.chain):
            compaction.start(paths, stage, lo, hi, self.committed)
        return outputs, len(after.values), sum(v.size for v in after.chain), after.chain[-1].name


class MicroBatch(BatchRun):
    """Runs one micro-batch of a streaming plan; see the module docstring."""

    _streaming = True

    def __init__(self, sc: Any, spec: MicroBatchSpec) -> None:
        job_context = spec.job_context

        def with_batch(node: Transform) -> JobContext:
            return dataclasses.replace(
                job_context(node), batch_id=spec.batch, checkpoint_id=spec.checkpoint_id
            )

        super().__init__(sc, BatchSpec(spec.plan, with_batch, spec.metrics, spec.cancelled,
                                       spec.on_commit))
        self.batch = spec.batch
        self.committed = spec.committed
        self.source_ranges = dict(spec.source_ranges)
        self.state = spec.state
        self.tasks = spec.tasks
        # The batch's planned time, so a replay expires exactly what the first run did.
        self.now_ms = spec.now_ms
        self.cache_owner = spec.cache_owner
        self.windows = dict(spec.windows)
        #: Per source stage, the partition each Spark partition read (for the watermark).
        self._partitions: dict[str, list[str]] = {}

    def _now_ms(self) -> int:
        """Ingestion time: the batch's planned time, the same on a replay."""
        return self.now_ms

    def _result(self) -> BatchResult:
        """The batch's counts, and per stage its state and the files that count."""
        reports: dict[StateRange, RangeReport] = self.reports.state_ranges.value
        state: dict[str, StateSize] = {}
        for key, report in reports.items():
            keys, size = state.get(key.stage, (0, 0))
            state[key.stage] = StateSize(keys + report.keys, size + report.bytes)
        seen: dict[str, dict[str, Any]] = {}
        for (stage, pidx), highest in self.reports.event_times.value.items():
            partition = self._partitions[stage][pidx]
            had = seen.setdefault(stage, {}).get(partition)
            seen[stage][partition] = highest if had is None or highest > had else had
        return BatchResult(
            items=self.stage_counts(), state=state,
            state_files={key: report.file for key, report in reports.items()},
            event_times=seen,
        )

    def _descriptors(self, spec: SourceSpec, name: str, ctx: JobContext) -> Iterable[Any]:
        """The partition descriptors of source stage ``name``'s planned range this batch."""
        source = spec.source
        start, end = self.source_ranges[name]
        descriptors = list(source.plan_range(start, end, ctx))
        if spec.timestamps is not None:
            self._partitions[name] = [str(source.watermark_partition(d)) for d in descriptors]
        return descriptors

    def _keyed(self, spec: KeyedSpec, name: str, flow: Flow) -> Flow:
        fold = stage_fold(spec, self.windows.get(name))
        mapped = self._map_side(fold, spec, name, flow)
        task = StateTask(
            fold, name, state_ttl_ms(spec), self.state, self.batch, self.committed,
            self.now_ms, self.reports, self.tasks, self.cache_owner,
        )
        groups = self.state.key_groups
        shuffled = partition_by(mapped, self.tasks, KeyGroupPartition(groups, self.tasks), name)
        return Flow(shuffled.mapPartitionsWithIndex(task, True))
