"""The runner: drives one job in this process, on the engine, while it lives here.

The job thread runs the work (a batch plan, or the micro-batch loop); a
watcher thread (:mod:`.heartbeat`) takes control requests from other
processes and refreshes the lease until the job is terminal. A streaming
job's thread ends when it is suspended and a new one starts on resume, in
this process or, after a driver died, in the process that resumes it. Every
status change goes through the transition table (:mod:`.lifecycle`), by
:mod:`.statuses`.

The runner owns the job's lifecycle: its threads, the actions asked of it
(cancel, suspend, resume, restart, an update), the work on the job thread,
and the exports asked of it. The rest has owners of its own: how the job
ends, its failures and what its run counted (:mod:`.outcome`), the
checkpoint's folder (:mod:`.checkpointing`), a streaming job's micro-batch
loop and its host (:mod:`.streaming`), snapshot exports (:mod:`.exporting`),
seeding from a snapshot at submit (:mod:`.seeding`), the metrics shown
(:mod:`.metrics`), the watcher thread's requests and heartbeats
(:mod:`.heartbeat`), the status changes and their listeners
(:mod:`.statuses`) and the engine a batch job runs on (:mod:`.batch`).

Threads and the locks between them: the job thread, the watcher, the export
threads beside the loop (:mod:`.exporting`) and those of exports other
processes ask for (:mod:`.control`). The lease's lock orders every change
and write of the record; the statuses' lock (:mod:`.statuses`) orders a
status write with the listeners registered; ``_park_lock`` guards whether a
job thread runs the work, so a cancel racing a suspend ends the job once;
the export queue's lock guards the exports waiting for a cut and the pins.
The service's registry (:mod:`.service`) has its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sparkjet.core.config import EngineSettings
from sparkjet.core.engine.boundary import Engine, JobRun, RunHooks
from sparkjet.core.errors import JobCancelledError, JobStateError
from sparkjet.core.host.contracts import JobContext
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.jobs.checkpointing import CheckpointFolder
from sparkjet.core.jobs.control import ControlDesk
from sparkjet.core.jobs.exporting import Exporter, ExportRequest
from sparkjet.core.jobs.heartbeat import Heartbeat
from sparkjet.core.jobs.lifecycle import Action, JobStatusEvent, check_action
from sparkjet.core.jobs.outcome import Outcome, Tally
from sparkjet.core.jobs.policy import ClusterWatch
from sparkjet.core.jobs.record import Change, JobRecord, Lease
from sparkjet.core.jobs.seeding import seed_job
from sparkjet.core.jobs.statuses import Statuses
from sparkjet.core.jobs.stream_run import StreamRun
from sparkjet.core.microbatch.loop import StopReason
from sparkjet.core.model import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.core.pipeline.graph import Transform
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.pipeline.services import release_services
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.state.snapshots import Manifest, Snapshot, SnapshotStore
from sparkjet.core.state.snapshots.upgrade import CheckedUpgrade
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

log = logging.getLogger("sparkjet.jobs")

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
    #: The ``[engine]`` settings (the watcher's and an idle loop's polls).
    engine_settings: EngineSettings = field(default_factory=EngineSettings)
    #: Called with a pipeline at submit, before its job exists: checks the
    #: engine can run it (a Connect server reachable, its workers ready).
    before_submit: Callable[[Any], None] | None = None


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
        #: The job's status: each change checked, stored, told to listeners and plugins.
        self.statuses = Statuses(job, self.lease, services.plugins)
        self._future_work_cancelled = False
        #: True while no job thread runs the work (not started yet, or
        #: suspended): a cancel then ends the job itself. Guarded by
        #: ``_park_lock`` so a cancel racing a suspend ends the job exactly once.
        self._parked = True
        self._park_lock = threading.Lock()
        self.thread: threading.Thread | None = None
        #: Exports the job's state as snapshots (its queue: those waiting for the loop).
        self.exporter = Exporter(job, self.plan, services.snapshots, services.engine.version)
        #: The job's checkpoint folder: named in the record, opened, deleted.
        self.folder = CheckpointFolder(services.records, services.store, self.lease, job,
                                       self.plan.streaming)
        #: A streaming job's micro-batch loop and its host (unused by a batch job).
        self.stream = StreamRun(job, self.plan, services.engine, services.store, self.lease,
                                self.cancel_requested, self.exporter, self.context_factory,
                                self._checkpoint, services.engine_settings)
        #: What the run counted (times, counts, metrics), and how the job ends.
        self.tally = Tally(job, self.plan, self.lease, self.stream)
        self.outcome = Outcome(
            job, self.plan, self.lease, self.statuses, self.tally, self.folder,
            self.cancel_requested, self.done, plugins=services.plugins, records=services.records,
            engine=services.engine, redact=services.redact, park=self._park,
        )
        #: Requests from other processes, taken by the watcher thread.
        self.control = ControlDesk(services.records, self.lease, job.label, services.redact,
                                   self.act, self.export_snapshot)
        #: The watcher thread's work: requests taken, heartbeats written.
        self.heartbeat = Heartbeat(
            job.id, job.label, self.lease, self.control,
            self.stream if self.plan.streaming else None, self.done,
            services.store.object_store, services.engine_settings,
            cancel_again=self._cancel_again, stop_fenced=self.outcome.stop_fenced,
            failed_stored=self.folder.discard_of_failed,
        )
        self.watcher = threading.Thread(
            target=self.heartbeat.run, name=f"sparkjet-watch-{job.id}", daemon=True
        )

    # --- record and status ----------------------------------------------------

    def update_record(self, change: Change) -> None:
        """Change the job's record (``lambda r: replace(r, ...)``) and write it."""
        self.lease.write(change)

    @property
    def error(self) -> BaseException | None:
        """Why the job ended, if it did not complete (see :class:`.Outcome`)."""
        return self.outcome.error

    @property
    def execution_start(self) -> int:
        """When the execution started, in ms since the epoch (-1: not yet); the tally's."""
        return self.tally.execution_start

    @execution_start.setter
    def execution_start(self, value: int) -> None:
        self.tally.execution_start = value

    def set_status(
        self, new: JobStatus, description: str | None = None, user_requested: bool = False,
        *, outcome: bool = False,
    ) -> None:
        """Change the status, store it and tell the listeners (see :meth:`.Statuses.set`)."""
        self.statuses.set(new, description, user_requested, outcome=outcome)

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
        self.statuses.add_listener(listener)

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

    def _run_counted(self, resuming: bool) -> None:
        """:meth:`_run`, its store requests counted for the job."""
        with store_requests.working_for(self.job.id):
            self._run(resuming)

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
            self.outcome.cancelled_while_suspended()

    def _cancel_again(self) -> None:
        """Cancel again if the engine did not cancel future work (the watcher repeats it)."""
        if self.cancel_requested.is_set() and not self._future_work_cancelled:
            self.cancel()

    def _park(self) -> None:
        """The job thread stops here, SUSPENDED; a cancel that came meanwhile ends the job."""
        with self._park_lock:
            if not self.cancel_requested.is_set():
                self._parked = True
                return
        self.outcome.cancelled_while_suspended()

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
            self.tally.start()
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
            self.outcome.completed()
        except BaseException as exc:
            self.outcome.failed(exc)

    def _run_batch(self) -> None:
        contexts = self.context_factory()
        job = JobRun(self.plan, contexts, metrics=self.job.config.metrics_enabled,
                     adaptive=self.job.config.adaptive_micro_batches, label=self.job.label,
                     join_table_max_bytes=self.services.engine_settings.join_table_max_bytes)
        hooks = RunHooks(cancelled=self.cancel_requested.is_set,
                         before_commit=lambda: self.set_status(JobStatus.COMPLETING))
        try:
            execution = self.tally.execution = self.services.engine.batch(job, hooks)
            execution.run()
        finally:
            self.plan.close_sources(contexts)
            release_services(self.job.id)  # those its work made in this process

    def _checkpoint(self, record_now: bool = True) -> Checkpoint:
        """The job's checkpoint (see :meth:`.CheckpointFolder.open`)."""
        return self.folder.open(record_now)

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

    def seed(self, snapshot: Snapshot, upgrade: CheckedUpgrade) -> None:
        """Start the new job's checkpoint from ``snapshot``, at submit, before its record exists.

        ``upgrade`` is what the submit's check of the upgrade rules found. See
        :func:`~sparkjet.core.jobs.seeding.seed_job`: a bad file refuses the submit.
        """
        checkpoint = self._checkpoint(record_now=False)
        seed_job(checkpoint, self.plan, snapshot, upgrade, self.job.config, self.job.label,
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
                release_services(self.job.id)  # made again by the next run's first items
            if reason is not StopReason.RESTART:
                return reason
            log.info("job %s: restarting", self.job.label)
            self.stream.stop_request = None
            self.set_status(JobStatus.STARTING, "restart requested", user_requested=True)
            self.set_status(JobStatus.RUNNING)
            if guarantee is ProcessingGuarantee.NONE:
                self.folder.discard()  # NONE restarts from scratch

    # --- metrics --------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """The job's metrics as ``Job.get_metrics()`` returns them (see :meth:`.Tally.metrics`)."""
        return self.tally.metrics()
