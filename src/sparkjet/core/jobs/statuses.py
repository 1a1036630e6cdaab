"""A job's status as its runner changes it: checked, stored in the record, told.

Every status change of a job driven here goes through :class:`Statuses`:
the move is checked against the transition table (:mod:`.lifecycle`),
written to the job's record through the driver's lease (:mod:`.record`),
then told to the listeners the job's handles registered and to plugins
(``on_job_status_changed``). The change that says how the job ended or
stopped holds even when the store fails at that moment: the runner's watcher
(:mod:`.heartbeat`) writes it once the store takes it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from sparkjet.core.errors import JobFencedError
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.jobs.lifecycle import JobStatusEvent, check_transition
from sparkjet.core.jobs.record import HEARTBEAT_SECONDS, Change, Lease
from sparkjet.core.model import JobStatus

if TYPE_CHECKING:
    from sparkjet.core.jobs.handle import Job

log = logging.getLogger("sparkjet.jobs")


class Statuses:
    """The status of one job driven in this process: its changes and their listeners."""

    def __init__(self, job: Job, lease: Lease, plugins: PluginHost) -> None:
        self.job, self.lease, self.plugins = job, lease, plugins
        self.listeners: list[Callable[[JobStatusEvent], None]] = []
        #: Orders status writes with listener registration: a listener added
        #: after a status became visible never hears of that change.
        self.lock = threading.Lock()

    def add_listener(self, listener: Callable[[JobStatusEvent], None]) -> None:
        """Call ``listener`` on every status change from now on."""
        with self.lock:
            self.listeners.append(listener)

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

    def set(
        self, new: JobStatus, description: str | None = None, user_requested: bool = False,
        *, outcome: bool = False,
    ) -> None:
        """Change the status, store it and tell the listeners.

        With ``outcome`` (how the job ended or stopped) a store that fails
        does not stop it: see :meth:`record_outcome`.
        """
        with self.lock:
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
        self.plugins.job_status_changed(job=self.job, old_status=old, new_status=new)
