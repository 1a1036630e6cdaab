"""The runner: drives one job in this process, on the engine, while it lives here.

The job thread runs the work (a batch plan, or the micro-batch loop); a
watcher thread takes control requests from other processes and refreshes the
lease until the job is terminal. A streaming job's thread ends when it is
suspended and a new one starts on resume, in this process or, after a driver
died, in the process that resumes it. Every status change goes through the
transition table (:mod:`.lifecycle`).

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
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from sparkjet.core.checkpoint import Checkpoint
from sparkjet.core.contracts import JobContext
from sparkjet.core.dead_letters import dead_counter
from sparkjet.core.engine import BatchSpec, Engine, Execution
from sparkjet.core.errors import (
    JobCancelledError,
    JobFailedError,
    JobFencedError,
    JobStateError,
)
from sparkjet.core.event_time import NO_WATERMARK, late_counter
from sparkjet.core.exports import (
    ExportCut,
    SourceOffsets,
    UpgradeOptions,
    cut_export,
    export_state,
    release_cut,
    seed_checkpoint,
)
from sparkjet.core.graph import SinkSpec, Transform, WindowSpec
from sparkjet.core.jobs.control import ControlDesk
from sparkjet.core.jobs.exporting import ExportQueue, ExportRequest
from sparkjet.core.jobs.lifecycle import (
    Action,
    JobStatusEvent,
    check_action,
    check_transition,
)
from sparkjet.core.jobs.policy import ClusterWatch
from sparkjet.core.jobs.record import (
    HEARTBEAT_SECONDS,
    Change,
    Failure,
    JobRecord,
    Lease,
    checkpoint_path,
    now_ms,
)
from sparkjet.core.microbatch_loop import (
    LoopSettings,
    StopReason,
    StreamLoop,
    StreamProgress,
    initial_offsets,
    latest_offsets,
)
from sparkjet.core.model import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.core.planner import Plan
from sparkjet.core.plugin_manager import PluginHost
from sparkjet.core.snapshots import Manifest, Snapshot, SnapshotStore
from sparkjet.core.state_cache import CacheOwner
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

log = logging.getLogger("sparkjet.jobs")

#: How often the watcher looks for control requests.
CONTROL_POLL_SECONDS = 0.25
#: How often the cluster policy is asked, at most.
CLUSTER_CHECK_SECONDS = 1.0


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


def _sparkjet_version() -> str:
    try:
        return version("sparkjet")
    except PackageNotFoundError:  # pragma: no cover - a source checkout without metadata
        return "0.0.0"


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
        self.final_counts: dict[str, int] | None = None
        self.execution_start = -1
        self.execution_completion = -1
        self.listeners: list[Callable[[JobStatusEvent], None]] = []
        #: A stop asked between micro-batches (suspend or restart).
        self.stop_request: StopReason | None = None
        self.progress = StreamProgress()
        self.cluster = ClusterWatch()
        self._future_work_cancelled = False
        self._stop_cause: str | None = None
        self._last_cluster_check = 0.0
        #: Orders status writes with listener registration: a listener added
        #: after a status became visible never hears of that change.
        self.status_lock = threading.Lock()
        #: True while no job thread runs the work (not started yet, or
        #: suspended): a cancel then ends the job itself. Guarded by
        #: ``_park_lock`` so a cancel racing a suspend ends the job exactly once.
        self._parked = True
        self._park_lock = threading.Lock()
        self.thread: threading.Thread | None = None
        #: Snapshot exports waiting for a cut or reading beside the loop.
        self.exports = ExportQueue(job.id, job.label)
        #: Requests from other processes, taken by the watcher thread.
        self.control = ControlDesk(services.records, self.lease, job.label, services.redact,
                                   self.act, self.export_snapshot)
        #: The micro-batch loop running (or last run) here.
        self._loop: StreamLoop | None = None
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

    def start(self, resuming: bool = False) -> None:
        self.stop_request = None
        with self._park_lock:
            self._parked = False
        self.thread = threading.Thread(
            target=self._run, args=(resuming,), name=f"sparkjet-job-{self.job.id}",
            daemon=False,
        )
        self.thread.start()
        if not self.watcher.is_alive():
            self.watcher.start()

    def _watch(self) -> None:
        self._take_requests_and_beat()
        self._store_unwritten_outcome()

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

    def _take_requests_and_beat(self) -> None:
        last_beat = time.monotonic()
        failing = False
        while not self.done.wait(CONTROL_POLL_SECONDS):
            # The heartbeat has a try of its own: nothing the control folder
            # holds may stop it, or the job would be judged dead and taken over.
            try:
                if self.cancel_requested.is_set() and not self._future_work_cancelled:
                    # Engines that cancel only running work: repeat until the runner
                    # sees the flag, so work started meanwhile stops too.
                    self.cancel()
                self.control.take()
            except Exception:
                log.exception("job %s: taking control requests failed", self.job.label)
            if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                try:
                    # A streaming job's heartbeat carries its progress too (a source's
                    # lag changes between batches, while the job idles or works).
                    running = self.plan.streaming and self.progress.last_committed >= 0
                    self.lease.write(self._progress_change() if running else None)
                    last_beat = time.monotonic()
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
        self.stop_request = StopReason.SUSPEND

    def restart(self) -> None:
        self._check(Action.RESTART)
        self.stop_request = StopReason.RESTART

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
                    cause = self._stop_cause or "Requested by user"
                    by_user = self._stop_cause is None
                    self._stop_cause = None
                    self.cluster.reset()  # resuming re-counts what it has
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
        self.execution = self.services.engine.batch(BatchSpec(
            self.plan,
            self.context_factory(),
            metrics=self.job.config.metrics_enabled,
            cancelled=self.cancel_requested.is_set,
            on_commit=lambda: self.set_status(JobStatus.COMPLETING),
        ))
        self.execution.run()

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

    def _cluster_check(self) -> StopReason | None:
        now = time.monotonic()
        if now - self._last_cluster_check < CLUSTER_CHECK_SECONDS:
            return None
        self._last_cluster_check = now
        cause = self.cluster.check(
            self.services.engine.live_executors(), self.job.config, self.job.label
        )
        if cause is None:
            return None
        self._stop_cause = cause
        return StopReason.SUSPEND

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
        self.exports.ask(request)
        while not request.done.wait(0.05):
            # The loop stopped meanwhile (suspended, or the job ended): not served there.
            stopped = self.done.is_set() or (
                self.thread is not None and not self.thread.is_alive())
            if stopped and self.exports.withdraw(request):
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
            cut = self._cut(checkpoint, name)
            manifest = self._export_cut(checkpoint, cut, name)
        finally:
            self.set_status(JobStatus.SUSPENDED)
        if cancel_job:
            self.cancel()
        return manifest

    def _export_cut(self, checkpoint: Checkpoint, cut: ExportCut, name: str) -> Manifest:
        """Export ``cut`` as snapshot ``name`` (its pin told to every batch meanwhile)."""
        self.exports.hold(cut)
        try:
            return export_state(
                checkpoint, cut, self.plan, self.services.snapshots(), name,
                job_id=self.job.id, job_name=self.job.name,
                versions=(_sparkjet_version(), self.services.engine.version()),
            )
        finally:
            try:
                release_cut(checkpoint, cut)
            except Exception:  # the driver that next starts the job removes it
                log.exception("job %s: removing the pin of snapshot %r's export failed",
                              self.job.label, name)
            self.exports.release(cut)

    def _cut(self, checkpoint: Checkpoint, name: str) -> ExportCut:
        return cut_export(checkpoint, self.plan, name, self.job.label,
                          before_first=self._first_offsets, key_groups=self.job.config.key_groups)

    def _first_offsets(self) -> dict[str, Any]:
        """Where the job's first micro-batch starts (it has committed none)."""
        loop = self._loop
        if loop is not None and loop.ends:
            return dict(loop.ends)
        return initial_offsets(self.plan, self.context_factory())

    def pinned_batch(self) -> int:
        """The newest batch an export of this runner is reading, or -1 (for the loop)."""
        return self.exports.pinned_batch()

    def _take_cut(self, name: str) -> tuple[Checkpoint, ExportCut]:
        self.lease.check_fence()
        checkpoint = self._checkpoint()
        return checkpoint, self._cut(checkpoint, name)

    def _serve_exports(self) -> None:
        """Take the cuts of the exports asked meanwhile (see :meth:`ExportQueue.serve`)."""
        self.exports.serve(self._take_cut, self._export_cut, self.cancel_requested.set)

    # --- the micro-batch loop's host (core.microbatch_loop.LoopHost) -------------

    def between_batches(self) -> None:
        """Before each micro-batch is planned: take the cuts of exports asked meanwhile."""
        if self.exports.waiting():
            self._serve_exports()

    def cancelled(self) -> bool:
        """Whether the job was cancelled: a running micro-batch is abandoned."""
        return self.cancel_requested.is_set()

    def check_fence(self) -> None:
        """Raise JobFencedError once another driver took the job over."""
        self.lease.check_fence()

    def batch_committed(self) -> None:
        """After each committed micro-batch: its progress and stage counts into the job record.

        So other processes (``sparkjet metrics``, ``status``, a Prometheus
        scrape) read what this one does.
        """
        self.lease.write(self._progress_change())

    def _progress_change(self) -> Change:
        """The record's ``progress`` set to the loop's metrics now, stage counts included."""
        progress = {**self.progress.as_metrics(), "stages": self._stage_metrics()}
        return lambda r: replace(r, progress=progress)

    def stop_reason(self) -> StopReason | None:
        """Why the loop should stop before its next batch (cancel, suspend, restart, cluster)."""
        if self.cancel_requested.is_set():
            return StopReason.CANCEL
        if self.stop_request is not None:
            return self.stop_request
        return self._cluster_check()

    def seed(self, snapshot: Snapshot) -> None:
        """Start the new job's checkpoint from ``snapshot``, at submit, before its record exists.

        Each restored file is read once, checked against the manifest as it is
        copied; a bad one refuses the submit (the half-made checkpoint is
        removed), naming the file.
        """
        name = snapshot.name
        checkpoint = self._checkpoint(record_now=False)
        make = self.context_factory()
        sources = {self.plan.name(n): (n, spec) for n, spec in self.plan.sources().items()}
        offsets = SourceOffsets(
            initial=lambda stage: sources[stage][1].source.initial_offsets(
                make(sources[stage][0])),
            latest=lambda stage: latest_offsets(sources[stage][1].source,
                                                make(sources[stage][0]), None),
            partitions=lambda stage, at: list(
                sources[stage][1].source.watermark_partitions(at)),
        )
        try:
            rows = seed_checkpoint(checkpoint, self.plan, snapshot, offsets,
                                   self.job.config.key_groups,
                                   UpgradeOptions.of(self.job.config))
        except BaseException:
            checkpoint.delete()
            raise
        for row in rows:
            if row.status in ("dropped", "changed") or row.note:
                what = "source" if row.kind == "source" else "stage"
                log.warning("job %s: snapshot %r: %s %r %s%s", self.job.label, name, what,
                            row.stage, row.status, f": {row.note}" if row.note else "")
        log.info("job %s: started from snapshot %r (batch %d): %s", self.job.label, name,
                 snapshot.manifest.batch_id,
                 ", ".join(f"{r.stage} {r.status}" for r in rows) or "no stateful stages")

    def _run_stream(self) -> StopReason:
        config = self.job.config
        checkpoint = self._checkpoint()
        mine = self.exports.pins()  # a suspended job's export may still be reading
        checkpoint.clear_pins(keep=mine)  # those of exports that died with their driver
        while True:
            guarantee = config.processing_guarantee
            trigger = 0.0 if guarantee is ProcessingGuarantee.NONE else (
                config.snapshot_interval_millis / 1000
            )
            loop = StreamLoop(
                self.plan,
                self.services.engine,
                self.context_factory(),
                self._checkpoint(),
                LoopSettings(config.metrics_enabled, trigger, config.key_groups,
                             CacheOwner(self.services.store, self.job.id,
                                        config.state_cache_bytes)),
                self,  # the loop's host
                self.progress,
            )
            self._loop = loop
            try:
                reason = loop.run()
            finally:
                self.exports.join()
            if reason is StopReason.CANCEL:
                self.exports.fail(f"job {self.job.label} was cancelled")
            else:
                self._serve_exports()  # asked as the loop stopped: its state is as it was
                self.exports.join()
            if reason is StopReason.CANCEL:
                raise JobCancelledError(f"job {self.job.label} was cancelled")
            if reason is not StopReason.RESTART:
                return reason
            log.info("job %s: restarting", self.job.label)
            self.stop_request = None
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
        metrics: dict[str, Any] = {
            "executionStartTime": self.execution_start,
            "executionCompletionTime": self.execution_completion,
            "stages": self._stage_metrics(),
        }
        if self.plan.streaming:
            metrics.update(self.progress.as_metrics())
            restore = self.lease.record.restore
            if restore:
                # Which stages the job's initial snapshot restored, started empty or dropped.
                metrics["snapshotRestore"] = dict(restore)
        return metrics

    def _stage_metrics(self) -> dict[str, dict[str, int]]:
        """Each stage's counts (empty when the job's metrics are off)."""
        streaming = self.plan.streaming
        if streaming:
            counts = self.progress.stage_totals
        else:
            counts = self.final_counts or (
                self.execution.stage_counts() if self.execution is not None else {}
            )
        stages: dict[str, dict[str, int]] = {}
        if self.job.config.metrics_enabled:
            names = self.plan.names
            for node in self.plan.nodes:
                received = sum(counts.get(names[i], 0) for i in node.inputs)
                emitted = 0 if isinstance(node.spec, SinkSpec) else counts.get(names[node], 0)
                stage = {"receivedCount": received, "emittedCount": emitted}
                if streaming and names[node] in self.progress.state:
                    keys, size = self.progress.state[names[node]]
                    stage.update(snapshotKeys=keys, snapshotBytes=size)
                if streaming and names[node] in self.progress.lag:
                    stage["sourceLag"] = self.progress.lag[names[node]]
                dead = self.plan.dead_letters
                if dead is not None and names[node] in dead.stages:
                    stage["deadLetters"] = counts.get(dead_counter(names[node]), 0)
                if isinstance(node.spec, WindowSpec):
                    stage["lateEventsDropped"] = counts.get(late_counter(names[node]), 0)
                    if streaming:
                        stage["watermark"] = self.progress.watermarks.get(names[node],
                                                                          NO_WATERMARK)
                stages[names[node]] = stage
        return stages
