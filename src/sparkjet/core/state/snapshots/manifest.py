"""The snapshot manifest: what an export hands over, the manifest's JSON codec and signing."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.errors import (
    SnapshotCorruptedError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotSignatureError,
)
from sparkjet.core.state.snapshots.names import MANIFEST, check_relpath

#: The ``format`` marker of every manifest.
FORMAT = "sparkjet-snapshot"
#: The format version this sparkjet writes.
FORMAT_VERSION = 1
#: The format versions this sparkjet reads.
READABLE_VERSIONS = frozenset({1})
#: The only signature algorithm.
SIGNATURE_ALGORITHM = "HMAC-SHA256"
#: The fields of a migrated snapshot's ``derived_from`` and their JSON types: the
#: snapshot and attempt it was made from, the batch of that cut, ``{old: new}``
#: stage and source names, and the stages (as the source snapshot names them)
#: dropped and transformed.
DERIVED_FROM_KEYS: dict[str, type] = {
    "snapshot": str, "attempt": str, "batch_id": int, "renamed": dict, "dropped": list,
    "transformed": list,
}




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
    #: Source stage name -> what it reads (``{"plugin", "reads", "partitions"}``).
    source_identities: Mapping[str, Any] = field(default_factory=dict)
    #: Where a migrated snapshot came from and what was done (see :data:`DERIVED_FROM_KEYS`);
    #: None for an ordinary export.
    derived_from: Mapping[str, Any] | None = None


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
    #: Source stage name -> what it reads (``{"plugin", "reads", "partitions"}``);
    #: empty in snapshots written before sparkjet recorded it.
    source_identities: Mapping[str, Any] = field(default_factory=dict)
    #: A migrated snapshot's provenance (``sparkjet migrate-snapshot``): the snapshot
    #: and attempt it was made from, its batch, and the stages renamed, dropped and
    #: transformed (see :data:`DERIVED_FROM_KEYS`). None (and absent from the JSON)
    #: for an ordinary export.
    derived_from: Mapping[str, Any] | None = None

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
        body: dict[str, Any] = {
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
            "source_identities": dict(self.source_identities),
            "stages": [s.to_json() for s in self.stages],
            "files": [f.to_json() for f in self.files],
            "payload_size": self.payload_size,
        }
        if self.derived_from is not None:  # absent from ordinary exports' manifests
            body["derived_from"] = dict(self.derived_from)
        return body

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
            source_identities=self.source_identities,
            derived_from=self.derived_from,
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
    check_relpath(path, where, None)
    sha = _typed(data["sha256"], str, f"{where}.sha256")
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError(f"{where}.sha256: not a sha256 hex digest")
    size = _typed(data["size"], int, f"{where}.size")
    if size < 0:
        raise ValueError(f"{where}.size: negative")
    return FileEntry(path, sha, size)


def _derived_from(data: Any) -> dict[str, Any] | None:
    """A manifest's ``derived_from``, checked field by field (None: an ordinary export)."""
    if data is None:
        return None
    _typed(data, dict, "derived_from")
    for key, kind in DERIVED_FROM_KEYS.items():
        _typed(data[key], kind, f"derived_from.{key}")
    for old, new in data["renamed"].items():
        _typed(new, str, f"derived_from.renamed[{old!r}]")
    for key in ("dropped", "transformed"):
        for i, stage in enumerate(data[key]):
            _typed(stage, str, f"derived_from.{key}[{i}]")
    return dict(data)


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
        source_identities=_typed(body.get("source_identities", {}), dict, "source_identities"),
        derived_from=_derived_from(body.get("derived_from")),
    )
    paths = [f.path for f in manifest.all_files()]
    if len(paths) != len(set(paths)):
        raise ValueError("a file is named twice")
    if len({s.name for s in manifest.stages}) != len(manifest.stages):
        raise ValueError("a stage is named twice")
    return manifest


def json_value(value: Any, what: str, name: str) -> Any:
    """``value`` as it reads back from JSON; refuses values JSON cannot hold."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"snapshot {name!r}: {what} is not a JSON value: {exc}", name) from exc


def plan_files(name: str, fields: ManifestFields) -> dict[str, str | None]:
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
    if fields.derived_from is not None and not isinstance(fields.derived_from, Mapping):
        raise SnapshotError(f"{where}: derived_from must be a mapping or None", name)
    if not isinstance(fields.sources, Mapping) or not all(
        isinstance(k, str) for k in fields.sources
    ):
        raise SnapshotError(f"{where}: sources must map source stage names to offsets", name)
    owners: dict[str, str | None] = {}

    def own(path: Any, stage: str | None) -> None:
        label = f"{where}, stage {stage!r}" if stage is not None else where
        check_relpath(path, label, name)
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


