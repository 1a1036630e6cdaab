"""Windowed aggregation: frames and sessions folded per key, emitted as event time passes.

A windowed stage is a keyed stage (:mod:`sparkjet.core.pipeline.keyed`) whose state
per key is its open windows:

- sliding and tumbling windows keep one accumulator per *frame* (one slide of
  event time, labelled by its end), as Jet does: ``Frames(slide, {frame end:
  acc})``. The map side pre-aggregates each partition's items into frames
  (the ``frames`` terminal of :mod:`sparkjet.core.pipeline.fusion`); the reduce side
  combines them into the key's frames. A window's result combines the frames
  in ``(end - size, end]``; when the operation has ``deduct``, consecutive
  windows of a key are reached by adding the newest frame and deducting the
  oldest. A frame is purged once the last window holding it is emitted;
- session windows keep ``Sessions(timeout, [[start, last timestamp, acc],
  ...])``, sorted by start; parts merge with the key's sessions where their
  spans overlap, and a session is emitted (and dropped) once the watermark
  reaches ``last + timeout``.

Operations without ``combine`` are windowed through :func:`listing`, whose
accumulator is the list of items (folded with the user's functions when the
window is emitted), so any :class:`AggregateOperation` windows.

A key's state says which slide or timeout it was built with, so a job
started from a snapshot taken with another window definition reshapes it on
first use (:func:`reshaped`): frames are reassigned to the new frame their
end falls in, colliding ones combined in order; sessions are merged anew
with the new timeout. A session state never meets a sliding definition: the
upgrade rules refuse that change (``snapshots.upgrade.check_upgrade``).

Timers: in a streaming job a range's keys are filed by the time they are next
due (:class:`sparkjet.core.pipeline.timers.DueIndex`, kept with the range's state as
``timers["window"]``): a sliding or tumbling key under the first window end
above the last emitted watermark that holds one of its frames, a session key
under its earliest session end. A watermark step then visits only the keys
filed at or before it, so its cost follows the windows that close, not the
keys held. An index kept for another window definition, or none (state
written before there were timers), is rebuilt from the keys once, when the
fold first meets it. A batch that emits early results still visits every key
(each has open windows to report).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from sparkjet.core.pipeline.aggregation import AggregateOperation, to_list
from sparkjet.core.pipeline.event_time import WindowClock
from sparkjet.core.pipeline.fusion import Terminal, TerminalKind
from sparkjet.core.pipeline.graph import AggregateSpec, IntervalJoinSpec, KeyedSpec, WindowSpec
from sparkjet.core.pipeline.interval_fold import IntervalJoinFold
from sparkjet.core.pipeline.keyed import MISSING, KeyedFold, keyed_fold
from sparkjet.core.pipeline.timers import DueIndex, ready_index
from sparkjet.core.pipeline.windows import KeyedWindowResult, WindowDefinition, WindowResult

__all__ = ["WINDOW_TIMERS", "Frames", "Sessions", "WindowFold", "listing", "reshaped",
           "stage_fold"]

#: The name of a windowed stage's index in a range's ``timers``.
WINDOW_TIMERS = "window"


class Frames(NamedTuple):
    """A key's state in a sliding or tumbling window: accumulators by frame end."""

    slide: int
    frames: dict[int, Any]


class Sessions(NamedTuple):
    """A key's state in a session window: ``[start, last timestamp, acc]`` by start."""

    timeout: int
    sessions: list[list[Any]]


def listing(operation: AggregateOperation) -> AggregateOperation:
    """``operation`` made combinable: the accumulator is the items, folded at ``finish``."""
    create, accumulate, finish = operation.create, operation.accumulate, operation.finish

    def finished(items: list[Any]) -> Any:
        acc = create()
        for item in items:
            acc = accumulate(acc, item)
        return finish(acc)

    return replace(to_list(), finish=finished, name=operation.name)


def window_operation(operation: AggregateOperation) -> AggregateOperation:
    """The operation a window folds frames and sessions with (always combinable)."""
    return operation if operation.combine is not None else listing(operation)


def _frame_of(end: int, slide: int) -> int:
    """The first multiple of ``slide`` at or above ``end``."""
    return -((-end) // slide) * slide


def reshaped(state: Any, definition: WindowDefinition, operation: AggregateOperation) -> Any:
    """A key's window state as ``definition`` keeps it (the state as is when it already does)."""
    combine = operation.combine
    assert combine is not None
    if isinstance(state, Frames):
        if state.slide == definition.slide:
            return state
        frames: dict[int, Any] = {}
        for end in sorted(state.frames):
            frame = _frame_of(end, definition.slide)
            had = frames.get(frame, MISSING)
            frames[frame] = state.frames[end] if had is MISSING else combine(had, state.frames[end])
        return Frames(definition.slide, frames)
    if state.timeout == definition.timeout:
        return state
    return Sessions(definition.timeout, _merged(list(state.sessions), definition.timeout, combine))


def _merged(
    sessions: list[list[Any]], timeout: int, combine: Callable[[Any, Any], Any]
) -> list[list[Any]]:
    """Sessions merged where their spans overlap; ``sessions`` in order of arrival."""
    sessions.sort(key=_start)
    out: list[list[Any]] = []
    for session in sessions:
        if out and session[0] < out[-1][1] + timeout:
            last = out[-1]
            last[1] = max(last[1], session[1])
            last[2] = combine(last[2], session[2])
        else:
            out.append(list(session))
    return out


def _start(session: list[Any]) -> Any:
    return session[0]


class WindowFold(KeyedFold):
    """``window(definition)[.group_by(key_fn)].aggregate(operation)``; see the module docstring.

    ``clock`` says the batch's watermarks (a batch job's: every window is
    emitted at the end).
    """

    timed = True

    def __init__(
        self,
        definition: WindowDefinition,
        operation: AggregateOperation,
        keyed: bool,
        clock: WindowClock,
    ) -> None:
        self.definition = definition
        self.operation = window_operation(operation)
        self.keyed = keyed
        self.clock = clock
        #: Where each key folded since the last advance first appeared (batch output order).
        self._first: dict[Any, tuple[int, int]] = {}

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        op, definition = self.operation, self.definition
        if definition.is_session:
            return Terminal(TerminalKind.SESSIONS, stage, key_fn, op.create, op.accumulate,
                            span=definition.timeout)
        return Terminal(TerminalKind.FRAMES, stage, key_fn, op.create, op.accumulate,
                        inline=op.inline, span=definition.slide)

    def empty_state(self) -> Any:
        """A key's state before its first part."""
        if self.definition.is_session:
            return Sessions(self.definition.timeout, [])
        return Frames(self.definition.slide, {})

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        pidx, pos, key, _ = parts[0]
        if entry is MISSING:
            state = self.empty_state()
        else:
            key, state = entry
            state = reshaped(state, self.definition, self.operation)
        self._first.setdefault(key, (pidx, pos))
        combine = self.operation.combine
        assert combine is not None
        if isinstance(state, Frames):
            frames = state.frames
            for _pidx, _pos, _key, partial in parts:
                for frame, acc in partial.items():
                    had = frames.get(frame, MISSING)
                    frames[frame] = acc if had is MISSING else combine(had, acc)
        else:
            incoming = [s for _pidx, _pos, _key, partial in parts for s in partial]
            state = Sessions(state.timeout,
                             _merged([*state.sessions, *incoming], state.timeout, combine))
        return key, (key, state)

    @property
    def timers_for(self) -> str:
        """What the due times of this fold's index are computed for: its window definition."""
        d = self.definition
        return f"{d.kind} size={d.size} slide={d.slide} timeout={d.timeout}"

    def _due(self, state: Frames | Sessions, after: int) -> int | None:
        """When a key holding ``state`` is next due, windows up to ``after`` emitted (None: never).

        Frames: the first window end above ``after`` that holds the earliest
        frame (a later frame is in no earlier window); sessions: the earliest
        session end.
        """
        if isinstance(state, Frames):
            frames = state.frames
            if not frames:
                return None
            slide = state.slide
            return max(min(frames), after - after % slide + slide)
        sessions = state.sessions
        if not sessions:
            return None
        due: int = min(s[1] for s in sessions) + state.timeout
        return due

    def due(self, entry: Any) -> int | None:
        """When the key of ``entry``, just folded, is next due."""
        return self._due(entry[1], self.clock.previous)

    def due_index(self, values: dict[Any, Any], timers: dict[str, DueIndex]) -> DueIndex:
        """The range's index in ``timers``, ready for this batch.

        Rebuilt from ``values`` (O(keys), once) where it was kept for another
        window definition or not kept at all.
        """
        after, definition, operation = self.clock.previous, self.definition, self.operation
        return ready_index(timers, WINDOW_TIMERS, self.timers_for, values, lambda stored: self._due(
            reshaped(stored, definition, operation), after))

    def advance(
        self, values: dict[Any, Any], out: list[tuple[Any, Any]], changed: list[Any],
        removed: list[Any], index: DueIndex | None = None,
    ) -> None:
        clock = self.clock
        first, self._first = self._first, {}
        if clock.current <= clock.previous and not clock.early:
            return
        emit = self._emitter(out, first)
        due: dict[Any, None] = {}
        if index is None:
            entries = list(values.items())
        else:
            # Only the keys filed at or before the watermark have windows to emit or
            # frames to purge; early results need every key with open windows. A key
            # filed but gone (a TTL dropped it) has nothing left.
            due = dict.fromkeys(index.pop_due(clock.current))
            entries = (list(values.items()) if clock.early
                       else [(k, values[k]) for k in due if k in values])
        current = clock.current
        for group_key, (key, stored) in entries:
            state = reshaped(stored, self.definition, self.operation)
            if isinstance(state, Frames):
                left: Any = self._frames(key, state, emit)
            else:
                left = self._sessions(key, state, emit)
            if index is not None and group_key in due:
                when = self._due(left, current)
                if when is not None:
                    index.add(group_key, when)
            if left is stored:
                continue
            if left[1]:
                values[group_key] = (key, left)
                changed.append(group_key)
            else:
                del values[group_key]
                removed.append(group_key)

    def _emitter(
        self, out: list[tuple[Any, Any]], first: dict[Any, tuple[int, int]]
    ) -> Callable[[int, int, Any, Any, bool], None]:
        finish = self.operation.finish
        keyed = self.keyed

        def emit(start: int, end: int, key: Any, acc: Any, early: bool) -> None:
            pidx, pos = first.get(key, (0, 0))
            result = finish(acc)
            item: Any = (KeyedWindowResult(start, end, key, result, early) if keyed
                         else WindowResult(start, end, result, early))
            # Batch jobs put window results in order of end, then of the key's first item.
            out.append(((end, early, pidx, pos), item))

        return emit

    def _frames(
        self, key: Any, state: Frames, emit: Callable[[int, int, Any, Any, bool], None]
    ) -> Frames:
        """Emit the key's due (and early) windows; its frames left (``state`` if unchanged)."""
        clock, size, slide = self.clock, self.definition.size, self.definition.slide
        frames = state.frames
        ends = sorted(frames)
        if not ends:
            return state
        previous, current = clock.previous, clock.current
        due_from = previous - previous % slide + slide  # the first window end above previous
        due_to = current - current % slide  # the last window end at or below current
        self._windows(key, frames, ends, due_from, due_to, False, emit)
        if clock.early:
            self._windows(key, frames, ends, max(due_from, due_to + slide), ends[-1] + size,
                          True, emit)
        horizon = current - size + slide  # frames ending at or before it are in no open window
        if ends[0] > horizon:
            return state
        return Frames(slide, {f: frames[f] for f in ends if f > horizon})

    def _windows(
        self, key: Any, frames: dict[int, Any], ends: list[int], lo: int, hi: int, early: bool,
        emit: Callable[[int, int, Any, Any, bool], None],
    ) -> None:
        """Emit every window of the key ending in ``[lo, hi]`` that holds a frame."""
        if lo > hi:
            return
        size, slide = self.definition.size, self.definition.slide
        op = self.operation
        combine, deduct, create = op.combine, op.deduct, op.create
        assert combine is not None
        acc: Any = MISSING
        last = 0
        for end in _window_ends(ends, size, slide, lo, hi):
            if deduct is not None and acc is not MISSING and end - last == slide:
                added = frames.get(end, MISSING)
                if added is not MISSING:
                    acc = combine(acc, added)
                gone = frames.get(end - size, MISSING)
                if gone is not MISSING:
                    acc = deduct(acc, gone)
            else:
                acc = create()
                for frame in ends[bisect.bisect_right(ends, end - size):
                                  bisect.bisect_right(ends, end)]:
                    acc = combine(acc, frames[frame])
            last = end
            emit(end - size, end, key, acc, early)

    def _sessions(
        self, key: Any, state: Sessions, emit: Callable[[int, int, Any, Any, bool], None]
    ) -> Sessions:
        """Emit the key's sessions that ended (and early, the open ones); those left.

        ``state`` itself when none ended.
        """
        clock, timeout = self.clock, state.timeout
        open_sessions = []
        for start, last, acc in state.sessions:
            if last + timeout <= clock.current:
                emit(start, last + timeout, key, acc, False)
            else:
                open_sessions.append([start, last, acc])
        if clock.early:
            for start, last, acc in open_sessions:
                emit(start, last + timeout, key, acc, True)
        if len(open_sessions) == len(state.sessions):
            return state
        return Sessions(timeout, open_sessions)


def _window_ends(ends: list[int], size: int, slide: int, lo: int, hi: int) -> list[int]:
    """Ends in ``[lo, hi]`` of the windows holding at least one of the frames ``ends``."""
    out: list[int] = []
    start = stop = None
    for frame in ends:
        # Frame f lies in the windows ending at f, f + slide, ..., f + size - slide.
        if stop is not None and frame <= stop + slide:
            stop = frame + size - slide
            continue
        if start is not None and stop is not None:
            out.extend(range(max(start, lo), min(stop, hi) + 1, slide))
        start, stop = frame, frame + size - slide
    if start is not None and stop is not None:
        out.extend(range(max(start, lo), min(stop, hi) + 1, slide))
    return out


def stage_fold(spec: KeyedSpec | AggregateSpec, clock: WindowClock | None = None) -> KeyedFold:
    """The fold of a stateful node: :func:`keyed.keyed_fold`'s, or a timed one's under ``clock``.

    Timed: a window's, an interval join's (:mod:`sparkjet.core.pipeline.interval_fold`).
    """
    if isinstance(spec, WindowSpec):
        return WindowFold(spec.window, spec.operation, spec.keyed,
                          clock or WindowClock.batch_job())
    if isinstance(spec, IntervalJoinSpec):
        return IntervalJoinFold(spec.lower, spec.upper, spec.map_fn, spec.how,
                                clock or WindowClock.batch_job())
    return keyed_fold(spec)
