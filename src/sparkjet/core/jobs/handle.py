"""The job handle users hold (Jet's ``Job``): status, control, metrics, planned batches.

A handle in the process that drives the job sees it live, through its
runner; a handle in another process reads the job's record in the store and
acts through the record's control folder, or takes the job over when its
driver died. Which of these a call takes is the handle's; its waits and its
requests to a driver elsewhere, polled, are :mod:`.polling`'s (whose
intervals and timeouts are re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sparkjet.core.errors import (
    ConfigError,
    JobCancelledError,
    JobFailedError,
    JobStateError,
    SnapshotError,
    TimeoutException,
)
from sparkjet.core.jobs.lifecycle import Action, JobStatusEvent, check_action
from sparkjet.core.jobs.metrics import recorded_metrics
from sparkjet.core.jobs.polling import ANSWER_AFTER_END_SECONDS as ANSWER_AFTER_END_SECONDS
from sparkjet.core.jobs.polling import REMOTE_POLL_SECONDS as REMOTE_POLL_SECONDS
from sparkjet.core.jobs.polling import REQUEST_TIMEOUT_SECONDS as REQUEST_TIMEOUT_SECONDS
from sparkjet.core.jobs.polling import Polling
from sparkjet.core.jobs.ports import DrivenJob, JobHost
from sparkjet.core.jobs.record import (
    Answer,
    JobRecord,
    checkpoint_path,
    driver_alive,
    read_record,
)
from sparkjet.core.model import JobConfig, JobStatus, PlannedBatch
from sparkjet.core.state.checkpoint import Checkpoint

if TYPE_CHECKING:
    from sparkjet.core.state.snapshots import Snapshot

#: How long an export asked of a driver in another process may take, by default.
EXPORT_TIMEOUT_SECONDS = 600.0

#: JobConfig fields a suspended job may change (as Jet's updateConfig allows).
UPDATABLE_FIELDS = frozenset({
    "auto_scaling_enabled",
    "split_brain_protection_enabled",
    "suspend_on_failure",
    "snapshot_interval_millis",
    "metrics_enabled",
    "store_metrics_after_job_completion",
})


class Job:
    """A handle on one job; see Jet's ``Job``.

    Handles from the process running the job see it live; handles from other
    processes read its record in the store.
    """

    def __init__(self, service: JobHost, record: JobRecord) -> None:
        self._service = service
        #: The record as last read; while the job runs here, the runner's live copy.
        self._record = record
        #: Its waits, polled, and its requests to a driver in another process.
        self._polling = Polling(service.records, record.id, self.label, refresh=self._refresh,
                                alive=self._driver_alive, status=lambda: self.status,
                                failure=self.get_failure)

    # --- identity ------------------------------------------------------------

    @property
    def id(self) -> str:
        """The job's id (``xxxx-xxxx-xxxx-xxxx``)."""
        return self._record.id

    @property
    def name(self) -> str | None:
        """The job's name, from its configuration (None if unnamed)."""
        return self._record.name

    @property
    def label(self) -> str:
        """How messages name the job: ``'name' (id)``, or the id of an unnamed job."""
        return f"'{self.name}' ({self.id})" if self.name else self.id

    @property
    def config(self) -> JobConfig:
        """The job's configuration."""
        runner = self._runner  # a driver here changes it live; elsewhere, as last read
        record = runner.lease.record if runner is not None else self._record
        return JobConfig.from_dict(dict(record.config))

    @property
    def submission_time(self) -> int:
        """When the job was submitted, in milliseconds since the epoch."""
        return self._record.submission_time

    def __repr__(self) -> str:
        return f"<Job {self.label} {self.status.value}>"

    @property
    def _runner(self) -> DrivenJob | None:
        """The runner driving the job here; None elsewhere, or once this process was fenced off."""
        runner = self._service.runners.get(self.id)
        return runner if runner is not None and runner.lease.fenced is None else None

    def _refresh(self) -> JobRecord:
        runner = self._runner
        if runner is not None:
            self._record = runner.lease.record
        else:
            fresh = read_record(self._service.records, self.id)
            if fresh is not None:
                self._record = fresh
        return self._record

    def _take_over(self, then: Callable[[DrivenJob], object] | None = None) -> DrivenJob:
        """Adopt the job here (its driver died); this handle then reads the runner's record."""
        # The epoch whose driver this handle saw dead: a newer driver means another
        # process took the job over meanwhile, and this one is refused.
        runner = self._service.runners.take_over(self.id, then, self._record.epoch)
        self._record = runner.lease.record
        return runner

    # --- status --------------------------------------------------------------

    @property
    def status(self) -> JobStatus:
        """The current status (a driver that stopped sending heartbeats counts as FAILED)."""
        record = self._refresh()
        status = record.status
        if self._runner is None and not status.is_terminal() and not self._driver_alive(record):
            # The driver died. A streaming job can be resumed from its checkpoint.
            return JobStatus.SUSPENDED if record.streaming else JobStatus.FAILED
        return status

    def is_terminal(self) -> bool:
        """True once the job has COMPLETED or FAILED."""
        return self.status.is_terminal()

    def is_streaming(self) -> bool:
        """True for a streaming job (one that reads an unbounded source)."""
        return self._refresh().streaming

    def is_driven_here(self) -> bool:
        """True when this process drives the job: it submitted it, or took it over on resume."""
        return self._runner is not None

    def is_driver_alive(self) -> bool:
        """Whether the process that drives the job still does (True in that process).

        Another process's driver counts as dead when the store saw no heartbeat
        from it for 20 seconds (by the store's clock, not the machines'), or at
        once when it ran on this host and its process is gone.
        """
        return self._runner is not None or self._driver_alive(self._refresh())

    def _driver_alive(self, record: JobRecord) -> bool:
        return driver_alive(self._service.records, record)

    def wait_for_status(self, *wanted: JobStatus, timeout: float | None = None) -> JobStatus:
        """Wait until the job's status is one of ``wanted`` or terminal; return that status.

        :raises TimeoutException: ``timeout`` seconds passed first (the message
            names the job and its status then).
        """
        shown = " or ".join(s.value for s in wanted) or "a terminal status"
        return self._polling.until(wanted, timeout, f"did not become {shown}")

    def is_user_cancelled(self) -> bool:
        """True if the job ended because a user cancelled it."""
        return self._refresh().user_cancelled

    def get_failure(self) -> str | None:
        """Why the job failed, or None."""
        failure = self._refresh().failure
        if failure is not None:
            return failure.message
        if self.status is JobStatus.FAILED:
            return "the driver process running the job died"
        return None

    def get_suspension_cause(self, *, how_to_resume: str = "resume() continues it here") -> str:
        """Why the job is suspended: requested by a user, a failure, or a dead driver.

        When the process that ran the job has exited, the cause ends with
        ``how_to_resume``: the default speaks to a Python caller; the
        ``sparkjet`` command passes its own words (``sparkjet resume NAME``).

        :raises JobStateError: the job is not suspended.
        """
        status = self.status
        if status is not JobStatus.SUSPENDED:
            raise JobStateError(f"job {self.label} is not suspended (it is {status.value})")
        record = self._refresh()
        cause = record.suspension_cause or "Requested by user"
        if self._runner is None and not self._driver_alive(record):
            if record.status is JobStatus.SUSPENDED:
                return f"{cause}; the process that ran it has exited, {how_to_resume}"
            return f"the driver process running the job died; {how_to_resume}"
        return cause

    def add_status_listener(self, listener: Callable[[JobStatusEvent], None]) -> None:
        """Call ``listener(event)`` on every later status change.

        In the process running the job the listener runs on the job's thread;
        elsewhere a daemon thread polls the job's record.
        """
        runner = self._runner
        if runner is not None:
            runner.add_listener(listener)
            return
        self._polling.listen(listener)

    # --- control -------------------------------------------------------------

    def join(self, timeout: float | None = None) -> None:
        """Wait for the job to end; raise if it failed.

        :raises TimeoutException: ``timeout`` seconds passed first.
        :raises JobCancelledError: the job was cancelled.
        :raises JobFailedError: the job failed (stage named, cause chained).
        :raises JobFencedError: this process drove the job until another one
            took it over; the job goes on there.
        """
        runner = self._service.runners.get(self.id)
        if runner is not None:
            if not runner.done.wait(timeout):
                raise TimeoutException(
                    f"job {self.label} did not finish within {timeout:g} s "
                    f"(status {self.status.value})"
                )
            if runner.error is not None:
                raise runner.error
            return
        if self._polling.until((), timeout, "did not finish") is JobStatus.FAILED:
            failure = self.get_failure() or "unknown failure"
            stage = self._record.failure.stage if self._record.failure is not None else None
            if self.is_user_cancelled():
                raise JobCancelledError(failure, stage)
            raise JobFailedError(failure, stage)

    def cancel(self) -> None:
        """Stop the job; it ends FAILED with ``is_user_cancelled()`` true.

        A streaming job's checkpoint is deleted, as Jet deletes a cancelled
        job's snapshots.

        :raises JobStateError: the job has already ended.
        """
        check_action(Action.CANCEL, self.status, streaming=self.is_streaming(), label=self.label)
        runner = self._runner
        if runner is not None:
            runner.cancel()
        elif not self._driver_alive(self._refresh()):
            self._take_over(lambda runner: runner.cancel())
        elif self._ask(Action.CANCEL) is None:
            self.cancel()  # its driver died before it answered: once more, from here

    def _act(self, action: Action, again: bool = True) -> None:
        check_action(action, self.status, streaming=self.is_streaming(), label=self.label)
        runner = self._runner
        if runner is not None:
            runner.act(action)
        elif action is Action.RESUME and not self._driver_alive(self._record):
            self._take_over(lambda runner: runner.resume())
        elif self._ask(action) is None and again:
            self._act(action, again=False)  # its driver died before it answered

    def _ask(self, action: Action, payload: dict[str, Any] | None = None,
             timeout: float | None = None, what: str | None = None,
             refused: Callable[[str], Exception] = JobStateError) -> Answer | None:
        """Ask the job's live driver in another process to act (see :meth:`.Polling.ask`)."""
        return self._polling.ask(action, self._record.epoch, payload, timeout, what, refused)

    def suspend(self) -> None:
        """Stop a streaming job after its current micro-batch commits; status SUSPENDED.

        Returns once the job's driver took the request (a driver in another
        process answers through the job record); the status changes when the
        batch has committed.

        :raises JobStateError: the job's status does not allow it, here or
            when the driver took the request.
        """
        self._act(Action.SUSPEND)

    def resume(self) -> None:
        """Continue a SUSPENDED job from its last committed micro-batch.

        If the process that ran the job died, the job continues in this process.
        Of two processes resuming the same job at once, one does and the other
        gets :class:`JobStateError`.

        :raises JobStateError: the job is not SUSPENDED (here, or when its
            driver in another process took the request).
        """
        self._act(Action.RESUME)

    def restart(self) -> None:
        """Stop a RUNNING streaming job and start it again.

        With a processing guarantee it continues from its last committed
        micro-batch; with NONE it starts from scratch.
        """
        self._act(Action.RESTART)

    def export_snapshot(
        self, name: str, cancel_job: bool = False, timeout: float | None = None
    ) -> Snapshot:
        """Export the job's state as snapshot ``name`` (Jet's ``exportSnapshot``); returns it.

        A consistent cut at the job's last committed micro-batch: every
        stateful stage's state by key group, and every source's offsets. A
        RUNNING job goes on running its micro-batches while the state of the
        cut is written (the cut's files are pinned meanwhile); a SUSPENDED
        one reads SUSPENDED_EXPORTING_SNAPSHOT meanwhile.
        A snapshot of the same name is replaced once the new one is complete.
        With ``cancel_job`` the job runs no batch after the cut and is
        cancelled after the export (its checkpoint is deleted; the snapshot
        stays). A job that has not committed a micro-batch yet exports its
        empty state at the offsets its first batch starts from (batch -1).

        :raises JobStateError: the job is neither RUNNING nor SUSPENDED, or is
            a batch job.
        :raises TimeoutException: a driver in another process did not answer
            within ``timeout`` seconds (default 600).
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"export_snapshot() needs a non-empty snapshot name, got {name!r}")
        check_action(Action.EXPORT_SNAPSHOT, self.status, streaming=self.is_streaming(),
                     label=self.label)
        runner = self._runner
        if runner is None and not self._driver_alive(self._refresh()):
            runner = self._take_over()  # its driver died: SUSPENDED, here
        if runner is not None:
            # The manifest the export wrote: no second listing of the backend.
            return self._service.snapshot_of(runner.export_snapshot(name, cancel_job))
        answer = self._ask(
            Action.EXPORT_SNAPSHOT, {"name": name, "cancel_job": cancel_job},
            EXPORT_TIMEOUT_SECONDS if timeout is None else timeout, f"the export of {name!r}",
            refused=lambda error: SnapshotError(
                f"job {self.label}: exporting snapshot {name!r} failed in the driving "
                f"process: {error}"))
        if answer is None:
            raise SnapshotError(
                f"job {self.label}: its driver died before it exported snapshot {name!r}; "
                f"export it again (the job is SUSPENDED now)")
        return self._service.get_snapshot(name)

    def cancel_and_export_snapshot(self, name: str, timeout: float | None = None) -> Snapshot:
        """Export snapshot ``name``, then cancel the job (Jet's ``cancelAndExportSnapshot``)."""
        return self.export_snapshot(name, cancel_job=True, timeout=timeout)

    def update_config(self, **changes: Any) -> JobConfig:
        """Change a SUSPENDED job's configuration; returns the new one.

        Only the fields Jet lets a suspended job change are accepted:
        ``auto_scaling_enabled``, ``split_brain_protection_enabled``,
        ``suspend_on_failure``, ``snapshot_interval_millis``,
        ``metrics_enabled`` and ``store_metrics_after_job_completion``.
        """
        check_action(
            Action.UPDATE_CONFIG, self.status, streaming=self.is_streaming(), label=self.label
        )
        refused = sorted(set(changes) - UPDATABLE_FIELDS)
        if refused:
            raise ConfigError(
                f"job {self.label}: {', '.join(refused)} cannot change after submit "
                f"(changeable: {', '.join(sorted(UPDATABLE_FIELDS))})"
            )
        config = self.config
        for key, value in changes.items():
            setattr(config, key, value)  # validates
        runner = self._runner
        if runner is not None:
            runner.update_record(lambda r: replace(r, config=config.to_dict()))
        elif not self._driver_alive(self._refresh()):
            self._take_over().update_record(lambda r: replace(r, config=config.to_dict()))
        else:
            # The live driver owns the record: ask it, or its next heartbeat undoes this.
            if self._ask(Action.UPDATE_CONFIG, {"config": config.to_dict()}) is None:
                return self.update_config(**changes)  # its driver died: once more, from here
        return config

    # --- metrics -------------------------------------------------------------

    def get_metrics(self) -> dict[str, Any]:
        """Per-stage ``receivedCount`` / ``emittedCount`` and execution times.

        Returns ``{"executionStartTime": ms, "executionCompletionTime": ms,
        "stages": {name: {"receivedCount": n, "emittedCount": n}}}``; times
        are -1 until known. Counts are updated as Spark tasks finish. Empty
        stages when ``metrics_enabled`` is off. Other processes see a streaming
        job's progress, its ``snapshotRestore`` (a job started from a
        snapshot), and all metrics of completed jobs with
        ``store_metrics_after_job_completion``.
        """
        runner = self._runner
        if runner is None:
            return recorded_metrics(self._refresh())
        return runner.metrics()

    def get_planned_batches(self) -> list[PlannedBatch]:
        """A streaming job's micro-batches as its checkpoint planned them, oldest first.

        Each names the offsets every source stage reads from and up to,
        written before the batch ran (what a replay after a crash reads
        again). The checkpoint keeps the plans of at least its last 10
        committed batches and of a batch planned but not committed yet. Read
        from the store, so a handle in any process sees them; empty for a job
        without a checkpoint (a batch job, a stream before its first plan). A
        job with NONE starts a new checkpoint, counting from 0, on a restart.
        """
        path = checkpoint_path(self._service.records, self._refresh())
        if path is None:
            return []
        checkpoint = Checkpoint(self._service.records.store, path)
        return [PlannedBatch(plan.batch, dict(plan.starts), dict(plan.ends), plan.time_ms)
                for plan in checkpoint.plans()]
