"""How a job driven here ends, and what its run counted: the outcome its record keeps.

:class:`Tally` keeps what the run of a job driven here counted: when its
execution started and ended, a batch job's engine execution, the stages'
counts as the job ended; from them, and from a streaming job's progress,
the job's metrics (:mod:`.metrics`).

:class:`Outcome` ends the job and says why: completed; failed, with the
stage named and the cause chained (a streaming job with
``suspend_on_failure`` is suspended instead); cancelled, also while
suspended; fenced off, when another driver took the job over (then nothing
more is written: the job is theirs); or failed again while its failure was
handled. Each end is staged into the record with the execution's times, the
failure and, with ``store_metrics_after_job_completion``, the metrics; the
status is told through :mod:`.statuses` (which stores it now, or has the
watcher store it later); the job's name is freed, and a failed streaming
job's checkpoint deleted (:mod:`.checkpointing`).

Threads: the job thread ends a job; a cancel of a suspended job ends it on
the cancelling thread, and the watcher stops a fenced one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sparkjet.core.engine.boundary import Engine, Execution
from sparkjet.core.errors import JobCancelledError, JobFailedError, JobFencedError
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.jobs.checkpointing import CheckpointFolder
from sparkjet.core.jobs.metrics import job_metrics, stage_metrics
from sparkjet.core.jobs.record import Failure, Lease, now_ms
from sparkjet.core.jobs.statuses import Statuses
from sparkjet.core.jobs.stream_run import StreamRun
from sparkjet.core.model import JobStatus, StageCount
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.job_records import JobRecords

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

log = logging.getLogger("sparkjet.jobs")


class Tally:
    """What the run of one job driven here counted: its times and counts, shown as metrics."""

    def __init__(self, job: Job, plan: Plan, lease: Lease, stream: StreamRun) -> None:
        self.job, self.plan, self.lease, self.stream = job, plan, lease, stream
        #: A batch job's execution on its engine (None: not started, or a streaming job).
        self.execution: Execution | None = None
        #: The stages' counts as the job ended (None: it has not ended here).
        self.final_counts: dict[StageCount, int] | None = None
        #: When the execution started and ended, in ms since the epoch (-1: not yet).
        self.execution_start = -1
        self.execution_completion = -1

    def start(self) -> None:
        """The execution starts now, unless it started before (a resumed job): in the record."""
        if self.execution_start < 0:
            self.execution_start = now_ms()
            start = self.execution_start
            self.lease.write(lambda r: replace(r, execution_start_time=start))

    def metrics(self) -> dict[str, Any]:
        """The job's metrics as ``Job.get_metrics()`` returns them (see there)."""
        streaming = self.plan.streaming
        return job_metrics(
            self.execution_start, self.execution_completion, self._stage_metrics(),
            self.stream.progress if streaming else None,
            self.lease.record.restore if streaming else None,
            store_requests.by_kind(self.job.id),
        )

    def _stage_metrics(self) -> dict[str, dict[str, int]]:
        """Each stage's counts (empty when the job's metrics are off)."""
        if self.plan.streaming:
            counts = self.stream.progress.stage_totals
            progress = self.stream.progress
        else:
            counts = self.final_counts or (
                self.execution.stage_counts() if self.execution is not None else {}
            )
            progress = None
        if not self.job.config.metrics_enabled:
            return {}
        return stage_metrics(self.plan, counts, progress)


class Outcome:
    """How one job driven here ends: the error it ends with, and its end in the record.

    ``park`` is the runner's: the job thread stops there, SUSPENDED (a
    streaming job suspended on its failure).
    """

    def __init__(
        self, job: Job, plan: Plan, lease: Lease, statuses: Statuses, tally: Tally,
        folder: CheckpointFolder, cancel_requested: threading.Event, done: threading.Event, *,
        plugins: PluginHost, records: JobRecords, engine: Engine,
        redact: Callable[[str], str], park: Callable[[], None],
    ) -> None:
        self.job, self.plan, self.lease, self.statuses = job, plan, lease, statuses
        self.tally, self.folder = tally, folder
        self.cancel_requested, self.done = cancel_requested, done
        self.plugins, self.records, self.engine = plugins, records, engine
        self.redact, self._park = redact, park
        #: Why the job ended, if it did not complete (raised by ``join()``).
        self.error: BaseException | None = None

    def set_status(
        self, new: JobStatus, description: str | None = None, user_requested: bool = False,
        *, outcome: bool = False,
    ) -> None:
        """Change the status, store it and tell the listeners (see :meth:`.Statuses.set`)."""
        self.statuses.set(new, description, user_requested, outcome=outcome)

    def completed(self) -> None:
        """The work is done: the job ends COMPLETED."""
        self.tally.execution_completion = now_ms()
        self._finish(JobStatus.COMPLETED, None)
        self.done.set()

    def failed(self, exc: BaseException) -> None:
        """The work raised ``exc``: the job ends FAILED (or cancelled, fenced, suspended)."""
        try:
            self._failed(exc)
        except BaseException as handling:
            self._failed_to_fail(exc, handling)

    def stop_fenced(self, exc: JobFencedError) -> None:
        """Another driver took the job over: stop here, writing nothing more (it is theirs)."""
        if self.error is None:
            log.error("%s", exc)
        self.error = exc
        self.cancel_requested.set()  # the loop stops at its next check
        self.engine.cancel(self.job.id)  # and running Spark work stops now
        self.done.set()

    def cancelled_while_suspended(self) -> None:
        """A cancel ended the job while no job thread ran it (suspended, or not started)."""
        error = JobCancelledError(f"job {self.job.label} was cancelled")
        self.error = error
        self.lease.check_fence()  # the job belongs to the newer driver now
        self._finish(JobStatus.FAILED, error)
        self.folder.discard_of_failed()
        self.done.set()

    def _failed_to_fail(self, exc: BaseException, handling: BaseException) -> None:
        """Handling the job's failure failed too (a bug, a broken metric): end it FAILED here.

        ``join()`` raises the job's error with the second failure named. The
        status goes through :meth:`set_status` as for any failure, so listeners
        and plugins hear of it, and the store gets the record now or from the
        watcher later; only if even that raises is the record staged directly.
        """
        log.error("job %s: failed (%s: %s), and handling that failed too: %s: %s",
                  self.job.label, type(exc).__name__, exc, type(handling).__name__, handling)
        if isinstance(handling, JobFencedError) or self.lease.fenced is not None:
            self.stop_fenced(self.lease.fenced or handling)  # type: ignore[arg-type]
            return
        error = JobFailedError(
            f"job {self.job.label} failed: {type(exc).__name__}: {exc}; handling that failed "
            f"too: {type(handling).__name__}: {handling}",
            getattr(exc, "stage", None),
        )
        error.__cause__ = exc
        self.error = error
        failure = Failure(self.redact(str(error)), error.stage, False)
        self.lease.stage(lambda r: replace(r, failure=failure, completion_time=now_ms()))
        try:
            if self.lease.status is not JobStatus.FAILED:
                self.set_status(JobStatus.FAILED, failure.message, outcome=True)
        except BaseException:
            log.exception("job %s: storing its FAILED status failed", self.job.label)
            self.lease.stage(lambda r: replace(r, status=JobStatus.FAILED))
            with contextlib.suppress(Exception):
                self.lease.write()  # else the watcher writes it once the store takes it
        self.done.set()

    def _failed(self, exc: BaseException) -> None:
        job = self.job
        if self.lease.fenced is not None or isinstance(exc, JobFencedError):
            self.stop_fenced(self.lease.fenced or exc)  # type: ignore[arg-type]
            return
        self.tally.execution_completion = now_ms()
        if self.cancel_requested.is_set():
            error: BaseException = JobCancelledError(f"job {job.label} was cancelled")
            error.__cause__ = exc if not isinstance(exc, JobCancelledError) else None
        elif isinstance(exc, JobFailedError):
            error = exc
        else:
            error = JobFailedError(f"job {job.label} failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
        self.plugins.job_error(job=job, error=error)
        cancelled = isinstance(error, JobCancelledError)
        if self.plan.streaming and job.config.suspend_on_failure and not cancelled:
            cause = self.redact(str(error))
            self.lease.stage(lambda r: replace(r, suspension_cause=cause))
            self.set_status(JobStatus.SUSPENDED, cause, outcome=True)
            self._park()
            return
        self.error = error
        self._finish(JobStatus.FAILED, error)
        self.folder.discard_of_failed()
        self.done.set()

    def _finish(self, status: JobStatus, error: BaseException | None) -> None:
        tally = self.tally
        tally.final_counts = (
            tally.execution.stage_counts() if tally.execution is not None else {})
        cancelled = isinstance(error, JobCancelledError)
        failure = None if error is None else Failure(
            self.redact(str(error)), getattr(error, "stage", None), cancelled
        )
        metrics = tally.metrics() if self.job.config.store_metrics_after_job_completion else None
        self.lease.stage(lambda r: replace(
            r,
            completion_time=tally.execution_completion,
            execution_start_time=tally.execution_start,
            failure=failure if failure is not None else r.failure,
            user_cancelled=cancelled if error is not None else r.user_cancelled,
            metrics=metrics if metrics is not None else r.metrics,
        ))
        description = str(error) if error is not None else None
        self.set_status(status, description, user_requested=cancelled, outcome=True)
        if self.job.name and self.lease.unwritten is None:
            # (While the record says the job is active, its name stays taken; a
            # name whose job ended is freed by the next submit that wants it.)
            try:
                self.records.release_name(self.job.name, self.job.id)
            except Exception:
                log.exception("job %s: freeing its name failed", self.job.label)
