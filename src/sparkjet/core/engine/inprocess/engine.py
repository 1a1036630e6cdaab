"""The in-process engine: an :class:`~sparkjet.core.engine.boundary.Engine` run in the driver.

A run is the very :class:`~sparkjet.core.engine.tasks.runs.PlanRun` (or
:class:`~sparkjet.core.engine.tasks.runs.MicroBatchRun`) that Spark's engine runs,
over :class:`~.datasets.LocalDatasets`: same plan, same partitioning, same
state files and changelogs (the state tasks keep their ranges loaded in the
driver's :data:`~sparkjet.core.state.cache.CACHE` and catch up with what
executors wrote, as executors catch up with what the driver wrote), same
sink commits with the batch's token, same counts.

Where the work runs is the difference: on the job's thread, one partition
after another. That is what makes a small micro-batch take milliseconds
instead of a Spark job's couple of hundred; a large one belongs on Spark.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from sparkjet.core.engine.boundary import BatchWork, JobRun, RunHooks
from sparkjet.core.engine.inprocess.datasets import LocalDatasets
from sparkjet.core.engine.tasks.runs import MicroBatchRun, PlanRun
from sparkjet.core.pipeline.planner import Plan

__all__ = ["InProcessEngine"]


class InProcessEngine:
    """Runs batch plans and micro-batches in this process; see the module docstring.

    ``parallelism``: the partitions a run spreads over, as Spark's default
    parallelism, or a function asked for it (Spark's, when both engines serve
    one job: the parallelism a job sees does not depend on the engine). ``pickle_items`` False
    skips pickling items where Spark would (benchmarks only).
    """

    def __init__(
        self, parallelism: int | Callable[[], int], *, pickle_items: bool = True
    ) -> None:
        self._parallelism = parallelism
        self._pickle_items = pickle_items
        self._lock = threading.Lock()
        #: Plans whose tasks were pickled once (as Spark would), by id.
        self._checked: dict[int, weakref.ref[Plan]] = {}

    def parallelism(self) -> int:
        parallelism = self._parallelism
        return max(1, parallelism if isinstance(parallelism, int) else parallelism())

    def version(self) -> str:
        return "in-process"

    def live_executors(self) -> frozenset[str] | None:
        return None

    def bind(self, job_id: str, description: str) -> None:
        return None  # the work runs on the job's own thread

    def cancel(self, job_id: str) -> bool:
        # A run asks its job's ``cancelled`` between nodes and partitions:
        # running and future work alike stop there.
        return True

    def batch(self, job: JobRun, hooks: RunHooks) -> PlanRun:
        """A batch job's whole plan, run on the calling thread."""
        return PlanRun(self._datasets(job.plan, hooks.cancelled), job, hooks)

    def micro_batch(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> MicroBatchRun:
        """One micro-batch, run on the calling thread."""
        return MicroBatchRun(self._datasets(job.plan, hooks.cancelled), job, work, hooks)

    def _datasets(self, plan: Plan, cancelled: Any) -> LocalDatasets:
        return LocalDatasets(self._parallelism, cancelled, check_tasks=self._first_run(plan),
                             pickle_items=self._pickle_items)

    def _first_run(self, plan: Plan) -> bool:
        """Whether ``plan`` runs here for the first time (its tasks are pickled once)."""
        key = id(plan)
        with self._lock:
            known = self._checked.get(key)
            if known is not None and known() is plan:
                return False
            self._checked = {k: ref for k, ref in self._checked.items() if ref() is not None}
            self._checked[key] = weakref.ref(plan)
            return True
