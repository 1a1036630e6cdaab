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

The state task itself is :mod:`sparkjet.core.tasks.state`'s (engine-neutral);
here it is wired to Spark. The state's files and versions are
:mod:`sparkjet.core.state_files`'; which
task owns a key is :mod:`sparkjet.core.keygroups`'; what a fold does to a key's
state is :mod:`sparkjet.core.keyed`'s. Each state task reports its range's
keys, bytes and file once, a :class:`~sparkjet.core.tasks.reports.RangeReport`
by :class:`~sparkjet.core.state_files.StateRange` (on Spark, through one
accumulator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from sparkjet.core.contracts import JobContext
from sparkjet.core.engine import BatchResult, BatchSpec, MicroBatchSpec, StateSize
from sparkjet.core.graph import KeyedSpec, SourceSpec, Transform, state_ttl_ms
from sparkjet.core.keygroups import KeyGroupPartition
from sparkjet.core.runtime.batch import BatchRun, Flow
from sparkjet.core.runtime.output import partition_by
from sparkjet.core.state_files import StateRange
from sparkjet.core.tasks.reports import RangeReport
from sparkjet.core.tasks.state import StateTask
from sparkjet.core.windowing import stage_fold

__all__ = ["MicroBatch", "StateTask"]


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
