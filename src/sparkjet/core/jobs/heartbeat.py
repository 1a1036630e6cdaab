"""A runner's watcher thread: control requests taken, heartbeats written, an outcome stored.

While a job lives in this process its runner (:mod:`.runner`) keeps a
watcher thread, whose work is :meth:`Heartbeat.run`: until the job is done it
takes requests from other processes out of the job's control folder
(:mod:`.control`; on S3 or GCS, where each look is a billed listing, less
often), repeats a cancel for engines that cancel only running work, and
writes the job record's heartbeat (:mod:`.record`), carrying a streaming
job's progress (:mod:`.streaming`). A heartbeat fenced by a newer driver
stops the job here. After the job ended it stores the record its end left
unwritten (the store failed then), until the store takes it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from sparkjet.core.config import EngineSettings
from sparkjet.core.errors import JobFencedError
from sparkjet.core.jobs.control import ControlDesk
from sparkjet.core.jobs.record import HEARTBEAT_SECONDS, Lease, lease_refresh_seconds
from sparkjet.core.jobs.stream_run import StreamRun
from sparkjet.core.model import JobStatus
from sparkjet.core.store import requests as store_requests

log = logging.getLogger("sparkjet.jobs")

#: How often the watcher looks for control requests.
CONTROL_POLL_SECONDS = 0.25
#: On an object store (S3, GCS), where each look is a billed listing, how often
#: the watcher looks at the control folder at least (``[engine]
#: idle_poll_max_seconds`` if less).
REMOTE_CONTROL_POLL_SECONDS = 2.0


class Heartbeat:
    """The work of one runner's watcher thread, until its job is done here.

    ``stream`` is the job's stream run when the job is a streaming one (its
    progress rides on the heartbeat), else None. The runner's callbacks:
    ``cancel_again`` repeats a cancel that did not stop future work,
    ``stop_fenced`` stops the job when another driver took it over, and
    ``failed_stored`` runs once a FAILED outcome written late is stored.
    """

    def __init__(
        self, job_id: str, label: str, lease: Lease, control: ControlDesk,
        stream: StreamRun | None, done: threading.Event, object_store: bool,
        settings: EngineSettings, *, cancel_again: Callable[[], None],
        stop_fenced: Callable[[JobFencedError], None], failed_stored: Callable[[], None],
    ) -> None:
        self.job_id, self.label = job_id, label
        self.lease, self.control, self.stream, self.done = lease, control, stream, done
        self.object_store, self.settings = object_store, settings
        self._cancel_again, self._stop_fenced = cancel_again, stop_fenced
        self._failed_stored = failed_stored

    def run(self) -> None:
        """The watcher thread: requests and heartbeats, then the unwritten outcome."""
        with store_requests.working_for(self.job_id):
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
                log.debug("job %s: storing its record failed again: %s", self.label, exc)
            else:
                log.info("job %s: its record is stored (%s)", self.label, lease.status.value)
                if lease.status is JobStatus.FAILED:
                    with contextlib.suppress(JobFencedError):
                        self._failed_stored()
                return

    def _control_every(self) -> float:
        """How often the watcher takes control requests: every look, or on S3/GCS less often."""
        if not self.object_store:
            return 0.0
        return min(REMOTE_CONTROL_POLL_SECONDS,
                   max(self.settings.idle_poll_max_seconds, CONTROL_POLL_SECONDS))

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
        if not self.object_store or self.lease.unwritten is not None:
            return True
        if self.stream is not None and self.stream.progress_unwritten:
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
                # Engines that cancel only running work: repeat until the runner
                # sees the flag, so work started meanwhile stops too.
                self._cancel_again()
                if time.monotonic() - last_control >= control_every:
                    last_control = time.monotonic()
                    self.control.take()
            except Exception:
                log.exception("job %s: taking control requests failed", self.label)
            # A streaming job's heartbeat carries its progress too (a source's
            # lag changes between batches, while the job idles or works).
            if self._beat_due():
                try:
                    stream, change = self.stream, None
                    if stream is not None and stream.progress.last_committed >= 0:
                        change = stream.progress_change()
                    self.lease.write(change)
                except JobFencedError as exc:
                    self._stop_fenced(exc)
                    return
                except Exception as exc:
                    if not failing:  # once: a store that is down fails every 0.25 s
                        log.exception("job %s: heartbeat failed", self.label)
                    log.debug("job %s: heartbeat failed: %s", self.label, exc)
                    failing = True
                else:
                    if failing:
                        log.info("job %s: heartbeats are stored again", self.label)
                    failing = False
