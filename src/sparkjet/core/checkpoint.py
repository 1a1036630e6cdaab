"""The checkpoint of a streaming job: its format, and every read and write of it.

The micro-batch loop (:mod:`sparkjet.core.streaming`) and the state reducers
(:mod:`sparkjet.core.runtime.stream`) go through :class:`Checkpoint` and
:class:`StatePaths`; nothing else knows file names. A checkpoint written by
one version of sparkjet must be resumed by the next, so this format changes
only with the ``format`` number in ``meta.json``.

In the layout below, ``<batch>`` is the batch number zero-padded to 20
digits, so names sort in batch order (the offsets and commit files of the
last 10 committed batches are kept); ``<stage>`` is the stage name encoded by
:func:`sparkjet.core.store.encode_name`, ``<shard>`` the shard number
zero-padded to 4 digits, ``<keys>`` the number of keys in the shard after the
batch and ``<bytes>`` the file's size.
The layout must stay the last part of this docstring: a docs test reads it.

A ``.state`` file (a full copy) is a cloudpickle of ``{"values": {key:
entry}, "touched": {key: millis}}`` (entries as
:class:`sparkjet.core.keyed.KeyedFold` describes; ``touched`` only for stages
with a TTL); a ``.delta`` file (one batch's changelog) a cloudpickle of
``{"set": {key: entry}, "touched": {key: millis}, "removed": [key]}``. A
shard's state as of batch ``b`` is its newest ``.state`` not after ``b``
with the ``.delta`` files after it, up to ``b``, applied in order (see
:class:`StatePaths`). Keys go to shards by :func:`stable_hash` modulo the
shard count, which meta.json fixes for the checkpoint's life. Format 1 wrote
only ``<batch>-<keys>.state`` full copies; they are read as they are.

Layout (``jobs/<id>/checkpoint`` in the store; a throw-away
``jobs/<id>/scratch-<n>`` for NONE)::

    meta.json              {"format": 2, "shards": <n>, "stages": [<names>, sorted]}
    offsets/<batch>.json   planned ranges (write-ahead): {"batch", "starts", "ends", "time"}
    commits/<batch>.json   committed batches: {"ends", "time", "duration_ms"}
    state/<stage>/<shard>/<batch>-<keys>-<bytes>.state   a full copy
    state/<stage>/<shard>/<batch>-<keys>-<bytes>.delta   one batch's changelog
"""

from __future__ import annotations

import json
import zlib
from typing import Any, NamedTuple

import cloudpickle

from sparkjet.core.errors import StoreError
from sparkjet.core.naming import encode_name
from sparkjet.core.store import Store

#: The ``format`` number written to meta.json (2: changelogs and sizes in state
#: file names; format-1 checkpoints, full copies only, are read as they are).
FORMAT = 2
_WIDTH = 20  # digits of a batch number in file names
_SHARD_WIDTH = 4  # digits of a shard number in folder names
_KEEP_LOG = 10  # committed batches whose offsets/commit files are kept
_META = "meta.json"
_OFFSETS = "offsets"
_COMMITS = "commits"
_STATE = "state"
_STATE_SUFFIX = ".state"
_DELTA_SUFFIX = ".delta"
#: A shard writes a full copy of its state at least every this many batches
#: that change it; the batches between write changelogs.
COMPACT_EVERY = 10


def _batch_file(folder: str, batch: int) -> str:
    return f"{folder}/{batch:0{_WIDTH}d}.json"


def stable_hash(key: Any) -> int:
    """A hash that is the same in every process, whatever PYTHONHASHSEED says.

    Equal keys hash equally (``1``, ``1.0`` and ``True`` too): numbers use
    Python's numeric hash, which does not depend on the seed; strings and bytes
    use CRC-32; tuples and frozensets combine their elements. Other keys fall
    back to ``hash()``, which must then be stable across processes.
    """
    if key is None:
        return 0
    if isinstance(key, int | float | complex):
        return hash(key)
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes):
        return zlib.crc32(key) ^ 0x5BD1E995
    if isinstance(key, tuple):
        h = 0x345678
        for item in key:
            h = (h * 1000003) ^ stable_hash(item)
            h &= 0xFFFFFFFFFFFF
        return h
    if isinstance(key, frozenset):
        h = 0
        for item in key:
            h ^= stable_hash(item)
        return h
    return hash(key)


class StablePartition:
    """The state shuffle's partition function: a key goes to shard ``stable_hash(key) % shards``.

    Spark's ``partitionBy(shards, StablePartition())`` takes the modulo.
    """

    def __call__(self, key: Any) -> int:
        return stable_hash(key)


class StateVersion(NamedTuple):
    """One file of a shard's state: a full copy or one batch's changelog.

    ``size`` is the file's size in bytes, from its name (-1 for a format-1
    name, which does not carry it).
    """

    batch: int
    keys: int
    name: str
    full: bool = True
    size: int = -1


def _parse_version(entry: str) -> StateVersion | None:
    for suffix, full in ((_STATE_SUFFIX, True), (_DELTA_SUFFIX, False)):
        if entry.endswith(suffix):
            parts = entry[: -len(suffix)].split("-")
            if len(parts) in (2, 3) and all(p.isdigit() for p in parts):
                size = int(parts[2]) if len(parts) == 3 else -1
                return StateVersion(int(parts[0]), int(parts[1]), entry, full, size)
    return None


class ShardState(NamedTuple):
    """A shard's state as of one batch, and the files it was read from (oldest first)."""

    values: dict[Any, Any]
    touched: dict[Any, int]
    chain: list[StateVersion]


class StatePaths:
    """Where a job's keyed state lives, and reading and writing it; picklable.

    Cost follows the work: a batch writes a *changelog* of the keys it
    changed (``.delta``), not the shard's whole state; every
    :data:`COMPACT_EVERY` batches of a shard (or when a batch changed at
    least half its keys) it writes a full copy (``.state``) instead, and the
    files before that copy's predecessor are removed. A shard's state as of
    a batch is the newest full copy not after it plus the changelogs after
    that copy, in order. A batch replayed after a crash reads the state as
    of the last committed batch, so it starts from exactly the state it
    started from the first time.
    """

    def __init__(self, store: Store, root: str) -> None:
        self.store = store
        self.root = root

    def shard_dir(self, stage: str, shard: int) -> str:
        """The folder of one shard of one stage's state."""
        return f"{self.root}/{encode_name('stage', stage)}/{shard:0{_SHARD_WIDTH}d}"

    def versions(self, stage: str, shard: int) -> list[StateVersion]:
        """Every state file of a shard, oldest first (listed afresh)."""
        found = (_parse_version(e) for e in self.store.listdir(self.shard_dir(stage, shard)))
        return sorted(v for v in found if v is not None)

    @staticmethod
    def chain(versions: list[StateVersion], committed: int) -> list[StateVersion]:
        """The files that make up the state as of ``committed``: a full copy, then changelogs."""
        usable = [v for v in versions if v.batch <= committed]
        fulls = [i for i, v in enumerate(usable) if v.full]
        return usable[fulls[-1]:] if fulls else usable

    def usable(self, stage: str, shard: int, committed: int) -> list[StateVersion]:
        """The files a batch after ``committed`` starts from (see :meth:`chain`)."""
        return self.chain(self.versions(stage, shard), committed)

    def size(self, stage: str, shard: int, version: StateVersion) -> int:
        """The size of a version's file in bytes."""
        if version.size >= 0:
            return version.size
        return self.store.size(f"{self.shard_dir(stage, shard)}/{version.name}")

    def _load(self, stage: str, shard: int, version: StateVersion) -> Any:
        path = f"{self.shard_dir(stage, shard)}/{version.name}"
        raw = self.store.read_bytes(path)
        try:
            data = cloudpickle.loads(raw)
            wanted = ("values", "touched") if version.full else ("set", "touched", "removed")
            missing = [k for k in wanted if k not in data]
            if missing:
                raise KeyError(f"no {', '.join(missing)}")
        except Exception as exc:
            raise StoreError(self.store.redact(
                f"stage {stage!r}: state file {path!r} is corrupt or truncated "
                f"({len(raw)} bytes): {type(exc).__name__}: {exc}"
            )) from exc
        return data

    def read_chain(self, stage: str, shard: int, chain: list[StateVersion]) -> ShardState:
        """The state the files of ``chain`` make up (see :meth:`chain`)."""
        values: dict[Any, Any] = {}
        touched: dict[Any, int] = {}
        for version in chain:
            data = self._load(stage, shard, version)
            if version.full:
                values, touched = data["values"], data["touched"]
            else:
                for key in data["removed"]:
                    values.pop(key, None)
                    touched.pop(key, None)
                values.update(data["set"])
                touched.update(data["touched"])
            if len(values) != version.keys:
                path = f"{self.shard_dir(stage, shard)}/{version.name}"
                raise StoreError(self.store.redact(
                    f"stage {stage!r}: state file {path!r} leaves {len(values)} keys, "
                    f"its name says {version.keys}"
                ))
        return ShardState(values, touched, list(chain))

    def read(
        self, stage: str, shard: int, version: StateVersion
    ) -> tuple[dict[Any, Any], dict[Any, int], int]:
        """The state as of ``version``'s batch: ``(values, touched, bytes read)``."""
        chain = self.chain(self.versions(stage, shard), version.batch)
        state = self.read_chain(stage, shard, chain)
        return state.values, state.touched, sum(self.size(stage, shard, v) for v in chain)

    def write(
        self,
        stage: str,
        shard: int,
        batch: int,
        state: ShardState,
        changed: list[Any],
        removed: list[Any],
        existing: list[StateVersion],
    ) -> ShardState:
        """Write ``batch``'s file of a shard; returns the state with its new chain.

        ``state`` is the shard's state after the batch (its chain: the files it
        was read from), ``changed`` and ``removed`` the keys the batch set and
        dropped, ``existing`` the shard's files as listed before. Removes what a
        failed attempt of this same batch left under another name first, and
        after, the files older than the chain's full copy (a replay of this
        batch reads only the chain). Never touches a newer batch's file: a late
        or stray attempt of an old batch must not delete what a newer one wrote.
        """
        values, touched, chain = state
        deltas = sum(1 for v in chain if not v.full)
        full = not chain or deltas + 1 >= COMPACT_EVERY or 2 * (len(changed) + len(removed)) >= max(
            len(values), 1
        )
        if full:
            data = cloudpickle.dumps({"values": values, "touched": touched})
        else:
            data = cloudpickle.dumps({
                "set": {key: values[key] for key in changed},
                "touched": {key: touched[key] for key in changed if key in touched},
                "removed": removed,
            })
        suffix = _STATE_SUFFIX if full else _DELTA_SUFFIX
        name = f"{batch:0{_WIDTH}d}-{len(values)}-{len(data)}{suffix}"
        folder = self.shard_dir(stage, shard)
        for version in existing:
            if version.batch == batch and version.name != name:
                self.store.remove(f"{folder}/{version.name}")
        self.store.write_bytes(f"{folder}/{name}", data)
        written = StateVersion(batch, len(values), name, full, len(data))
        fulls = [v for v in chain if v.full]
        if fulls:
            for version in existing:
                if version.batch < fulls[0].batch:
                    self.store.remove(f"{folder}/{version.name}")
        return ShardState(values, touched, [written] if full else [*chain, written])


class Checkpoint:
    """A streaming job's checkpoint folder in the store (layout in the module docstring)."""

    def __init__(self, store: Store, root: str) -> None:
        self.store = store
        self.root = root

    def _json(self, path: str) -> Any:
        try:
            return json.loads(self.store.read_bytes(f"{self.root}/{path}"))
        except FileNotFoundError:
            return None

    def meta(self) -> dict[str, Any] | None:
        """meta.json, or None before the first batch was planned."""
        meta: dict[str, Any] | None = self._json(_META)
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write meta.json."""
        self.store.write_bytes(f"{self.root}/{_META}", json.dumps(meta).encode())

    def shards(self, default: int, stages: list[str]) -> int:
        """The checkpoint's shard count; on first use, write meta with ``default`` shards.

        The count is fixed for the checkpoint's life: keys were assigned to
        shards by it.
        """
        meta = self.meta()
        if meta is None:
            meta = {"format": FORMAT, "shards": max(1, int(default)), "stages": sorted(stages)}
            if not self.store.create_exclusive(
                f"{self.root}/{_META}", json.dumps(meta).encode()
            ):
                meta = self.meta()  # another driver wrote it first: its count stands
                assert meta is not None
        return int(meta["shards"])

    def _batches(self, folder: str) -> list[int]:
        return sorted(
            int(e[:-5]) for e in self.store.listdir(f"{self.root}/{folder}")
            if e.endswith(".json") and e[:-5].isdigit()
        )

    def last_commit(self) -> int:
        """The last committed batch, or -1."""
        batches = self._batches(_COMMITS)
        return batches[-1] if batches else -1

    def commit_record(self, batch: int) -> dict[str, Any]:
        """What :meth:`write_commit` recorded for ``batch``."""
        record: dict[str, Any] = self._json(_batch_file(_COMMITS, batch))
        return record

    def planned(self, batch: int) -> dict[str, Any] | None:
        """The plan :meth:`write_plan` recorded for ``batch``, or None."""
        planned: dict[str, Any] | None = self._json(_batch_file(_OFFSETS, batch))
        return planned

    def write_plan(self, batch: int, plan: dict[str, Any]) -> dict[str, Any]:
        """Record ``batch``'s planned ranges before running it (the write-ahead log).

        Create-only: a batch has one plan for its life. If another driver
        planned it first, that plan is returned and must be run instead.
        """
        if self.store.create_exclusive(
            f"{self.root}/{_batch_file(_OFFSETS, batch)}", json.dumps(plan).encode()
        ):
            return plan
        standing = self.planned(batch)
        assert standing is not None
        return standing

    def write_commit(self, batch: int, record: dict[str, Any]) -> bool:
        """Record ``batch`` as committed; forget the log of batches long committed.

        Create-only: False if the batch was committed already (by another
        driver, which is then the job's driver: the caller checks its fence).
        """
        if not self.store.create_exclusive(
            f"{self.root}/{_batch_file(_COMMITS, batch)}", json.dumps(record).encode()
        ):
            return False
        for folder in (_OFFSETS, _COMMITS):
            for old in self._batches(folder):
                if old <= batch - _KEEP_LOG:
                    self.store.remove(f"{self.root}/{_batch_file(folder, old)}")
        return True

    @property
    def state_root(self) -> str:
        """The folder of the keyed state."""
        return f"{self.root}/{_STATE}"

    def state(self) -> StatePaths:
        """The state layout of this checkpoint."""
        return StatePaths(self.store, self.state_root)

    def delete(self) -> None:
        """Remove the whole checkpoint."""
        self.store.remove(self.root, recursive=True)
