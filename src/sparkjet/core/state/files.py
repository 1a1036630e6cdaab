"""The keyed state's files in a checkpoint: their names, their two formats, reading and writing.

:class:`StatePaths` is the one place that names, lists, reads, writes and
removes the files under a checkpoint's ``state/`` folder (the folder itself,
and the checkpoint's record files, are :mod:`sparkjet.core.state.checkpoint`'s);
which key group a key belongs to is :mod:`sparkjet.core.state.keygroups`'.

Names: ``state/<stage>/<batch>-<lo>-<hi>-<keys>-<bytes>-<attempt>.state|.delta``
(format 4; :mod:`sparkjet.core.state.checkpoint`'s docstring has the whole layout
and the older formats, which are read as they are). ``<batch>`` is
zero-padded to 20 digits, ``<lo>`` and ``<hi>`` (the key groups ``[lo, hi)``
a file holds) to 5; ``<keys>`` is the number of keys in those groups after
the batch, ``<bytes>`` the file's size, ``<attempt>`` 8 characters naming the
task attempt that wrote it (a compaction's start with ``z``), so attempts
never overwrite one another.

Contents: a ``.state`` file (a full copy) is a cloudpickle of ``{"values":
{key: entry}, "touched": {key: millis}, "timers": {kind: index}}`` (entries as
:class:`sparkjet.core.pipeline.keyed.KeyedFold` describes; ``touched`` only for stages
with a TTL; ``timers``, the keys by due time, for windowed stages, each
index as :meth:`sparkjet.core.pipeline.timers.DueIndex.to_state` gives it); a
``.delta`` file (one batch's changelog) a cloudpickle of ``{"set": {key:
entry}, "touched": {key: millis}, "removed": [key], "due": {kind: changes}}``
(``due``: :meth:`sparkjet.core.pipeline.timers.DueIndex.changes`). A key group's state
as of batch ``b`` is the newest ``.state`` covering it not after ``b`` with
the ``.delta`` files covering it after that, up to ``b``, applied in order.
Files written before there were timers have no ``timers`` and ``due``: the
range's index is rebuilt from its keys when the fold first meets it, and so
it is for a chain of several ranges' files (rare: the number of state tasks
changed).

Which file of a batch and range counts is what the batch's commit record
says (:class:`StateRange` to file name; see :meth:`StatePaths.counts`).
"""

from __future__ import annotations

import functools
import gc
import logging
from typing import Any, NamedTuple

import cloudpickle

from sparkjet.core.errors import StoreError
from sparkjet.core.model import DEFAULT_KEY_GROUPS
from sparkjet.core.pipeline.timers import DueIndex
from sparkjet.core.state.keygroups import key_group
from sparkjet.core.state.versions import (
    _COMPACTED,
    _DELTA_SUFFIX,
    _SHARD_WIDTH,
    Counted,
    StateRange,
    StateVersion,
    chain_order,
    full_copy_starts,
    new_version,
    parse_version,
    replaced_by_full_copies,
)
from sparkjet.core.store import upkeep
from sparkjet.core.store.fs import Store
from sparkjet.core.store.naming import decode_name, encode_name, loads, unpickle

log = logging.getLogger(__name__)
#: A range's state is compacted into a full copy once its chain holds this many
#: changelogs: off the critical path (:mod:`sparkjet.core.state.compaction`) where the
#: store is shared between processes, else by the state task itself.
COMPACT_EVERY = 10
#: The state task writes a full copy itself once the chain holds this many
#: changelogs: background compaction has fallen behind or keeps failing.
COMPACT_LIMIT = 4 * COMPACT_EVERY


class RangeState(NamedTuple):
    """The state of key groups ``[lo, hi)`` as of one batch, and the files it was read from.

    ``timers``: the range's indexes of keys by due time, by kind (``"window"``),
    as read from its files (None where not kept: a timed fold then visits
    every key). Only an index that a fold keeps up to date
    (:attr:`DueIndex.synced`) is written back.
    """

    values: dict[Any, Any]
    touched: dict[Any, int]
    chain: list[StateVersion]
    timers: dict[str, DueIndex] | None = None


def _loads_paused(raw: bytes) -> Any:
    """``loads`` (pickles of moved modules too) with the cyclic garbage collector paused.

    Unpickling a range's state makes millions of container objects, and each
    full collection their growth sets off walks all of them again: 500k keys
    of window frames took 4.4 s to unpickle with the collector running and
    1.1 s with it paused. Unpickling makes no garbage cycles of its own.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return loads(raw)
    finally:
        if enabled:
            gc.enable()


def _timers_of(data: dict[str, Any]) -> dict[str, DueIndex]:
    """The indexes a full copy holds (none in one written before there were timers)."""
    return {kind: DueIndex.from_state(state) for kind, state in data.get("timers", {}).items()}


def _replay_due(timers: dict[str, DueIndex], delta: dict[str, Any]) -> None:
    """Bring ``timers`` past one changelog; an index the changelog says nothing of is dropped.

    (Its writer did not keep that index up to date: it is rebuilt where it is next used.)
    """
    due = delta.get("due", {})
    for kind in list(timers):
        if kind in due:
            timers[kind].apply_changes(due[kind])
        else:
            del timers[kind]


def _written_timers(timers: dict[str, DueIndex] | None) -> dict[str, DueIndex]:
    """The indexes to write with a range's state: those a fold keeps up to date."""
    return {kind: index for kind, index in (timers or {}).items() if index.synced}


class StatePaths:
    """Where a job's keyed state lives, and reading and writing it; picklable.

    State is split into a fixed number of *key groups* (``key_groups``, fixed
    for a checkpoint's life, like Flink's maximum parallelism); a micro-batch
    runs some number of state tasks, each owning a contiguous range of key
    groups (:func:`task_range`), and that number may differ from batch to
    batch (a job resumed on a bigger cluster runs more). A task's files name
    its range, and a reader of any range takes from every file that overlaps
    it the keys of its own groups.

    Cost follows the work: a batch writes a *changelog* of the keys it
    changed (``.delta``), not the range's whole state. A full copy
    (``.state``) is written when a batch changed at least half the keys, or
    the range differs from the files it read, or (``background=False``) the
    chain holds :data:`COMPACT_EVERY` changelogs; otherwise chains are folded
    into full copies off the critical path by :meth:`compact`, and the task
    writes one itself only past :data:`COMPACT_LIMIT`. After a full copy
    exists, the next write removes the range's older files. A key group's
    state as of a batch is the newest full copy covering it, not after the
    batch, plus the changelogs after that copy. A batch replayed after a
    crash reads the state as of the last committed batch, so it starts from
    exactly the state it started from the first time.
    """

    def __init__(
        self,
        store: Store,
        root: str,
        key_groups: int = DEFAULT_KEY_GROUPS,
        counted: Counted | None = None,
        pinned: int = -1,
    ) -> None:
        self.store = store
        self.root = root
        self.key_groups = key_groups
        #: The files that count of batches whose commit records are still kept.
        self.counted: Counted = counted or {}
        #: Files of this batch or older are never removed here: a snapshot
        #: export is reading that batch's state (-1: none; see :meth:`Checkpoint.pin`).
        self.pinned = pinned

    def with_counted(self, counted: Counted) -> StatePaths:
        """The same layout, knowing which files of recent batches count (see :meth:`counts`)."""
        return StatePaths(self.store, self.root, self.key_groups, counted, self.pinned)

    def with_pin(self, pinned: int) -> StatePaths:
        """The same layout, removing no file of batch ``pinned`` or older (-1: none)."""
        return StatePaths(self.store, self.root, self.key_groups, self.counted, pinned)

    def counts(self, stage: str, version: StateVersion) -> bool:
        """Whether a file counts: its batch's commit record names it, or names nothing.

        A batch's commit record names, per :class:`StateRange`, the
        file its successful task attempt wrote (``""`` for none). Another
        attempt's file of that batch and range (a task retried, a speculative
        or late copy, a replay after a crash) does not count, and neither does
        a file for a range the record says got none. A full copy that
        compaction folded (attempt ``z...``) counts where the record names a
        changelog of that range. For batches whose records are no longer kept
        every file counts: those that did not were removed before the records
        (see :meth:`remove_uncounted`).
        """
        files = self.counted.get(version.batch)
        named = None if files is None else files.get(StateRange(stage, version.lo, version.hi))
        if named is None or version.name == named:
            return True
        return version.full and version.attempt.startswith(_COMPACTED) and named.endswith(
            _DELTA_SUFFIX)

    def remove_uncounted(self, batches: set[int]) -> None:
        """Remove the files of ``batches`` that do not count (before their records go)."""
        self.store.remove_many([
            self.path(stage, version) for stage in self.stages()
            for version in self.versions(stage, counted_only=False)
            if version.batch in batches and not self.counts(stage, version)])

    def stage_dir(self, stage: str) -> str:
        """The folder of one stage's state."""
        return f"{self.root}/{encode_name('stage', stage)}"

    def path(self, stage: str, version: StateVersion) -> str:
        """The path of one state file."""
        if version.folder:
            return f"{self.stage_dir(stage)}/{version.folder}/{version.name}"
        return f"{self.stage_dir(stage)}/{version.name}"

    def versions(
        self, stage: str, lo: int = 0, hi: int | None = None, counted_only: bool = True,
        entries: list[str] | None = None,
    ) -> list[StateVersion]:
        """Every state file of a stage overlapping key groups ``[lo, hi)``, oldest first.

        Listed afresh, or from ``entries``, the stage folder's listing taken
        since the last commit (a micro-batch's driver lists it once for all
        its state tasks: a range's files are removed only by the range's own
        task, after it read them); without the files that do not count
        (:meth:`counts`) unless ``counted_only`` is False.
        """
        hi = self.key_groups if hi is None else hi
        folder = self.stage_dir(stage)
        found: list[StateVersion | None] = []
        for entry in self.store.listdir(folder) if entries is None else entries:
            if len(entry) == _SHARD_WIDTH and entry.isdigit():
                if lo <= int(entry) < hi:  # a format-1/2 shard folder
                    found.extend(parse_version(e, entry)
                                 for e in self.store.listdir(f"{folder}/{entry}"))
            else:
                found.append(parse_version(entry))
        return sorted(
            (v for v in found if v is not None and v.lo < hi and v.hi > lo and (
                not counted_only or self.counts(stage, v))),
            key=chain_order)

    @staticmethod
    def chain(
        versions: list[StateVersion], committed: int, lo: int = 0, hi: int = 1
    ) -> list[StateVersion]:
        """The files that make up key groups ``[lo, hi)`` as of ``committed``, oldest first.

        For each key group, the newest full copy covering it and the
        changelogs covering it after that copy. ``versions`` holds only files
        that count (:meth:`counts`); where two still remain for one batch and
        range (a format-3 checkpoint, or a batch whose record is gone), the
        first by name stands.
        """
        seen: set[tuple[int, bool, int, int]] = set()
        usable: list[StateVersion] = []
        for v in versions:
            if v.batch <= committed and v.lo < hi and v.hi > lo and (
                    (v.batch, v.full, v.lo, v.hi) not in seen):
                seen.add((v.batch, v.full, v.lo, v.hi))
                usable.append(v)
        if all(v.lo == lo and v.hi == hi for v in usable):  # one range throughout: the usual
            fulls = [i for i, v in enumerate(usable) if v.full]
            return usable[fulls[-1]:] if fulls else usable
        starts = full_copy_starts(usable, lo, hi)
        return [
            v for v in usable
            if any((starts[g] == v.batch) if v.full else (v.batch > starts[g])
                   for g in range(max(v.lo, lo), min(v.hi, hi)))
        ]

    def size(self, stage: str, version: StateVersion) -> int:
        """The size of a version's file in bytes."""
        if version.size >= 0:
            return version.size
        return self.store.size(self.path(stage, version))

    def _check_keys(self, stage: str, version: StateVersion, keys: int) -> None:
        """A chain applied up to ``version`` must leave the key count its name gives."""
        if keys != version.keys:
            raise StoreError(self.store.redact(
                f"stage {stage!r}: state file {self.path(stage, version)!r} leaves "
                f"{keys} keys, its name says {version.keys}"
            ))

    def _load(self, stage: str, version: StateVersion) -> Any:
        path = self.path(stage, version)
        return unpickle(
            self.store.read_bytes(path), f"stage {stage!r}: state file {path!r}",
            keys=("values", "touched") if version.full else ("set", "touched", "removed"),
            redact=self.store.redact, loads=_loads_paused,
        )

    def read_chain(self, stage: str, lo: int, hi: int, chain: list[StateVersion]) -> RangeState:
        """The state of key groups ``[lo, hi)`` that the files of ``chain`` make up."""
        values: dict[Any, Any] = {}
        touched: dict[Any, int] = {}
        timers: dict[str, DueIndex] = {}
        simple = all(v.lo == lo and v.hi == hi for v in chain)
        starts = {} if simple else full_copy_starts(chain, lo, hi)
        for version in chain:
            data = self._load(stage, version)
            if simple:
                if version.full:
                    values, touched = data["values"], data["touched"]
                    timers = _timers_of(data)
                else:
                    _apply(values, touched, data, None, self.key_groups)
                    _replay_due(timers, data)
                self._check_keys(stage, version, len(values))
                continue
            overlap = range(max(version.lo, lo), min(version.hi, hi))
            if version.full:
                keep = {g for g in overlap if starts[g] == version.batch}
                whole = len(keep) == version.hi - version.lo
                for key, entry in data["values"].items():
                    if whole or key_group(key, self.key_groups) in keep:
                        values[key] = entry
                        if key in data["touched"]:
                            touched[key] = data["touched"][key]
            else:
                keep = {g for g in overlap if version.batch > starts[g]}
                whole = len(keep) == version.hi - version.lo
                _apply(values, touched, data, None if whole else keep, self.key_groups)
        return RangeState(values, touched, list(chain), timers)

    def read(self, stage: str, lo: int, hi: int, committed: int) -> tuple[RangeState, int]:
        """The state of key groups ``[lo, hi)`` as of ``committed``, and the bytes read."""
        chain = self.chain(self.versions(stage, lo, hi), committed, lo, hi)
        return self.read_chain(stage, lo, hi, chain), sum(self.size(stage, v) for v in chain)

    def write(
        self,
        stage: str,
        lo: int,
        hi: int,
        batch: int,
        state: RangeState,
        changed: list[Any],
        removed: list[Any],
        existing: list[StateVersion],
        background: bool = False,
    ) -> RangeState:
        """Write ``batch``'s file of key groups ``[lo, hi)``; returns the state with its new chain.

        ``state`` is the range's state after the batch (its chain: the files it
        was read from), ``changed`` and ``removed`` the keys the batch set and
        dropped, ``existing`` the stage's files as listed before. After
        writing, removes this range's files older than the chain's full copy (a
        replay of this batch reads only the chain), but none of the pinned
        batch or older (a snapshot export is reading it). Never touches a newer
        batch's file, nor one of this batch (a stray attempt of an old batch
        must not delete what a newer one wrote, and a reader of this batch may
        be reading the other attempt's copy), nor one that other ranges may
        still read (``sparkjet gc`` collects those). With ``background``,
        compaction is left to :meth:`compact` up to :data:`COMPACT_LIMIT`
        changelogs.
        """
        values, touched, chain, timers = state
        kept = _written_timers(timers)
        simple = bool(chain) and all(v.lo == lo and v.hi == hi for v in chain)
        deltas = sum(1 for v in chain if not v.full)
        limit = COMPACT_LIMIT if background else COMPACT_EVERY
        full = not simple or deltas + 1 >= limit or 2 * (
            len(changed) + len(removed)) >= max(len(values), 1)
        content: dict[str, Any]
        if full:
            content = {"values": values, "touched": touched}
            if kept:
                content["timers"] = {kind: index.to_state() for kind, index in kept.items()}
        else:
            content = {
                "set": {key: values[key] for key in changed},
                "touched": {key: touched[key] for key in changed if key in touched},
                "removed": removed,
            }
            if kept:
                content["due"] = {kind: index.changes() for kind, index in kept.items()}
        for index in kept.values():
            index.changes()  # what a full copy holds, or the changelog took
        data = cloudpickle.dumps(content)
        written = new_version(batch, lo, hi, len(values), data, full)
        self.store.write_bytes(self.path(stage, written), data)
        fulls = [v for v in chain if v.full]
        if simple and fulls:
            replaced = [self.path(stage, version) for version in existing
                        if (self.pinned < version.batch < fulls[0].batch and lo <= version.lo
                            and version.hi <= hi)]
            if replaced:
                # In one request (S3), after the batch when it runs on the driver (upkeep).
                upkeep.later(("replaced", replaced[0]),
                             functools.partial(self.store.remove_many, replaced),
                             f"removing {len(replaced)} state files that {written.name} replaces")
        return RangeState(values, touched, [written] if full else [*chain, written], timers)

    def write_copy(
        self, stage: str, lo: int, hi: int, batch: int, keys: int, data: bytes
    ) -> StateVersion:
        """Write ``data``, a full copy of key groups ``[lo, hi)`` (``keys`` keys) as of ``batch``.

        For a checkpoint seeded from a snapshot; the caller's commit record
        names the file (see :meth:`counts`).
        """
        written = new_version(batch, lo, hi, keys, data, True)
        self.store.write_bytes(self.path(stage, written), data)
        return written

    def compact(self, stage: str, lo: int, hi: int, committed: int) -> StateVersion | None:
        """Fold key groups ``[lo, hi)``'s chain as of ``committed`` into one full copy.

        Reads only committed files and writes the full copy under the batch of
        the chain's newest file, which is the state as of that batch: a reader
        then takes the copy and the changelogs after it, and the next write of
        the range removes the files it replaces. Returns the copy written, or
        None where there was nothing to fold (no changelog, or a chain over
        other ranges, which the next batch's task rewrites itself) or the
        chain is *superseded*: a full copy of a later batch covers the range
        (the task's own, or another process's compaction; two processes may
        compact one range at once), so the job never reads a copy as of
        ``committed`` unless it is pinned (a snapshot export folds it), and
        the writes after that copy remove the chain's files
        (:meth:`write`), even while this reads them. A file gone under it
        that is older than a full copy listed then is such a removal, not a
        loss: said at DEBUG only. (Nor is a superseded chain folded from a
        listing such removals have half done, which may lack a changelog.)
        """
        versions = self.versions(stage, lo, hi)
        chain = self.chain(versions, committed, lo, hi)
        if not chain or all(v.full for v in chain) or not all(
                v.lo == lo and v.hi == hi for v in chain):
            return None
        if self.pinned < committed and replaced_by_full_copies(versions, lo, hi, committed):
            log.debug("stage %r key groups [%d, %d): compaction as of batch %d skipped, "
                      "superseded by a later full copy", stage, lo, hi, committed)
            return None
        try:
            values, touched, _, timers = self.read_chain(stage, lo, hi, chain)
        except FileNotFoundError as exc:
            listed = self.versions(stage, lo, hi)
            gone = [v for v in chain if v not in listed]
            if not gone or not all(replaced_by_full_copies(listed, lo, hi, v.batch) for v in gone):
                raise
            log.debug("stage %r key groups [%d, %d): compaction as of batch %d skipped, "
                      "superseded: %d file(s) of its chain were removed after a later full "
                      "copy (%s)", stage, lo, hi, committed, len(gone), self.store.redact(str(exc)))
            return None
        # The indexes as the files make them up: as good as those files.
        content: dict[str, Any] = {"values": values, "touched": touched}
        if timers:
            content["timers"] = {kind: index.to_state() for kind, index in timers.items()}
        data = cloudpickle.dumps(content)
        written = new_version(chain[-1].batch, lo, hi, len(values), data, True, compacted=True)
        self.store.write_bytes(self.path(stage, written), data)
        return written

    @staticmethod
    def newer_files(
        kept: list[StateVersion], listed: list[StateVersion]
    ) -> list[StateVersion] | None:
        """The changelogs that bring state made of ``kept`` up to the chain ``listed``.

        ``[]`` when both make up the same state: the same files, or ``listed``
        starting with a full copy that :meth:`compact` folded from a prefix of
        ``kept`` (of the batch of that prefix's newest file) and going on
        with the rest of ``kept``'s files. The changelogs after those when
        ``listed`` goes on further. None when ``kept`` is not where ``listed``
        came from (another attempt's file, another range, a full copy
        ``kept`` never reached): such state must be read again.
        """
        if listed[: len(kept)] == kept:
            extra = listed[len(kept):]
        elif listed and listed[0].full:
            head = listed[0]
            cut = next((i + 1 for i, v in enumerate(kept)
                        if (v.batch, v.lo, v.hi) == (head.batch, head.lo, head.hi)), 0)
            rest = kept[cut:]
            if not cut or listed[1: 1 + len(rest)] != rest:
                return None
            extra = listed[1 + len(rest):]
        else:
            return None
        return None if any(v.full for v in extra) else extra

    def catch_up(
        self, stage: str, lo: int, hi: int, kept: RangeState, listed: list[StateVersion]
    ) -> RangeState | None:
        """``kept`` brought up to the chain ``listed`` by its newer changelogs, or None.

        The state kept loaded in a worker that ran this range some batches ago
        (another worker ran it since): reading the few changelogs written
        since costs the work done since, where reading ``listed`` again costs
        the whole range. None where :meth:`newer_files` says ``kept`` is not
        on ``listed``'s way; updates ``kept`` in place.
        """
        extra = self.newer_files(kept.chain, listed)
        if extra is None or not all(v.lo == lo and v.hi == hi for v in extra):
            return None
        values, touched = kept.values, kept.touched
        timers = {} if kept.timers is None else kept.timers
        for version in extra:
            data = self._load(stage, version)
            _apply(values, touched, data, None, self.key_groups)
            _replay_due(timers, data)
            self._check_keys(stage, version, len(values))
        return RangeState(values, touched, list(listed), timers)

    def stages(self) -> list[str]:
        """The names of the stages that have state here."""
        return sorted(decode_name(e) for e in self.store.listdir(self.root))

    def superseded(self, stage: str, committed: int) -> list[StateVersion]:
        """The stage's files that no key group's state needs as of ``committed`` or later.

        None of the pinned batch or older (a snapshot export is reading them).
        """
        versions = self.versions(stage)
        live = set(self.chain(versions, committed, 0, self.key_groups))
        return [v for v in versions
                if self.pinned < v.batch <= committed and v not in live]


def _apply(
    values: dict[Any, Any], touched: dict[Any, int], delta: dict[str, Any],
    keep: set[int] | None, groups: int,
) -> None:
    """Apply one changelog; with ``keep``, only to the keys of those key groups."""
    if keep is None:
        for key in delta["removed"]:
            values.pop(key, None)
            touched.pop(key, None)
        values.update(delta["set"])
        touched.update(delta["touched"])
        return
    for key in delta["removed"]:
        if key_group(key, groups) in keep:
            values.pop(key, None)
            touched.pop(key, None)
    for key, entry in delta["set"].items():
        if key_group(key, groups) in keep:
            values[key] = entry
            if key in delta["touched"]:
                touched[key] = delta["touched"][key]

