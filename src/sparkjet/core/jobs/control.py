"""Control requests from other processes: taken from the control folder, answered in the record.

A handle in another process asks the job's driver to act by writing a
request into the job's control folder (``JobRecords.request``) with an id;
the driver's watcher thread takes the requests every poll
(:meth:`ControlDesk.take`), carries each out through the runner, and answers
under ``answers`` in the job record (an :class:`~.record.Answer`, with an
error when the job's status refused it or it failed). An export is answered by its
own thread when it ends, so the watcher goes on beating meanwhile. Answers
are written under the lease's lock, through the lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sparkjet.core.errors import JobStateError
from sparkjet.core.jobs.lifecycle import Action
from sparkjet.core.jobs.record import Answer, JobRecord, Lease, now_ms
from sparkjet.core.state.snapshots import Manifest
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.job_records import JobRecords

log = logging.getLogger("sparkjet.jobs")

#: Answers to requests from other processes that a job record keeps (newest).
KEPT_ANSWERS = 20


def request_id(payload: Any) -> str | None:
    """The id a control request's asker waits for an answer under (None: nobody waits)."""
    request = payload.get("request") if isinstance(payload, dict) else None
    return request if isinstance(request, str) else None


class ControlDesk:
    """Takes one job's control requests, has the runner carry them out, answers them."""

    def __init__(
        self,
        records: JobRecords,
        lease: Lease,
        label: str,
        redact: Callable[[str], str],
        act: Callable[[Action, Any], None],
        export: Callable[[str, bool], Manifest],
    ) -> None:
        self.records, self.lease, self.label, self.redact = records, lease, label, redact
        #: Carries out an action here (the runner's ``act``); JobStateError when refused.
        self.act = act
        #: Exports a snapshot here (the runner's ``export_snapshot``).
        self.export = export

    def take(self) -> None:
        """Take the requests waiting in the control folder and handle each (the watcher)."""
        job_id = self.lease.record.id
        for action, payload in self.records.take_requests_with_payload(job_id):
            self.handle(action, payload)

    def handle(self, action: str, payload: Any) -> None:
        """Carry out one request and answer it (an export: on a thread of its own)."""
        try:
            chosen = Action(action)
        except ValueError:
            log.warning("job %s: ignoring unknown request %r", self.label, action)
            return
        request = request_id(payload)
        if chosen is Action.EXPORT_SNAPSHOT:
            # Not on the watcher's thread: it must go on beating while the export runs.
            threading.Thread(target=store_requests.carried(self._export), args=(payload,),
                             daemon=True, name=f"sparkjet-export-{self.lease.record.id}").start()
            return
        try:
            self.act(chosen, payload)
        except JobStateError as exc:
            log.warning("job %s: %s", self.label, exc)
            self.answer(request, error=str(exc))
            return
        except Exception as exc:  # e.g. a configuration the driver cannot read
            log.exception("job %s: the %s request failed", self.label, chosen.value)
            self.answer(request, error=f"{type(exc).__name__}: {exc}")
            return
        self.answer(request)

    def _export(self, payload: Any) -> None:
        """An export asked by another process; its result goes into the job record."""
        request = request_id(payload)
        try:
            name, cancel_job = payload["name"], bool(payload["cancel_job"])
        except (TypeError, KeyError):
            log.warning("job %s: ignoring a malformed export request %r", self.label, payload)
            self.answer(request, error=f"malformed export request {payload!r}")
            return
        try:
            batch = self.export(str(name), cancel_job).batch_id
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("job %s: export of snapshot %r asked by another process failed: %s",
                        self.label, name, self.redact(error))
            self.answer(request, error=error)
        else:
            self.answer(request, batch=batch)

    def answer(self, request: str | None, error: str | None = None,
               batch: int | None = None) -> None:
        """Record the answer to request ``request`` (None: nobody waits for one)."""
        if request is None:
            return
        entry = Answer(now_ms(), self.redact(error) if error is not None else None, batch)

        def answered(record: JobRecord) -> JobRecord:
            answers = {**record.answers, request: entry}
            kept = sorted(answers, key=lambda r: answers[r].time)[-KEPT_ANSWERS:]
            return replace(record, answers={r: answers[r] for r in kept})

        try:
            self.lease.write(answered)  # read and written under the lease's lock
        except Exception:
            log.exception("job %s: recording the answer to request %s failed", self.label,
                          request)
