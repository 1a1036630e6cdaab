"""Named snapshots in one backend: attempts, the manifest written last, replace, gc, copy."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Iterable, Iterator
from typing import Any, TypeAlias

from sparkjet.core.errors import (
    ConfigError,
    SnapshotBackendError,
    SnapshotCorruptedError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotNotFoundError,
    SnapshotSignatureError,
    SparkjetError,
)
from sparkjet.core.host.contracts import SnapshotBackend
from sparkjet.core.state.snapshots.manifest import (
    FORMAT_VERSION,
    FileEntry,
    Manifest,
    ManifestFields,
    StageManifest,
    decode_manifest,
    encode_manifest,
    json_value,
    plan_files,
)
from sparkjet.core.state.snapshots.names import (
    ATTEMPT,
    MANIFEST,
    attempt_start,
    now_ms,
    snapshot_folder,
    snapshot_name,
)
from sparkjet.core.state.snapshots.reader import CHUNK_SIZE, Snapshot

log = logging.getLogger("sparkjet.snapshots")

#: Attempts without a manifest younger than this are never collected (seconds).
DEFAULT_GC_AGE_SECONDS = 3600.0
#: How often a reader lists a name again when attempts come and go under it.
_RESOLVE_TRIES = 10
#: File contents: the bytes, or an iterable of chunks of bytes (for large files).
FileData: TypeAlias = "bytes | bytearray | memoryview | Iterable[bytes]"


class _Source:
    """The chunks of one file being exported: counted, hashed, and the caller's errors marked."""

    def __init__(self, data: Iterable[Any], name: str, path: str) -> None:
        self.data = data
        self.name, self.path = name, path
        self.hash = hashlib.sha256()
        self.size = 0
        #: An error raised by the caller's iterable (propagated as it is, never blamed on storage).
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[bytes]:
        iterator = iter(self.data)
        while True:
            try:
                chunk = next(iterator)
            except StopIteration:
                return
            except BaseException as exc:
                self.error = exc
                raise
            if not isinstance(chunk, bytes | bytearray | memoryview):
                self.error = SnapshotError(
                    f"snapshot {self.name!r}: file {self.path!r} yielded a "
                    f"{type(chunk).__name__}, expected bytes", self.name, self.path,
                )
                raise self.error
            chunk = bytes(chunk)
            self.hash.update(chunk)
            self.size += len(chunk)
            yield chunk



class SnapshotStore:
    """Named snapshots in one :class:`~sparkjet.plugin.SnapshotBackend`.

    Runs on the driver. Safe to use from several threads and processes at
    once: exports of one name race by attempt, and readers see one whole
    snapshot per name (see the module's documentation).

    :param backend: where the snapshots are kept.
    :param signing_key: with a key, every manifest written is signed and every
        manifest read must carry a matching signature; without one, a signed
        manifest is refused.
    """

    def __init__(self, backend: SnapshotBackend, signing_key: str | bytes | None = None) -> None:
        if not isinstance(backend, SnapshotBackend):
            raise TypeError(f"expected a SnapshotBackend, got {type(backend).__name__}")
        if isinstance(signing_key, str):
            signing_key = signing_key.encode("utf-8")
        if signing_key is not None and not signing_key:
            raise ConfigError("[snapshots] signing_key is empty: give a key, or leave it unset")
        #: The backend the snapshots are kept in.
        self.backend = backend
        self._key: bytes | None = signing_key

    @property
    def signed(self) -> bool:
        """Whether this store signs what it writes and requires signatures on what it reads."""
        return self._key is not None

    def __repr__(self) -> str:
        return f"SnapshotStore({self.backend!r}, signed={self.signed})"

    # --- backend calls: errors name the backend, never a secret --------------------------

    @contextlib.contextmanager
    def backend_errors(self, action: str, path: str) -> Iterator[None]:
        """Any failure of a (maybe third-party) backend becomes a SnapshotBackendError."""
        try:
            yield
        except (FileNotFoundError, SparkjetError):
            raise
        except Exception as exc:
            raise SnapshotBackendError(
                self.backend.redact(f"{self.backend.describe()}: cannot {action} {path!r}: "
                                    f"{exc!r}")
            ) from exc

    def path_exists(self, path: str) -> bool:
        with self.backend_errors("check", path):
            return self.backend.exists(path)

    def list_files(self, prefix: str) -> builtins.list[str]:
        with self.backend_errors("list", prefix):
            return self.backend.list(prefix)

    def _children(self, prefix: str) -> builtins.list[str]:
        with self.backend_errors("list", prefix):
            return self.backend.list_children(prefix)

    def _delete(self, path: str) -> None:
        with self.backend_errors("delete", path):
            self.backend.delete(path)

    def _attempts(self, folder: str) -> builtins.list[str]:
        """The attempt folders under a name, oldest first."""
        return sorted(a for a in self._children(folder) if ATTEMPT.match(a))

    def _remove_attempt(self, path: str) -> None:
        """Unpublish an attempt (its manifest first), then delete its files."""
        self._delete(f"{path}/{MANIFEST}")
        self._delete(path)

    # --- writing -------------------------------------------------------------------------

    def write(
        self,
        name: str,
        fields: ManifestFields,
        files: Iterable[tuple[str, FileData]],
        *,
        read_back: bool = False,
    ) -> Manifest:
        """Export a snapshot named ``name``: the files, then its manifest; replaces ``name``.

        :param fields: what the manifest says about the snapshot (the files'
            checksums and sizes are computed here).
        :param files: ``(relpath, data)`` for every file ``fields`` names,
            in any order; ``data`` is bytes or an iterable of chunks of bytes.
        :param read_back: read every file back and check its checksum before
            publishing (copies do).
        :returns: the manifest written.

        Until the manifest exists nothing of this export is visible, and an
        error (also one raised by ``files``, which propagates as it is)
        leaves the name's previous snapshot as it was.
        """
        folder = snapshot_folder(name)
        owners = plan_files(name, fields)
        sources = {
            source: json_value(offsets, f"the offsets of source {source!r}", name)
            for source, offsets in fields.sources.items()
        }
        signatures = {
            stage.name: json_value(
                stage.state_signature, f"the state signature of stage {stage.name!r}", name
            )
            for stage in fields.stages
        }
        attempt = self._new_attempt(folder)
        base = f"{folder}/{attempt}"
        creation_time = fields.creation_time if fields.creation_time is not None else now_ms()
        written: dict[str, FileEntry] = {}
        try:
            for item in files:
                if not isinstance(item, tuple) or len(item) != 2:
                    raise SnapshotError(
                        f"snapshot {name!r}: files must yield (relpath, data) pairs, got "
                        f"{type(item).__name__}", name,
                    )
                relpath, data = item
                if relpath not in owners:
                    raise SnapshotError(
                        f"snapshot {name!r}: file {relpath!r} is not named by any stage or by "
                        "the fields' files", name, relpath if isinstance(relpath, str) else None,
                    )
                if relpath in written:
                    raise SnapshotError(
                        f"snapshot {name!r}: file {relpath!r} is written twice", name, relpath
                    )
                written[relpath] = self._write_file(name, f"{base}/{relpath}", relpath, data)
            missing = [path for path in owners if path not in written]
            if missing:
                raise SnapshotError(
                    f"snapshot {name!r}: file {missing[0]!r} is named but was not written "
                    f"({len(missing)} missing)", name, missing[0],
                )
            self._check_landed(name, base, written.values(), read_back)
            manifest = Manifest(
                format_version=FORMAT_VERSION,
                name=name,
                attempt=attempt,
                creation_time=creation_time,
                job_id=fields.job_id,
                job_name=fields.job_name,
                sparkjet_version=fields.sparkjet_version,
                spark_version=fields.spark_version,
                pipeline_fingerprint=fields.pipeline_fingerprint,
                batch_id=fields.batch_id,
                sources=sources,
                stages=tuple(
                    StageManifest(
                        name=stage.name,
                        kind=stage.kind,
                        state_signature=signatures[stage.name],
                        key_count=stage.key_count,
                        bytes=sum(written[p].size for p in stage.files),
                        key_groups=stage.key_groups,
                        files=tuple(written[p] for p in stage.files),
                    )
                    for stage in fields.stages
                ),
                files=tuple(written[p] for p in fields.files),
                signed=self._key is not None,
                source_identities={
                    source: json_value(identity, f"the identity of source {source!r}", name)
                    for source, identity in fields.source_identities.items()
                },
                derived_from=None if fields.derived_from is None else json_value(
                    dict(fields.derived_from), "derived_from", name),
            )
            payload = encode_manifest(manifest, self._key)
            with self.backend_errors("create", f"{base}/{MANIFEST}"):
                created = self.backend.create_exclusive(f"{base}/{MANIFEST}", payload)
            if not created:  # a random 64-bit attempt id taken twice: never in practice
                raise SnapshotError(
                    f"snapshot {name!r}: attempt {attempt} already has another manifest",
                    name, MANIFEST,
                )
        except BaseException:
            with contextlib.suppress(Exception):
                self._remove_attempt(base)  # best effort; gc removes what is left
            raise
        self._retire(name, folder, attempt)
        return manifest

    def _new_attempt(self, folder: str) -> str:
        """A unique attempt id that sorts after every attempt under the name so far."""
        latest = max((attempt_start(a) for a in self._attempts(folder)), default=-1)
        return f"{max(now_ms(), latest + 1):015d}-{secrets.token_hex(8)}"

    def _write_file(self, name: str, path: str, relpath: str, data: Any) -> FileEntry:
        if isinstance(data, bytes | bytearray | memoryview):
            payload = bytes(data)
            with self.backend_errors("write", path):
                self.backend.write_bytes(path, payload)
            return FileEntry(relpath, hashlib.sha256(payload).hexdigest(), len(payload))
        if isinstance(data, str) or not isinstance(data, Iterable):
            raise SnapshotError(
                f"snapshot {name!r}: file {relpath!r}: data must be bytes or an iterable of "
                f"bytes, got {type(data).__name__}", name, relpath,
            )
        source = _Source(data, name, relpath)
        try:
            with self.backend_errors("write", path):
                self.backend.write_chunks(path, source)
        except BaseException as exc:
            if source.error is not None and exc is not source.error:
                raise source.error from None  # the caller's error, not the backend's
            raise
        return FileEntry(relpath, source.hash.hexdigest(), source.size)

    def _check_landed(
        self, name: str, base: str, entries: Iterable[FileEntry], read_back: bool
    ) -> None:
        """Before publishing: every file is in the backend with its size (and checksum)."""
        for entry in entries:
            path = f"{base}/{entry.path}"
            try:
                if read_back:
                    digest, size = hashlib.sha256(), 0
                    with self.backend_errors("read back", path):
                        for chunk in self.backend.read_chunks(path, CHUNK_SIZE):
                            digest.update(chunk)
                            size += len(chunk)
                    good = size == entry.size and digest.hexdigest() == entry.sha256
                else:
                    with self.backend_errors("check", path):
                        size = self.backend.size(path)
                    good = size == entry.size
            except FileNotFoundError:
                good, size = False, -1
            if not good:
                found = "is missing" if size < 0 else f"reads back as {size} bytes"
                raise SnapshotError(
                    f"snapshot {name!r}: file {entry.path!r} {found} in "
                    f"{self.backend.describe()} right after it was written ({entry.size} bytes, "
                    f"sha256 {entry.sha256}); nothing was published", name, entry.path,
                )

    def _retire(self, name: str, folder: str, mine: str) -> None:
        """After publishing ``mine``: remove older complete attempts, or ``mine`` if superseded.

        A failure here is logged, not raised: the snapshot is published, and
        :meth:`gc` removes what is left.
        """
        try:
            attempts = self._attempts(folder)
            complete = [
                a for a in attempts if a != mine and self.path_exists(f"{folder}/{a}/{MANIFEST}")
            ]
            for attempt in complete:
                if attempt < mine:
                    self._remove_attempt(f"{folder}/{attempt}")
            if any(attempt > mine for attempt in complete):
                log.info(
                    "snapshot %r: attempt %s was superseded by a newer export while it was "
                    "written; removing it", name, mine,
                )
                self._remove_attempt(f"{folder}/{mine}")
        except SparkjetError as exc:
            log.warning(
                "snapshot %r is published, but removing older exports failed (sparkjet gc "
                "will): %s", name, exc,
            )

    # --- reading --------------------------------------------------------------------------

    def _resolve(self, name: str) -> Manifest:
        """The manifest of the newest complete attempt of ``name``."""
        folder = snapshot_folder(name)
        previous: builtins.list[str] | None = None
        for _ in range(_RESOLVE_TRIES):
            attempts = self._attempts(folder)
            for attempt in reversed(attempts):
                path = f"{folder}/{attempt}/{MANIFEST}"
                try:
                    with self.backend_errors("read", path):
                        raw = self.backend.read_bytes(path)
                except FileNotFoundError:
                    continue  # being written, or being retired: look at the next one
                return decode_manifest(raw, name, attempt, self._key)
            # The same listing twice (also empty twice): nothing more will show. A
            # listing is no snapshot of the folder: one walked while a newer export
            # published and retired the attempt it had found may come back empty.
            if attempts == previous:
                break
            previous = attempts  # attempts came or went while we looked: look again
        raise SnapshotNotFoundError(
            f"no snapshot named {name!r} in {self.backend.describe()}", name
        )

    def get(self, name: str) -> Snapshot:
        """The snapshot ``name``; its manifest is read and checked, its files when read.

        Raises :class:`SnapshotNotFoundError`, or the error saying why its
        manifest cannot be trusted.
        """
        return Snapshot(self, self._resolve(name))

    def exists(self, name: str) -> bool:
        """Whether a complete snapshot named ``name`` exists (its manifest is not checked)."""
        folder = snapshot_folder(name)
        return any(
            self.path_exists(f"{folder}/{attempt}/{MANIFEST}") for attempt in self._attempts(folder)
        )

    def names(self) -> builtins.list[str]:
        """The names that have folders in the backend, complete or not, sorted."""
        found = (snapshot_name(child) for child in self._children(""))
        return sorted(name for name in found if name is not None)

    def list(self) -> builtins.list[Snapshot]:
        """Every complete snapshot, by name.

        A snapshot whose manifest cannot be trusted (corrupt, unknown format,
        bad signature) is left out with a warning naming it, so one bad
        snapshot does not hide the others; :meth:`get` raises its error.
        """
        found = []
        for name in self.names():
            try:
                found.append(self.get(name))
            except SnapshotNotFoundError:
                continue  # only incomplete attempts: an export under way, or garbage
            except (SnapshotCorruptedError, SnapshotFormatError, SnapshotSignatureError) as exc:
                log.warning("skipping snapshot %r: %s", name, exc)
        return found

    # --- deleting, copying, collecting --------------------------------------------------------

    def delete(self, name: str) -> bool:
        """Delete the snapshot ``name`` and every attempt under it; False if there was none.

        Every manifest goes first, so a reader never finds a snapshot with
        its files half deleted. An export of the same name running meanwhile
        may publish after this; deleting races it as any two writers race.
        """
        folder = snapshot_folder(name)
        found = False
        for attempt in self._attempts(folder):
            manifest = f"{folder}/{attempt}/{MANIFEST}"
            if self.path_exists(manifest):
                found = True
                self._delete(manifest)
        self._delete(folder)
        return found

    def copy_to(self, other: SnapshotStore, name: str, *, as_name: str | None = None) -> Manifest:
        """Copy the snapshot ``name`` to ``other`` (as ``as_name``), verified by checksum.

        Every file is checked against the source manifest as it is read, and
        read back from ``other`` and checked again before the copy's manifest
        is written; the copy keeps the creation time, job and stages, and is
        signed with ``other``'s key (or not). A copy that fails leaves
        ``other`` as it was.
        """
        snapshot = self.get(name)
        snapshot.check_listing()
        files = ((e.path, snapshot.read_chunks(e.path)) for e in snapshot.manifest.all_files())
        return other.write(as_name or name, snapshot.manifest.fields(), files, read_back=True)

    def gc(
        self, min_age_seconds: float = DEFAULT_GC_AGE_SECONDS, *, dry_run: bool = False
    ) -> builtins.list[str]:
        """Remove what failed, killed or superseded exports left; returns the attempt folders.

        Removes attempts without a manifest started more than
        ``min_age_seconds`` ago (by their id's time stamp; an export taking
        longer than that would be collected under its feet), and complete
        attempts older than their name's newest (left by an export killed
        while it cleaned up). With ``dry_run`` only says what it would remove.
        """
        removed: builtins.list[str] = []
        cutoff = now_ms() - int(min_age_seconds * 1000)
        for folder in self._children(""):
            name = snapshot_name(folder)
            if name is None:
                continue
            attempts = self._attempts(folder)
            complete = [a for a in attempts if self.path_exists(f"{folder}/{a}/{MANIFEST}")]
            newest = max(complete, default=None)
            for attempt in attempts:
                superseded = attempt in complete and attempt != newest
                abandoned = attempt not in complete and attempt_start(attempt) <= cutoff
                if superseded or abandoned:
                    removed.append(f"{folder}/{attempt}")
                    if not dry_run:
                        self._remove_attempt(f"{folder}/{attempt}")
            if not dry_run and not self._children(folder):
                self._delete(folder)  # an empty folder (local disks keep them)
        return removed


