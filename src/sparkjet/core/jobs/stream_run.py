"""A streaming job's side of its runner: the micro-batch loop, and the answers the loop asks for.

:class:`StreamRun` runs the job's :class:`~sparkjet.core.microbatch.loop.StreamLoop`
on the job thread and is the loop's host
(:class:`~sparkjet.core.microbatch.loop.LoopHost`): between two batches it
says whether to stop (a cancel, a suspend or restart asked, or the cluster
policy suspending the job when executors are lost) and serves the snapshot
exports waiting for a cut; before each write it checks the fence; after
each committed batch it writes the job's progress into its record. It owns
what only a streaming job has: the loop's progress, the stop asked, the
cluster watch. Statuses and restarts stay the runner's (:mod:`.runner`),
the checkpoint's folder is :mod:`.checkpointing`'s.

Threads: the loop and its host run on the job thread; :attr:`stop_request`
is set by the threads asking (a handle, the watcher) and read between
batches; :meth:`progress_change` is also called by the watcher's heartbeats.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sparkjet.core.config import EngineSettings
from sparkjet.core.engine.boundary import Engine
from sparkjet.core.errors import JobCancelledError
from sparkjet.core.host.contracts import JobContext
from sparkjet.core.jobs.exporting import Exporter
from sparkjet.core.jobs.metrics import progress_metrics
from sparkjet.core.jobs.policy import ClusterWatch
from sparkjet.core.jobs.record import Change, Lease
from sparkjet.core.microbatch.loop import (
    RELIST_SECONDS,
    LoopSettings,
    StopReason,
    StreamLoop,
    StreamProgress,
    initial_offsets,
)
from sparkjet.core.model import ProcessingGuarantee
from sparkjet.core.pipeline.graph import Transform
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.state.cache import CacheOwner
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.state.export import ExportCut
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.fs import Store

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

__all__ = ["CLUSTER_CHECK_SECONDS", "StreamRun"]

log = logging.getLogger("sparkjet.jobs")

#: How often the cluster policy is asked, at most.
CLUSTER_CHECK_SECONDS = 1.0


class StreamRun:
    """Runs a streaming job's micro-batch loop in its runner, and hosts it (a ``LoopHost``)."""

    def __init__(
        self, job: Job, plan: Plan, engine: Engine, store: Store, lease: Lease,
        cancel_requested: threading.Event, exporter: Exporter,
        context_factory: Callable[[], Callable[[Transform], JobContext]],
        checkpoint: Callable[[], Checkpoint],
        engine_settings: EngineSettings | None = None,
    ) -> None:
        """``context_factory`` and ``checkpoint`` are the runner's.

        ``checkpoint`` gives the job's checkpoint, naming a new one in the
        record if it has none. ``engine_settings``: the ``[engine]`` settings
        (how often an idle loop lists its sources).
        """
        self.job, self.plan = job, plan
        self._engine, self._store, self._lease = engine, store, lease
        self._cancel_requested = cancel_requested
        self._exporter = exporter
        self._context_factory = context_factory
        self._checkpoint = checkpoint
        self._engine_settings = engine_settings or EngineSettings()
        #: What the loop reports, for the metrics and the record's ``progress``.
        self.progress = StreamProgress()
        #: The executors seen, for the auto-scaling and split-brain rules.
        self.cluster = ClusterWatch()
        #: A stop asked between micro-batches (suspend or restart).
        self.stop_request: StopReason | None = None
        self._stop_cause: str | None = None
        self._last_cluster_check = 0.0
        #: The micro-batch loop running (or last run) here.
        self._loop: StreamLoop | None = None
        #: A micro-batch committed since the record last took the progress (S3, GCS).
        self.progress_unwritten = False

    def _relist_seconds(self) -> float:
        """How often the loop lists its sources while their waits say nothing came.

        On S3 or GCS a wait says "nothing" only until its next (backed-off)
        look is due, so listing more often would undo the back-off.
        """
        if getattr(self._store, "object_store", False):
            return max(RELIST_SECONDS, self._engine_settings.idle_poll_max_seconds)
        return RELIST_SECONDS

    def run(self, checkpoint: Checkpoint) -> StopReason:
        """Run the loop on ``checkpoint`` until it stops; serve or refuse the exports left.

        Raises JobCancelledError when the job was cancelled; else says why the
        loop stopped (suspend or restart).
        """
        config = self.job.config
        trigger = 0.0 if config.processing_guarantee is ProcessingGuarantee.NONE else (
            config.snapshot_interval_millis / 1000
        )
        loop = StreamLoop(
            self.plan,
            self._engine,
            self._context_factory(),
            checkpoint,
            LoopSettings(config.metrics_enabled, trigger, config.key_groups,
                         CacheOwner(self._store, self.job.id, config.state_cache_bytes),
                         config.adaptive_micro_batches, self.job.label,
                         relist_seconds=self._relist_seconds(),
                         join_table_max_bytes=self._engine_settings.join_table_max_bytes),
            self,  # the loop's host
            self.progress,
        )
        self._loop = loop
        exports = self._exporter.queue
        try:
            reason = loop.run()
        finally:
            if self.progress_unwritten:
                # Batches committed since the last heartbeat (S3, GCS): the record
                # write that says how the loop stopped carries their progress.
                self._lease.stage(self.progress_change())
            exports.join()
        if reason is StopReason.CANCEL:
            exports.fail(f"job {self.job.label} was cancelled")
        else:
            self._serve_exports()  # asked as the loop stopped: its state is as it was
            exports.join()
        if reason is StopReason.CANCEL:
            raise JobCancelledError(f"job {self.job.label} was cancelled")
        return reason

    def ask_stop(self, reason: StopReason | None) -> None:
        """Ask the loop to stop before its next batch (None: a cancel, seen through the flag).

        The loop's pause between batches ends at once, so it looks now.
        """
        if reason is not None:
            self.stop_request = reason
        if self._loop is not None:
            self._loop.wake()

    def take_stop_cause(self) -> str | None:
        """After a suspend: why the job suspended itself (the cluster's cause), None if asked.

        The cause is taken (the next suspend starts without one) and the
        cluster watch starts over (resuming re-counts what it has).
        """
        cause, self._stop_cause = self._stop_cause, None
        self.cluster.reset()
        return cause

    def first_offsets(self) -> dict[str, Any]:
        """Where the job's first micro-batch starts (it has committed none)."""
        loop = self._loop
        if loop is not None and loop.ends:
            return dict(loop.ends)
        return initial_offsets(self.plan, self._context_factory())

    def progress_change(self) -> Change:
        """The record's ``progress`` set to the loop's metrics now, stage counts included."""
        self.progress_unwritten = False
        progress = progress_metrics(self.plan, self.progress, self.job.config.metrics_enabled,
                                    store_requests.by_kind(self.job.id))
        return lambda r: replace(r, progress=progress)

    # --- the loop's host (core.microbatch.loop.LoopHost) ----------------------------

    def between_batches(self) -> None:
        """Before each micro-batch is planned: take the cuts of exports asked meanwhile."""
        if self._exporter.queue.waiting():
            self._serve_exports()

    def cancelled(self) -> bool:
        """Whether the job was cancelled: a running micro-batch is abandoned."""
        return self._cancel_requested.is_set()

    def check_fence(self) -> None:
        """Raise JobFencedError once another driver took the job over."""
        self._lease.check_fence()

    def batch_committed(self) -> None:
        """After each committed micro-batch: its progress and stage counts into the job record.

        So other processes (``sparkjet metrics``, ``status``, a Prometheus
        scrape) read what this one does. On a local store at once; on S3 or
        GCS, where a write is a PUT and a fence check, the watcher's next
        heartbeat writes it (:attr:`progress_unwritten`), within
        :data:`~sparkjet.core.jobs.record.HEARTBEAT_SECONDS`: a busy job
        writes its record at most every 2 s, not at every micro-batch.
        """
        if getattr(self._store, "object_store", False):
            self.progress_unwritten = True
        else:
            self._lease.write(self.progress_change())

    def stop_reason(self) -> StopReason | None:
        """Why the loop should stop before its next batch (cancel, suspend, restart, cluster)."""
        if self._cancel_requested.is_set():
            return StopReason.CANCEL
        if self.stop_request is not None:
            return self.stop_request
        return self._cluster_check()

    def pinned_batch(self) -> int:
        """The newest batch an export of this job is reading, or -1 (for the loop)."""
        return self._exporter.queue.pinned_batch()

    # --- internals -----------------------------------------------------------------

    def _cluster_check(self) -> StopReason | None:
        now = time.monotonic()
        if now - self._last_cluster_check < CLUSTER_CHECK_SECONDS:
            return None
        self._last_cluster_check = now
        cause = self.cluster.check(
            self._engine.live_executors(), self.job.config, self.job.label
        )
        if cause is None:
            return None
        self._stop_cause = cause
        return StopReason.SUSPEND

    def _take_cut(self, name: str) -> tuple[Checkpoint, ExportCut]:
        self._lease.check_fence()
        checkpoint = self._checkpoint()
        return checkpoint, self._exporter.cut(checkpoint, name, self.first_offsets)

    def _serve_exports(self) -> None:
        """Take the cuts of the exports asked meanwhile (see :meth:`ExportQueue.serve`)."""
        self._exporter.queue.serve(self._take_cut, self._exporter.export_cut,
                                   self._cancel_requested.set)
