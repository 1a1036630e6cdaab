"""The engine boundary: what the job services ask of the engine that runs the work.

The services (:mod:`sparkjet.core.jobs`, :mod:`sparkjet.core.microbatch_loop`) talk
to Spark only through :class:`Engine`; the Spark implementation lives in
:mod:`sparkjet.core.runtime` and is chosen by the client, the composition
root. Nothing here imports Spark, so the job lifecycle, the control protocol,
take-over and the cluster policy run against an in-process engine in the
tests, in milliseconds and without a JVM.

The Spark engine conforms structurally (it does not import this module): the
runtime sits below the services and the boundary, and mypy checks that it fits
where the client hands it to the services.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sparkjet.core.contracts import JobContext
from sparkjet.core.graph import Transform
from sparkjet.core.planner import Plan

if TYPE_CHECKING:
    from sparkjet.core.checkpoint import StatePaths

#: Builds the context a plugin sees on the driver for one node of the plan.
ContextFactory = Callable[[Transform], JobContext]


class Execution(Protocol):
    """One unit of work on the engine: a whole batch job, or one micro-batch."""

    def run(self) -> None:
        """Run to the end on the calling thread; raise ``JobFailedError`` if the work failed.

        A batch job commits its sinks before returning; a micro-batch commits
        them with its batch id.
        """

    def stage_counts(self) -> dict[str, int]:
        """Items emitted per stage so far (empty when metrics are off); safe from any thread."""

    def state_files(self) -> dict[str, dict[str, str]]:
        """After :meth:`run`, a micro-batch's state files that count (empty for batch jobs).

        ``{stage: {"<lo>-<hi>": file name}}``, ``""`` for a task that wrote
        none; the batch's commit record keeps it (see
        :meth:`sparkjet.core.checkpoint.StatePaths.counts`).
        """


class Engine(Protocol):
    """The engine a job's work runs on; every method is called on the driver."""

    def parallelism(self) -> int:
        """How many tasks the engine runs at once: the default partition count."""

    def version(self) -> str:
        """The engine's version (for snapshot manifests), e.g. ``"4.3.0"`` for Spark."""

    def live_executors(self) -> frozenset[str] | None:
        """The ids of the executors alive now; None where there is nothing to watch (local)."""

    def bind(self, job_id: str, description: str) -> None:
        """Tag the work this thread starts from now on as the job's, for :meth:`cancel`."""

    def cancel(self, job_id: str) -> bool:
        """Cancel the job's work: running and, if the engine can, future work.

        Returns False when only running work could be cancelled; the caller
        then cancels again until its runner has seen the request.
        """

    def batch(
        self,
        plan: Plan,
        job_context: ContextFactory,
        *,
        metrics: bool,
        cancelled: Callable[[], bool],
        on_commit: Callable[[], None] | None,
    ) -> Execution:
        """A batch job's whole plan; ``on_commit`` is called just before its sinks commit."""

    def micro_batch(
        self,
        plan: Plan,
        job_context: ContextFactory,
        *,
        metrics: bool,
        cancelled: Callable[[], bool],
        batch: int,
        committed: int,
        source_ranges: Mapping[str, tuple[Any, Any]],
        state: StatePaths,
        tasks: int,
        now_ms: int,
        on_commit: Callable[[], None] | None = None,
    ) -> Execution:
        """One micro-batch of a streaming plan.

        :param batch: the micro-batch's id.
        :param committed: the last committed batch: keyed state is read as of it.
        :param source_ranges: per source stage, the ``(start, end)`` offsets planned.
        :param state: where the keyed state lives in the checkpoint.
        :param tasks: how many state tasks share the key groups (the plan says).
        :param now_ms: the batch's planned time (TTL expiry), the same on a replay.
        :param on_commit: called just before the sinks commit (the runner's fence check).
        """
