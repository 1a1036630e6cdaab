"""Persistence of job records, job-name locks and control requests in the store.

A job's record is ``job.json`` in its folder, a JSON object read and written
whole; what its fields mean belongs to :mod:`sparkjet.core.jobs.record`. Names
are claimed by a create-only lock file, one active job per name across
processes. Control requests are files another process drops in the job's
control folder for the job's driver to take. Every path comes from the
store's :class:`~sparkjet.core.store.layout.StoreLayout`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store.fs import Store
from sparkjet.core.store.layout import StoreLayout
from sparkjet.core.store.naming import json_loads

log = logging.getLogger("sparkjet.store")


class JobRecords:
    """Job records (``jobs/<id>/job.json``), name locks and each job's control requests."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def layout(self) -> StoreLayout:
        """Where the jobs' files lie in the store."""
        return self.store.layout

    def write(self, record: dict[str, Any]) -> None:
        """Store ``record`` as its job's record (readers see the old or the new one whole)."""
        self.store.write_bytes(
            self.layout.job_record(record["id"]),
            json.dumps(record, indent=1, sort_keys=True).encode(),
        )

    def read(self, job_id: str) -> dict[str, Any] | None:
        """The job's record, or None; StoreError naming the file if it does not parse."""
        path = self.layout.job_record(job_id)
        def of_this_job(record: Any) -> None:
            if not isinstance(record, dict) or record.get("id") != job_id:
                raise ValueError(f"not the record of job {job_id}")

        try:
            record: dict[str, Any] = self.store.read_json(path, "job record", check=of_this_job)
        except FileNotFoundError:
            return None
        return record

    def ids(self) -> list[str]:
        """The ids of every job with a folder in the store."""
        return [self.layout.name_of(n) for n in self.store.listdir(self.layout.jobs)]

    def all(self) -> list[dict[str, Any]]:
        """Every readable record; a corrupt one is logged (naming its file) and skipped."""
        out = []
        for job_id in self.ids():
            try:
                record = self.read(job_id)
            except StoreError as exc:
                log.warning("skipping a job: %s", exc)
                continue
            if record is not None:
                out.append(record)
        return out

    def checkpoint_path(self, record: dict[str, Any]) -> str | None:
        """The checkpoint folder a record names, checked to be one of the job's own.

        The field is read from a file anyone with write access to the store can
        edit; a value that is not ``checkpoint`` or ``scratch-<hex>`` is refused,
        so no crafted record steers a recursive delete outside the job's folder.
        """
        folder = record.get("checkpoint")
        if folder is None:
            return None
        if not isinstance(folder, str) or not self.layout.is_checkpoint_folder(folder):
            raise StoreError(self.store.redact(
                f"job {record.get('id')!r}: its record's checkpoint field {folder!r} is not a "
                "checkpoint folder of the job ('checkpoint' or 'scratch-<hex>'); refusing to "
                "use it (was the record edited?)"
            ))
        return self.layout.checkpoint(str(record["id"]), folder)

    # Names: one active job per name, across processes, by a create-only lock file.

    def claim_name(self, name: str, job_id: str) -> str | None:
        """Take ``name`` for ``job_id``; returns the holder's id if another job has it."""
        path = self.layout.name_lock(name)
        if self.store.create_exclusive(path, job_id.encode()):
            return None
        try:
            return self.store.read_bytes(path).decode()
        except FileNotFoundError:  # released meanwhile: try once more
            return None if self.store.create_exclusive(path, job_id.encode()) else "unknown"

    def release_name(self, name: str, job_id: str) -> None:
        """Give ``name`` up if ``job_id`` holds it."""
        path = self.layout.name_lock(name)
        try:
            if self.store.read_bytes(path).decode() == job_id:
                self.store.remove(path)
        except FileNotFoundError:
            pass

    # Control requests: another process asks the job's driver to act.

    def request(self, job_id: str, action: str, payload: Any = None) -> None:
        """Ask the driver of ``job_id`` to do ``action`` (with ``payload``)."""
        path = self.layout.control_request(job_id, action, time.time_ns())
        self.store.write_bytes(path, json.dumps({"action": action, "payload": payload}).encode())

    def take_requests_with_payload(self, job_id: str) -> list[tuple[str, Any]]:
        """Take (read and delete) the job's pending control requests, oldest first.

        A file that does not parse is moved to ``control/quarantine/`` and
        logged with its name; it never stops the driver from taking the rest.
        """
        taken = []
        for entry in self.store.listdir(self.layout.control(job_id)):
            if not self.layout.is_control_request(entry):
                continue
            path = self.layout.control_file(job_id, entry)
            try:
                raw = self.store.read_bytes(path)
            except FileNotFoundError:
                continue  # taken meanwhile

            def names_its_action(request: Any, entry: str = entry) -> None:
                action = self.layout.control_action(entry)
                if not isinstance(request, dict) or request.get("action") != action:
                    raise ValueError("its action does not match its name")

            try:
                request = self.store.decode(path, raw, json_loads, "control request",
                                            check=names_its_action)
            except StoreError as exc:
                self.store.move(path, self.layout.quarantined(job_id, entry))
                log.warning(
                    "job %s: control request %r does not parse (%s); moved to %s/",
                    job_id, path, exc, self.layout.quarantine(job_id),
                )
                continue
            taken.append((request["action"], request.get("payload")))
            self.store.remove(path)
        return taken

    def take_requests(self, job_id: str) -> list[str]:
        """Take the job's pending control requests, oldest first: their actions only."""
        return [action for action, _ in self.take_requests_with_payload(job_id)]
