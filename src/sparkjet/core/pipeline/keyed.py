"""Keyed-operation semantics, written once for batch and streaming jobs.

A keyed stage (``group_by(...)`` with ``aggregate``, ``apply`` or
``map_stateful``, and ``distinct``) and the global ``aggregate`` run in two
halves:

- the *map side*, fused into the pass that feeds the stage
  (:mod:`sparkjet.core.pipeline.fusion`), emits ``(shuffle key, part)`` records;
- the *reduce side* gathers each key's parts, sorts them by position and
  folds them into the key's state with the stage's :class:`KeyedFold`: from no
  state in a batch job (:func:`reduce_batch`), from the state as of the last
  committed micro-batch in a streaming job (:func:`fold_into`).

So Python's semantics hold alike in both: keys group as dict keys do (``1``,
``1.0`` and ``True`` are one key, reported as the first one encountered);
each key gets its own state (``create()`` per key, so its own copy of an
``initial`` value); a key's items fold in encounter order; ``distinct``
keeps the first occurrence.

Records crossing the shuffle
----------------------------
Parts are plain tuples: the map side emits one per item for stages that do
not combine, and each is pickled through the shuffle. A ``NamedTuple`` part
costs about 2.7 times as much to pickle and unpickle (a class reference per
record) and 1.4 times as much to build. The layouts, unpacked by name on the
reduce side::

    ITEM     (pidx, pos, key, item)   one per item: aggregates without a
                                      combiner, apply, map_stateful, and the
                                      global aggregate without one (key 0)
    PARTIAL  (pidx, pos, key, acc)    one per key and map partition: aggregates
                                      with a combiner (pos: the key's first
                                      item; global aggregate: key 0, pos 0)
    FIRST    (pidx, pos, item)        one per key and map partition: distinct,
                                      whose shuffle key is the (frozen) key

``pidx`` is the map partition, ``pos`` the item's index in that partition's
input to the map side, so ``(pidx, pos)`` is the item's place in encounter
order. The shuffle key of ITEM and PARTIAL parts is their ``key``. ITEM parts
are built in fusion's generated loop (the ``keyed`` terminal) rather than by
a function here, which would cost a call per item.

The reduce side emits ``(position, output)`` pairs, a position being
``(pidx, pos, j)``: the place of the item the output came from, and ``j``
orders several outputs there. Batch jobs put outputs back in that order;
streaming jobs drop the positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any, assert_never

from sparkjet.core.pipeline.aggregation import AggregateOperation
from sparkjet.core.pipeline.fusion import FusedPass, Terminal, TerminalKind
from sparkjet.core.pipeline.graph import (
    AggregateSpec,
    DistinctSpec,
    GroupAggregateSpec,
    GroupApplySpec,
    MapStatefulSpec,
)
from sparkjet.core.pipeline.timers import DueIndex

#: A part's place in encounter order, ``(pidx, pos)``: the sort key of a key's parts.
position = itemgetter(0, 1)

#: Where the global aggregate's one output goes.
_ORIGIN = (0, 0, 0)
#: Batch outputs are handed on in runs of about this many: a generator step per key
#: would cost as much as a small key's fold, one list of all would hold them all.
_FLUSH = 1024


class _Missing:
    """The state of a key not seen before."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _constant_key(_item: Any) -> int:
    return 0


class KeyedFold(ABC):
    """One keyed operation's semantics: how a key's parts fold into its state.

    A key's *entry* is what a streaming job keeps for it between batches:
    ``(key, state)``, the key as first encountered and the operation's state
    (an accumulator, a transform's state, a ``map_stateful`` state), or
    ``True`` for ``distinct``. Its layout is part of the checkpoint format.
    """

    @abstractmethod
    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        """The map side: the terminal of the fused pass that feeds the stage."""

    @abstractmethod
    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        """Fold one key's ``parts`` (sorted by position) into ``entry``.

        ``entry`` is :data:`MISSING` for a key with no state. Appends
        ``(position, output)`` pairs to ``out``; returns ``(key, new entry)``.
        """

    def empty(self) -> list[tuple[Any, Any]]:
        """The outputs of a batch job whose input had no items."""
        return []

    #: Whether the fold has work of its own as event time advances (windows):
    #: :meth:`advance` runs after every batch's fold, for the keys that are due.
    timed = False

    def advance(
        self, values: dict[Any, Any], out: list[tuple[Any, Any]], changed: list[Any],
        removed: list[Any], index: DueIndex | None = None,
    ) -> None:
        """Emit and purge what event time made due, over ``values``.

        Appends ``(position, output)`` pairs to ``out``, the keys changed to
        ``changed`` and the keys dropped (deleted from ``values``) to ``removed``.
        With ``index`` (:meth:`due_index`'s), visits only the keys it files as
        due and files them anew; without, every key. Only timed folds have any.
        """
        return None

    def due_index(self, values: dict[Any, Any], timers: dict[str, DueIndex]) -> DueIndex | None:
        """The index in ``timers`` of when ``values``' keys are due, made ready (timed folds).

        Rebuilt from ``values`` where ``timers`` holds none, or one kept for
        another definition. None for folds without timers.
        """
        return None

    def due(self, entry: Any) -> int | None:
        """When the key of ``entry``, just folded, is next due (None: not at all)."""
        return None


def _accumulated(operation: AggregateOperation, acc: Any, parts: list[Any]) -> Any:
    accumulate = operation.accumulate
    for _pidx, _pos, _key, item in parts:
        acc = accumulate(acc, item)
    return acc


def _combined(operation: AggregateOperation, parts: list[Any]) -> Any:
    combine = operation.combine
    assert combine is not None
    _pidx, _pos, _key, acc = parts[0]
    for _pidx, _pos, _key, partial in parts[1:]:
        acc = combine(acc, partial)
    return acc


class GroupAggregate(KeyedFold):
    """``group_by(...).aggregate(op)`` with a combiner: partials per key and partition."""

    def __init__(self, operation: AggregateOperation) -> None:
        self.operation = operation

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        op = self.operation
        return Terminal(
            TerminalKind.GROUP, stage, key_fn, op.create, op.accumulate, inline=op.inline
        )

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        op = self.operation
        pidx, pos, key, _ = parts[0]
        acc = _combined(op, parts)
        if entry is not MISSING:
            assert op.combine is not None
            key, old = entry
            acc = op.combine(old, acc)
        out.append(((pidx, pos, 0), (key, op.finish(acc))))
        return key, (key, acc)


class GroupAccumulate(KeyedFold):
    """``group_by(...).aggregate(op)`` without a combiner: every item to its key's reducer."""

    def __init__(self, operation: AggregateOperation) -> None:
        self.operation = operation

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        return Terminal(TerminalKind.KEYED, stage, key_fn)

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        op = self.operation
        pidx, pos, key, _ = parts[0]
        key, acc = (key, op.create()) if entry is MISSING else entry
        acc = _accumulated(op, acc, parts)
        out.append(((pidx, pos, 0), (key, op.finish(acc))))
        return key, (key, acc)


class GroupApply(KeyedFold):
    """``group_by(...).apply(transform)``: one ``process`` call per key and batch."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        return Terminal(TerminalKind.KEYED, stage, key_fn)

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        transform = self.transform
        pidx, pos, key, _ = parts[0]
        key, state = (key, transform.create_state()) if entry is MISSING else entry
        state, outputs = transform.process(state, key, [item for _, _, _, item in parts])
        for j, output in enumerate(outputs):
            out.append(((pidx, pos, j), output))
        return key, (key, state)


class MapStateful(KeyedFold):
    """``group_by(...).map_stateful(create_fn, map_fn)``: outputs placed at their items."""

    def __init__(self, create_fn: Callable[[], Any], map_fn: Callable[[Any, Any, Any], Any]):
        self.create_fn = create_fn
        self.map_fn = map_fn

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        return Terminal(TerminalKind.KEYED, stage, key_fn)

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        map_fn = self.map_fn
        _, _, key, _ = parts[0]
        key, state = (key, self.create_fn()) if entry is MISSING else entry
        j = 0
        for pidx, pos, _key, item in parts:
            output = map_fn(state, key, item)
            if output is not None:
                out.append(((pidx, pos, j), output))
                j += 1
        return key, (key, state)


class Distinct(KeyedFold):
    """``distinct(key_fn)``: the first occurrence of each key, ever (or within the TTL)."""

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        return Terminal(TerminalKind.DISTINCT, stage, key_fn)

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        if entry is MISSING:
            pidx, pos, item = parts[0]
            out.append(((pidx, pos, 0), item))
        # The group key: FIRST parts carry none, and it is the frozen form when
        # the key is unhashable, which is what the state must be keyed by.
        return group_key, True


class Aggregate(KeyedFold):
    """The global ``aggregate(op)`` (batch jobs only): everything under the one key 0."""

    def __init__(self, operation: AggregateOperation) -> None:
        self.operation = operation

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        op = self.operation
        if op.combine is not None:
            return Terminal(TerminalKind.FOLD, stage, None, op.create, op.accumulate)
        return Terminal(TerminalKind.KEYED, stage, _constant_key)

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        op = self.operation
        if op.combine is not None:
            acc = _combined(op, parts)
        else:
            acc = _accumulated(op, op.create(), parts)
        out.append((_ORIGIN, op.finish(acc)))
        return group_key, acc

    def empty(self) -> list[tuple[Any, Any]]:
        op = self.operation
        return [(_ORIGIN, op.finish(op.create()))]


def keyed_fold(
    spec: GroupAggregateSpec | GroupApplySpec | MapStatefulSpec | DistinctSpec | AggregateSpec,
) -> KeyedFold:
    """The fold of a keyed node (but a window: see ``windowing.stage_fold``) or ``aggregate``."""
    match spec:
        case GroupAggregateSpec(operation=operation):
            if operation.combine is not None:
                return GroupAggregate(operation)
            return GroupAccumulate(operation)
        case GroupApplySpec(transform=transform):
            return GroupApply(transform)
        case MapStatefulSpec(create_fn=create_fn, map_fn=map_fn):
            return MapStateful(create_fn, map_fn)
        case DistinctSpec():
            return Distinct()
        case AggregateSpec(operation=operation):
            return Aggregate(operation)
        case _:  # pragma: no cover
            assert_never(spec)


# --- map side: records of the folding terminals ------------------------------


def folded_records(
    fused: FusedPass, state: dict[str, Any], items: Iterator[Any], counts: dict[str, int]
) -> Iterator[tuple[Any, Any]]:
    """Run ``fused``, which ends in a folding terminal, over one partition; its records.

    The pass folds the whole partition (group, distinct, fold, frames or
    sessions terminal) into ``state``, which holds ``"pidx"`` (and ``"wm"``
    for a windowed terminal) and keeps what the pass leaves there (the
    highest timestamp, the late items) for the caller; then it yields one
    ``(shuffle key, part)`` record per key (one in all for fold).
    """
    kind = fused.terminal.kind
    pidx = state["pidx"]
    if kind == TerminalKind.GROUP:
        state.update(accs={}, firsts={})
        fused.consume(items, counts, state)
        firsts = state["firsts"]
        for key, acc in state.pop("accs").items():
            yield (key, (pidx, firsts[key], key, acc))  # PARTIAL
    elif kind == TerminalKind.DISTINCT:
        state["seen"] = {}
        fused.consume(items, counts, state)
        for key, (pos, item) in state.pop("seen").items():
            yield (key, (pidx, pos, item))  # FIRST
    elif kind == TerminalKind.FOLD:
        create = fused.terminal.create
        assert create is not None
        state["acc"] = create()
        fused.consume(items, counts, state)
        yield (0, (pidx, 0, 0, state.pop("acc")))  # PARTIAL of the global aggregate
    elif kind == TerminalKind.FRAMES:
        state.update(accs={}, firsts={})
        fused.consume(items, counts, state)
        firsts = state.pop("firsts")
        keys: dict[Any, tuple[int, dict[Any, Any]]] = {}
        for (key, frame), acc in state.pop("accs").items():
            had = keys.get(key)
            if had is None:  # the key's first frame holds its first item
                keys[key] = (firsts[(key, frame)], {frame: acc})
            else:
                had[1][frame] = acc
        for key, (pos, frames) in keys.items():
            yield (key, (pidx, pos, key, frames))  # PARTIAL of frames
    elif kind == TerminalKind.SESSIONS:
        state.update(accs={}, firsts={})
        fused.consume(items, counts, state)
        terminal = fused.terminal
        firsts = state.pop("firsts")
        for key, events in state.pop("accs").items():
            sessions = sessions_of(events, terminal.span, terminal.create, terminal.accumulate)
            yield (key, (pidx, firsts[key], key, sessions))  # PARTIAL of sessions
    elif kind == TerminalKind.EVENTS:
        state.update(accs={}, firsts={})
        fused.consume(items, counts, state)
        firsts = state.pop("firsts")
        for key, events in state.pop("accs").items():
            yield (key, (pidx, firsts[key], key, events))  # PARTIAL of timed events
    else:  # pragma: no cover - callers run other terminals themselves
        raise AssertionError(f"{kind} is not a folding terminal")


def sessions_of(
    events: list[tuple[Any, Any]], timeout: int, create: Any, accumulate: Any
) -> list[list[Any]]:
    """One key's ``(t, item)`` events as sessions ``[start, last timestamp, acc]``.

    Sorted by timestamp (stable: encounter order among equal ones), each
    event folded into the session its span ``[t, t + timeout)`` overlaps.
    """
    events.sort(key=_timestamp)
    sessions: list[list[Any]] = []
    current: list[Any] | None = None
    for t, item in events:
        if current is not None and t < current[1] + timeout:
            if t > current[1]:
                current[1] = t
            current[2] = accumulate(current[2], item)
        else:
            current = [t, t, accumulate(create(), item)]
            sessions.append(current)
    return sessions


_timestamp = itemgetter(0)


# --- reduce side -------------------------------------------------------------


def group_parts(records: Iterable[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    """Gather ``(shuffle key, part)`` records into each key's parts."""
    groups: dict[Any, list[Any]] = {}
    for key, part in records:
        bucket = groups.get(key)
        if bucket is None:
            groups[key] = [part]
        else:
            bucket.append(part)
    return groups


def reduce_batch(fold: KeyedFold, records: Iterable[tuple[Any, Any]]) -> Iterator[Any]:
    """Batch reduce side: fold each key from no state; yields ``(position, output)``."""
    groups = group_parts(records)
    out: list[tuple[Any, Any]] = []
    fold_key = fold.fold
    timed = fold.timed
    values: dict[Any, Any] = {}
    for group_key, parts in groups.items():
        if len(parts) > 1:
            parts.sort(key=position)
        _key, entry = fold_key(group_key, parts, MISSING, out)
        if timed:
            values[group_key] = entry
        if len(out) >= _FLUSH:
            yield from out
            out.clear()
    if timed:  # the end of a batch job's input: event time's end, every window due
        fold.advance(values, out, [], [])
    yield from out
    if not groups:
        yield from fold.empty()


#: The name of a TTL's index in a range's ``timers``: keys by the time they last had items.
TTL_TIMERS = "ttl"


def _ttl_index(touched: dict[Any, int], timers: dict[str, DueIndex]) -> DueIndex:
    """The range's index of keys by when they last had items; built from ``touched`` if missing."""
    index = timers.get(TTL_TIMERS)
    if index is None or index.of != TTL_TIMERS:
        index = DueIndex(TTL_TIMERS)
        for key, t in touched.items():
            index.add(key, t)
        index.changes()  # a reader without this index builds it just the same
        timers[TTL_TIMERS] = index
    index.synced = True
    return index


def fold_into(
    fold: KeyedFold,
    groups: dict[Any, list[Any]],
    values: dict[Any, Any],
    touched: dict[Any, int],
    now_ms: int,
    ttl_ms: int | None,
    changed: list[Any] | None = None,
    removed: list[Any] | None = None,
    timers: dict[str, DueIndex] | None = None,
) -> list[Any]:
    """Streaming reduce side: fold a micro-batch's parts into a shard's per-key state.

    ``groups`` holds the batch's parts by key (:func:`group_parts`);
    ``values`` maps each key to its entry and ``touched`` to when it last had
    items (kept only with a TTL); both are updated in place. Keys whose TTL
    ran out are forgotten first, so this batch sees them as new. Returns the
    outputs; the keys set are appended to ``changed`` and those dropped by
    the TTL to ``removed`` (the batch's changelog).

    ``timers``, the range's due-time indexes (``RangeState.timers``), let a
    timed fold visit only the keys that are due, and a TTL expire only the
    keys whose time ran out; they are kept up to date in place (and built on
    first use). Without them a timed fold visits every key as event time
    advances, and a TTL scans every key's ``touched``.
    """
    ttl_index = None
    if ttl_ms:
        horizon = now_ms - int(ttl_ms)
        if timers is None:
            expired = [k for k, t in touched.items() if t < horizon]
        else:
            ttl_index = _ttl_index(touched, timers)
            # A key popped but touched since is filed again under that touch: skip it.
            expired = [k for k in ttl_index.pop_due(horizon - 1)
                       if touched.get(k, horizon) < horizon]
        for key in expired:
            values.pop(key, None)
            del touched[key]
            if removed is not None:
                removed.append(key)
    out: list[tuple[Any, Any]] = []
    get = values.get
    fold_key = fold.fold
    index = fold.due_index(values, timers) if timers is not None and fold.timed else None
    for group_key, parts in groups.items():
        if len(parts) > 1:
            parts.sort(key=position)
        key, entry = fold_key(group_key, parts, get(group_key, MISSING), out)
        values[key] = entry
        if index is not None:
            due = fold.due(entry)
            if due is not None:
                index.add(key, due)
        if ttl_ms:
            touched[key] = now_ms
            if ttl_index is not None:
                ttl_index.add(key, now_ms)
        if changed is not None:
            changed.append(key)
    if fold.timed:
        timed_changed: list[Any] = []
        timed_removed: list[Any] = []
        fold.advance(values, out, timed_changed, timed_removed, index)
        if changed is not None:
            # A key folded in and then emitted to nothing is removed, not set.
            changed[:] = [k for k in dict.fromkeys([*changed, *timed_changed]) if k in values]
        if removed is not None:
            removed.extend(timed_removed)
    return [output for _, output in out]
