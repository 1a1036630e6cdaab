"""The engine boundary: what the job services ask of the engine that runs the work.

The services (:mod:`sparkjet.core.jobs`, :mod:`sparkjet.core.microbatch.loop`) talk
to the engine only through :class:`Engine`, and see one engine. They hand it
the job (:class:`JobRun`, made once per run), for a micro-batch that batch's
work (:class:`BatchWork`), and the runner's callbacks (:class:`RunHooks`);
they get an :class:`Execution` whose run returns a :class:`BatchResult`, and
which says whether it ran in the driver's process (:attr:`Execution.on_driver`).
The engines are the client's choice, the composition root: Spark
(:mod:`sparkjet.core.engine.spark`), the in-process engine
(:mod:`sparkjet.core.engine.inprocess`), or the adaptive engine that picks
one of those two per batch (:mod:`sparkjet.core.engine.adaptive`). Nothing
here imports Spark, so the job lifecycle, the control protocol, take-over and
the cluster policy run on the in-process engine in the tests, in
milliseconds and without a JVM.

The Spark engine conforms structurally (the runtime imports only this
module's job, work, hooks and result types); mypy checks that it fits where
the client hands it to the services.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from sparkjet.core.config import DEFAULT_JOIN_TABLE_MAX_BYTES
from sparkjet.core.host.contracts import JobContext
from sparkjet.core.model import StageCount
from sparkjet.core.pipeline.event_time import WindowClock
from sparkjet.core.pipeline.graph import Transform
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.state.cache import CacheOwner
from sparkjet.core.state.files import StatePaths
from sparkjet.core.state.versions import StateRange

#: Builds the context a plugin sees on the driver for one node of the plan.
ContextFactory = Callable[[Transform], JobContext]


@dataclass(frozen=True)
class JobRun:
    """What stays the same across a job's executions: the plan and how its stages run.

    Made once per run of a job: once per batch job, once per run of a
    stream's micro-batch loop (every micro-batch of that run shares it).
    """

    plan: Plan
    #: Builds each stage's driver-side :class:`~sparkjet.core.host.contracts.JobContext`.
    job_context: ContextFactory
    #: Count the items each stage emits (:meth:`Execution.stage_counts`,
    #: :attr:`BatchResult.items`).
    metrics: bool
    #: The job whose keyed state the workers keep loaded between micro-batches
    #: (None: not kept; always None for a batch job, which keeps no state).
    cache_owner: CacheOwner | None = None
    #: The checkpoint a stream's batch ids count in (``JobContext.checkpoint_id``);
    #: None for a batch job, which has none.
    checkpoint_id: str | None = None
    #: The job's ``JobConfig.adaptive_micro_batches``: whether its small work may
    #: run on the driver (None: as the ``[engine] adaptive`` setting says).
    adaptive: bool | None = None
    #: The job as logs name it.
    label: str = ""
    #: Only build the hash joins' tables (a streaming job's build sides, read
    #: once per run of its loop): the run reads the build sides, stores each
    #: join's tables and returns their digests (:attr:`BatchResult.tables`).
    tables_only: bool = False
    #: The most bytes a hash join's table may take pickled (``[engine]
    #: join_table_max_bytes``); more fails the job at start, naming the stage.
    join_table_max_bytes: int = DEFAULT_JOIN_TABLE_MAX_BYTES


@dataclass(frozen=True)
class BatchWork:
    """What one micro-batch does: its id, its planned ranges and where its state lives.

    Everything here comes from the batch's write-ahead plan (or the loop's
    record of the checkpoint), so a replay of the batch runs the same work.
    """

    #: The micro-batch's id.
    batch: int
    #: The last committed batch: keyed state is read as of it.
    committed: int
    #: Per source stage, the ``(start, end)`` offsets planned.
    source_ranges: Mapping[str, tuple[Any, Any]]
    #: Where the keyed state lives in the checkpoint (which files count, the pin).
    state: StatePaths
    #: How many state tasks share the key groups (the batch's plan says).
    tasks: int
    #: The batch's planned time (TTL expiry, ingestion time), the same on a replay.
    now_ms: int
    #: Per windowed stage, its event time in this batch (the plan's watermarks).
    windows: Mapping[str, WindowClock] = field(default_factory=dict)
    #: Per stateful stage, its state folder's entries as the driver listed them
    #: for this batch, so its state tasks do not each list it again (a stage
    #: missing here: each task lists it). See :meth:`StatePaths.versions`.
    listed: Mapping[str, list[str]] = field(default_factory=dict)
    #: Per hash join stage, the digests of the tables its batch joins against
    #: (recorded in the batch's plan, so a replay joins against the same tables).
    tables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The bytes of keyed state the job holds, as its last batch reported
    #: (None: not known yet in this run of the loop: a stateful job's first
    #: batch after a start from an existing checkpoint, a restart or a take-over).
    state_bytes: int | None = 0


@dataclass(frozen=True)
class RunHooks:
    """What an execution calls back into the job's runner while it runs."""

    #: Asked between stages (and partitions, in process) and before the commit:
    #: True abandons the work.
    cancelled: Callable[[], bool]
    #: Called just before the sinks commit: a batch job's move to COMPLETING,
    #: a micro-batch's fence check (None: nothing to call).
    before_commit: Callable[[], None] | None = None


class StateSize(NamedTuple):
    """A stateful stage's state after a micro-batch: its keys and the bytes of its files."""

    keys: int
    bytes: int


@dataclass(frozen=True)
class BatchResult:
    """What one execution did, once it has run."""

    #: The per-stage counts: emitted items, dead letters, late items (empty when
    #: metrics are off).
    items: Mapping[StageCount, int] = field(default_factory=dict)
    #: Per stateful stage of a micro-batch, its state after the batch.
    state: Mapping[str, StateSize] = field(default_factory=dict)
    #: Per stage and range of key groups a state task owned, the file it wrote
    #: (``""``: none); the batch's commit record keeps it (see
    #: :meth:`sparkjet.core.state.files.StatePaths.counts`). Empty for batch jobs.
    state_files: Mapping[StateRange, str] = field(default_factory=dict)
    #: Per timestamped source stage, per source partition (its watermark key),
    #: the highest timestamp the batch read there. Empty for batch jobs.
    event_times: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Per hash join stage, the digests of the tables the run built (a
    #: :attr:`JobRun.tables_only` run's result; empty otherwise).
    tables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class Execution(Protocol):
    """One unit of work on the engine: a whole batch job, or one micro-batch."""

    #: Whether its tasks run in the driver's own process (a micro-batch run
    #: there counts in ``localBatches``, the others in ``sparkBatches``).
    on_driver: bool

    def run(self) -> BatchResult:
        """Run to the end on the calling thread; raise ``JobFailedError`` if the work failed.

        A batch job commits its sinks before returning; a micro-batch commits
        them with its batch id.
        """

    def stage_counts(self) -> dict[StageCount, int]:
        """The per-stage counts so far (empty when metrics are off); safe from any thread."""


class MicroBatch(Execution, Protocol):
    """One micro-batch on the engine: :meth:`run` does its work, its commit is the loop's.

    :meth:`run` reads, folds and writes (state files, what each sink will
    commit) and returns; the sinks commit only when the checkpoint's commit
    sequence (:class:`sparkjet.core.microbatch.commit.BatchCommit`) calls
    :meth:`commit`, after its fence check, or are aborted by :meth:`abort`.
    """

    def commit(self) -> None:
        """Commit the dead letters, then each sink's writes, with the batch id.

        Raises ``JobFailedError`` naming the stage whose sink failed (the
        writes not committed yet are aborted).
        """

    def abort(self) -> None:
        """Abort every sink's writes not committed yet (the batch will not commit)."""


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

    def batch(self, job: JobRun, hooks: RunHooks) -> Execution:
        """A batch job's whole plan, ready to :meth:`~Execution.run`."""

    def micro_batch(self, job: JobRun, work: BatchWork, hooks: RunHooks) -> MicroBatch:
        """One micro-batch of a streaming plan, ready to :meth:`~Execution.run`.

        ``job.checkpoint_id`` must be set: the sinks commit with the batch id
        in that checkpoint.
        """
