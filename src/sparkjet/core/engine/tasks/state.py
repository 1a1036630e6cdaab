"""The state task: a keyed stage's reduce side in a stream, over one range of key groups.

Task ``p`` of ``tasks`` owns key groups ``task_range(p, tasks, key_groups)``
(:mod:`sparkjet.core.state.keygroups`); the engine hands it the map side's
``(key, part)`` records of those groups. It loads the range's state as of the
last committed batch (kept loaded in this process, :mod:`sparkjet.core.state.cache`,
and caught up, or read from the checkpoint), folds the batch in
(:func:`sparkjet.core.pipeline.keyed.fold_into`), writes what changed
(:mod:`sparkjet.core.state.files`), emits the updated results and reports
the range's keys, bytes and file (a :class:`RangeReport`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sparkjet.core.engine.tasks.base import Task
from sparkjet.core.engine.tasks.reports import RangeReport, Reports
from sparkjet.core.pipeline.keyed import KeyedFold, fold_into, group_parts
from sparkjet.core.state import compaction
from sparkjet.core.state.cache import CACHE, CacheOwner
from sparkjet.core.state.files import RangeState, StatePaths
from sparkjet.core.state.keygroups import task_range
from sparkjet.core.state.versions import StateRange, StateVersion

__all__ = ["RangeReport", "StateTask"]


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
        listed: list[str] | None = None,
    ) -> None:
        self.fold, self.stage, self.ttl_ms, self.paths = fold, stage, ttl_ms, paths
        self.batch, self.committed, self.now_ms = batch, committed, now_ms
        #: Where the task reports its outputs' count and its range (None: nowhere).
        self.reports = reports
        self.tasks = tasks
        #: The job the state is kept loaded for between batches (None: not kept).
        self.owner = owner
        #: The stage folder's entries as the driver listed them for the batch (None: list).
        self.listed = listed

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
        self.count_items(len(outputs))
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

        Kept loaded here (:mod:`sparkjet.core.state.cache`) and caught up, or read.
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
        versions = paths.versions(stage, lo, hi, entries=self.listed)
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
            changed, removed, timers=state.timers,
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
