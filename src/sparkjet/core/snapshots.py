"""The snapshot format and its storage: named, checksummed, optionally signed sets of files.

An exported snapshot is the state of a job's stateful stages at one committed
batch plus its sources' offsets (DESIGN.md, "Snapshots"). This module owns
how such a snapshot is laid out in a snapshot backend, written, found, read
and trusted; what goes into it is the engine's business. Layout::

    <name>/                      the snapshot's name, percent-encoded
      <attempt>/                 one export: <start ms, 15 digits>-<16 hex digits>
        <data files>             any relative paths the manifest names
        MANIFEST.json            written last, with a create-only write

**Replace by name, on storage without rename.** Each export writes into a
folder of its own (an *attempt*) and publishes it by creating its
``MANIFEST.json`` last. A name's snapshot is its newest complete attempt,
newest by attempt id, whose leading start time is made to exceed every
attempt already under the name (so one writer's next export always wins,
whatever its clock). Only after its own manifest exists does an export
delete the older complete attempts, manifest first, then their files; an
export that finds a newer complete attempt beside its own removes itself. So
at every moment a name has its old or its new snapshot, whole: a failed or
killed export leaves an attempt folder without a manifest, which no reader
looks at and :meth:`SnapshotStore.gc` removes once older than its age.

**Trust.** The manifest records each file's size and sha256 and its own
sha256; every read checks them, so corruption is an error naming the file,
never a partial restore. With a signing key the manifest also carries an
HMAC-SHA256 of its canonical form (sorted keys, no spaces, UTF-8): a store
with a key refuses unsigned manifests and wrong signatures, and a store
without one refuses signed manifests (configure the key to read them).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import cloudpickle
import fsspec

from sparkjet.core.contracts import SnapshotBackend
from sparkjet.core.errors import (
    ConfigError,
    PluginError,
    SnapshotBackendError,
    SnapshotCorruptedError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotNotFoundError,
    SnapshotReplacedError,
    SnapshotSignatureError,
    SparkjetError,
)
from sparkjet.core.naming import encode_name as encode_store_name
from sparkjet.core.plugin_manager import Category

if TYPE_CHECKING:
    from sparkjet.core.config import Config
    from sparkjet.core.plugin_manager import PluginHost

log = logging.getLogger("sparkjet.snapshots")

#: The ``format`` marker of every manifest.
FORMAT = "sparkjet-snapshot"
#: The format version this sparkjet writes.
FORMAT_VERSION = 1
#: The format versions this sparkjet reads.
READABLE_VERSIONS = frozenset({1})
#: The manifest's file name in an attempt folder.
MANIFEST = "MANIFEST.json"
#: The only signature algorithm.
SIGNATURE_ALGORITHM = "HMAC-SHA256"
#: Attempts without a manifest younger than this are never collected (seconds).
DEFAULT_GC_AGE_SECONDS = 3600.0
#: Reading a file or a checksum in pieces of this size.
CHUNK_SIZE = 1 << 20

_ATTEMPT = re.compile(r"^(\d{15})-([0-9a-f]{16})$")
#: How often a reader lists a name again when attempts come and go under it.
_RESOLVE_TRIES = 10

#: File contents: the bytes, or an iterable of chunks of bytes (for large files).
FileData: TypeAlias = "bytes | bytearray | memoryview | Iterable[bytes]"


# --- names and paths -------------------------------------------------------------------


def encode_name(name: str) -> str:
    """The folder of snapshot ``name``: percent-encoded, never starting with ``_`` or ``.``.

    Folders starting with ``_`` are the backend's own (the create-only probe);
    a name that cannot be a folder is a :class:`SnapshotError`.
    """
    if not isinstance(name, str) or not name.strip():
        raise SnapshotError(f"invalid snapshot name {name!r}: expected a non-empty string")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise SnapshotError(
            f"invalid snapshot name {name!r}: control characters are not allowed", name
        )
    encoded = urllib.parse.quote(name, safe="")
    if encoded[0] in "_.":
        encoded = f"%{ord(encoded[0]):02X}{encoded[1:]}"
    return encoded


def decode_name(folder: str) -> str | None:
    """The snapshot name of a folder :func:`encode_name` made, or None for any other folder."""
    try:
        name = urllib.parse.unquote(folder, errors="strict")
        return name if encode_name(name) == folder else None
    except (SnapshotError, UnicodeDecodeError):
        return None


def _check_relpath(path: Any, where: str, snapshot: str | None) -> str:
    """A data file's path inside a snapshot: relative, ``/``-separated, no ``.``/``..``."""
    if not isinstance(path, str) or not path:
        raise SnapshotError(f"{where}: a file path must be a non-empty string, got {path!r}",
                            snapshot)
    parts = path.split("/")
    if (
        any(p in ("", ".", "..") or "\\" in p for p in parts)
        or any(ord(ch) < 32 for ch in path)
        or path == MANIFEST
    ):
        raise SnapshotError(
            f"{where}: invalid file path {path!r} (relative, '/'-separated, no '.' or '..' "
            f"segments, not {MANIFEST})", snapshot, path,
        )
    return path


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _attempt_start(attempt: str) -> int:
    match = _ATTEMPT.match(attempt)
    return int(match.group(1)) if match else 0


# --- what an export hands over, and the manifest ----------------------------------------


@dataclass(frozen=True)
class StageFields:
    """One stateful stage of an export, as the engine hands it to :meth:`SnapshotStore.write`."""

    #: The stage's name (state is matched by it on restore).
    name: str
    #: The stage's kind (``aggregate``, ``map_stateful``, a plugin's transform kind, ...).
    kind: str
    #: Identifies the state's layout; any JSON value. A restore refuses a different one.
    state_signature: Any
    #: How many keys the stage's state holds.
    key_count: int
    #: The number of key groups the state is split into.
    key_groups: int
    #: The stage's data files, as relative paths inside the snapshot.
    files: Sequence[str] = ()


@dataclass(frozen=True)
class ManifestFields:
    """What an export knows of its snapshot: the manifest but for the files' checksums."""

    #: The id of the job the snapshot was taken of.
    job_id: str
    #: The job's name, or None.
    job_name: str | None
    #: ``sparkjet.__version__`` of the exporting process.
    sparkjet_version: str
    #: Spark's version in the exporting process.
    spark_version: str
    #: Identifies the pipeline the state was built by.
    pipeline_fingerprint: str
    #: The committed batch the snapshot is a cut of.
    batch_id: int
    #: Source stage name -> its offsets at the cut (any JSON value).
    sources: Mapping[str, Any] = field(default_factory=dict)
    #: The stateful stages, each with its files.
    stages: Sequence[StageFields] = ()
    #: Data files outside any stage (relative paths).
    files: Sequence[str] = ()
    #: Milliseconds since the epoch; None: now, when the export starts.
    creation_time: int | None = None


@dataclass(frozen=True)
class FileEntry:
    """One data file of a snapshot: its path inside the snapshot, sha256 (hex) and size."""

    path: str
    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        """The file's entry in ``MANIFEST.json``."""
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class StageManifest:
    """One stateful stage as its manifest records it."""

    name: str
    kind: str
    state_signature: Any
    key_count: int
    #: Total size of the stage's files, in bytes.
    bytes: int
    key_groups: int
    files: tuple[FileEntry, ...]

    def to_json(self) -> dict[str, Any]:
        """The stage's entry in ``MANIFEST.json``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "state_signature": self.state_signature,
            "key_count": self.key_count,
            "bytes": self.bytes,
            "key_groups": self.key_groups,
            "files": [f.to_json() for f in self.files],
        }


@dataclass(frozen=True)
class Manifest:
    """A snapshot's ``MANIFEST.json``: what it is, where it was cut, and every file's checksum."""

    format_version: int
    #: The snapshot's name.
    name: str
    #: The attempt folder the snapshot was written to.
    attempt: str
    #: Milliseconds since the epoch (kept by copies).
    creation_time: int
    job_id: str
    job_name: str | None
    sparkjet_version: str
    spark_version: str
    pipeline_fingerprint: str
    batch_id: int
    #: Source stage name -> offsets at the cut.
    sources: Mapping[str, Any]
    stages: tuple[StageManifest, ...]
    #: Data files outside any stage.
    files: tuple[FileEntry, ...] = ()
    #: Whether the manifest as read or written carries a signature.
    signed: bool = False

    @property
    def payload_size(self) -> int:
        """Bytes of all data files together (Jet's ``payload_size``)."""
        return sum(f.size for f in self.all_files())

    def all_files(self) -> tuple[FileEntry, ...]:
        """Every data file: the stages' in stage order, then the others."""
        return (*(f for stage in self.stages for f in stage.files), *self.files)

    def file(self, path: str) -> FileEntry | None:
        """The entry of the data file ``path``, or None if the manifest does not name it."""
        return next((f for f in self.all_files() if f.path == path), None)

    def stage(self, name: str) -> StageManifest | None:
        """The stage named ``name``, or None."""
        return next((s for s in self.stages if s.name == name), None)

    def body(self) -> dict[str, Any]:
        """The manifest as JSON, without its checksum and signature (what both cover)."""
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "name": self.name,
            "attempt": self.attempt,
            "creation_time": self.creation_time,
            "job_id": self.job_id,
            "job_name": self.job_name,
            "sparkjet_version": self.sparkjet_version,
            "spark_version": self.spark_version,
            "pipeline_fingerprint": self.pipeline_fingerprint,
            "batch_id": self.batch_id,
            "sources": dict(self.sources),
            "stages": [s.to_json() for s in self.stages],
            "files": [f.to_json() for f in self.files],
            "payload_size": self.payload_size,
        }

    def fields(self) -> ManifestFields:
        """What an export would hand over to write this snapshot again (copies)."""
        return ManifestFields(
            job_id=self.job_id,
            job_name=self.job_name,
            sparkjet_version=self.sparkjet_version,
            spark_version=self.spark_version,
            pipeline_fingerprint=self.pipeline_fingerprint,
            batch_id=self.batch_id,
            sources=self.sources,
            stages=[
                StageFields(s.name, s.kind, s.state_signature, s.key_count, s.key_groups,
                            [f.path for f in s.files])
                for s in self.stages
            ],
            files=[f.path for f in self.files],
            creation_time=self.creation_time,
        )


def canonical(body: Mapping[str, Any]) -> bytes:
    """The bytes the manifest's checksum and signature cover: sorted keys, no spaces, UTF-8."""
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _sign(key: bytes, body: Mapping[str, Any]) -> str:
    return hmac.new(key, canonical(body), hashlib.sha256).hexdigest()


def encode_manifest(manifest: Manifest, signing_key: bytes | None) -> bytes:
    """``MANIFEST.json``'s bytes: the body, its sha256, and its signature with a key."""
    body = manifest.body()
    document: dict[str, Any] = {
        **body, "manifest_sha256": hashlib.sha256(canonical(body)).hexdigest()
    }
    if signing_key is not None:
        document["signature"] = {
            "algorithm": SIGNATURE_ALGORITHM, "value": _sign(signing_key, body)
        }
    return (json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


def decode_manifest(
    raw: bytes, name: str, attempt: str, signing_key: bytes | None
) -> Manifest:
    """Parse and check a ``MANIFEST.json`` read from ``<name>/<attempt>/``.

    Checked in this order: it parses; its format and version are readable
    (:class:`SnapshotFormatError`); its own checksum (corruption); its
    signature against ``signing_key`` (:class:`SnapshotSignatureError`); the
    type of every field; that it belongs to this name and attempt; and that
    its totals add up.
    """

    def corrupted(problem: str) -> SnapshotCorruptedError:
        return SnapshotCorruptedError(
            f"snapshot {name!r}: {MANIFEST} (attempt {attempt}) {problem}", name, MANIFEST
        )

    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise corrupted(f"does not parse as JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise corrupted(f"is not a sparkjet snapshot manifest (no \"format\": \"{FORMAT}\")")
    version = document.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise corrupted(f"has no valid format_version (got {version!r})")
    if version not in READABLE_VERSIONS:
        readable = ", ".join(str(v) for v in sorted(READABLE_VERSIONS))
        raise SnapshotFormatError(
            f"snapshot {name!r} has format version {version}; this sparkjet reads "
            f"version {readable} (was it written by a newer sparkjet?)", name, MANIFEST,
        )
    stored_sha = document.pop("manifest_sha256", None)
    signature = document.pop("signature", None)
    try:
        body_bytes = canonical(document)
    except ValueError as exc:
        raise corrupted(f"holds a value that is not JSON: {exc}") from exc
    actual_sha = hashlib.sha256(body_bytes).hexdigest()
    if not isinstance(stored_sha, str) or not hmac.compare_digest(stored_sha, actual_sha):
        raise corrupted(
            f"does not match its checksum (manifest_sha256 {stored_sha!r}, content {actual_sha})"
        )
    _check_signature(signature, document, name, signing_key)
    try:
        manifest = _from_body(document, signed=signature is not None)
    except (KeyError, TypeError, ValueError) as exc:
        raise corrupted(f"is malformed: {exc}") from exc
    if manifest.name != name or manifest.attempt != attempt:
        raise corrupted(
            f"belongs to snapshot {manifest.name!r}, attempt {manifest.attempt}: it was "
            f"moved or copied by hand"
        )
    if document.get("payload_size") != manifest.payload_size:
        raise corrupted(
            f"says payload_size {document.get('payload_size')!r}, but its files add up to "
            f"{manifest.payload_size}"
        )
    return manifest


def _check_signature(
    signature: Any, body: Mapping[str, Any], name: str, key: bytes | None
) -> None:
    if key is None:
        if signature is not None:
            raise SnapshotSignatureError(
                f"snapshot {name!r} is signed, but no signing key is configured to check "
                "it: set [snapshots] signing_key to the key it was signed with", name, MANIFEST,
            )
        return
    if signature is None:
        raise SnapshotSignatureError(
            f"snapshot {name!r} is not signed, but a signing key is configured: an unsigned "
            "snapshot could have been written by anyone", name, MANIFEST,
        )
    if (
        not isinstance(signature, dict)
        or signature.get("algorithm") != SIGNATURE_ALGORITHM
        or not isinstance(signature.get("value"), str)
        or not hmac.compare_digest(signature["value"], _sign(key, body))
    ):
        raise SnapshotSignatureError(
            f"snapshot {name!r}: the signature of its {MANIFEST} does not match the "
            "configured signing key: it was tampered with, or signed with another key",
            name, MANIFEST,
        )


def _typed(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) and kind is int:
        raise TypeError(f"{what}: expected int, got a bool")
    if not isinstance(value, kind):
        raise TypeError(f"{what}: expected {kind}, got {type(value).__name__}")
    return value


def _file_from(data: Any, where: str) -> FileEntry:
    _typed(data, dict, where)
    path = _typed(data["path"], str, f"{where}.path")
    _check_relpath(path, where, None)
    sha = _typed(data["sha256"], str, f"{where}.sha256")
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError(f"{where}.sha256: not a sha256 hex digest")
    size = _typed(data["size"], int, f"{where}.size")
    if size < 0:
        raise ValueError(f"{where}.size: negative")
    return FileEntry(path, sha, size)


def _from_body(body: Mapping[str, Any], signed: bool) -> Manifest:
    stages = []
    for i, data in enumerate(_typed(body["stages"], list, "stages")):
        where = f"stages[{i}]"
        _typed(data, dict, where)
        files = tuple(
            _file_from(f, f"{where}.files[{j}]")
            for j, f in enumerate(_typed(data["files"], list, f"{where}.files"))
        )
        stage = StageManifest(
            name=_typed(data["name"], str, f"{where}.name"),
            kind=_typed(data["kind"], str, f"{where}.kind"),
            state_signature=data["state_signature"],
            key_count=_typed(data["key_count"], int, f"{where}.key_count"),
            bytes=_typed(data["bytes"], int, f"{where}.bytes"),
            key_groups=_typed(data["key_groups"], int, f"{where}.key_groups"),
            files=files,
        )
        if stage.bytes != sum(f.size for f in files):
            raise ValueError(f"{where}.bytes: {stage.bytes} is not the sum of its files' sizes")
        stages.append(stage)
    job_name = body["job_name"]
    if job_name is not None:
        _typed(job_name, str, "job_name")
    manifest = Manifest(
        format_version=body["format_version"],
        name=_typed(body["name"], str, "name"),
        attempt=_typed(body["attempt"], str, "attempt"),
        creation_time=_typed(body["creation_time"], int, "creation_time"),
        job_id=_typed(body["job_id"], str, "job_id"),
        job_name=job_name,
        sparkjet_version=_typed(body["sparkjet_version"], str, "sparkjet_version"),
        spark_version=_typed(body["spark_version"], str, "spark_version"),
        pipeline_fingerprint=_typed(body["pipeline_fingerprint"], str, "pipeline_fingerprint"),
        batch_id=_typed(body["batch_id"], int, "batch_id"),
        sources=_typed(body["sources"], dict, "sources"),
        stages=tuple(stages),
        files=tuple(
            _file_from(f, f"files[{j}]")
            for j, f in enumerate(_typed(body["files"], list, "files"))
        ),
        signed=signed,
    )
    paths = [f.path for f in manifest.all_files()]
    if len(paths) != len(set(paths)):
        raise ValueError("a file is named twice")
    if len({s.name for s in manifest.stages}) != len(manifest.stages):
        raise ValueError("a stage is named twice")
    return manifest


def _json_value(value: Any, what: str, name: str) -> Any:
    """``value`` as it reads back from JSON; refuses values JSON cannot hold."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"snapshot {name!r}: {what} is not a JSON value: {exc}", name) from exc


def _plan(name: str, fields: ManifestFields) -> dict[str, str | None]:
    """Every file the manifest will name -> its stage (None: outside stages); checks the fields."""
    where = f"snapshot {name!r}"
    if not isinstance(fields, ManifestFields):
        raise SnapshotError(f"{where}: expected ManifestFields, got {type(fields).__name__}", name)
    for attr in ("job_id", "sparkjet_version", "spark_version", "pipeline_fingerprint"):
        if not isinstance(getattr(fields, attr), str):
            raise SnapshotError(f"{where}: {attr} must be a string", name)
    if fields.job_name is not None and not isinstance(fields.job_name, str):
        raise SnapshotError(f"{where}: job_name must be a string or None", name)
    for attr in ("batch_id", "creation_time"):
        value = getattr(fields, attr)
        if (value is not None or attr == "batch_id") and (
            not isinstance(value, int) or isinstance(value, bool)
        ):
            raise SnapshotError(f"{where}: {attr} must be an int", name)
    if not isinstance(fields.sources, Mapping) or not all(
        isinstance(k, str) for k in fields.sources
    ):
        raise SnapshotError(f"{where}: sources must map source stage names to offsets", name)
    owners: dict[str, str | None] = {}

    def own(path: Any, stage: str | None) -> None:
        label = f"{where}, stage {stage!r}" if stage is not None else where
        _check_relpath(path, label, name)
        if path in owners:
            raise SnapshotError(f"{label}: file {path!r} is named twice", name, path)
        owners[path] = stage

    if isinstance(fields.files, str) or any(isinstance(s.files, str) for s in fields.stages):
        raise SnapshotError(f"{where}: files must be a list of paths, not one string", name)
    seen: set[str] = set()
    for stage in fields.stages:
        if not isinstance(stage, StageFields):
            raise SnapshotError(f"{where}: stages must be StageFields", name)
        if not isinstance(stage.name, str) or not stage.name or stage.name in seen:
            raise SnapshotError(f"{where}: stage name {stage.name!r} is empty or used twice",
                                name)
        seen.add(stage.name)
        if not isinstance(stage.kind, str):
            raise SnapshotError(f"{where}, stage {stage.name!r}: kind must be a string", name)
        for attr in ("key_count", "key_groups"):
            value = getattr(stage, attr)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SnapshotError(
                    f"{where}, stage {stage.name!r}: {attr} must be a non-negative int", name
                )
        for path in stage.files:
            own(path, stage.name)
    for path in fields.files:
        own(path, None)
    return owners


# --- reading and writing ------------------------------------------------------------------


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


class Snapshot:
    """A complete snapshot in a backend: Jet's ``JobStateSnapshot`` fields and its manifest.

    Every read checks the file's size and sha256 against the manifest; a
    snapshot that is not whole and intact is refused with an error naming
    the snapshot and the file, never read in part.
    """

    def __init__(self, store: SnapshotStore, manifest: Manifest) -> None:
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
        return f"{encode_name(self.name)}/{self.attempt}"

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
        if not self._store._exists(f"{self.folder}/{MANIFEST}"):
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

    def read_file(self, relpath: str) -> bytes:
        """The data file ``relpath``, after checking its size and sha256 against the manifest."""
        entry = self._entry(relpath)
        try:
            with self._store._backend_errors("read", self.path(relpath)):
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
            with self._store._backend_errors("read", path):
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
            for p in self._store._list(self.folder)
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
            data = cloudpickle.loads(self.read_file(file.path))
            for key, value in data["values"].items():
                out[key] = value[1] if isinstance(value, tuple) and len(value) == 2 else value
        return out


def state_file_path(stage: str, lo: int, hi: int, keys: int) -> str:
    """Where a snapshot keeps key groups ``[lo, hi)`` of ``stage``'s state (``keys`` keys).

    The file holds what a checkpoint's full copy holds: a cloudpickle of
    ``{"values": {key: entry}, "touched": {key: millis}}``.
    """
    return f"state/{encode_store_name('stage', stage)}/{lo:05d}-{hi:05d}-{keys}.state"


def parse_state_file(path: str) -> tuple[int, int, int] | None:
    """``(lo, hi, keys)`` of a :func:`state_file_path`, or None if it is not one."""
    stem = path.rsplit("/", 1)[-1]
    if not stem.endswith(".state"):
        return None
    parts = stem[: -len(".state")].split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    lo, hi, keys = map(int, parts)
    return (lo, hi, keys) if lo < hi else None


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
    def _backend_errors(self, action: str, path: str) -> Iterator[None]:
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

    def _exists(self, path: str) -> bool:
        with self._backend_errors("check", path):
            return self.backend.exists(path)

    def _list(self, prefix: str) -> builtins.list[str]:
        with self._backend_errors("list", prefix):
            return self.backend.list(prefix)

    def _children(self, prefix: str) -> builtins.list[str]:
        with self._backend_errors("list", prefix):
            return self.backend.list_children(prefix)

    def _delete(self, path: str) -> None:
        with self._backend_errors("delete", path):
            self.backend.delete(path)

    def _attempts(self, folder: str) -> builtins.list[str]:
        """The attempt folders under a name, oldest first."""
        return sorted(a for a in self._children(folder) if _ATTEMPT.match(a))

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
        folder = encode_name(name)
        owners = _plan(name, fields)
        sources = {
            source: _json_value(offsets, f"the offsets of source {source!r}", name)
            for source, offsets in fields.sources.items()
        }
        signatures = {
            stage.name: _json_value(
                stage.state_signature, f"the state signature of stage {stage.name!r}", name
            )
            for stage in fields.stages
        }
        attempt = self._new_attempt(folder)
        base = f"{folder}/{attempt}"
        creation_time = fields.creation_time if fields.creation_time is not None else _now_ms()
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
            )
            payload = encode_manifest(manifest, self._key)
            with self._backend_errors("create", f"{base}/{MANIFEST}"):
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
        latest = max((_attempt_start(a) for a in self._attempts(folder)), default=-1)
        return f"{max(_now_ms(), latest + 1):015d}-{secrets.token_hex(8)}"

    def _write_file(self, name: str, path: str, relpath: str, data: Any) -> FileEntry:
        if isinstance(data, bytes | bytearray | memoryview):
            payload = bytes(data)
            with self._backend_errors("write", path):
                self.backend.write_bytes(path, payload)
            return FileEntry(relpath, hashlib.sha256(payload).hexdigest(), len(payload))
        if isinstance(data, str) or not isinstance(data, Iterable):
            raise SnapshotError(
                f"snapshot {name!r}: file {relpath!r}: data must be bytes or an iterable of "
                f"bytes, got {type(data).__name__}", name, relpath,
            )
        source = _Source(data, name, relpath)
        try:
            with self._backend_errors("write", path):
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
                    with self._backend_errors("read back", path):
                        for chunk in self.backend.read_chunks(path, CHUNK_SIZE):
                            digest.update(chunk)
                            size += len(chunk)
                    good = size == entry.size and digest.hexdigest() == entry.sha256
                else:
                    with self._backend_errors("check", path):
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
                a for a in attempts if a != mine and self._exists(f"{folder}/{a}/{MANIFEST}")
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
        folder = encode_name(name)
        previous: builtins.list[str] | None = None
        for _ in range(_RESOLVE_TRIES):
            attempts = self._attempts(folder)
            for attempt in reversed(attempts):
                path = f"{folder}/{attempt}/{MANIFEST}"
                try:
                    with self._backend_errors("read", path):
                        raw = self.backend.read_bytes(path)
                except FileNotFoundError:
                    continue  # being written, or being retired: look at the next one
                return decode_manifest(raw, name, attempt, self._key)
            if not attempts or attempts == previous:
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
        folder = encode_name(name)
        return any(
            self._exists(f"{folder}/{attempt}/{MANIFEST}") for attempt in self._attempts(folder)
        )

    def names(self) -> builtins.list[str]:
        """The names that have folders in the backend, complete or not, sorted."""
        found = (decode_name(child) for child in self._children(""))
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
        folder = encode_name(name)
        found = False
        for attempt in self._attempts(folder):
            manifest = f"{folder}/{attempt}/{MANIFEST}"
            if self._exists(manifest):
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
        cutoff = _now_ms() - int(min_age_seconds * 1000)
        for folder in self._children(""):
            name = decode_name(folder)
            if name is None:
                continue
            attempts = self._attempts(folder)
            complete = [a for a in attempts if self._exists(f"{folder}/{a}/{MANIFEST}")]
            newest = max(complete, default=None)
            for attempt in attempts:
                superseded = attempt in complete and attempt != newest
                abandoned = attempt not in complete and _attempt_start(attempt) <= cutoff
                if superseded or abandoned:
                    removed.append(f"{folder}/{attempt}")
                    if not dry_run:
                        self._remove_attempt(f"{folder}/{attempt}")
            if not dry_run and not self._children(folder):
                self._delete(folder)  # an empty folder (local disks keep them)
        return removed


# --- from the configuration ---------------------------------------------------------------

#: The built-in backend kind for each store URL scheme (snapshots beside the store).
_KIND_OF_SCHEME: dict[str | None, str] = {
    None: "local", "file": "local", "local": "local", "memory": "memory",
    "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs",
}
#: The folder under the store where snapshots go when ``[snapshots] url`` is unset.
STORE_SUBFOLDER = "snapshots"


def kind_for_url(url: str) -> str | None:
    """The built-in backend kind for a URL's scheme (``local``, ``memory``, ``s3``, ``gcs``)."""
    scheme, _ = fsspec.core.split_protocol(url)
    return _KIND_OF_SCHEME.get(scheme)


def backend_settings(config: Config) -> tuple[str, str, dict[str, Any]]:
    """``(kind, url, options)`` of the configured snapshot backend.

    With ``[snapshots] url`` set: ``backend`` (default ``local``), that URL and
    ``[snapshots.options]``. Without it, snapshots are kept beside the store,
    in ``<store url>/snapshots``, on the store's own kind of storage with the
    store's options (``[snapshots.options]`` added on top); ``backend`` must
    then be left unset or name that kind.
    """
    where = config.source or "configuration"
    if config.snapshots_url is not None:
        return config.snapshots_backend, config.snapshots_url, dict(config.snapshots_options)
    kind = kind_for_url(config.store_url)
    if kind is None:
        raise ConfigError(config.redact(
            f"{where}: [store] url {config.store_url!r} has no built-in snapshot backend to "
            "keep snapshots beside it: set [snapshots] backend and url"
        ))
    if config.snapshots_backend not in ("local", kind):
        raise ConfigError(
            f"{where}: [snapshots] backend = {config.snapshots_backend!r} needs "
            "[snapshots] url (without it snapshots are kept in the store, on its own "
            f"kind of storage, {kind!r})"
        )
    url = f"{config.store_url.rstrip('/')}/{STORE_SUBFOLDER}"
    return kind, url, {**config.store_options, **config.snapshots_options}


def make_backend(config: Config, plugins: PluginHost) -> SnapshotBackend:
    """The configured snapshot backend (see :func:`backend_settings`), secrets masked."""
    where = config.source or "configuration"
    kind, url, options = backend_settings(config)
    try:
        entry = plugins.lookup_kind(Category.SNAPSHOT_BACKEND, kind)
    except PluginError as exc:
        raise ConfigError(f"{where}: [snapshots] backend: {exc}") from exc
    cls: Callable[..., SnapshotBackend] = entry.cls
    try:
        backend = cls(url, options)
    except SparkjetError as exc:
        raise type(exc)(config.redact(str(exc))) from exc.__cause__
    except Exception as exc:
        raise SnapshotBackendError(config.redact(
            f"snapshot backend {kind!r} (plugin {entry.plugin!r}) at {url}: cannot be made "
            f"with these options: {exc!r}"
        )) from None  # the plugin's own message may hold a secret
    backend.add_secrets(config.secrets)
    return backend


def snapshot_store(config: Config, plugins: PluginHost) -> SnapshotStore:
    """The :class:`SnapshotStore` ``[snapshots]`` configures: its backend and signing key."""
    return SnapshotStore(make_backend(config, plugins), config.snapshots_signing_key)
