"""Snapshot exports of a running job: the cut, the export, and the requests waiting for the loop.

:class:`Exporter` exports one job's state: it takes the cut (the last
committed batch, pinned) and writes it as a snapshot, telling every batch
of the pin meanwhile. An export asked while a job runs waits in the
exporter's :class:`ExportQueue` until the loop takes its cut between two
micro-batches (:meth:`ExportQueue.serve`, on the loop's thread). The cut's
state is then read by a thread of its own while micro-batches go on; the
cut's *pin* (:meth:`ExportQueue.hold`) tells every batch meanwhile to keep
the files it reads. An export with ``cancel_job`` is read on the loop's
thread instead, and the job then ends, so no batch after the cut runs. A
suspended job's export runs on the asking thread (the runner's, which sets
the job's status meanwhile).

Locks: one lock guards the waiting requests and the pins, which the loop's
thread, the export threads and the asking threads all touch; the list of
export threads is touched only by the loop's thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from sparkjet.core.errors import JobStateError
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.state.export import ExportCut, cut_export, export_state, release_cut
from sparkjet.core.state.snapshots import Manifest, SnapshotStore
from sparkjet.core.store import requests as store_requests

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

log = logging.getLogger("sparkjet.jobs")

#: Takes the cut of the export named: the checkpoint and the cut at its last committed batch.
TakeCut = Callable[[str], tuple[Checkpoint, ExportCut]]
#: Exports a cut as the snapshot named; returns the manifest written.
ExportCutTo = Callable[[Checkpoint, ExportCut, str], Manifest]


@dataclass
class ExportRequest:
    """A snapshot export waiting for the micro-batch loop (between two batches)."""

    name: str
    cancel_job: bool
    done: threading.Event = field(default_factory=threading.Event)
    manifest: Manifest | None = None
    error: BaseException | None = None


class ExportQueue:
    """The exports of one running job: waiting for a cut, or reading beside the loop."""

    def __init__(self, job_id: str, label: str) -> None:
        self.job_id, self.label = job_id, label
        self._lock = threading.Lock()
        self._waiting: list[ExportRequest] = []
        #: Pins of the exports reading now (token: batch), which every batch is told of.
        self._pins: dict[str, int] = {}
        self._threads: list[threading.Thread] = []

    def ask(self, request: ExportRequest) -> None:
        """Queue ``request`` for the loop's next batch boundary."""
        with self._lock:
            self._waiting.append(request)

    def withdraw(self, request: ExportRequest) -> bool:
        """Take ``request`` back if the loop has not taken it (True); it stopped meanwhile."""
        with self._lock:
            if request in self._waiting:
                self._waiting.remove(request)
                return True
            return False

    def waiting(self) -> bool:
        """Whether an export waits for a cut."""
        return bool(self._waiting)

    def hold(self, cut: ExportCut) -> None:
        """Tell every batch from now on of ``cut``'s pin (a cut before the first batch has none)."""
        if cut.pin:
            with self._lock:
                self._pins[cut.pin] = cut.batch

    def release(self, cut: ExportCut) -> None:
        """The export of ``cut`` is over: batches may remove its files again."""
        with self._lock:
            self._pins.pop(cut.pin, None)

    def pinned_batch(self) -> int:
        """The newest batch an export is reading, or -1."""
        with self._lock:
            return max(self._pins.values(), default=-1)

    def pins(self) -> set[str]:
        """The tokens of the pins held now (a suspended job's export may still be reading)."""
        with self._lock:
            return set(self._pins)

    def serve(self, take_cut: TakeCut, export: ExportCutTo, cancel: Callable[[], None]) -> None:
        """Take the cuts of the exports asked meanwhile (the loop's thread, between two batches).

        Each is exported by a thread of its own while the loop goes on; one
        with ``cancel_job`` is exported here, then ``cancel()`` ends the job.
        """
        with self._lock:
            pending, self._waiting = self._waiting, []
        for request in pending:
            try:
                checkpoint, cut = take_cut(request.name)
            except Exception as exc:
                request.error = exc
                request.done.set()
                continue
            if request.cancel_job:
                self._export(request, export, checkpoint, cut)
                if request.error is None:
                    cancel()
                continue
            self.hold(cut)  # before the next batch is planned
            thread = threading.Thread(
                target=store_requests.carried(self._export),
                args=(request, export, checkpoint, cut), daemon=True,
                name=f"sparkjet-export-{self.job_id}")
            self._threads.append(thread)
            thread.start()

    def _export(self, request: ExportRequest, export: ExportCutTo, checkpoint: Checkpoint,
                cut: ExportCut) -> None:
        try:
            request.manifest = export(checkpoint, cut, request.name)
            log.info("job %s: exported snapshot %r at batch %d", self.label, request.name,
                     cut.batch)
        except Exception as exc:
            request.error = exc
        finally:
            request.done.set()

    def join(self) -> None:
        """Wait for the exports reading beside the loop (it stopped: nothing writes now)."""
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()

    def fail(self, why: str) -> None:
        """Refuse the exports still waiting: the loop will take no more cuts."""
        with self._lock:
            pending, self._waiting = self._waiting, []
        for request in pending:
            request.error = JobStateError(
                f"snapshot {request.name!r} was not exported: {why}; export it again")
            request.done.set()


def _sparkjet_version() -> str:
    try:
        return version("sparkjet")
    except PackageNotFoundError:  # pragma: no cover - a source checkout without metadata
        return "0.0.0"


class Exporter:
    """Exports one job's state as snapshots: takes a cut, exports it, releases its pin.

    Used on the loop's thread (the cuts :class:`ExportQueue` serves), on
    the export threads beside it, and on the thread asking while the job is
    suspended; it keeps no state of its own but the :attr:`queue`.
    """

    def __init__(self, job: Job, plan: Plan, snapshots: Callable[[], SnapshotStore],
                 engine_version: Callable[[], str]) -> None:
        self.job, self.plan = job, plan
        self._snapshots = snapshots
        self._engine_version = engine_version
        #: Snapshot exports waiting for a cut or reading beside the loop.
        self.queue = ExportQueue(job.id, job.label)

    def cut(self, checkpoint: Checkpoint, name: str,
            before_first: Callable[[], dict[str, Any]]) -> ExportCut:
        """The cut of snapshot ``name`` at the checkpoint's last committed batch, pinned.

        ``before_first`` gives the sources' offsets where the first batch
        starts, for a job that committed none.
        """
        return cut_export(checkpoint, self.plan, name, self.job.label,
                          before_first=before_first, key_groups=self.job.config.key_groups)

    def export_cut(self, checkpoint: Checkpoint, cut: ExportCut, name: str) -> Manifest:
        """Export ``cut`` as snapshot ``name`` (its pin told to every batch meanwhile)."""
        self.queue.hold(cut)
        try:
            return export_state(
                checkpoint, cut, self.plan, self._snapshots(), name,
                job_id=self.job.id, job_name=self.job.name,
                versions=(_sparkjet_version(), self._engine_version()),
            )
        finally:
            try:
                release_cut(checkpoint, cut)
            except Exception:  # the driver that next starts the job removes it
                log.exception("job %s: removing the pin of snapshot %r's export failed",
                              self.job.label, name)
            self.queue.release(cut)
