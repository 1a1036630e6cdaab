"""The job record: what is stored of a job, the driver's lease on it, and take-over claims.

A job's record (``jobs/<id>/job.json``, kept by
:class:`~sparkjet.core.store.JobRecords`) makes it visible to every process
that shares the store. The process that drives the job holds a lease on it:
every write refreshes the record's heartbeat and names the driver (host and
pid). A record whose heartbeat is older than :data:`STALE_AFTER_SECONDS`, or
whose driver ran on this host and is gone, belongs to a dead driver; another
process may then take the job over by winning a create-only claim for the
next epoch.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from typing import Any

from sparkjet.core.errors import JobFencedError
from sparkjet.core.model import JobStatus
from sparkjet.core.store.job_records import JobRecords

#: How often a driver refreshes its lease while nothing else is written.
HEARTBEAT_SECONDS = 2.0
#: A non-terminal job whose heartbeat is older than this has lost its driver.
STALE_AFTER_SECONDS = 20.0


def now_ms() -> int:
    """Milliseconds since the epoch, as job records keep times."""
    return int(time.time() * 1000)


def new_job_id() -> str:
    """A random 64-bit id, shown as Jet shows ids: ``xxxx-xxxx-xxxx-xxxx``."""
    raw = secrets.token_hex(8)
    return "-".join(raw[i : i + 4] for i in range(0, 16, 4))


def this_driver() -> dict[str, Any]:
    """How a record names the process that drives its job."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def is_stale(record: dict[str, Any]) -> bool:
    """Whether the record's heartbeat is older than :data:`STALE_AFTER_SECONDS`."""
    return bool(time.time() - float(record.get("heartbeat", 0)) > STALE_AFTER_SECONDS)


def driver_alive(record: dict[str, Any]) -> bool:
    """Whether the process that drives the job still does (heartbeat, and pid on this host)."""
    driver = record.get("driver") or {}
    if driver.get("host") == socket.gethostname() and isinstance(driver.get("pid"), int):
        try:
            os.kill(driver["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return not is_stale(record)


class Lease:
    """The driver's copy of one job record; every write refreshes the lease.

    ``data`` is the same dict the job's handle reads in this process, so the
    handle sees changes at once; writes are serialised by one lock because
    the job thread and the watcher thread both write.

    Fencing: a driver holds the job at its *epoch* (0 from submit, one more
    at each take-over). Taking a job over creates ``owner-<epoch>`` with a
    create-only write, so the file ``owner-<epoch + 1>`` existing means this
    driver was judged dead and replaced. :meth:`check_fence` asks the store
    for it afresh; the record writes, the write-ahead plans and the commit
    points call it, and a fenced driver stops without writing again.
    """

    def __init__(self, records: JobRecords, data: dict[str, Any]) -> None:
        self.records = records
        self.data = data
        self._lock = threading.Lock()
        #: Set once this driver found itself fenced off; it never writes again.
        self.fenced: JobFencedError | None = None

    @property
    def status(self) -> JobStatus:
        return JobStatus(self.data["status"])

    @property
    def epoch(self) -> int:
        return int(self.data.get("epoch", 0))

    def _owner_path(self, epoch: int) -> str:
        return self.records.layout.owner_claim(self.data["id"], epoch)

    def check_fence(self) -> None:
        """Raise :class:`JobFencedError` if another driver took the job over from this one."""
        if self.fenced is not None:
            raise self.fenced
        newer = self.epoch + 1
        path = self._owner_path(newer)
        if not self.records.store.exists(path):
            return
        try:
            owner = json.loads(self.records.store.read_bytes(path))
            who = f"host {owner.get('host')!r}, pid {owner.get('pid')}"
        except (FileNotFoundError, ValueError):
            who = "another process"
        label = f"'{self.data['name']}' ({self.data['id']})" if self.data.get("name") else (
            self.data["id"]
        )
        self.fenced = JobFencedError(
            f"job {label}: this driver (epoch {self.epoch}) was fenced off: {who} took the "
            f"job over at epoch {newer}; this process stopped driving it and wrote nothing more",
            newer,
        )
        raise self.fenced

    def write(self, **changes: Any) -> None:
        """Apply ``changes``, stamp the heartbeat and this driver, and store the record.

        :raises JobFencedError: another driver took the job over; nothing was stored.
        """
        with self._lock:
            self.check_fence()
            self.data.update(changes)
            self.data["heartbeat"] = time.time()
            self.data["driver"] = this_driver()
            self.records.write(self.data)

    def stage(self, **changes: Any) -> None:
        """Apply ``changes`` to the local copy only; the next :meth:`write` stores them."""
        with self._lock:
            self.data.update(changes)

    def claim(self, epoch: int) -> bool:
        """Win the create-only claim on ``epoch`` (taking the job over); False if taken."""
        # The nonce tells two claimants in one process apart (see Store.create_exclusive).
        claim = {**this_driver(), "nonce": secrets.token_hex(8)}
        return self.records.store.create_exclusive(
            self._owner_path(epoch), json.dumps(claim).encode()
        )
