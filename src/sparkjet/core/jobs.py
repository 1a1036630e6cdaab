"""Jobs: the jet service, job handles, the runner thread and job records.

A job runs in the process that submitted it, on a thread of its own, against
the process-wide Spark session. Its record in the store (``jobs/<id>``) makes
it visible to other processes; they act on it through the record's control
folder (``sparkjet cancel``), which the running process watches. A record
whose heartbeat has stopped belongs to a driver that died.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkjet.core.graph import Transform
from sparkjet.core.planner import Plan, plan
from sparkjet.core.store import JobRecords
from sparkjet.errors import (
    ConfigError,
    JobAlreadyExistsError,
    JobCancelledError,
    JobFailedError,
    JobStateError,
    PipelineDefinitionError,
    TimeoutException,
)
from sparkjet.job import JobConfig, JobStatus
from sparkjet.plugin import JobContext

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
    """Runs one job in this process; owns its record while it runs."""

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
        self._record_lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._run, name=f"sparkjet-job-{job.id}", daemon=False
        )
        self.watcher = threading.Thread(
            target=self._watch, name=f"sparkjet-watch-{job.id}", daemon=True
        )

    # --- record ------------------------------------------------------------

    def write_record(self, **changes: Any) -> None:
        with self._record_lock:
            self.job._record.update(changes)
            self.job._record["heartbeat"] = time.time()
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

    def start(self) -> None:
        self.thread.start()
        self.watcher.start()

    def _watch(self) -> None:
        last_beat = time.monotonic()
        while not self.done.wait(CONTROL_POLL_SECONDS):
            try:
                if self.cancel_requested.is_set():
                    # cancelJobGroup stops running Spark jobs only: repeat it until
                    # the runner sees the flag, so a job started meanwhile stops too.
                    self.cancel()
                for action in self.service.records.take_requests(self.job.id):
                    if action == "cancel":
                        self.cancel()
                    else:
                        log.warning("job %s: ignoring unknown request %r", self.job.label, action)
                if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                    self.write_record()
                    last_beat = time.monotonic()
            except Exception:
                log.exception("job %s: watcher failed", self.job.label)

    def cancel(self) -> None:
        self.cancel_requested.set()
        from sparkjet.core.runtime.session import cancel_job_group

        cancel_job_group(self.job.id)

    def _run(self) -> None:
        from sparkjet.core.runtime.batch import BatchRun
        from sparkjet.core.runtime.session import set_job_group

        job = self.job
        try:
            self.set_status(JobStatus.STARTING)
            if self.cancel_requested.is_set():
                raise JobCancelledError(f"job {job.label} was cancelled")
            sc = self.service.client.spark.sparkContext
            set_job_group(sc, job.id, f"sparkjet job {job.label}")
            if self.cancel_requested.is_set():  # arrived while Spark was starting
                raise JobCancelledError(f"job {job.label} was cancelled")
            self.execution_start = _now_ms()
            self.set_status(JobStatus.RUNNING)
            self.batch = BatchRun(
                self.plan,
                sc,
                self.service.job_context_factory(job),
                metrics=job.config.metrics_enabled,
                cancelled=self.cancel_requested.is_set,
                on_commit=lambda: self.set_status(JobStatus.COMPLETING),
            )
            self.batch.run()
            self.execution_completion = _now_ms()
            self._finish(JobStatus.COMPLETED, None)
        except BaseException as exc:
            self.execution_completion = _now_ms()
            if self.cancel_requested.is_set():
                error: BaseException = JobCancelledError(f"job {job.label} was cancelled")
                error.__cause__ = exc if not isinstance(exc, JobCancelledError) else None
            elif isinstance(exc, JobFailedError):
                error = exc
            else:
                error = JobFailedError(f"job {job.label} failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
            self.error = error
            self.service.client.plugins.notify("on_job_error", job=job, error=error)
            self._finish(JobStatus.FAILED, error)
        finally:
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
        if self._runner is None and not status.is_terminal() and _is_stale(record):
            return JobStatus.FAILED
        return status

    def is_terminal(self) -> bool:
        """True once the job has COMPLETED or FAILED."""
        return self.status.is_terminal()

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
            return "the driver process running the job stopped sending heartbeats"
        return None

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

        :raises JobStateError: the job has already ended.
        """
        status = self.status
        if status.is_terminal():
            raise JobStateError(f"cannot cancel job {self.label}: it has already {status.value}")
        runner = self._runner
        if runner is not None:
            runner.cancel()
        else:
            self._service.records.request(self.id, "cancel")

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
            }
        counts = runner.final_counts
        if counts is None:
            counts = runner.batch.stage_counts() if runner.batch is not None else {}
        stages: dict[str, dict[str, int]] = {}
        if self.config.metrics_enabled:
            names = runner.plan.names
            for node in runner.plan.nodes:
                received = sum(counts.get(names[i], 0) for i in node.inputs)
                emitted = 0 if node.op == "sink" else counts.get(names[node], 0)
                stages[names[node]] = {"receivedCount": received, "emittedCount": emitted}
        return {
            "executionStartTime": runner.execution_start,
            "executionCompletionTime": runner.execution_completion,
            "stages": stages,
        }


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
        if config.suspend_on_failure:
            raise PipelineDefinitionError(
                "JobConfig.suspend_on_failure=True: batch jobs cannot be suspended in this "
                "version of sparkjet; a failed batch job leaves its sinks untouched, so submit "
                "it again"
            )
        validated = plan(pipeline, self.client.plugins, config.processing_guarantee)
        if validated.streaming:
            sources = ", ".join(
                validated.name(n) for n in validated.nodes
                if n.op == "source" and n.params["source"].streaming
            )
            raise PipelineDefinitionError(
                f"stage(s) {sources} read a stream; streaming jobs are not supported by this "
                "version of sparkjet yet, only batch jobs",
                sources.split(", ")[0],
            )
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
                "kind": "batch",
                "driver": {"host": socket.gethostname(), "pid": os.getpid()},
                "stages": list(validated.names.values()),
            }
            job = Job(self, record)
            runner = _Runner(self, job, validated)
            self._runners[job.id] = runner
            runner.write_record()
        runner.start()
        return job

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
