"""What a job handle asks of the service and the runner: the seams that keep core.jobs acyclic.

The handle (:mod:`.handle`) is made by the service and drives the runner,
while the service and the runner both hold handles. Naming those two here,
as the little the handle uses of each, lets the handle import neither: the
service (:mod:`.service`) and the runner (:mod:`.runner`) conform
structurally, and mypy checks that where the service hands itself to a
handle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from sparkjet.core.jobs.lifecycle import Action, JobStatusEvent
from sparkjet.core.jobs.record import Change, Lease
from sparkjet.core.state.snapshots import Manifest, Snapshot
from sparkjet.core.store.job_records import JobRecords


class DrivenJob(Protocol):
    """The runner driving a job in this process, as the job's handles see it."""

    @property
    def lease(self) -> Lease:
        """The driver's lease on the job's record (its live copy, and whether it was fenced)."""

    @property
    def done(self) -> threading.Event:
        """Set once the job has ended here."""

    @property
    def error(self) -> BaseException | None:
        """Why the job ended, if it did not complete (raised by ``join()``)."""

    def add_listener(self, listener: Callable[[JobStatusEvent], None]) -> None:
        """Call ``listener`` on every status change from now on."""

    def act(self, action: Action, payload: Any = None) -> None:
        """Suspend, resume, restart or update the job, as the lifecycle allows."""

    def cancel(self) -> None:
        """Cancel the job."""

    def resume(self) -> None:
        """Resume the job here (a job taken over from a dead driver)."""

    def export_snapshot(self, name: str, cancel_job: bool = False) -> Manifest:
        """Export the job's state as snapshot ``name``; returns the manifest written."""

    def update_record(self, change: Change) -> None:
        """Change the job's record (``lambda r: replace(r, ...)``) and write it."""

    def metrics(self) -> dict[str, Any]:
        """The job's metrics as ``Job.get_metrics()`` returns them."""


class Runners(Protocol):
    """The runners of this process, by job id (the service's registry)."""

    def get(self, job_id: str) -> DrivenJob | None:
        """The runner driving the job here, or None."""

    def take_over(
        self, job_id: str, then: Callable[[DrivenJob], object] | None = None,
        seen_epoch: int | None = None,
    ) -> DrivenJob:
        """Adopt the job, whose driver (at ``seen_epoch``) died, to resume or cancel it here."""


class JobHost(Protocol):
    """What a job handle asks of the jet service that made it."""

    @property
    def records(self) -> JobRecords:
        """The job records in the store."""

    @property
    def runners(self) -> Runners:
        """The runners of this process."""

    def get_snapshot(self, name: str) -> Snapshot:
        """The exported snapshot ``name``."""

    def snapshot_of(self, manifest: Manifest) -> Snapshot:
        """The snapshot an export of this process just wrote, from its manifest."""
