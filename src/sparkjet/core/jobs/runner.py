"""The runner: drives one job in this process, on the engine, while it lives here.

The job thread runs the work (a batch plan, or the micro-batch loop); a
watcher thread takes control requests from other processes and refreshes the
lease until the job is terminal. A streaming job's thread ends when it is
suspended and a new one starts on resume, in this process or, after a driver
died, in the process that resumes it. Every status change goes through the
transition table (:mod:`.lifecycle`).

The runner owns the job's lifecycle: its threads, statuses, failures, the
checkpoint's folder and the exports asked of it. The rest has owners of its
own: a streaming job's micro-batch loop and its host (:mod:`.streaming`),
snapshot exports (:mod:`.exporting`), seeding from a snapshot at submit
(:mod:`.seeding`) and the metrics shown (:mod:`.metrics`).

Threads and the locks between them: the job thread, the watcher, the export
threads beside the loop (:mod:`.exporting`) and those of exports other
processes ask for (:mod:`.control`). The lease's lock orders every change
and write of the record; ``status_lock`` orders a status write with the
listeners registered; ``_park_lock`` guards whether a job thread runs the
work, so a cancel racing a suspend ends the job once; the export queue's lock
guards the exports waiting for a cut and the pins. The service's registry
(:mod:`.service`) has its own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sparkjet.core.adaptive import ask_sizes, choose_local, resolve_adaptive
from sparkjet.core.checkpoint import Checkpoint
from sparkjet.core.config import EngineSettings
from sparkjet.core.contracts import JobContext
from sparkjet.core.engine import Engine, Execution, JobRun, RunHooks
from sparkjet.core.errors import (
    JobCancelledError,
    JobFailedError,
    JobFencedError,
    JobStateError,
)
from sparkjet.core.graph import SourceSpec, Transform
from sparkjet.core.jobs.control import ControlDesk
from sparkjet.core.jobs.exporting import Exporter, ExportRequest
from sparkjet.core.jobs.lifecycle import (
    Action,
    JobStatusEvent,
    check_action,
    check_transition,
)
from sparkjet.core.jobs.metrics import job_metrics, stage_metrics
from sparkjet.core.jobs.policy import ClusterWatch
from sparkjet.core.jobs.record import (
    HEARTBEAT_SECONDS,
    Change,
    Failure,
    JobRecord,
    Lease,
    checkpoint_path,
    lease_refresh_seconds,
    now_ms,
)
from sparkjet.core.jobs.seeding import seed_job
from sparkjet.core.jobs.streaming import StreamRun
from sparkjet.core.microbatch_loop import StopReason
from sparkjet.core.model import JobConfig, JobStatus, ProcessingGuarantee, StageCount
from sparkjet.core.planner import Plan
from sparkjet.core.plugin_manager import PluginHost
from sparkjet.core.snapshots import Manifest, Snapshot, SnapshotStore
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

log = logging.getLogger("sparkjet.jobs")

#: How often the watcher looks for control requests.
CONTROL_POLL_SECONDS = 0.25
#: On an object store (S3, GCS), where each look is a billed listing, how often
#: the watcher looks at the control folder at least (``[engine]
#: idle_poll_max_seconds`` if less).
REMOTE_CONTROL_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class Services:
    """What a runner needs from the client: the store, the plugins and the engine."""

    store: Store
    records: JobRecords
    plugins: PluginHost
    engine: Engine
    #: Masks configured secrets in anything written or shown.
    redact: Callable[[str], str]
    #: ``[plugins.<name>]`` tables of the configuration, by plugin name.
    plugin_options: Mapping[str, Mapping[str, Any]]
    #: The configured snapshot store (made on first use).
    snapshots: Callable[[], SnapshotStore]
    #: The engine small micro-batches run on, in this process (None: none; every
    #: batch runs on :attr:`engine`), and the ``[engine]`` settings saying when.
    local_engine: Engine | None = None
    engine_settings: EngineSettings = field(default_factory=EngineSettings)


class JobRunner:
    """Runs one job in this process; holds its lease while the job lives here."""

    def __init__(self, services: Services, job: Job, plan: Plan, record: JobRecord) -> None:
        self.services = services
        self.job = job
        config = job.config
        self.plan = plan.for_job(job.id, config.name, config.error_policy,
                                 config.dead_letter_stream)
        #: The job's record, driven from here: handles of the job here read ``lease.record``.
        self.lease = Lease(services.records, record)
        self.cancel_requested = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.execution: Execution | None = None
        self.final_counts: dict[StageCount, int] | None = None
        self.execution_start = -1
        self.execution_completion = -1
        self.listeners: list[Callable[[JobStatusEvent], None]] = []
        self._future_work_cancelled = False
        #: Orders status writes with listener registration: a listener added
        #: after a status became visible never hears of that change.
        self.status_lock = threading.Lock()
        #: True while no job thread runs the work (not started yet, or
        #: suspended): a cancel then ends the job itself. Guarded by
        #: ``_park_lock`` so a cancel racing a suspend ends the job exactly once.
        self._parked = True
        self._park_lock = threading.Lock()
        self.thread: threading.Thread | None = None
        #: Exports the job's state as snapshots (its queue: those waiting for the loop).
        self.exporter = Exporter(job, self.plan, services.snapshots, services.engine.version)
        #: A streaming job's micro-batch loop and its host (unused by a batch job).
        self.stream = StreamRun(job, self.plan, services.engine, services.store, self.lease,
                                self.cancel_requested, self.exporter, self.context_factory,
                                self._checkpoint, services.local_engine,
                                services.engine_settings)
        #: Requests from other processes, taken by the watcher thread.
        self.control = ControlDesk(services.records, self.lease, job.label, services.redact,
                                   self.act, self.export_snapshot)
        self.watcher = threading.Thread(
            target=self._watch, name=f"sparkjet-watch-{job.id}", daemon=True
        )

    # --- record and status ----------------------------------------------------

    def update_record(self, change: Change) -> None:
        """Change the job's record (``lambda r: replace(r, ...)``) and write it."""
        self.lease.write(change)

    def record_outcome(self, change: Change) -> None:
        """Change the record for how the job ended or stopped, even if the store fails now.

        A store that fails while the job is failing (a full disk, throttling,
        expired credentials) must not leave the job half-stopped: the change
        holds here at once (handles in this process see it), and the watcher
        keeps writing the record until the store takes it. Meanwhile no
        heartbeat lands, so other processes see the driver gone and may take
        the job over (which fences this one off).
        """
        try:
            self.lease.write(change)
        except JobFencedError:
            raise
        except Exception as exc:
            log.error(
                "job %s: its record could not be stored (%s); the job is %s here, and this "
                "process writes it again every %g s until the store takes it",
                self.job.label, exc, self.lease.status.value, HEARTBEAT_SECONDS,
            )

    def set_status(
        self, new: JobStatus, description: str | None = None, user_requested: bool = False,
        *, outcome: bool = False,
    ) -> None:
        """Change the status, store it and tell the listeners.

        With ``outcome`` (how the job ended or stopped) a store that fails
        does not stop it: see :meth:`record_outcome`.
        """
        with self.status_lock:
            old = self.lease.status
            check_transition(self.job.label, old, new)
            change: Change = lambda r: replace(r, status=new)  # noqa: E731
            if outcome:
                self.record_outcome(change)
            else:
                self.lease.write(change)
            listeners = list(self.listeners)
        event = JobStatusEvent(old, new, description, user_requested)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("a status listener of job %s failed", self.job.label)
        self.services.plugins.job_status_changed(job=self.job, old_status=old, new_status=new)

    def context_factory(self) -> Callable[[Transform], JobContext]:
        """Builds the context each source, sink and transform of the plan sees on the driver."""
        config = self.job.config
        parallelism = self.services.engine.parallelism()

        def make(node: Transform) -> JobContext:
            entry = self.plan.participants.get(node)
            options = self.services.plugin_options.get(entry.plugin, {}) if entry else {}
            return JobContext(
                job_id=self.job.id,
                job_name=self.job.name,
                stage=self.plan.names[node],
                store=self.services.store,
                parallelism=parallelism,
                options=options,
                processing_guarantee=config.processing_guarantee,
            )

        return make

    # --- threads --------------------------------------------------------------

    def add_listener(self, listener: Callable[[JobStatusEvent], None]) -> None:
        """Call ``listener`` on every status change from now on."""
        with self.status_lock:
            self.listeners.append(listener)

    @property
    def cluster(self) -> ClusterWatch:
        """The executors a streaming job has seen (its stream run's)."""
        return self.stream.cluster

    def start(self, resuming: bool = False) -> None:
        self.stream.stop_request = None
        with self._park_lock:
            self._parked = False
        self.thread = threading.Thread(
            target=self._run_counted, args=(resuming,), name=f"sparkjet-job-{self.job.id}",
            daemon=False,
        )
        self.thread.start()
        if not self.watcher.is_alive():
            self.watcher.start()

    def _watch(self) -> None:
        with store_requests.working_for(self.job.id):
            self._take_requests_and_beat()
            self._store_unwritten_outcome()

    def _run_counted(self, resuming: bool) -> None:
        """:meth:`_run`, its store requests counted for the job."""
        with store_requests.working_for(self.job.id):
            self._run(resuming)

    def _store_unwritten_outcome(self) -> None:
        """After the job ended: write the record its end left unwritten, until it lands."""
        lease = self.lease
        if lease.unwritten is None:
            return
        while lease.fenced is None:
            time.sleep(HEARTBEAT_SECONDS)
            try:
                lease.write()
            except JobFencedError:
                return  # the job is another driver's: nothing of this one's is written
            except Exception as exc:
                log.debug("job %s: storing its record failed again: %s", self.job.label, exc)
            else:
                log.info("job %s: its record is stored (%s)", self.job.label,
                         lease.status.value)
                if lease.status is JobStatus.FAILED:
                    with contextlib.suppress(JobFencedError):
                        self._discard_checkpoint_of_failed()
                return

    def _control_every(self) -> float:
        """How often the watcher takes control requests: every look, or on S3/GCS less often."""
        if not self.services.store.object_store:
            return 0.0
        return min(REMOTE_CONTROL_POLL_SECONDS,
                   max(self.services.engine_settings.idle_poll_max_seconds, CONTROL_POLL_SECONDS))

    def _beat_due(self) -> bool:
        """Whether the heartbeat writes the record now.

        On a local store every :data:`HEARTBEAT_SECONDS` since the record
        was last written. On S3 or GCS, where each write is a PUT and a fence
        check, as often only while a write failed or micro-batches committed
        since (their progress, which the loop leaves to the heartbeat there);
        else once the lease needs refreshing (:func:`lease_refresh_seconds`):
        what changes while the job idles (a source's lag) reaches the record
        within that time.
        """
        since = time.monotonic() - self.lease.written_at
        if since < HEARTBEAT_SECONDS:
            return False
        if not self.services.store.object_store or self.lease.unwritten is not None:
            return True
        if self.plan.streaming and self.stream.progress_unwritten:
            return True
        return since >= lease_refresh_seconds()

    def _take_requests_and_beat(self) -> None:
        failing = False
        control_every = self._control_every()
        last_control = float("-inf")
        while not self.done.wait(CONTROL_POLL_SECONDS):
            # The heartbeat has a try of its own: nothing the control folder
            # holds may stop it, or the job would be judged dead and taken over.
            try:
                if self.cancel_requested.is_set() and not self._future_work_cancelled:
                    # Engines that cancel only running work: repeat until the runner
                    # sees the flag, so work started meanwhile stops too.
                    self.cancel()
                if time.monotonic() - last_control >= control_every:
                    last_control = time.monotonic()
                    self.control.take()
            except Exception:
                log.exception("job %s: taking control requests failed", self.job.label)
            # A streaming job's heartbeat carries its progress too (a source's
            # lag changes between batches, while the job idles or works).
            if self._beat_due():
                try:
                    running = (self.plan.streaming
                               and self.stream.progress.last_committed >= 0)
                    change = self.stream.progress_change() if running else None
                    self.lease.write(change)
                except JobFencedError as exc:
                    self._stop_fenced(exc)
                    return
                except Exception as exc:
                    if not failing:  # once: a store that is down fails every 0.25 s
                        log.exception("job %s: heartbeat failed", self.job.label)
                    log.debug("job %s: heartbeat failed: %s", self.job.label, exc)
                    failing = True
                else:
                    if failing:
                        log.info("job %s: heartbeats are stored again", self.job.label)
                    failing = False

    def _stop_fenced(self, exc: JobFencedError) -> None:
        """Another driver took the job over: stop here, writing nothing more (it is theirs)."""
        if self.error is None:
            log.error("%s", exc)
        self.error = exc
        self.cancel_requested.set()  # the loop stops at its next check
        self.services.engine.cancel(self.job.id)  # and running Spark work stops now
        self.done.set()

    def act(self, action: Action, payload: Any = None) -> None:
        """Carry out ``action`` here; JobStateError if the job's status does not allow it."""
        if action is Action.UPDATE_CONFIG:
            if isinstance(payload, dict) and payload.get("config"):
                self._check(action)
                config = JobConfig.from_dict(payload["config"]).to_dict()
                self.lease.write(lambda r: replace(r, config=config))
        elif action is Action.CANCEL:
            self._check(action)
            self.cancel()
        elif action is Action.SUSPEND:
            self.suspend()
        elif action is Action.RESUME:
            self.resume()
        elif action is Action.RESTART:
            self.restart()
        else:  # an export is not an act: export_snapshot() returns its manifest
            raise JobStateError(f"job {self.job.label}: {action.value} is not carried out by act()")

    @property
    def running_here(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def _check(self, action: Action) -> None:
        check_action(action, self.lease.status, streaming=self.plan.streaming,
                     label=self.job.label)

    def cancel(self) -> None:
        self.cancel_requested.set()
        self.stream.ask_stop(None)
        self._future_work_cancelled = self.services.engine.cancel(self.job.id)
        with self._park_lock:
            end_now = self._parked and not self.done.is_set()
            self._parked = False  # whoever ends a parked job ends it once
        if end_now:
            # Suspended: nothing runs, end the job now.
            self._end_suspended_by_cancel()

    def _park(self) -> None:
        """The job thread stops here, SUSPENDED; a cancel that came meanwhile ends the job."""
        with self._park_lock:
            if not self.cancel_requested.is_set():
                self._parked = True
                return
        self._end_suspended_by_cancel()

    def suspend(self) -> None:
        self._check(Action.SUSPEND)
        self.stream.ask_stop(StopReason.SUSPEND)

    def restart(self) -> None:
        self._check(Action.RESTART)
        self.stream.ask_stop(StopReason.RESTART)

    def resume(self) -> None:
        self._check(Action.RESUME)
        old = self.thread
        if old is not None and old.is_alive() and old is not threading.current_thread():
            old.join(timeout=30)  # it wrote SUSPENDED and is running listeners and hooks
        if self.running_here:
            raise JobStateError(f"cannot resume job {self.job.label}: it is still stopping")
        with self._park_lock:
            if not self._parked:  # a cancel ended it meanwhile
                raise JobStateError(f"cannot resume job {self.job.label}: it was cancelled")
            self._parked = False
        self.set_status(JobStatus.STARTING)
        self.start(resuming=True)

    def _end_suspended_by_cancel(self) -> None:
        error = JobCancelledError(f"job {self.job.label} was cancelled")
        self.error = error
        self.lease.check_fence()  # the job belongs to the newer driver now
        self._finish(JobStatus.FAILED, error)
        self._discard_checkpoint_of_failed()
        self.done.set()

    # --- running --------------------------------------------------------------

    def _run(self, resuming: bool) -> None:
        job = self.job
        try:
            if not resuming:
                self.set_status(JobStatus.STARTING)
            if self.cancel_requested.is_set():
                raise JobCancelledError(f"job {job.label} was cancelled")
            self.services.engine.bind(job.id, f"sparkjet job {job.label}")
            if self.cancel_requested.is_set():  # arrived while the engine was starting
                raise JobCancelledError(f"job {job.label} was cancelled")
            if self.execution_start < 0:
                self.execution_start = now_ms()
                start = self.execution_start
                self.lease.write(lambda r: replace(r, execution_start_time=start))
            self.set_status(JobStatus.RUNNING)
            if self.plan.streaming:
                if self._run_stream() is StopReason.SUSPEND:
                    stop_cause = self.stream.take_stop_cause()
                    cause = stop_cause or "Requested by user"
                    by_user = stop_cause is None
                    self.lease.write(lambda r: replace(r, suspension_cause=cause))
                    self.set_status(JobStatus.SUSPENDED, cause, user_requested=by_user)
                    self._park()
                    return
            else:
                self._run_batch()
            self.execution_completion = now_ms()
            self._finish(JobStatus.COMPLETED, None)
            self.done.set()
        except BaseException as exc:
            try:
                self._failed(exc)
            except BaseException as handling:
                self._failed_to_fail(exc, handling)

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
            self._stop_fenced(self.lease.fenced or handling)  # type: ignore[arg-type]
            return
        error = JobFailedError(
            f"job {self.job.label} failed: {type(exc).__name__}: {exc}; handling that failed "
            f"too: {type(handling).__name__}: {handling}",
            getattr(exc, "stage", None),
        )
        error.__cause__ = exc
        self.error = error
        failure = Failure(self.services.redact(str(error)), error.stage, False)
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

    def _run_batch(self) -> None:
        contexts = self.context_factory()
        job = JobRun(self.plan, contexts, metrics=self.job.config.metrics_enabled)
        hooks = RunHooks(cancelled=self.cancel_requested.is_set,
                         before_commit=lambda: self.set_status(JobStatus.COMPLETING))
        try:
            self.execution = self._batch_engine(contexts).batch(job, hooks)
            self.execution.run()
        finally:
            self.plan.close_sources(contexts)

    def _batch_engine(self, contexts: Callable[[Transform], JobContext]) -> Engine:
        """Where a batch job runs: on the driver when its input is known and small (adaptive)."""
        services = self.services
        local = services.local_engine
        if local is None or not resolve_adaptive(self.job.config.adaptive_micro_batches,
                                                 services.engine_settings):
            return services.engine
        sizes = ask_sizes({
            self.plan.name(node): functools.partial(node.spec.source.estimated_size,
                                                    contexts(node))
            for node in self.plan.nodes if isinstance(node.spec, SourceSpec)})
        small, reason = choose_local(sizes, state_bytes=0, driver_holds_state=False,
                                     settings=services.engine_settings, enabled=True)
        log.debug("job %s runs %s: %s", self.job.label, "on the driver" if small else "on Spark",
                  reason)
        return local if small else services.engine

    def _checkpoint(self, record_now: bool = True) -> Checkpoint:
        """The job's checkpoint; a new one is named in the record (written now, or staged)."""
        path = checkpoint_path(self.services.records, self.lease.record)
        if path is None:
            layout = self.services.records.layout
            if self.job.config.processing_guarantee is ProcessingGuarantee.NONE:
                folder = layout.new_scratch_checkpoint()  # thrown away on restart
            else:
                folder = layout.DURABLE_CHECKPOINT
            if record_now:
                self.lease.write(lambda r: replace(r, checkpoint=folder))
            else:
                self.lease.stage(lambda r: replace(r, checkpoint=folder))
            path = layout.checkpoint(self.job.id, folder)
        return Checkpoint(self.services.store, path)

    def _discard_checkpoint(self) -> None:
        self.lease.check_fence()  # the checkpoint belongs to the newer driver now
        path = checkpoint_path(self.services.records, self.lease.record)
        if path is not None:
            Checkpoint(self.services.store, path).delete()
            self.lease.write(lambda r: replace(r, checkpoint=None))

    # --- snapshots ------------------------------------------------------------

    def export_snapshot(self, name: str, cancel_job: bool = False) -> Manifest:
        """Export the job's state as snapshot ``name``; then cancel it with ``cancel_job``.

        A running job takes the cut between two micro-batches: it pins its
        last committed batch's state and goes on running while a thread of
        its own exports that state (with ``cancel_job`` the job runs no
        batch after the cut: it exports, then ends). A suspended one exports
        here, its status SUSPENDED_EXPORTING_SNAPSHOT meanwhile. Plugins are
        told once the manifest is written.
        """
        manifest = self._export(name, cancel_job)
        self.services.plugins.snapshot_exported(
            job=self.job, name=name, manifest=manifest, cancel_job=cancel_job)
        return manifest

    def _export(self, name: str, cancel_job: bool) -> Manifest:
        """Export where the job is: beside its micro-batch loop, or here while parked."""
        self._check(Action.EXPORT_SNAPSHOT)
        manifest = self._export_parked(name, cancel_job)
        if manifest is not None:
            return manifest
        request = ExportRequest(name, cancel_job)
        exports = self.exporter.queue
        exports.ask(request)
        while not request.done.wait(0.05):
            # The loop stopped meanwhile (suspended, or the job ended): not served there.
            stopped = self.done.is_set() or (
                self.thread is not None and not self.thread.is_alive())
            if stopped and exports.withdraw(request):
                manifest = self._export_parked(name, cancel_job)
                if manifest is not None:
                    return manifest
                raise JobStateError(
                    f"snapshot {name!r} was not exported: job {self.job.label} ended "
                    f"({self.lease.status.value}) first")
        if request.error is not None:
            raise request.error
        assert request.manifest is not None
        return request.manifest

    def _export_parked(self, name: str, cancel_job: bool) -> Manifest | None:
        """Export a SUSPENDED job's state here; None if the job is not parked here."""
        with self._park_lock:
            if not self._parked or self.done.is_set():
                return None
            self.set_status(JobStatus.SUSPENDED_EXPORTING_SNAPSHOT)
        try:
            self.lease.check_fence()
            checkpoint = self._checkpoint()
            cut = self.exporter.cut(checkpoint, name, self.stream.first_offsets)
            manifest = self.exporter.export_cut(checkpoint, cut, name)
        finally:
            self.set_status(JobStatus.SUSPENDED)
        if cancel_job:
            self.cancel()
        return manifest

    def seed(self, snapshot: Snapshot) -> None:
        """Start the new job's checkpoint from ``snapshot``, at submit, before its record exists.

        See :func:`~sparkjet.core.jobs.seeding.seed_job`: a bad file refuses the submit.
        """
        checkpoint = self._checkpoint(record_now=False)
        seed_job(checkpoint, self.plan, snapshot, self.job.config, self.job.label,
                 self.context_factory())

    def _run_stream(self) -> StopReason:
        """Run the micro-batch loop (:class:`.StreamRun`) until it stops, restarting it here."""
        checkpoint = self._checkpoint()
        mine = self.exporter.queue.pins()  # a suspended job's export may still be reading
        checkpoint.clear_pins(keep=mine)  # those of exports that died with their driver
        while True:
            guarantee = self.job.config.processing_guarantee
            try:
                reason = self.stream.run(self._checkpoint())  # raises JobCancelledError
            finally:
                self.plan.close_sources(self.context_factory())
            if reason is not StopReason.RESTART:
                return reason
            log.info("job %s: restarting", self.job.label)
            self.stream.stop_request = None
            self.set_status(JobStatus.STARTING, "restart requested", user_requested=True)
            self.set_status(JobStatus.RUNNING)
            if guarantee is ProcessingGuarantee.NONE:
                self._discard_checkpoint()  # NONE restarts from scratch

    def _failed(self, exc: BaseException) -> None:
        job = self.job
        if self.lease.fenced is not None or isinstance(exc, JobFencedError):
            self._stop_fenced(self.lease.fenced or exc)  # type: ignore[arg-type]
            return
        self.execution_completion = now_ms()
        if self.cancel_requested.is_set():
            error: BaseException = JobCancelledError(f"job {job.label} was cancelled")
            error.__cause__ = exc if not isinstance(exc, JobCancelledError) else None
        elif isinstance(exc, JobFailedError):
            error = exc
        else:
            error = JobFailedError(f"job {job.label} failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
        self.services.plugins.job_error(job=job, error=error)
        cancelled = isinstance(error, JobCancelledError)
        if self.plan.streaming and job.config.suspend_on_failure and not cancelled:
            cause = self.services.redact(str(error))
            self.lease.stage(lambda r: replace(r, suspension_cause=cause))
            self.set_status(JobStatus.SUSPENDED, cause, outcome=True)
            self._park()
            return
        self.error = error
        self._finish(JobStatus.FAILED, error)
        self._discard_checkpoint_of_failed()
        self.done.set()

    def _discard_checkpoint_of_failed(self) -> None:
        """Delete a FAILED streaming job's checkpoint, as Jet deletes its snapshots.

        Only once the store holds FAILED: until then another process may find
        the driver gone and resume the job from this checkpoint. The watcher
        deletes it when it stores the record later.
        """
        if not self.plan.streaming or self.lease.unwritten is not None:
            return
        try:
            self._discard_checkpoint()
        except JobFencedError:
            raise
        except Exception:  # the job failed all the same; gc removes the folder in time
            log.exception("job %s: deleting its checkpoint failed", self.job.label)

    def _finish(self, status: JobStatus, error: BaseException | None) -> None:
        self.final_counts = self.execution.stage_counts() if self.execution is not None else {}
        cancelled = isinstance(error, JobCancelledError)
        failure = None if error is None else Failure(
            self.services.redact(str(error)), getattr(error, "stage", None), cancelled
        )
        metrics = self.metrics() if self.job.config.store_metrics_after_job_completion else None
        self.lease.stage(lambda r: replace(
            r,
            completion_time=self.execution_completion,
            execution_start_time=self.execution_start,
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
                self.services.records.release_name(self.job.name, self.job.id)
            except Exception:
                log.exception("job %s: freeing its name failed", self.job.label)

    # --- metrics --------------------------------------------------------------

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
