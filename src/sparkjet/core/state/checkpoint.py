"""The checkpoint of a streaming job: its folder and its records (plans, commits, pins, meta).

The micro-batch loop (:mod:`sparkjet.core.microbatch.loop`), the snapshot
exports and the garbage collector go through :class:`Checkpoint`, and read and
write its records as :class:`BatchPlan` and :class:`CommitRecord`, whose JSON
codecs are here and nowhere else; the state files under ``state/`` are
:mod:`sparkjet.core.state.files`' (names, formats, reading and writing), and
which key group a key belongs to is :mod:`sparkjet.core.state.keygroups`'. A
checkpoint written by one version of sparkjet must be resumed by the next, so
this format changes only with the ``format`` number in ``meta.json``.

In the layout below, ``<batch>`` is the batch number zero-padded to 20
digits, so names sort in batch order (the offsets and commit files of at
least the last 10 committed batches are kept); ``<stage>`` is the stage name encoded by
:func:`sparkjet.core.store.naming.encode_name`; ``<lo>`` and ``<hi>`` the key groups
``[lo, hi)`` a file holds, zero-padded to 5 digits; ``<keys>`` the number of
keys in those groups after the batch, ``<bytes>`` the file's size and
``<attempt>`` 8 characters naming the task attempt that wrote it (a compaction's
start with ``z``), so attempts never overwrite one another. A commit record's
``"state"`` names, per stage and range ``"<lo>-<hi>"``, the file of the
attempt that counts (``""``: none); other attempts' files of that batch are
ignored, and removed before the record is (see
:meth:`sparkjet.core.state.files.StatePaths.counts`).
A job with windowed stages also keeps event time (:mod:`sparkjet.core.pipeline.event_time`):
its plans hold ``"watermarks"`` (per windowed stage, the watermark the batch
emits up to) and ``"early"`` (the stages emitting early results), its commit
records ``"event_time"`` (per source partition the highest timestamp and when
it was last seen; per windowed stage its watermark).
A commit record's ``"totals"`` are the job's per-stage counts up to the batch
(:class:`sparkjet.core.model.StageCount`), by name: a stage's emitted items
under the stage's name, its dead letters and late items under the name, the
unit separator (U+001F) and ``dead`` or ``late`` (stage names have no control
characters).
A *pin* names a batch whose state a snapshot export is reading while the job
goes on: no state file of that batch or an older one is removed while it
stands (see :meth:`Checkpoint.pin`).
The layout must stay the last part of this docstring: a docs test reads it.

A key belongs to key group ``stable_hash(key) % key_groups`` (see
:mod:`sparkjet.core.state.keygroups`); meta.json fixes the number of key groups for the
checkpoint's life, and each batch's plan the number of state tasks it ran
with (a replay runs with the same). The contents of ``.state`` (full copy)
and ``.delta`` (changelog) files are described in
:mod:`sparkjet.core.state.files`.

Formats 1 and 2 fixed a number of *shards* instead (``"shards": <n>`` in
meta.json, keys by the same hash modulo n) and kept each shard's files in a
folder ``state/<stage>/<shard>/`` (shard zero-padded to 4 digits), named
``<batch>-<keys>.state`` (format 1) or ``<batch>-<keys>-<bytes>.state|.delta``
(format 2); format 3 named flat files without ``-<attempt>``. They are read
as they are, shard ``s`` as key group ``s`` of n; new files go to the flat
layout with format 4's names, and meta.json then says format 4.

Layout (``jobs/<id>/checkpoint`` in the store; a throw-away
``jobs/<id>/scratch-<n>`` for NONE)::

    meta.json              {"format": 4, "key_groups": <n>, "stages": [<names>, sorted]}
    offsets/<batch>.json   the plan (write-ahead): {"batch", "starts", "ends", "time", "tasks"}
    commits/<batch>.json   committed batches: {"ends", "time", "duration_ms", "state"}
    pins/<token>.json      a snapshot export reading a batch's state: {"batch", "time"}
    state/<stage>/<batch>-<lo>-<hi>-<keys>-<bytes>-<attempt>.state   a full copy of [lo, hi)
    state/<stage>/<batch>-<lo>-<hi>-<keys>-<bytes>-<attempt>.delta   one batch's changelog
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.model import StageCount
from sparkjet.core.pipeline.event_time import EventTime
from sparkjet.core.state.files import StatePaths
from sparkjet.core.state.versions import Counted, StateFiles, StateRange
from sparkjet.core.store.fs import Store
from sparkjet.core.store.naming import json_loads

#: The ``format`` number written to meta.json (4: file names carry their
#: attempt; 3: key groups; format-1 and format-2 checkpoints, with shards, are
#: read as they are).
FORMAT = 4
_WIDTH = 20  # digits of a batch number in file names
#: Committed batches whose offsets and commit files are kept, at least.
KEEP_LOG = 10
_META = "meta.json"
_OFFSETS = "offsets"
_COMMITS = "commits"
_PINS = "pins"
_STATE = "state"


def _batch_file(folder: str, batch: int) -> str:
    return f"{folder}/{batch:0{_WIDTH}d}.json"


@dataclass(frozen=True)
class BatchPlan:
    """A micro-batch's plan, written before it runs (``offsets/<batch>.json``, the write-ahead log).

    A batch replayed after a crash runs this plan again: the same source
    ranges, the same planned time and the same number of state tasks.
    """

    batch: int
    #: Per source stage, the offsets the batch starts from (the last batch's ends).
    starts: dict[str, Any]
    #: Per source stage, the offsets the batch reads up to.
    ends: dict[str, Any]
    #: When it was planned (milliseconds since the epoch): TTL expiry's "now", also on a replay.
    time_ms: int
    #: How many state tasks share the key groups; None in a plan written before
    #: that was planned (it ran one task per key group).
    tasks: int | None
    #: Per windowed stage, the watermark the batch emits up to and judges late
    #: items by (:mod:`sparkjet.core.pipeline.event_time`); None in older plans.
    watermarks: dict[str, int] | None = None
    #: The windowed stages that emit early results in this batch.
    early: tuple[str, ...] = ()
    #: Per hash join stage, the digests of the tables the batch joins against
    #: (see :mod:`sparkjet.core.engine.tasks.tables`); None: the job has no joins.
    tables: Mapping[str, tuple[str, ...]] | None = None

    def source_ranges(self) -> dict[str, tuple[Any, Any]]:
        """Per source stage, the ``(start, end)`` offsets the batch reads."""
        return {name: (self.starts[name], end) for name, end in self.ends.items()}

    def state_tasks(self, key_groups: int) -> int:
        """How many state tasks the batch runs, for a checkpoint of ``key_groups``."""
        return key_groups if self.tasks is None else self.tasks

    def to_json(self) -> dict[str, Any]:
        """The record as ``offsets/<batch>.json`` holds it."""
        data: dict[str, Any] = {"batch": self.batch, "starts": self.starts,
                                "ends": self.ends, "time": self.time_ms}
        if self.tasks is not None:
            data["tasks"] = self.tasks
        if self.watermarks is not None:
            data["watermarks"] = dict(self.watermarks)
        if self.early:
            data["early"] = list(self.early)
        if self.tables is not None:
            data["tables"] = {stage: list(digests) for stage, digests in self.tables.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchPlan:
        """The record ``offsets/<batch>.json`` holds (those of older versions too)."""
        tasks = data.get("tasks")
        watermarks = data.get("watermarks")
        tables = data.get("tables")
        return cls(int(data["batch"]), dict(data.get("starts", {})), dict(data.get("ends", {})),
                   int(data.get("time", 0)), None if tasks is None else int(tasks),
                   None if watermarks is None else {str(k): int(v) for k, v in
                                                    dict(watermarks).items()},
                   tuple(str(s) for s in data.get("early", ())),
                   None if tables is None else {str(stage): tuple(str(d) for d in digests)
                                                for stage, digests in dict(tables).items()})


@dataclass(frozen=True)
class RestoredFrom:
    """The snapshot a checkpoint's first commit was seeded from."""

    snapshot: str
    batch: int
    job_id: str


def _state_to_json(files: StateFiles) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for key, name in files.items():
        out.setdefault(key.stage, {})[f"{key.lo}-{key.hi}"] = name
    return out


def _state_from_json(data: Mapping[str, Mapping[str, str]]) -> dict[StateRange, str]:
    out: dict[StateRange, str] = {}
    for stage, ranges in data.items():
        for ranged, name in ranges.items():
            lo, hi = ranged.split("-")
            out[StateRange(stage, int(lo), int(hi))] = name
    return out


@dataclass(frozen=True)
class CommitRecord:
    """A committed micro-batch (``commits/<batch>.json``): where the job goes on from.

    Records of older versions may lack ``time``, ``duration_ms`` and ``state``
    (read as 0, 0 and None).
    """

    #: The batch (the file's name; not in the JSON).
    batch: int
    #: Per source stage, the offsets the batch read up to: where the next one starts.
    ends: dict[str, Any]
    #: When it was committed (milliseconds since the epoch).
    time_ms: int = 0
    #: How long the batch took, planning to commit.
    duration_ms: int = 0
    #: The state files that count, by range (see
    #: :meth:`sparkjet.core.state.files.StatePaths.counts`); None: the record
    #: names none, every file of the batch counts.
    state: StateFiles | None = None
    #: The snapshot the checkpoint was seeded from (its batch-0 record only).
    restored_from: RestoredFrom | None = None
    #: Event time after the batch: what the sources saw, the watermarks emitted up to.
    event_time: EventTime | None = None
    #: The job's per-stage counts from its first batch up to and including this one
    #: (emitted items, dead letters, late items): the per-stage metrics go on from
    #: here after a suspend, a restart or another driver. None in records of older
    #: versions (the counts start again).
    totals: dict[StageCount, int] | None = None
    #: Where the batch ran: ``"local"`` (the driver, a small batch) or ``"spark"``;
    #: for metrics and post-mortems only (a replay may run on either). None in
    #: records of older versions.
    engine: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as ``commits/<batch>.json`` holds it."""
        data: dict[str, Any] = {"ends": self.ends, "time": self.time_ms,
                                "duration_ms": self.duration_ms}
        if self.state is not None:
            data["state"] = _state_to_json(self.state)
        if self.restored_from is not None:
            r = self.restored_from
            data["restored_from"] = {"snapshot": r.snapshot, "batch": r.batch, "job_id": r.job_id}
        if self.event_time is not None and not self.event_time.empty():
            data["event_time"] = self.event_time.to_json()
        if self.totals is not None:
            data["totals"] = {_count_name(key): n for key, n in self.totals.items()}
        if self.engine is not None:
            data["engine"] = self.engine
        return data

    @classmethod
    def from_json(cls, batch: int, data: Mapping[str, Any]) -> CommitRecord:
        """The record ``commits/<batch>.json`` holds (those of older versions too)."""
        state = data.get("state")
        restored = data.get("restored_from")
        return cls(
            batch, dict(data["ends"]), int(data.get("time", 0)), int(data.get("duration_ms", 0)),
            _state_from_json(state) if isinstance(state, dict) else None,
            RestoredFrom(str(restored["snapshot"]), int(restored["batch"]),
                         str(restored["job_id"])) if isinstance(restored, dict) else None,
            EventTime.from_json(data["event_time"]) if "event_time" in data else None,
            _totals_from_json(data.get("totals")),
            str(data["engine"]) if isinstance(data.get("engine"), str) else None,
        )


#: Between a stage's name and the kind of count in a ``totals`` name.
_KIND_SEPARATOR = "\x1f"


def _count_name(key: StageCount) -> str:
    """The name ``key`` has in a commit record's ``totals``."""
    return key.stage if key.kind == "items" else f"{key.stage}{_KIND_SEPARATOR}{key.kind}"


def _count_key(name: str) -> StageCount:
    """The count a ``totals`` name stands for; ValueError if it names no kind of count."""
    stage, separator, kind = name.partition(_KIND_SEPARATOR)
    if not separator:
        return StageCount(stage, "items")
    if kind == "dead":
        return StageCount(stage, "dead")
    if kind == "late":
        return StageCount(stage, "late")
    raise ValueError(f"'totals' has a count of no known kind: {name!r}")


def _totals_from_json(data: Any) -> dict[StageCount, int] | None:
    """A commit record's ``totals``; ValueError if they are not counts by name."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"'totals' is not an object of counts: {data!r}")
    totals: dict[StageCount, int] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"'totals' of {name!r} is not a count: {value!r}")
        totals[_count_key(str(name))] = value
    return totals


class Checkpoint:
    """A streaming job's checkpoint folder in the store (layout in the module docstring)."""

    def __init__(self, store: Store, root: str) -> None:
        self.store = store
        self.root = root

    @property
    def id(self) -> str:
        """The checkpoint's id: the name of its folder, which the job's record names.

        A job with NONE starts a new checkpoint on every restart; sinks
        count batch ids per checkpoint id (``JobContext.checkpoint_id``).
        """
        return self.root.rstrip("/").rsplit("/", 1)[-1]

    def _json(self, path: str, loads: Callable[[bytes], Any] = json_loads) -> Any:
        """The checkpoint file ``path`` decoded by ``loads``; None if absent.

        A truncated or damaged one is a StoreError naming it (the job that
        reads it suspends with ``suspend_on_failure``, its checkpoint kept).
        """
        full = f"{self.root}/{path}"
        try:
            raw = self.store.read_bytes(full)
        except FileNotFoundError:
            return None
        return self.store.decode(full, raw, loads, "checkpoint file")

    def meta(self) -> dict[str, Any] | None:
        """meta.json, or None before the first batch was planned."""
        meta: dict[str, Any] | None = self._json(_META)
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write meta.json."""
        self.store.write_bytes(f"{self.root}/{_META}", json.dumps(meta).encode())

    def key_groups(self, default: int, stages: list[str]) -> int:
        """The checkpoint's number of key groups; on first use, write meta with ``default``.

        The number is fixed for the checkpoint's life: keys were assigned to key
        groups by it (a format-1/2 checkpoint's shards are its key groups).
        """
        meta = self.meta()
        if meta is None:
            meta = {"format": FORMAT, "key_groups": max(1, int(default)),
                    "stages": sorted(stages)}
            if not self.store.create_exclusive(
                f"{self.root}/{_META}", json.dumps(meta).encode()
            ):
                meta = self.meta()  # another driver wrote it first: its number stands
                assert meta is not None
        if int(meta.get("format", 1)) > FORMAT:
            raise StoreError(self.store.redact(
                f"checkpoint {self.root!r} has format {meta['format']}; this sparkjet reads "
                f"formats up to {FORMAT} (upgrade sparkjet to resume it)"
            ))
        if int(meta.get("format", 1)) < FORMAT:
            # New files get this format's names: an older sparkjet must not
            # resume the checkpoint and miss them.
            self.write_meta({**meta, "format": FORMAT})
        groups = self.written_key_groups()
        assert groups is not None
        return groups

    def written_key_groups(self) -> int | None:
        """The number of key groups meta.json fixed, or None before the first batch."""
        meta = self.meta()
        if meta is None:
            return None
        groups = meta.get("key_groups", meta.get("shards")) if isinstance(meta, dict) else None
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise StoreError(self.store.redact(
                f"checkpoint {self.root!r}: its {_META} names no number of key groups: {meta!r}"
            ))
        return groups

    def _batches(self, folder: str) -> list[int]:
        return sorted(
            int(e[:-5]) for e in self.store.listdir(f"{self.root}/{folder}")
            if e.endswith(".json") and e[:-5].isdigit()
        )

    def last_commit(self) -> int:
        """The last committed batch, or -1."""
        batches = self._batches(_COMMITS)
        return batches[-1] if batches else -1

    def commit_record(self, batch: int) -> CommitRecord:
        """What :meth:`write_commit` recorded for ``batch``."""
        record = self._json(_batch_file(_COMMITS, batch),
                            lambda raw: CommitRecord.from_json(batch, json_loads(raw)))
        if record is None:
            raise StoreError(self.store.redact(
                f"checkpoint file {self.root}/{_batch_file(_COMMITS, batch)!r} is missing "
                f"in store {self.store.shown_url!r}"))
        assert isinstance(record, CommitRecord)
        return record

    def planned(self, batch: int) -> BatchPlan | None:
        """The plan :meth:`write_plan` recorded for ``batch``, or None."""
        plan: BatchPlan | None = self._json(
            _batch_file(_OFFSETS, batch), lambda raw: BatchPlan.from_json(json_loads(raw)))
        return plan

    def plans(self) -> list[BatchPlan]:
        """The plans still kept, in batch order: one listing, then each plan read.

        At least those of the last :data:`KEEP_LOG` committed batches, and a
        batch planned but not committed yet.
        """
        return [plan for batch in self._batches(_OFFSETS)
                if (plan := self.planned(batch)) is not None]

    def write_plan(self, plan: BatchPlan) -> BatchPlan:
        """Record a batch's plan before running it (the write-ahead log).

        Create-only: a batch has one plan for its life. If another driver
        planned it first, that plan is returned and must be run instead.
        """
        if self.store.create_exclusive(
            f"{self.root}/{_batch_file(_OFFSETS, plan.batch)}", json.dumps(plan.to_json()).encode()
        ):
            return plan
        standing = self.planned(plan.batch)
        assert standing is not None
        return standing

    def write_commit(
        self, record: CommitRecord, state: StatePaths | None = None, *, prune: bool = True
    ) -> bool:
        """Record ``record.batch`` as committed; forget the log of batches long committed.

        Create-only: False if the batch was committed already (by another
        driver, which is then the job's driver: the caller checks its fence).
        ``record.state`` names the state files that count. Then, with
        ``prune``, :meth:`prune` runs (with ``state``, whose ``counted`` must
        cover the batches pruned); a micro-batch's commit
        (:class:`~sparkjet.core.microbatch.commit.BatchCommit`) leaves that to its
        upkeep thread instead.
        """
        batch = record.batch
        if not self.store.create_exclusive(
            f"{self.root}/{_batch_file(_COMMITS, batch)}", json.dumps(record.to_json()).encode()
        ):
            return False
        if prune:
            self.prune(batch, state)
        return True

    def prune_due(self, batch: int) -> bool:
        """Whether the commit of ``batch`` is one after which the log is pruned."""
        return batch % KEEP_LOG == 0

    def prune(self, batch: int, state: StatePaths | None) -> int | None:
        """Forget the log of batches committed long before ``batch``; up to which batch.

        Every :data:`KEEP_LOG` batches (:meth:`prune_due`) the records and
        plans of batches ``batch - KEEP_LOG`` and older are removed, after
        the state files they say do not count, with ``state`` (its
        ``counted`` must cover them: a batch it does not know keeps every
        file). None when ``batch`` is not due. Cumulative: a prune that
        failed is made up by the next.
        """
        if not self.prune_due(batch):
            return None
        upto = batch - KEEP_LOG
        old = {b for b in self._batches(_COMMITS) if b <= upto}
        if state is not None and old:
            state.remove_uncounted(old)
        self.store.remove_many([
            f"{self.root}/{_batch_file(folder, b)}"
            for folder in (_OFFSETS, _COMMITS) for b in self._batches(folder)
            if b <= upto])
        return upto

    def counted(self) -> Counted:
        """Which state files count, from every commit record still kept that names them."""
        out: Counted = {}
        for batch in self._batches(_COMMITS):
            data = self._json(_batch_file(_COMMITS, batch))
            if isinstance(data, dict) and isinstance(data.get("state"), dict):
                state = CommitRecord.from_json(batch, data).state
                assert state is not None
                out[batch] = state
        return out

    def pin(self, batch: int) -> str:
        """Pin ``batch``'s state for a snapshot export; returns the pin's token.

        While the pin stands no state file of ``batch`` or an older one is
        removed: the job's own state tasks are told so by their driver
        (:attr:`StatePaths.pinned`), ``sparkjet gc`` reads the pin files. The
        exporter removes its pin with :meth:`unpin` when done; a driver
        starting the job removes those a dead one left (:meth:`clear_pins`).
        """
        token = uuid.uuid4().hex[:16]
        self.store.write_bytes(f"{self.root}/{_PINS}/{token}.json", json.dumps(
            {"batch": batch, "time": int(time.time() * 1000)}).encode())
        return token

    def unpin(self, token: str) -> None:
        """Remove the pin :meth:`pin` returned ``token`` for."""
        self.store.remove(f"{self.root}/{_PINS}/{token}.json")

    def pinned(self) -> int:
        """The newest batch a pin file names, or -1."""
        newest = -1
        for entry in self.store.listdir(f"{self.root}/{_PINS}"):
            pin = self._json(f"{_PINS}/{entry}") if entry.endswith(".json") else None
            if isinstance(pin, dict) and isinstance(pin.get("batch"), int):
                newest = max(newest, pin["batch"])
        return newest

    def clear_pins(self, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Remove every pin but those of ``keep`` (those of exports that died with their driver)."""
        for entry in self.store.listdir(f"{self.root}/{_PINS}"):
            if entry.removesuffix(".json") not in keep:
                self.store.remove(f"{self.root}/{_PINS}/{entry}")

    @property
    def state_root(self) -> str:
        """The folder of the keyed state."""
        return f"{self.root}/{_STATE}"

    def state(self, key_groups: int) -> StatePaths:
        """The state layout of this checkpoint, with its number of key groups."""
        return StatePaths(self.store, self.state_root, key_groups)

    def delete(self) -> None:
        """Remove the whole checkpoint."""
        self.store.remove(self.root, recursive=True)

