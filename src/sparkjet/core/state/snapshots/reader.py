"""Reading a complete snapshot: :class:`Snapshot`, every read checked against its manifest."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import json
from collections.abc import Iterator
from typing import Any, Protocol

from sparkjet.core.errors import (
    SnapshotCorruptedError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotReplacedError,
)
from sparkjet.core.host.contracts import SnapshotBackend
from sparkjet.core.pipeline.event_time import EventTime
from sparkjet.core.state.snapshots.format import EVENT_TIME_FILE
from sparkjet.core.state.snapshots.manifest import FileEntry, Manifest
from sparkjet.core.state.snapshots.names import MANIFEST, snapshot_folder
from sparkjet.core.store.fs import is_temp_file
from sparkjet.core.store.naming import loads

#: Reading a file or a checksum in pieces of this size.
CHUNK_SIZE = 1 << 20


class SnapshotFiles(Protocol):
    """What a :class:`Snapshot` reads through: its store's backend (``SnapshotStore``)."""

    @property
    def backend(self) -> SnapshotBackend:
        """The backend holding the snapshot's files."""

    def backend_errors(self, action: str, path: str) -> contextlib.AbstractContextManager[None]:
        """Turns the backend's errors into SnapshotBackendError naming ``action`` and ``path``."""

    def path_exists(self, path: str) -> bool:
        """Whether the backend has a file at ``path``."""

    def list_files(self, prefix: str) -> builtins.list[str]:
        """Every file under ``prefix``."""

    def delete(self, name: str) -> bool:
        """Delete snapshot ``name``."""


class Snapshot:
    """A complete snapshot in a backend: Jet's ``JobStateSnapshot`` fields and its manifest.

    Every read checks the file's size and sha256 against the manifest; a
    snapshot that is not whole and intact is refused with an error naming
    the snapshot and the file, never read in part.
    """

    def __init__(self, store: SnapshotFiles, manifest: Manifest) -> None:
        self._store = store
        #: The manifest, as read and checked.
        self.manifest = manifest

    # Jet's JobStateSnapshot
    @property
    def name(self) -> str:
        """The snapshot's name."""
        return self.manifest.name

    @property
    def creation_time(self) -> int:
        """When it was taken, in milliseconds since the epoch."""
        return self.manifest.creation_time

    @property
    def job_id(self) -> str:
        """The id of the job it was taken of."""
        return self.manifest.job_id

    @property
    def job_name(self) -> str | None:
        """The name of that job, or None."""
        return self.manifest.job_name

    @property
    def payload_size(self) -> int:
        """The size of its data in bytes."""
        return self.manifest.payload_size

    @property
    def attempt(self) -> str:
        """The export (attempt folder) this snapshot is."""
        return self.manifest.attempt

    @property
    def folder(self) -> str:
        """The attempt's folder in the backend (relative to its root)."""
        return f"{snapshot_folder(self.name)}/{self.attempt}"

    def path(self, relpath: str) -> str:
        """Where the data file ``relpath`` lies in the backend."""
        return f"{self.folder}/{relpath}"

    def __repr__(self) -> str:
        return (
            f"Snapshot(name={self.name!r}, job_name={self.job_name!r}, "
            f"creation_time={self.creation_time}, payload_size={self.payload_size})"
        )

    def _entry(self, relpath: str) -> FileEntry:
        entry = self.manifest.file(relpath)
        if entry is None:
            raise SnapshotCorruptedError(
                f"snapshot {self.name!r}: file {relpath!r} is not in its manifest", self.name,
                relpath,
            )
        return entry

    def _missing(self, relpath: str) -> SnapshotError:
        """The error for a file that is gone: replaced with the snapshot, or lost."""
        if not self._store.path_exists(f"{self.folder}/{MANIFEST}"):
            return SnapshotReplacedError(
                f"snapshot {self.name!r} (attempt {self.attempt}) was replaced by a newer "
                f"export or deleted while file {relpath!r} was being read: get it again",
                self.name, relpath,
            )
        return SnapshotCorruptedError(
            f"snapshot {self.name!r}: file {relpath!r} named by its manifest is missing from "
            f"{self._store.backend.describe()}", self.name, relpath,
        )

    def _check(self, entry: FileEntry, size: int, sha256: str) -> None:
        where = f"snapshot {self.name!r}: file {entry.path!r}"
        if size < entry.size:
            raise SnapshotCorruptedError(
                f"{where} is truncated: {size} of {entry.size} bytes", self.name, entry.path
            )
        if size > entry.size:
            raise SnapshotCorruptedError(
                f"{where} is longer than its manifest says: {size} bytes, not {entry.size}",
                self.name, entry.path,
            )
        if not hmac.compare_digest(sha256, entry.sha256):
            raise SnapshotCorruptedError(
                f"{where} does not match its checksum (sha256 {sha256}, manifest says "
                f"{entry.sha256})", self.name, entry.path,
            )

    def event_time(self) -> EventTime | None:
        """Event time at the cut: sources' highest timestamps, windowed stages' watermarks.

        None when the job had none (no timestamped source).
        """
        if self.manifest.file(EVENT_TIME_FILE) is None:
            return None
        data = self.read_file(EVENT_TIME_FILE)
        try:
            return EventTime.from_json(json.loads(data))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise SnapshotCorruptedError(
                f"snapshot {self.name!r}: {EVENT_TIME_FILE} cannot be read "
                f"({type(exc).__name__}: {exc})", self.name, EVENT_TIME_FILE,
            ) from None

    def read_file(self, relpath: str) -> bytes:
        """The data file ``relpath``, after checking its size and sha256 against the manifest."""
        entry = self._entry(relpath)
        try:
            with self._store.backend_errors("read", self.path(relpath)):
                data = self._store.backend.read_bytes(self.path(relpath))
        except FileNotFoundError:
            raise self._missing(relpath) from None
        self._check(entry, len(data), hashlib.sha256(data).hexdigest())
        return data

    def read_chunks(self, relpath: str, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """The data file ``relpath`` in chunks, checked when the last one has been read.

        The check raises after the last chunk, so use what was read only once
        the iterator has finished without an error.
        """
        entry = self._entry(relpath)
        path = self.path(relpath)
        digest, size = hashlib.sha256(), 0
        try:
            with self._store.backend_errors("read", path):
                chunks = self._store.backend.read_chunks(path, chunk_size)
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    if size > entry.size:
                        break  # stop reading a file that is longer than it should be
                    yield chunk
        except FileNotFoundError:
            raise self._missing(relpath) from None
        self._check(entry, size, digest.hexdigest())

    def check_listing(self) -> None:
        """Check the attempt folder holds exactly the manifest and the files it names."""
        listed = {
            p[len(self.folder) + 1 :]
            for p in self._store.list_files(self.folder)
            if not is_temp_file(p)  # a write landing this moment (a local folder's)
        }
        if MANIFEST not in listed:
            raise SnapshotReplacedError(
                f"snapshot {self.name!r} (attempt {self.attempt}) was replaced by a newer "
                "export or deleted while it was being checked: get it again", self.name,
            )
        named = {f.path for f in self.manifest.all_files()}
        for path in sorted(named - listed):
            raise self._missing(path)
        for path in sorted(listed - named - {MANIFEST}):
            raise SnapshotCorruptedError(
                f"snapshot {self.name!r}: file {path!r} is in its folder but not in its "
                "manifest", self.name, path,
            )

    def verify(self) -> None:
        """Check the whole snapshot: no file missing or extra, every size and sha256 right."""
        self.check_listing()
        for entry in self.manifest.all_files():
            for _ in self.read_chunks(entry.path):
                pass

    def destroy(self) -> None:
        """Delete this snapshot's name from the backend (Jet's ``destroy()``)."""
        self._store.delete(self.name)

    def _unpickled(self, relpath: str) -> Any:
        """The state file ``relpath`` (checked against the manifest) unpickled.

        A file that matches its checksum but does not unpickle (written
        damaged) is a :class:`SnapshotCorruptedError` naming it.
        """
        raw = self.read_file(relpath)
        try:
            data = loads(raw)
            data["values"].items()
        except MemoryError:
            raise
        except Exception as exc:
            raise SnapshotCorruptedError(
                f"snapshot {self.name!r}: file {relpath!r} is corrupt or truncated "
                f"({len(raw)} bytes) in {self._store.backend.describe()}: "
                f"{type(exc).__name__}: {exc}", self.name, relpath,
            ) from exc
        return data

    def read_state(self, stage: str) -> dict[Any, Any]:
        """A stateful stage's state at the cut, for analysis: ``{key: state}``.

        The state is what the stage keeps per key: an aggregation's
        accumulator (before ``finish``), a ``map_stateful``'s or a plugin
        transform's state object, ``True`` for ``distinct``. Every file is
        checked against the manifest first. Unpickles: a snapshot is trusted
        input (see the trust model in the docs).
        """
        entry = self.manifest.stage(stage)
        if entry is None:
            known = ", ".join(repr(s.name) for s in self.manifest.stages) or "none"
            raise SnapshotNotFoundError(
                f"snapshot {self.name!r} holds no state of stage {stage!r} (its stateful "
                f"stages: {known})", self.name)
        out: dict[Any, Any] = {}
        for file in entry.files:
            data = self._unpickled(file.path)
            for key, value in data["values"].items():
                out[key] = value[1] if isinstance(value, tuple) and len(value) == 2 else value
        return out


