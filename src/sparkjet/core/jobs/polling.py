"""A job handle's waits, polled: for a status, for status changes, for its driver's answer.

A handle reads its job's status every :data:`REMOTE_POLL_SECONDS` while it
waits for one, and, in a process that does not drive the job, to tell its
status listeners of each change. It asks a driver in another process to act
by writing a request, with an id, into the job's control folder (taken there
by :mod:`.control`), then reads the job record until the driver's answer
appears under ``answers``, the driver dies, another process takes the job
over, or the job ends. :class:`Polling` does this for one handle, through
what the handle gives it: its record read afresh, whether a record's driver
lives, its status and its failure.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sparkjet.core.errors import JobStateError, TimeoutException
from sparkjet.core.jobs.lifecycle import Action, JobStatusEvent
from sparkjet.core.jobs.record import Answer, JobRecord, now_ms
from sparkjet.core.model import JobStatus
from sparkjet.core.store.job_records import JobRecords

#: How long a driver in another process may take to answer a control request.
REQUEST_TIMEOUT_SECONDS = 60.0
#: How long a handle still waits for an answer once the job's record shows it ended.
ANSWER_AFTER_END_SECONDS = 3.0

log = logging.getLogger("sparkjet.jobs")

#: How often a handle in another process reads the job's record while it waits.
REMOTE_POLL_SECONDS = 0.2


class Polling:
    """One job handle's polled waits, and its requests to the job's driver elsewhere."""

    def __init__(
        self, records: JobRecords, job_id: str, label: str, *,
        refresh: Callable[[], JobRecord], alive: Callable[[JobRecord], bool],
        status: Callable[[], JobStatus], failure: Callable[[], str | None],
    ) -> None:
        self.records = records
        self.job_id = job_id
        #: How messages name the job.
        self.label = label
        #: The handle's record, read afresh (and kept by the handle).
        self.refresh = refresh
        #: Whether the driver a record names is alive.
        self.alive = alive
        #: The handle's status (a dead driver's job counted as it should be) and failure.
        self.status = status
        self.failure = failure

    def until(self, wanted: tuple[JobStatus, ...], timeout: float | None, missed: str) -> JobStatus:
        """Wait until the status is one of ``wanted`` or terminal; return it.

        :raises TimeoutException: ``timeout`` seconds passed first (the
            message says the job ``missed`` and names its status then).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status in wanted or status.is_terminal():
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutException(
                    f"job {self.label} {missed} within {timeout:g} s (status {status.value})"
                )
            time.sleep(REMOTE_POLL_SECONDS)

    def listen(self, listener: Callable[[JobStatusEvent], None]) -> None:
        """Call ``listener`` on every later status change, from a daemon thread that polls."""
        threading.Thread(
            target=self._poll_status, args=(listener,), daemon=True,
            name=f"sparkjet-listen-{self.job_id}",
        ).start()

    def _poll_status(self, listener: Callable[[JobStatusEvent], None]) -> None:
        last = self.status()
        while not last.is_terminal():
            time.sleep(REMOTE_POLL_SECONDS)
            now = self.status()
            if now is not last:
                try:
                    listener(JobStatusEvent(last, now, self.failure(), False))
                except Exception:
                    log.exception("a status listener of job %s failed", self.label)
                last = now

    def ask(self, action: Action, epoch: int, payload: dict[str, Any] | None = None,
            timeout: float | None = None, what: str | None = None,
            refused: Callable[[str], Exception] = JobStateError) -> Answer | None:
        """Ask the job's live driver in another process to act; returns its answer.

        The request goes into the job's control folder with an id, and the
        driver answers under ``answers`` in the job record. ``epoch``: the
        epoch of the driver the handle saw last. Returns None if the driver
        died before it answered (the caller may act itself now).

        :raises JobStateError: another process took the job over meanwhile.
        :raises Exception: ``refused(reason)`` (default :class:`JobStateError`)
            when the driver answered with an error (the job's status did not
            allow it, or the action failed there).
        :raises TimeoutException: no answer within ``timeout`` seconds
            (default :data:`REQUEST_TIMEOUT_SECONDS`).
        """
        what = what or f"the {action.value} request"
        request = uuid.uuid4().hex
        self.records.request(self.job_id, action, {**(payload or {}), "request": request})
        wait = REQUEST_TIMEOUT_SECONDS if timeout is None else timeout
        deadline = time.monotonic() + wait
        ended_at: float | None = None
        while True:
            record = self.refresh()
            answer = record.answers.get(request)
            if answer is not None:
                if answer.error is not None:
                    raise refused(answer.error)
                return answer
            if record.epoch != epoch:
                raise JobStateError(
                    f"job {self.label}: another process took the job over before its driver "
                    f"answered {what}; ask again")
            status = record.status
            if status.is_terminal():
                # A driver answers after acting; an ended job's driver takes no more requests.
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > ANSWER_AFTER_END_SECONDS:
                    if action is Action.CANCEL:
                        return Answer(now_ms())
                    raise JobStateError(
                        f"job {self.label} ended ({status.value}) before its driver answered "
                        f"{what}")
            elif not self.alive(record):
                return None
            if time.monotonic() > deadline:
                raise TimeoutException(
                    f"job {self.label}: its driver (pid "
                    f"{record.driver.pid if record.driver else None}) did not answer {what} "
                    f"within {wait:g} s")
            time.sleep(REMOTE_POLL_SECONDS)
