"""The job record: what is stored of a job, the driver's lease on it, and take-over claims.

:class:`JobRecord` is the one schema of a job's ``jobs/<id>/job.json``: every
reader and writer goes through it (the store's
:class:`~sparkjet.core.store.job_records.JobRecords` only moves its JSON).
A job's record makes it visible to every process
that shares the store. The process that drives the job holds a lease on it:
every write refreshes the record's heartbeat and names the driver (host and
pid). A record the store last saw written more than
:data:`STALE_AFTER_SECONDS` ago, or whose driver ran on this host and is
gone, belongs to a dead driver; another process may then take the job over
by winning a create-only claim for the next epoch.

Liveness trusts no machine's wall clock: the record's age is the store's own
modification time of ``job.json`` against the store's current time
(:meth:`~sparkjet.core.store.fs.Store.now`, measured with a probe file and
this process's monotonic clock). Only a filesystem without modification
times falls back to the heartbeat time the driver wrote, read against this
machine's clock.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sparkjet.core.errors import JobFencedError, StoreError
from sparkjet.core.model import JobStatus
from sparkjet.core.store.job_records import JobRecords

#: How often a driver refreshes its lease while nothing else is written.
HEARTBEAT_SECONDS = 2.0
#: A non-terminal job whose heartbeat is older than this has lost its driver.
STALE_AFTER_SECONDS = 20.0


def lease_refresh_seconds() -> float:
    """On S3 or GCS, how often a driver whose record has not changed rewrites it anyway.

    A quarter of :data:`STALE_AFTER_SECONDS` (5 s): the lease stays fresh
    through three lost writes, and an idle job's record costs a PUT and a
    fence check every 5 s instead of every :data:`HEARTBEAT_SECONDS`. On a
    local store, where writes are free, the driver writes every
    :data:`HEARTBEAT_SECONDS`.
    """
    return max(HEARTBEAT_SECONDS, STALE_AFTER_SECONDS / 4)


def now_ms() -> int:
    """Milliseconds since the epoch, as job records keep times."""
    return int(time.time() * 1000)


def new_job_id() -> str:
    """A random 64-bit id, shown as Jet shows ids: ``xxxx-xxxx-xxxx-xxxx``."""
    raw = secrets.token_hex(8)
    return "-".join(raw[i : i + 4] for i in range(0, 16, 4))


@dataclass(frozen=True)
class Driver:
    """The process that drives a job: its host and pid."""

    host: str
    pid: int

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid}

    @staticmethod
    def from_json(data: Any) -> Driver | None:
        if not isinstance(data, Mapping) or not isinstance(data.get("pid"), int):
            return None
        return Driver(str(data.get("host")), int(data["pid"]))


def this_driver() -> Driver:
    """How a record names the process that drives its job."""
    return Driver(socket.gethostname(), os.getpid())


@dataclass(frozen=True)
class Failure:
    """Why a job ended FAILED: the message (secrets masked), the stage named, a cancel."""

    message: str
    stage: str | None = None
    cancelled: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"message": self.message, "stage": self.stage, "cancelled": self.cancelled}

    @staticmethod
    def from_json(data: Any) -> Failure | None:
        if not isinstance(data, Mapping):
            return None
        stage = data.get("stage")
        return Failure(str(data.get("message", "")), str(stage) if stage is not None else None,
                       bool(data.get("cancelled", False)))


@dataclass(frozen=True)
class Answer:
    """A driver's answer to a control request from another process (kept under ``answers``)."""

    #: When it was answered, in milliseconds since the epoch (the newest answers are kept).
    time: int
    #: Why the request was refused or failed (secrets masked); None: carried out.
    error: str | None = None
    #: The batch an export's cut was taken at (an export's answer).
    batch: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"time": self.time}
        if self.batch is not None:
            data["batch"] = self.batch
        if self.error is not None:
            data["error"] = self.error
        return data

    @staticmethod
    def from_json(data: Any) -> Answer:
        data = data if isinstance(data, Mapping) else {}
        error, batch = data.get("error"), data.get("batch")
        return Answer(int(data.get("time", 0)), str(error) if error is not None else None,
                      int(batch) if batch is not None else None)


#: The record's JSON keys, in the order they are written.
_KEYS = (
    "id", "name", "status", "config", "submission_time", "completion_time",
    "execution_start_time", "user_cancelled", "kind", "driver", "stages", "heartbeat",
    "epoch", "restore", "suspension_cause", "failure", "answers", "checkpoint", "progress",
    "metrics", "sources",
)


@dataclass(frozen=True)
class JobRecord:
    """What the store keeps of a job (``jobs/<id>/job.json``): the one schema of that file.

    Change one with :func:`dataclasses.replace`; a driver writes it through
    its :class:`Lease`. Keys this version does not know are kept in
    :attr:`extra` and written back as they were.
    """

    id: str
    name: str | None = None
    status: JobStatus = JobStatus.NOT_RUNNING
    #: The job's configuration as stored: ``JobConfig.to_dict()``, arguments redacted.
    config: Mapping[str, Any] = field(default_factory=dict)
    #: Milliseconds since the epoch; -1 until known.
    submission_time: int = -1
    completion_time: int = -1
    execution_start_time: int = -1
    user_cancelled: bool = False
    #: ``"stream"`` for a streaming job, ``"batch"`` otherwise.
    kind: str = "batch"
    #: The driver that wrote the record last, and when (seconds since the epoch).
    driver: Driver | None = None
    heartbeat: float = 0.0
    stages: tuple[str, ...] = ()
    #: What each source stage reads, by stage name: the source's ``describe()``
    #: (``"stream:clicks"``); what stream retention asks of a job.
    sources: Mapping[str, str] = field(default_factory=dict)
    #: 0 from submit, one more at every take-over (see :class:`Lease`).
    epoch: int = 0
    #: What the job's initial snapshot restored (``snapshotRestore`` in its metrics).
    restore: Mapping[str, Any] | None = None
    suspension_cause: str | None = None
    failure: Failure | None = None
    #: Answers to control requests from other processes, by request id (the newest).
    answers: Mapping[str, Answer] = field(default_factory=dict)
    #: The checkpoint folder in the job's folder (None: none).
    checkpoint: str | None = None
    #: A streaming job's progress metrics, as of its last committed batch.
    progress: Mapping[str, Any] = field(default_factory=dict)
    #: All metrics of a completed job kept with ``store_metrics_after_job_completion``.
    metrics: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def streaming(self) -> bool:
        """Whether the job reads a stream."""
        return self.kind == "stream"

    @property
    def label(self) -> str:
        """How messages name the job: ``'name' (id)``, or the id of an unnamed job."""
        return f"'{self.name}' ({self.id})" if self.name else self.id

    def to_json(self) -> dict[str, Any]:
        """The record as stored (JSON-ready)."""
        data: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "status": self.status.value,
            "config": dict(self.config),
            "submission_time": self.submission_time,
            "completion_time": self.completion_time,
            "execution_start_time": self.execution_start_time,
            "user_cancelled": self.user_cancelled,
            "kind": self.kind,
            "driver": self.driver.to_json() if self.driver is not None else None,
            "stages": list(self.stages),
            "heartbeat": self.heartbeat,
            "epoch": self.epoch,
        }
        optional = {
            "restore": dict(self.restore) if self.restore is not None else None,
            "suspension_cause": self.suspension_cause,
            "failure": self.failure.to_json() if self.failure is not None else None,
            "answers": {k: v.to_json() for k, v in self.answers.items()} or None,
            "checkpoint": self.checkpoint,
            "progress": dict(self.progress) or None,
            "metrics": dict(self.metrics) if self.metrics is not None else None,
            "sources": dict(self.sources) or None,
        }
        data.update({k: v for k, v in optional.items() if v is not None})
        data.update({k: v for k, v in self.extra.items() if k not in data})
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> JobRecord:
        """A record as read from the store; missing keys take their defaults."""
        name = data.get("name")
        return JobRecord(
            id=str(data["id"]),
            name=str(name) if name is not None else None,
            status=JobStatus(data.get("status", JobStatus.NOT_RUNNING.value)),
            config=dict(data.get("config") or {}),
            submission_time=int(data.get("submission_time", -1)),
            completion_time=int(data.get("completion_time", -1)),
            execution_start_time=int(data.get("execution_start_time", -1)),
            user_cancelled=bool(data.get("user_cancelled", False)),
            kind=str(data.get("kind", "batch")),
            driver=Driver.from_json(data.get("driver")),
            heartbeat=float(data.get("heartbeat", 0.0)),
            stages=tuple(data.get("stages") or ()),
            epoch=int(data.get("epoch", 0)),
            restore=data.get("restore") or None,
            suspension_cause=data.get("suspension_cause"),
            failure=Failure.from_json(data.get("failure")),
            answers={str(k): Answer.from_json(v) for k, v in (data.get("answers") or {}).items()},
            checkpoint=data.get("checkpoint"),
            progress=dict(data.get("progress") or {}),
            metrics=data.get("metrics"),
            sources={str(k): str(v) for k, v in (data.get("sources") or {}).items()},
            extra={k: v for k, v in data.items() if k not in _KEYS},
        )


def read_record(records: JobRecords, job_id: str) -> JobRecord | None:
    """The job's record in the store, or None."""
    data = records.read(job_id)
    return JobRecord.from_json(data) if data is not None else None


def all_records(records: JobRecords) -> list[JobRecord]:
    """Every job record in the store."""
    return [JobRecord.from_json(data) for data in records.all()]


def checkpoint_path(records: JobRecords, record: JobRecord) -> str | None:
    """Where the job's checkpoint is (None: it has none); see ``JobRecords.checkpoint_path``."""
    return records.checkpoint_path({"id": record.id, "checkpoint": record.checkpoint})


def record_age(records: JobRecords, record: JobRecord) -> float:
    """Seconds since the job's record was last written, by the store's own clock.

    Where the filesystem keeps no modification times, the heartbeat time the
    driver wrote, read against this machine's clock. A record that is gone
    counts as infinitely old.
    """
    store = records.store
    try:
        written = store.modified(records.layout.job_record(record.id))
    except FileNotFoundError:
        return float("inf")
    now = store.now() if written is not None else None
    if written is None or now is None:
        return time.time() - record.heartbeat
    return now - written


def is_stale(records: JobRecords, record: JobRecord) -> bool:
    """Whether the record was last written more than :data:`STALE_AFTER_SECONDS` ago."""
    return record_age(records, record) > STALE_AFTER_SECONDS


def driver_alive(records: JobRecords, record: JobRecord) -> bool:
    """Whether the process that drives the job still does (pid on this host, record's age)."""
    driver = record.driver
    if driver is not None and driver.host == socket.gethostname():
        try:
            os.kill(driver.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return not is_stale(records, record)


#: A change to a record: ``lambda r: replace(r, status=...)`` (mypy checks the fields).
Change = Callable[[JobRecord], JobRecord]


class Lease:
    """The driver's copy of one job record; every write refreshes the lease.

    Handles of the job in this process read :attr:`record`, so they see
    changes at once; changes are applied and written under one lock, because
    the job thread and the watcher thread both write.

    Fencing: a driver holds the job at its *epoch* (0 from submit, one more
    at each take-over). Taking a job over creates ``owner-<epoch>`` with a
    create-only write, so the file ``owner-<epoch + 1>`` existing means this
    driver was judged dead and replaced. :meth:`check_fence` asks the store
    for it afresh; the record writes, the write-ahead plans and the commit
    points call it, and a fenced driver stops without writing again.
    """

    def __init__(self, records: JobRecords, record: JobRecord) -> None:
        self.records = records
        self.record = record
        self._lock = threading.Lock()
        #: Set once this driver found itself fenced off; it never writes again.
        self.fenced: JobFencedError | None = None
        #: Why the last write failed while :attr:`record` is ahead of the store (else None).
        self.unwritten: Exception | None = None
        #: When (monotonic) the record was last stored: the lease's age here.
        self.written_at = time.monotonic()

    @property
    def status(self) -> JobStatus:
        return self.record.status

    @property
    def epoch(self) -> int:
        return self.record.epoch

    def _owner_path(self, epoch: int) -> str:
        return self.records.layout.owner_claim(self.record.id, epoch)

    def check_fence(self) -> None:
        """Raise :class:`JobFencedError` if another driver took the job over from this one."""
        if self.fenced is not None:
            raise self.fenced
        newer = self.epoch + 1
        path = self._owner_path(newer)
        if not self.records.store.file_exists(path):  # one request on S3 and GCS
            return
        try:
            owner = self.records.store.read_json(path, "owner claim", check=_is_dict)
            who = f"host {owner.get('host')!r}, pid {owner.get('pid')}"
        except FileNotFoundError:
            who = "another process"
        except StoreError as exc:  # still fenced off: the claim exists, whoever made it
            who = f"another process ({exc})"
        self.fenced = JobFencedError(
            f"job {self.record.label}: this driver (epoch {self.epoch}) was fenced off: {who} "
            f"took the job over at epoch {newer}; this process stopped driving it and wrote "
            "nothing more",
            newer,
        )
        raise self.fenced

    def write(self, change: Change | None = None) -> None:
        """Apply ``change``, stamp the heartbeat and this driver, and store the record.

        The change is applied here even when storing fails (the error is
        raised, and kept in :attr:`unwritten`): the next write stores it.

        :raises JobFencedError: another driver took the job over; nothing was stored.
        """
        with self._lock:
            self.check_fence()
            record = change(self.record) if change is not None else self.record
            record = replace(record, heartbeat=time.time(), driver=this_driver())
            try:
                self.records.write(record.to_json())
            except Exception as exc:
                self.record = record
                self.unwritten = exc  # the next write stores the change along
                raise
            # Only now: a reader of ``record`` in this process (a job handle's status)
            # never sees a change that another process cannot read from the store yet.
            self.record = record
            self.unwritten = None
            self.written_at = time.monotonic()

    def stage(self, change: Change) -> None:
        """Apply ``change`` to the local copy only; the next :meth:`write` stores it."""
        with self._lock:
            self.record = change(self.record)

    def claim(self, epoch: int) -> bool:
        """Win the create-only claim on ``epoch`` (taking the job over); False if taken."""
        # The nonce tells two claimants in one process apart (see Store.create_exclusive).
        claim = {**this_driver().to_json(), "nonce": secrets.token_hex(8)}
        return self.records.store.create_exclusive(
            self._owner_path(epoch), json.dumps(claim).encode()
        )


def _is_dict(value: Any) -> None:
    """Checks an owner claim is a JSON object."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
