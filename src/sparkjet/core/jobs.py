"""Jobs: the jet service, job handles, the runner thread and job records.

A job runs in the process that submitted it, on a thread of its own, against
the process-wide Spark session. Its record in the store (``jobs/<id>``) makes
it visible to other processes; they act on it through the record's control
folder (``sparkjet cancel``), which the running process watches. A record
whose heartbeat has stopped belongs to a driver that died.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle

from sparkjet.core.contracts import JobContext
from sparkjet.core.errors import (
    ConfigError,
    JobAlreadyExistsError,
    JobCancelledError,
    JobFailedError,
    JobStateError,
    PipelineDefinitionError,
    TimeoutException,
)
from sparkjet.core.graph import Transform
from sparkjet.core.model import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.core.planner import Plan, plan
from sparkjet.core.store import JobRecords
from sparkjet.core.streaming import Checkpoint, StreamLoop, StreamProgress

if TYPE_CHECKING:
    from sparkjet.core.client import Client

log = logging.getLogger("sparkjet.jobs")

HEARTBEAT_SECONDS = 2.0
#: A non-terminal job whose heartbeat is older than this has lost its driver.
STALE_AFTER_SECONDS = 20.0
CONTROL_POLL_SECONDS = 0.25
REMOTE_POLL_SECONDS = 0.2


def _now_ms() -> int:
    return int(time.time() * 1000)


def _this_driver() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _driver_alive(record: dict[str, Any]) -> bool:
    """Whether the process that runs the job still does (heartbeat, and pid on this host)."""
    driver = record.get("driver") or {}
    if driver.get("host") == socket.gethostname() and isinstance(driver.get("pid"), int):
        try:
            os.kill(driver["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return not _is_stale(record)


#: JobConfig fields a suspended job may change (as Jet's updateConfig allows).
UPDATABLE_FIELDS = frozenset({
    "auto_scaling_enabled",
    "split_brain_protection_enabled",
    "suspend_on_failure",
    "snapshot_interval_millis",
    "metrics_enabled",
    "store_metrics_after_job_completion",
})


def new_job_id() -> str:
    """A random 64-bit id, shown as Jet shows ids: ``xxxx-xxxx-xxxx-xxxx``."""
    raw = secrets.token_hex(8)
    return "-".join(raw[i : i + 4] for i in range(0, 16, 4))


@dataclass(frozen=True)
class JobStatusEvent:
    """What a status listener receives (Jet's ``JobStatusEvent``)."""

    previous_status: JobStatus
    new_status: JobStatus
    #: Why, when known: the failure message, or "cancelled by user".
    description: str | None
    #: True when a user asked for the change (cancel).
    user_requested: bool


class _Runner:
    """Runs one job in this process; owns its record while the job lives here.

    The job thread runs the work; a watcher thread takes control requests
    from other processes and writes heartbeats until the job is terminal. A
    streaming job's thread ends when it is suspended and a new one starts on
    resume, in this process or, after a driver died, in the process that
    resumes it.
    """

    def __init__(self, service: JetService, job: Job, plan_: Plan) -> None:
        self.service = service
        self.job = job
        self.plan = plan_
        self.cancel_requested = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.batch: Any = None
        self.final_counts: dict[str, int] | None = None
        self.execution_start = -1
        self.execution_completion = -1
        self.listeners: list[Callable[[JobStatusEvent], None]] = []
        self.stop_request: str | None = None  # "suspend" | "restart", read between batches
        self._future_jobs_cancelled = False
        self._stop_cause: str | None = None
        self._started_executors: int | None = None
        self._known_executors: set[str] = set()
        self._last_cluster_check = 0.0
        self.progress = StreamProgress()
        self._record_lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.watcher = threading.Thread(
            target=self._watch, name=f"sparkjet-watch-{job.id}", daemon=True
        )

    # --- record ------------------------------------------------------------

    def write_record(self, **changes: Any) -> None:
        with self._record_lock:
            self.job._record.update(changes)
            self.job._record["heartbeat"] = time.time()
            self.job._record["driver"] = _this_driver()
            self.service.records.write(self.job._record)

    def set_status(
        self, new: JobStatus, description: str | None = None, user_requested: bool = False
    ) -> None:
        old = JobStatus(self.job._record["status"])
        self.write_record(status=new.value)
        event = JobStatusEvent(old, new, description, user_requested)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("a status listener of job %s failed", self.job.label)
        self.service.client.plugins.notify(
            "on_job_status_changed", job=self.job, old_status=old, new_status=new
        )

    # --- threads -------------------------------------------------------------

    def start(self, resuming: bool = False) -> None:
        self.stop_request = None
        self.thread = threading.Thread(
            target=self._run, args=(resuming,), name=f"sparkjet-job-{self.job.id}",
            daemon=False,
        )
        self.thread.start()
        if not self.watcher.is_alive():
            self.watcher.start()

    def _watch(self) -> None:
        last_beat = time.monotonic()
        while not self.done.wait(CONTROL_POLL_SECONDS):
            try:
                if self.cancel_requested.is_set() and not self._future_jobs_cancelled:
                    # cancelJobGroup stops running Spark jobs only: repeat it until
                    # the runner sees the flag, so a job started meanwhile stops too.
                    self.cancel()
                for action, payload in self.service.records.take_requests_with_payload(
                    self.job.id
                ):
                    if action == "update_config" and payload:
                        self.write_record(config=JobConfig.from_dict(payload).to_dict())
                    else:
                        self._act(action)
                if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                    self.write_record()
                    last_beat = time.monotonic()
            except Exception:
                log.exception("job %s: watcher failed", self.job.label)

    def _act(self, action: str) -> None:
        try:
            if action == "cancel":
                self.cancel()
            elif action == "suspend":
                self.suspend()
            elif action == "resume":
                self.resume()
            elif action == "restart":
                self.restart()
            else:
                log.warning("job %s: ignoring unknown request %r", self.job.label, action)
        except JobStateError as exc:
            log.warning("job %s: %s", self.job.label, exc)

    @property
    def running_here(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def cancel(self) -> None:
        self.cancel_requested.set()
        from sparkjet.core.runtime.session import cancel_job_group

        self._future_jobs_cancelled = cancel_job_group(self.job.id)
        if not self.running_here and not self.done.is_set():
            # Suspended: nothing runs, end the job now.
            self._end_suspended_by_cancel()

    def suspend(self) -> None:
        if not self.plan.streaming:
            raise JobStateError(
                f"cannot suspend job {self.job.label}: batch jobs cannot be suspended"
            )
        status = JobStatus(self.job._record["status"])
        if status not in (JobStatus.RUNNING, JobStatus.STARTING):
            raise JobStateError(f"cannot suspend job {self.job.label}: it is {status.value}")
        self.stop_request = "suspend"

    def restart(self) -> None:
        status = JobStatus(self.job._record["status"])
        if not self.plan.streaming or status is not JobStatus.RUNNING:
            raise JobStateError(
                f"cannot restart job {self.job.label}: only a RUNNING streaming job restarts "
                f"(it is {status.value})"
            )
        self.stop_request = "restart"

    def resume(self) -> None:
        status = JobStatus(self.job._record["status"])
        if status is not JobStatus.SUSPENDED:
            raise JobStateError(
                f"cannot resume job {self.job.label}: it is {status.value}, not SUSPENDED"
            )
        old = self.thread
        if old is not None and old.is_alive() and old is not threading.current_thread():
            old.join(timeout=30)  # it wrote SUSPENDED and is running listeners and hooks
        if self.running_here:
            raise JobStateError(f"cannot resume job {self.job.label}: it is still stopping")
        self.set_status(JobStatus.STARTING)
        self.start(resuming=True)

    def _end_suspended_by_cancel(self) -> None:
        error = JobCancelledError(f"job {self.job.label} was cancelled")
        self.error = error
        self._discard_checkpoint()
        self._finish(JobStatus.FAILED, error)
        self.done.set()

    # --- running -------------------------------------------------------------

    def _run(self, resuming: bool) -> None:
        job = self.job
        try:
            if not resuming:
                self.set_status(JobStatus.STARTING)
            if self.cancel_requested.is_set():
                raise JobCancelledError(f"job {job.label} was cancelled")
            from sparkjet.core.runtime.session import set_job_group

            sc = self.service.client.spark.sparkContext
            set_job_group(sc, job.id, f"sparkjet job {job.label}")
            if self.cancel_requested.is_set():  # arrived while Spark was starting
                raise JobCancelledError(f"job {job.label} was cancelled")
            if self.execution_start < 0:
                self.execution_start = _now_ms()
                self.write_record(execution_start_time=self.execution_start)
            self.set_status(JobStatus.RUNNING)
            if self.plan.streaming:
                if self._run_stream(sc) == "suspend":
                    cause = self._stop_cause or "Requested by user"
                    by_user = self._stop_cause is None
                    self._stop_cause = None
                    self._started_executors = None  # resuming re-counts what it has
                    self.write_record(suspension_cause=cause)
                    self.set_status(JobStatus.SUSPENDED, cause, user_requested=by_user)
                    return
            else:
                self._run_batch(sc)
            self.execution_completion = _now_ms()
            self._finish(JobStatus.COMPLETED, None)
            self.done.set()
        except BaseException as exc:
            self._failed(exc)

    def _run_batch(self, sc: Any) -> None:
        from sparkjet.core.runtime.batch import BatchRun

        self.batch = BatchRun(
            self.plan,
            sc,
            self.service.job_context_factory(self.job),
            metrics=self.job.config.metrics_enabled,
            cancelled=self.cancel_requested.is_set,
            on_commit=lambda: self.set_status(JobStatus.COMPLETING),
        )
        self.batch.run()

    def _checkpoint(self) -> Checkpoint:
        store = self.service.client.store
        folder = self.job._record.get("checkpoint")
        if folder is None:
            if self.job.config.processing_guarantee is ProcessingGuarantee.NONE:
                folder = f"scratch-{secrets.token_hex(4)}"  # thrown away on restart
            else:
                folder = "checkpoint"
            self.write_record(checkpoint=folder)
        return Checkpoint(store, self.service.records.path(self.job.id, folder))

    def _discard_checkpoint(self) -> None:
        folder = self.job._record.get("checkpoint")
        if folder is not None:
            Checkpoint(
                self.service.client.store, self.service.records.path(self.job.id, folder)
            ).delete()
            self.write_record(checkpoint=None)

    def _cluster_check(self, sc: Any) -> str | None:
        """Jet's auto-scaling and split-brain rules, applied to Spark executors.

        Checked between micro-batches (at most once a second). A lost executor
        is Spark's business while auto-scaling is on: its tasks are retried
        on the executors left, or wait for a new one. With auto-scaling off the
        job suspends (a guarantee keeps its state) or fails (NONE); with
        split-brain protection it suspends when fewer than half-plus-one of
        the executors it started with are left.
        """
        now = time.monotonic()
        if now - self._last_cluster_check < 1.0:
            return None
        self._last_cluster_check = now
        from sparkjet.core.runtime.session import executor_ids

        now_ids = executor_ids(sc)
        if now_ids is None:
            return None
        if self._started_executors is None:  # the baseline: what the job starts with
            if now_ids:
                self._started_executors = len(now_ids)
                self._known_executors = set(now_ids)
            return None
        started = self._started_executors
        lost = self._known_executors - now_ids  # by id: a replaced executor counts as lost
        self._known_executors |= now_ids
        self._known_executors -= lost
        config = self.job.config
        quorum = started // 2 + 1
        count = len(now_ids)
        if config.split_brain_protection_enabled and count < quorum:
            self._stop_cause = (
                f"split-brain protection: {count} of the {started} executors the job started "
                f"with are left, fewer than the {quorum} it needs"
            )
            return "suspend"
        if lost and not config.auto_scaling_enabled:
            cause = (
                f"executor(s) {', '.join(sorted(lost))} were lost ({count} of "
                f"{count + len(lost)} left) and auto-scaling is off"
            )
            if config.processing_guarantee is ProcessingGuarantee.NONE:
                raise JobFailedError(f"job {self.job.label} failed: {cause}")
            self._stop_cause = cause
            return "suspend"
        return None

    def _should_stop(self, sc: Any) -> str | None:
        if self.cancel_requested.is_set():
            return "cancel"
        if self.stop_request is not None:
            return self.stop_request
        return self._cluster_check(sc)

    def _run_stream(self, sc: Any) -> str:
        config = self.job.config
        while True:
            guarantee = config.processing_guarantee
            trigger = 0.0 if guarantee is ProcessingGuarantee.NONE else (
                config.snapshot_interval_millis / 1000
            )
            loop = StreamLoop(
                self.plan,
                sc,
                self.service.job_context_factory(self.job),
                self._checkpoint(),
                metrics=config.metrics_enabled,
                trigger_seconds=trigger,
                should_stop=lambda: self._should_stop(sc),
                cancelled=self.cancel_requested.is_set,
                progress=self.progress,
                on_batch=self._after_batch,
            )
            reason = loop.run()
            if reason == "cancel":
                raise JobCancelledError(f"job {self.job.label} was cancelled")
            if reason != "restart":
                return reason
            log.info("job %s: restarting", self.job.label)
            self.stop_request = None
            self.set_status(JobStatus.STARTING, "restart requested", user_requested=True)
            self.set_status(JobStatus.RUNNING)
            if guarantee is ProcessingGuarantee.NONE:
                self._discard_checkpoint()  # NONE restarts from scratch

    def _after_batch(self) -> None:
        self.write_record(progress=self.progress.as_metrics())

    def _failed(self, exc: BaseException) -> None:
        job = self.job
        self.execution_completion = _now_ms()
        if self.cancel_requested.is_set():
            error: BaseException = JobCancelledError(f"job {job.label} was cancelled")
            error.__cause__ = exc if not isinstance(exc, JobCancelledError) else None
        elif isinstance(exc, JobFailedError):
            error = exc
        else:
            error = JobFailedError(f"job {job.label} failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
        self.service.client.plugins.notify("on_job_error", job=job, error=error)
        cancelled = isinstance(error, JobCancelledError)
        if self.plan.streaming and job.config.suspend_on_failure and not cancelled:
            cause = self.service.client.config.redact(str(error))
            self.write_record(suspension_cause=cause)
            self.set_status(JobStatus.SUSPENDED, cause)
            return
        self.error = error
        if self.plan.streaming:
            self._discard_checkpoint()
        self._finish(JobStatus.FAILED, error)
        self.done.set()

    def _finish(self, status: JobStatus, error: BaseException | None) -> None:
        self.final_counts = self.batch.stage_counts() if self.batch is not None else {}
        changes: dict[str, Any] = {
            "completion_time": self.execution_completion,
            "execution_start_time": self.execution_start,
        }
        cancelled = isinstance(error, JobCancelledError)
        if error is not None:
            changes["failure"] = {
                "message": self.service.client.config.redact(str(error)),
                "stage": getattr(error, "stage", None),
                "cancelled": cancelled,
            }
            changes["user_cancelled"] = cancelled
        if self.job.config.store_metrics_after_job_completion:
            changes["metrics"] = self.job.get_metrics()
        with self._record_lock:
            self.job._record.update(changes)
        description = str(error) if error is not None else None
        self.set_status(status, description, user_requested=cancelled)
        if self.job.name:
            self.service.records.release_name(self.job.name, self.job.id)


class Job:
    """A handle on one job; see Jet's ``Job``.

    Handles from the process running the job see it live; handles from other
    processes read its record in the store.
    """

    def __init__(self, service: JetService, record: dict[str, Any]) -> None:
        self._service = service
        self._record = record

    # --- identity ------------------------------------------------------------

    @property
    def id(self) -> str:
        """The job's id (``xxxx-xxxx-xxxx-xxxx``)."""
        return str(self._record["id"])

    @property
    def name(self) -> str | None:
        """The job's name, from its configuration (None if unnamed)."""
        name = self._record.get("name")
        return str(name) if name is not None else None

    @property
    def label(self) -> str:
        """How messages name the job: ``'name' (id)``, or the id of an unnamed job."""
        return f"'{self.name}' ({self.id})" if self.name else self.id

    @property
    def config(self) -> JobConfig:
        """The job's configuration."""
        return JobConfig.from_dict(self._record["config"])

    @property
    def submission_time(self) -> int:
        """When the job was submitted, in milliseconds since the epoch."""
        return int(self._record["submission_time"])

    def __repr__(self) -> str:
        return f"<Job {self.label} {self.status.value}>"

    @property
    def _runner(self) -> _Runner | None:
        return self._service._runners.get(self.id)

    def _refresh(self) -> dict[str, Any]:
        if self._runner is None:
            fresh = self._service.records.read(self.id)
            if fresh is not None:
                self._record = fresh
        return self._record

    # --- status --------------------------------------------------------------

    @property
    def status(self) -> JobStatus:
        """The current status (a driver that stopped sending heartbeats counts as FAILED)."""
        record = self._refresh()
        status = JobStatus(record["status"])
        if self._runner is None and not status.is_terminal() and not _driver_alive(record):
            # The driver died. A streaming job can be resumed from its checkpoint.
            return JobStatus.SUSPENDED if record.get("kind") == "stream" else JobStatus.FAILED
        return status

    def is_terminal(self) -> bool:
        """True once the job has COMPLETED or FAILED."""
        return self.status.is_terminal()

    def is_streaming(self) -> bool:
        """True for a streaming job (one that reads an unbounded source)."""
        return self._refresh().get("kind") == "stream"

    def is_driven_here(self) -> bool:
        """True when this process drives the job: it submitted it, or took it over on resume."""
        return self._runner is not None

    def is_driver_alive(self) -> bool:
        """Whether the process that drives the job still does (True in that process).

        Another process's driver counts as dead when it stopped sending
        heartbeats, or at once when it ran on this host and its process is gone.
        """
        return self._runner is not None or _driver_alive(self._refresh())

    def wait_for_status(self, *wanted: JobStatus, timeout: float | None = None) -> JobStatus:
        """Wait until the job's status is one of ``wanted`` or terminal; return that status.

        :raises TimeoutException: ``timeout`` seconds passed first (the message
            names the job and its status then).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status
            if status in wanted or status.is_terminal():
                return status
            if deadline is not None and time.monotonic() >= deadline:
                shown = " or ".join(s.value for s in wanted) or "a terminal status"
                raise TimeoutException(
                    f"job {self.label} did not become {shown} within {timeout:g} s "
                    f"(status {status.value})"
                )
            time.sleep(REMOTE_POLL_SECONDS)

    def is_user_cancelled(self) -> bool:
        """True if the job ended because a user cancelled it."""
        return bool(self._refresh().get("user_cancelled", False))

    def get_failure(self) -> str | None:
        """Why the job failed, or None."""
        record = self._refresh()
        failure = record.get("failure")
        if failure:
            return str(failure["message"])
        if self.status is JobStatus.FAILED:
            return "the driver process running the job died"
        return None

    def get_suspension_cause(self) -> str:
        """Why the job is suspended: requested by a user, a failure, or a dead driver.

        :raises JobStateError: the job is not suspended.
        """
        status = self.status
        if status is not JobStatus.SUSPENDED:
            raise JobStateError(f"job {self.label} is not suspended (it is {status.value})")
        record = self._refresh()
        cause = str(record.get("suspension_cause") or "Requested by user")
        if self._runner is None and not _driver_alive(record):
            if record["status"] == JobStatus.SUSPENDED.value:
                return f"{cause}; the process that ran it has exited, resume() continues it here"
            return "the driver process running the job died; resume() continues it here"
        return cause

    def add_status_listener(self, listener: Callable[[JobStatusEvent], None]) -> None:
        """Call ``listener(event)`` on every later status change.

        In the process running the job the listener runs on the job's thread;
        elsewhere a daemon thread polls the job's record.
        """
        runner = self._runner
        if runner is not None:
            runner.listeners.append(listener)
            return
        threading.Thread(
            target=self._poll_status, args=(listener,), daemon=True,
            name=f"sparkjet-listen-{self.id}",
        ).start()

    def _poll_status(self, listener: Callable[[JobStatusEvent], None]) -> None:
        last = self.status
        while not last.is_terminal():
            time.sleep(REMOTE_POLL_SECONDS)
            now = self.status
            if now is not last:
                try:
                    listener(JobStatusEvent(last, now, self.get_failure(), False))
                except Exception:
                    log.exception("a status listener of job %s failed", self.label)
                last = now

    # --- control -------------------------------------------------------------

    def join(self, timeout: float | None = None) -> None:
        """Wait for the job to end; raise if it failed.

        :raises TimeoutException: ``timeout`` seconds passed first.
        :raises JobCancelledError: the job was cancelled.
        :raises JobFailedError: the job failed (stage named, cause chained).
        """
        runner = self._runner
        if runner is not None:
            if not runner.done.wait(timeout):
                raise TimeoutException(
                    f"job {self.label} did not finish within {timeout} s "
                    f"(status {self.status.value})"
                )
            if runner.error is not None:
                raise runner.error
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_terminal():
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutException(
                    f"job {self.label} did not finish within {timeout} s "
                    f"(status {self.status.value})"
                )
            time.sleep(REMOTE_POLL_SECONDS)
        if self.status is JobStatus.FAILED:
            failure = self.get_failure() or "unknown failure"
            stage = (self._record.get("failure") or {}).get("stage")
            if self.is_user_cancelled():
                raise JobCancelledError(failure, stage)
            raise JobFailedError(failure, stage)

    def cancel(self) -> None:
        """Stop the job; it ends FAILED with ``is_user_cancelled()`` true.

        A streaming job's checkpoint is deleted, as Jet deletes a cancelled
        job's snapshots.

        :raises JobStateError: the job has already ended.
        """
        status = self.status
        if status.is_terminal():
            raise JobStateError(f"cannot cancel job {self.label}: it has already {status.value}")
        runner = self._runner
        if runner is not None:
            runner.cancel()
        elif not _driver_alive(self._refresh()):
            self._service._take_over(self).cancel()
        else:
            self._service.records.request(self.id, "cancel")

    def _act(self, action: str, allowed: tuple[JobStatus, ...]) -> None:
        status = self.status
        if status not in allowed:
            wanted = " or ".join(s.value for s in allowed)
            raise JobStateError(
                f"cannot {action} job {self.label}: it is {status.value}, not {wanted}"
            )
        if self._refresh().get("kind") != "stream":
            raise JobStateError(f"cannot {action} job {self.label}: it is a batch job")
        runner = self._runner
        if runner is not None:
            getattr(runner, action)()
        elif action == "resume" and not _driver_alive(self._record):
            self._service._take_over(self).resume()
        else:
            self._service.records.request(self.id, action)

    def suspend(self) -> None:
        """Stop a streaming job after its current micro-batch commits; status SUSPENDED.

        Returns at once; the status changes when the batch has committed.
        """
        self._act("suspend", (JobStatus.RUNNING, JobStatus.STARTING))

    def resume(self) -> None:
        """Continue a SUSPENDED job from its last committed micro-batch.

        If the process that ran the job died, the job continues in this process.
        """
        self._act("resume", (JobStatus.SUSPENDED,))

    def restart(self) -> None:
        """Stop a RUNNING streaming job and start it again.

        With a processing guarantee it continues from its last committed
        micro-batch; with NONE it starts from scratch.
        """
        self._act("restart", (JobStatus.RUNNING,))

    def update_config(self, **changes: Any) -> JobConfig:
        """Change a SUSPENDED job's configuration; returns the new one.

        Only the fields Jet lets a suspended job change are accepted:
        ``auto_scaling_enabled``, ``split_brain_protection_enabled``,
        ``suspend_on_failure``, ``snapshot_interval_millis``,
        ``metrics_enabled`` and ``store_metrics_after_job_completion``.
        """
        if self.status is not JobStatus.SUSPENDED:
            raise JobStateError(
                f"cannot update the configuration of job {self.label}: it is "
                f"{self.status.value}, not SUSPENDED"
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
            runner.write_record(config=config.to_dict())
        elif not _driver_alive(self._refresh()):
            self._service._take_over(self).write_record(config=config.to_dict())
        else:
            # The live driver owns the record: ask it, or its next heartbeat undoes this.
            self._service.records.request(self.id, "update_config", config.to_dict())
        return config

    # --- metrics -------------------------------------------------------------

    def get_metrics(self) -> dict[str, Any]:
        """Per-stage ``receivedCount`` / ``emittedCount`` and execution times.

        Returns ``{"executionStartTime": ms, "executionCompletionTime": ms,
        "stages": {name: {"receivedCount": n, "emittedCount": n}}}``; times
        are -1 until known. Counts are updated as Spark tasks finish. Empty
        stages when ``metrics_enabled`` is off. Other processes see metrics
        only of completed jobs with ``store_metrics_after_job_completion``.
        """
        runner = self._runner
        if runner is None:
            stored = self._refresh().get("metrics")
            return dict(stored) if stored else {
                "executionStartTime": self._record.get("execution_start_time", -1),
                "executionCompletionTime": self._record.get("completion_time", -1),
                "stages": {},
                **(self._record.get("progress") or {}),
            }
        streaming = runner.plan.streaming
        if streaming:
            counts = runner.progress.stage_totals
        else:
            counts = runner.final_counts or (
                runner.batch.stage_counts() if runner.batch is not None else {}
            )
        stages: dict[str, dict[str, int]] = {}
        if self.config.metrics_enabled:
            names = runner.plan.names
            for node in runner.plan.nodes:
                received = sum(counts.get(names[i], 0) for i in node.inputs)
                emitted = 0 if node.op == "sink" else counts.get(names[node], 0)
                stage = {"receivedCount": received, "emittedCount": emitted}
                if streaming and names[node] in runner.progress.state:
                    keys, size = runner.progress.state[names[node]]
                    stage.update(snapshotKeys=keys, snapshotBytes=size)
                stages[names[node]] = stage
        metrics: dict[str, Any] = {
            "executionStartTime": runner.execution_start,
            "executionCompletionTime": runner.execution_completion,
            "stages": stages,
        }
        if streaming:
            metrics.update(runner.progress.as_metrics())
        return metrics


def _is_stale(record: dict[str, Any]) -> bool:
    return bool(time.time() - float(record.get("heartbeat", 0)) > STALE_AFTER_SECONDS)


class JetService:
    """Submits and finds jobs (``client.get_jet()``), like Jet's ``JetService``."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.records = JobRecords(client.store)
        self._runners: dict[str, _Runner] = {}
        self._lock = threading.Lock()

    def job_context_factory(self, job: Job) -> Callable[[Transform], JobContext]:
        runner = self._runners[job.id]
        config = job.config
        parallelism = max(1, int(self.client.spark.sparkContext.defaultParallelism))

        def make(node: Transform) -> JobContext:
            entry = runner.plan.participants.get(node)
            options = self.client.config.plugin_options.get(entry.plugin, {}) if entry else {}
            return JobContext(
                job_id=job.id,
                job_name=job.name,
                stage=runner.plan.names[node],
                store=self.client.store,
                parallelism=parallelism,
                options=options,
                processing_guarantee=config.processing_guarantee,
            )

        return make

    def submit(self, pipeline: Any, config: JobConfig | None = None) -> Job:
        """Validate ``pipeline`` and start it as a job; returns at once.

        :raises PipelineDefinitionError: the pipeline cannot run (stage named).
        :raises JobAlreadyExistsError: an active job has the same name.
        """
        return self._submit(pipeline, config, if_absent=False)

    def new_job_if_absent(self, pipeline: Any, config: JobConfig) -> Job:
        """Like :meth:`submit`, but return the active job of the same name if there is one."""
        if not isinstance(config, JobConfig) or not config.name:
            raise ConfigError("new_job_if_absent() needs a JobConfig with a name")
        return self._submit(pipeline, config, if_absent=True)

    def _submit(self, pipeline: Any, config: JobConfig | None, if_absent: bool) -> Job:
        config = config if config is not None else JobConfig()
        if not isinstance(config, JobConfig):
            raise PipelineDefinitionError(f"submit() takes a JobConfig, got {config!r}")
        if config.initial_snapshot_name is not None:
            raise PipelineDefinitionError(
                f"JobConfig.initial_snapshot_name={config.initial_snapshot_name!r}: starting from "
                "a snapshot is not supported by this version of sparkjet"
            )
        validated = plan(pipeline, self.client.plugins, config.processing_guarantee)
        if config.suspend_on_failure and not validated.streaming:
            raise PipelineDefinitionError(
                "JobConfig.suspend_on_failure=True: batch jobs cannot be suspended; a failed "
                "batch job leaves its sinks untouched, so submit it again"
            )
        frozen = cloudpickle.dumps(pipeline) if validated.streaming else None
        with self._lock:
            job_id = new_job_id()
            if config.name:
                active = self._claim_name(config.name, job_id)
                if active is not None:
                    if if_absent:
                        return active
                    raise JobAlreadyExistsError(
                        f"a job named '{config.name}' is already active: {active.id} "
                        f"({active.status.value}); cancel it or use new_job_if_absent()"
                    )
            record = {
                "id": job_id,
                "name": config.name,
                "status": JobStatus.NOT_RUNNING.value,
                "config": config.to_dict(),
                "submission_time": _now_ms(),
                "completion_time": -1,
                "execution_start_time": -1,
                "user_cancelled": False,
                "kind": "stream" if validated.streaming else "batch",
                "driver": _this_driver(),
                "stages": list(validated.names.values()),
            }
            job = Job(self, record)
            runner = _Runner(self, job, validated)
            self._runners[job.id] = runner
            if frozen is not None:
                # A streaming job outlives its driver: resume() elsewhere needs the pipeline.
                self.client.store.write_bytes(self.records.path(job.id, "pipeline.pkl"), frozen)
            runner.write_record()
        runner.start()
        return job

    def _take_over(self, job: Job) -> _Runner:
        """Adopt a job whose driver died, so it can be resumed or cancelled here."""
        with self._lock:
            runner = self._runners.get(job.id)
            if runner is not None:
                return runner
            try:
                pipeline = cloudpickle.loads(
                    self.client.store.read_bytes(self.records.path(job.id, "pipeline.pkl"))
                )
            except FileNotFoundError:
                raise JobStateError(
                    f"job {job.label} cannot continue here: its pipeline was not stored"
                ) from None
            config = job.config
            validated = plan(pipeline, self.client.plugins, config.processing_guarantee)
            record = dict(job._record)
            epoch = int(record.get("epoch", 0)) + 1
            claim = self.records.path(job.id, f"owner-{epoch:06d}")
            if not self.client.store.create_exclusive(claim, json.dumps(_this_driver()).encode()):
                raise JobStateError(
                    f"job {job.label}: another process is taking it over already"
                )
            record["epoch"] = epoch
            for stale in self.records.take_requests(job.id):
                log.info("job %s: dropping request %r left for its dead driver", job.label, stale)
            if record["status"] != JobStatus.SUSPENDED.value:
                record["suspension_cause"] = "the driver process running the job died"
            record["status"] = JobStatus.SUSPENDED.value
            adopted = Job(self, record)
            runner = _Runner(self, adopted, validated)
            runner.execution_start = int(record.get("execution_start_time", -1))
            self._runners[job.id] = runner
            runner.write_record()
            runner.watcher.start()
            job._record = adopted._record
            return runner

    def _claim_name(self, name: str, job_id: str) -> Job | None:
        """Take ``name`` for a new job, or return the active job that holds it.

        The lock file is created only if absent, so two processes cannot both
        take a name; a holder that ended (or whose driver died) is replaced.
        """
        for _ in range(3):
            holder_id = self.records.claim_name(name, job_id)
            if holder_id is None:
                return None
            holder = self.get_job(holder_id)
            if holder is not None and not holder.is_terminal():
                return holder
            self.records.release_name(name, holder_id)
        raise JobAlreadyExistsError(f"could not take the job name '{name}': another submit races")

    def get_job(self, job_id: str) -> Job | None:
        """The job with this id, or None."""
        runner = self._runners.get(job_id)
        if runner is not None:
            return runner.job
        record = self.records.read(job_id)
        return Job(self, record) if record is not None else None

    def get_job_by_name(self, name: str) -> Job | None:
        """The active job with this name, else the newest job with it, else None."""
        matches = [job for job in self.get_jobs() if job.name == name]
        for job in matches:
            if not job.is_terminal():
                return job
        return matches[0] if matches else None

    def get_jobs(self) -> list[Job]:
        """Every job in the store, newest first."""
        jobs = []
        for record in self.records.all():
            runner = self._runners.get(record["id"])
            jobs.append(runner.job if runner is not None else Job(self, record))
        jobs.sort(key=lambda j: j.submission_time, reverse=True)
        return jobs
