"""Migrating a snapshot: a new snapshot made from an old one, stages renamed, dropped or rewritten.

``sparkjet migrate-snapshot SRC DST`` and ``jet.migrate_snapshot(...)`` run
:func:`migrate_snapshot`. The old snapshot is only read (every file checked
against its manifest); the new one is written through
:meth:`SnapshotStore.write`, read back before its manifest is published, and
signed like any export, so a migration that fails anywhere (a transform
raising, two keys colliding, a bad file) publishes nothing.

What a migration can do, by the names the old snapshot uses:

- rename a stateful stage (its state files move to the new name, byte for
  byte) or a source (its offsets, and its event time, go under the new name);
- drop a stage or a source;
- transform a stage's state with ``fn(key, value) -> (key, value) | None``,
  ``value`` being what :meth:`Snapshot.read_state` shows (an aggregation's
  accumulator, a ``map_stateful``'s or a plugin transform's state, ``True``
  for ``distinct``). Keys are put back into the key groups the runtime
  assigns them to (:func:`~sparkjet.core.state.keygroups.key_group`), in the old
  snapshot's files' ranges of key groups, so the new snapshot has the same
  number of key groups and file layout. Windowed stages are refused: their
  state is per key a set of frames or sessions and a timer index, which a
  per-key function cannot rewrite safely.

The new manifest's ``derived_from`` records the old snapshot, its attempt and
batch, and what was renamed, dropped and transformed.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle

from sparkjet.core.errors import SnapshotError
from sparkjet.core.pipeline.event_time import EventTime
from sparkjet.core.state.keygroups import key_group
from sparkjet.core.state.snapshots.format import (
    EVENT_TIME_FILE,
    IDENTITY_FIELDS,
    parse_state_file,
    state_file_path,
)
from sparkjet.core.state.snapshots.manifest import (
    Manifest,
    ManifestFields,
    StageFields,
    StageManifest,
)
from sparkjet.core.state.snapshots.reader import Snapshot
from sparkjet.core.state.snapshots.storage import FileData, SnapshotStore
from sparkjet.core.store.naming import loads, unpickle

#: A transform of one stage's state: ``fn(key, value)`` gives the key's new
#: ``(key, value)``, or None to delete the key.
StateTransform = Callable[[Any, Any], "tuple[Any, Any] | None"]

#: Signature ``op`` -> the field naming the type of each key's value (None: no such field).
_TYPE_FIELD: dict[str, str | None] = {
    "aggregate": "accumulator", "map_stateful": "state", "distinct": None, "apply": None,
}


@dataclass(frozen=True)
class StageMigration:
    """What a migration did to one stage or source of the old snapshot."""

    #: The name in the old snapshot.
    name: str
    #: The name in the new one (None: dropped).
    new_name: str | None
    #: ``"stage"`` (stateful) or ``"source"``.
    what: str
    #: Keys in the old snapshot (0 for a source).
    keys_in: int
    #: Keys in the new one (0 for a source or a dropped stage).
    keys_out: int
    #: Whether its state went through a transform.
    transformed: bool = False


def _qualified(kind: type) -> str:
    # The same spelling as the state signature's (format.state_signature).
    return kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")


def _op(stage: StageManifest) -> str | None:
    signature = stage.state_signature
    return signature.get("op") if isinstance(signature, dict) else None


class _Plan:
    """The checked arguments of one migration."""

    def __init__(
        self,
        manifest: Manifest,
        dst: str,
        renames: Mapping[str, str] | None,
        drop: Iterable[str],
        transforms: Mapping[str, StateTransform] | None,
    ) -> None:
        src = manifest.name
        where = f"migrate-snapshot {src!r} -> {dst!r}"
        self.stages = [s.name for s in manifest.stages]
        self.sources = list(manifest.sources)
        known = set(self.stages) | set(self.sources)
        listed = (f"its stateful stages: {', '.join(map(repr, self.stages)) or 'none'}; "
                  f"its sources: {', '.join(map(repr, self.sources)) or 'none'}")

        def check_known(name: Any, role: str) -> str:
            if not isinstance(name, str):
                raise SnapshotError(f"{where}: {role} must name stages by string, got "
                                    f"{type(name).__name__} {name!r}", src)
            if name not in known:
                raise SnapshotError(
                    f"{where}: {role} names stage {name!r}, which snapshot {src!r} does not "
                    f"hold ({listed})", src)
            return name

        if isinstance(drop, str):
            drop = (drop,)
        self.renames: dict[str, str] = {}
        for old, new in dict(renames or {}).items():
            check_known(old, "a rename")
            if not isinstance(new, str) or not new:
                raise SnapshotError(f"{where}: stage {old!r} must be renamed to a non-empty "
                                    f"string, got {new!r}", src)
            self.renames[old] = new
        self.dropped = [check_known(name, "a drop") for name in drop]
        self.transforms: dict[str, StateTransform] = {}
        for name, fn in dict(transforms or {}).items():
            check_known(name, "a transform")
            if not callable(fn):
                raise SnapshotError(f"{where}: the transform of stage {name!r} is not "
                                    f"callable ({type(fn).__name__})", src)
            if name not in self.stages:
                raise SnapshotError(f"{where}: {name!r} is a source: it keeps offsets, no "
                                    "state to transform", src)
            self.transforms[name] = fn
        for name in self.dropped:
            if name in self.renames or name in self.transforms:
                raise SnapshotError(f"{where}: stage {name!r} is dropped and also "
                                    f"{'renamed' if name in self.renames else 'transformed'}",
                                    src)
        kept = [n for n in self.stages + self.sources if n not in self.dropped]
        targets: dict[str, str] = {}
        for name in kept:
            new = self.renames.get(name, name)
            if new in targets:
                other = targets[new]
                problem = ("is the name of an existing stage" if new in (other, name)
                           else f"is also the new name of {other!r}")
                culprit = name if name in self.renames else other
                raise SnapshotError(
                    f"{where}: stage {culprit!r} cannot be renamed to {new!r}: {new!r} "
                    f"{problem} ({listed}; drop or rename it too)", src)
            targets[new] = name
        for name in self.transforms:
            stage = manifest.stage(name)
            assert stage is not None
            op = _op(stage)
            if op == "window":
                raise SnapshotError(
                    f"{where}: stage {name!r} is windowed; its state (frames or sessions per "
                    "key, and their timers) cannot be transformed key by key: rename or drop "
                    "it, or let the new pipeline start it empty", src)
            if op not in _TYPE_FIELD:
                raise SnapshotError(
                    f"{where}: stage {name!r} keeps state of a kind migrate-snapshot cannot "
                    f"transform (state signature {stage.state_signature!r})", src)

    def new_name(self, name: str) -> str | None:
        """The name ``name`` has in the new snapshot (None: dropped)."""
        return None if name in self.dropped else self.renames.get(name, name)


class _Stage:
    """One transformed stage: read whole, rewritten key by key, rebucketed by key group."""

    def __init__(self, snapshot: Snapshot, stage: StageManifest, new: str, fn: StateTransform,
                 dst: str) -> None:
        self.snapshot, self.stage, self.new, self.fn, self.dst = snapshot, stage, new, fn, dst
        self.distinct = _op(stage) == "distinct"
        self.ranges: list[tuple[int, int]] = []
        for entry in stage.files:
            parsed = parse_state_file(entry.path)
            if parsed is None:
                raise SnapshotError(
                    f"snapshot {snapshot.name!r}: stage {stage.name!r} has a file "
                    f"{entry.path!r} this sparkjet cannot read", snapshot.name, entry.path)
            self.ranges.append(parsed[:2])
        self.ranges.sort()
        self.owner = {g: i for i, (lo, hi) in enumerate(self.ranges) for g in range(lo, hi)}
        #: The types of the old values, and of the new ones (each with a key that has it).
        self.types_in: set[type] = set()
        self.types_out: dict[type, Any] = {}

    def _where(self, key: Any) -> str:
        return (f"migrate-snapshot {self.snapshot.name!r} -> {self.dst!r}: stage "
                f"{self.stage.name!r}, key {key!r:.200}")

    def _load(self, path: str) -> Any:
        """One state file, checked against the manifest and unpickled."""
        return unpickle(
            self.snapshot.read_file(path),
            f"snapshot {self.snapshot.name!r}: stage {self.stage.name!r}: file {path!r}",
            keys=("values", "touched"), loads=loads)

    def rewrite(self) -> list[tuple[dict[Any, Any], dict[Any, int]]]:
        """The new state, per range of key groups: ``(values, touched)``."""
        enabled = gc.isenabled()
        gc.disable()  # a million new tuples would run the collector over all of them, often
        try:
            return self._rewrite()
        finally:
            if enabled:
                gc.enable()

    def _rewrite(self) -> list[tuple[dict[Any, Any], dict[Any, int]]]:
        out: list[tuple[dict[Any, Any], dict[Any, int]]] = [({}, {}) for _ in self.ranges]
        index = {r: i for i, r in enumerate(self.ranges)}
        came_from: dict[Any, Any] = {}
        fn, distinct, owner, groups = self.fn, self.distinct, self.owner, self.stage.key_groups
        types_in, types_out = self.types_in, self.types_out
        for entry in self.stage.files:
            parsed = parse_state_file(entry.path)
            assert parsed is not None  # checked in __init__
            home = index[parsed[:2]]  # the range the file's keys belong to
            data = self._load(entry.path)
            touched_in = data["touched"]
            for key, stored in data["values"].items():
                value = stored if distinct else stored[1]
                types_in.add(type(value))
                try:
                    result = fn(key, value)
                except Exception as exc:
                    raise SnapshotError(
                        f"{self._where(key)}: the transform raised {type(exc).__name__}: "
                        f"{exc}; snapshot {self.dst!r} was not written",
                        self.snapshot.name) from exc
                if result is None:
                    continue
                if not isinstance(result, tuple) or len(result) != 2:
                    raise SnapshotError(
                        f"{self._where(key)}: the transform returned {type(result).__name__} "
                        f"{result!r:.100}, expected a (key, value) pair or None",
                        self.snapshot.name)
                new_key, new_value = result
                try:
                    taken = new_key in came_from
                except TypeError:
                    raise SnapshotError(
                        f"{self._where(key)}: the transform's new key {new_key!r:.100} is "
                        f"unhashable ({type(new_key).__name__})", self.snapshot.name) from None
                if taken:
                    raise SnapshotError(
                        f"{self._where(key)}: the transform maps it to key {new_key!r:.200}, "
                        f"which key {came_from[new_key]!r:.200} was mapped to as well; "
                        f"snapshot {self.dst!r} was not written", self.snapshot.name)
                if distinct and new_value is not True:
                    raise SnapshotError(
                        f"{self._where(key)}: a distinct stage keeps True per key; the "
                        f"transform returned {new_value!r:.100}", self.snapshot.name)
                came_from[new_key] = key
                if type(new_value) not in types_out:
                    types_out[type(new_value)] = new_key
                if new_key == key:
                    target = home  # equal keys hash equally: the same key group
                else:
                    group = key_group(new_key, groups)
                    if group not in owner:
                        raise SnapshotError(
                            f"snapshot {self.snapshot.name!r}: stage {self.stage.name!r}: no "
                            f"file holds key group {group} of {groups}", self.snapshot.name)
                    target = owner[group]
                values, touches = out[target]
                values[new_key] = True if distinct else (new_key, new_value)
                touched = touched_in.get(key)
                if touched is not None:
                    touches[new_key] = touched
        return out

    def signature(self) -> Any:
        """The stage's state signature, its type field following the transformed values."""
        signature = self.stage.state_signature
        field = _TYPE_FIELD.get(_op(self.stage) or "")
        names_in = {_qualified(kind) for kind in self.types_in}
        names_out = {_qualified(kind): key for kind, key in self.types_out.items()}
        if isinstance(signature, dict):
            # The state was rewritten by the user's function: what it was keyed and
            # built by no longer says what it means, so the upgrade rules stop
            # comparing them (format.IDENTITY_FIELDS).
            signature = {k: v for k, v in signature.items() if k not in IDENTITY_FIELDS}
        if field is None or not names_out or set(names_out) == names_in:
            return signature
        if len(names_out) > 1:
            (one, key1), (two, key2) = list(names_out.items())[:2]
            raise SnapshotError(
                f"migrate-snapshot {self.snapshot.name!r} -> {self.dst!r}: stage "
                f"{self.stage.name!r}: the transform returned values of two types, {one} "
                f"(key {key1!r:.100}) and {two} (key {key2!r:.100}); a stage's state has one "
                "type", self.snapshot.name)
        return {**signature, field: next(iter(names_out))}


def migrate_snapshot(
    store: SnapshotStore,
    src: str,
    dst: str,
    *,
    renames: Mapping[str, str] | None = None,
    drop: Iterable[str] = (),
    transforms: Mapping[str, StateTransform] | None = None,
    overwrite: bool = False,
) -> tuple[Manifest, list[StageMigration]]:
    """Write snapshot ``dst`` from snapshot ``src`` (left as it is) in ``store``.

    ``renames``, ``drop`` and ``transforms`` name stages and sources as
    ``src`` names them (see the module's documentation). Returns the new
    manifest and what was done per stage and source of ``src``.

    :raises SnapshotError: ``src`` is ``dst``; ``dst`` exists and not
        ``overwrite``; a name is unknown (the message lists the snapshot's
        stages) or renamed onto another; a transform raised, returned
        something else than a pair or None, mapped two keys to one, or gave
        values of two types; a windowed stage is transformed. Nothing is
        written then.
    """
    if src == dst:
        raise SnapshotError(f"migrate-snapshot {src!r} -> {dst!r}: the new snapshot needs "
                            "another name than the one it is made from", src)
    snapshot = store.get(src)
    snapshot.check_listing()
    manifest = snapshot.manifest
    plan = _Plan(manifest, dst, renames, drop, transforms)
    if not overwrite and store.exists(dst):
        raise SnapshotError(f"migrate-snapshot {src!r} -> {dst!r}: snapshot {dst!r} exists; "
                            "overwrite it with overwrite=True (--force)", dst)
    stages: list[StageFields] = []
    files: list[tuple[str, FileData]] = []
    report: list[StageMigration] = []
    rewritten: dict[str, _Stage] = {}
    for stage in manifest.stages:
        new = plan.new_name(stage.name)
        if new is None:
            report.append(StageMigration(stage.name, None, "stage", stage.key_count, 0))
            continue
        fn = plan.transforms.get(stage.name)
        if fn is None:
            paths = []
            for entry in stage.files:
                parsed = parse_state_file(entry.path)
                path = entry.path if parsed is None else state_file_path(new, *parsed)
                files.append((path, snapshot.read_chunks(entry.path)))
                paths.append(path)
            stages.append(StageFields(new, stage.kind, stage.state_signature, stage.key_count,
                                      stage.key_groups, paths))
            report.append(StageMigration(stage.name, new, "stage", stage.key_count,
                                         stage.key_count))
            continue
        work = _Stage(snapshot, stage, new, fn, dst)
        ranges = work.rewrite()  # whole stage first: collisions cross files
        rewritten[stage.name] = work
        paths = []
        total = 0
        for (lo, hi), (values, touched) in zip(work.ranges, ranges, strict=True):
            path = state_file_path(new, lo, hi, len(values))
            files.append((path, cloudpickle.dumps({"values": values, "touched": touched})))
            paths.append(path)
            total += len(values)
        stages.append(StageFields(new, stage.kind, work.signature(), total, stage.key_groups,
                                  paths))
        report.append(StageMigration(stage.name, new, "stage", stage.key_count, total, True))
    sources = {}
    identities = {}
    for source, offsets in manifest.sources.items():
        new = plan.new_name(source)
        report.append(StageMigration(source, new, "source", 0, 0))
        if new is not None:
            sources[new] = offsets
            if source in manifest.source_identities:
                identities[new] = manifest.source_identities[source]
    extra: list[str] = []
    for entry in manifest.files:
        if entry.path == EVENT_TIME_FILE:
            moved = _event_time(snapshot, plan)
            if moved is not None:
                files.append((EVENT_TIME_FILE, moved))
                extra.append(EVENT_TIME_FILE)
        else:
            files.append((entry.path, snapshot.read_chunks(entry.path)))
            extra.append(entry.path)
    fields = ManifestFields(
        job_id=manifest.job_id, job_name=manifest.job_name,
        sparkjet_version=manifest.sparkjet_version, spark_version=manifest.spark_version,
        pipeline_fingerprint=manifest.pipeline_fingerprint, batch_id=manifest.batch_id,
        sources=sources, stages=stages, files=extra, source_identities=identities,
        derived_from={
            "snapshot": src, "attempt": manifest.attempt, "batch_id": manifest.batch_id,
            "renamed": dict(plan.renames), "dropped": list(plan.dropped),
            "transformed": list(plan.transforms),
        },
    )
    written = store.write(dst, fields, files, read_back=True)
    return written, report


def _event_time(snapshot: Snapshot, plan: _Plan) -> bytes | None:
    """The event-time file with sources' and windowed stages' entries renamed or dropped."""
    old = snapshot.event_time()
    if old is None:
        return None

    def moved(names: Mapping[str, Any]) -> dict[str, Any]:
        return {new: value for name, value in names.items()
                if (new := plan.new_name(name)) is not None}

    new = EventTime(moved(old.partitions), moved(old.watermarks), old.time_ms)
    if new.empty():
        return None
    return json.dumps(new.to_json(), sort_keys=True).encode()
