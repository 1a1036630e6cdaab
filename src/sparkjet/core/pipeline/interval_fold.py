"""The interval join's fold: per key, each input's items buffered, matched and evicted.

A key's state is ``(left, right)``: each input's items still able to match,
as ``[t, item, matched, pidx, pos]`` lists sorted by ``t``. ``matched`` is
stored, never inferred, so an outer row is emitted once for an item that
never matched and never for one that did (Spark's SPARK-26154 inferred it).

Folding a batch, each new item (in its key's encounter order) is matched
against the other input's buffer, every pair emitted once, when its later
item arrives, then buffered itself. A left item at ``t`` matches right items
in ``[t + lower, t + upper]``. After the fold, :meth:`IntervalJoinFold.advance`
evicts what the batch's watermark ``w`` leaves unmatchable, since every later
item has ``t >= w``: a left item once ``t + upper < w``, a right one once
``t - lower < w``; an evicted unmatched item gives its outer row
(``map_fn(item, None)`` or ``map_fn(None, item)``) when ``how`` asks for it.
A key with both buffers empty is dropped: once the inputs stop and the
watermark passes the last bound, the stage holds no keys.

A batch job's clock is the end of time: every pair is found, then every
buffer evicted. Output positions are the item that completed the pair (or
the unmatched item), so a batch job's output is in the merged input's order.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from sparkjet.core.pipeline.event_time import WindowClock
from sparkjet.core.pipeline.fusion import Terminal, TerminalKind
from sparkjet.core.pipeline.keyed import MISSING, KeyedFold
from sparkjet.core.pipeline.timers import DueIndex, ready_index

__all__ = ["INTERVAL_TIMERS", "IntervalJoinFold"]

#: The name of the fold's index in a range's ``timers``: keys by their next eviction.
INTERVAL_TIMERS = "interval-join"

_T = itemgetter(0)
_LEFT, _RIGHT = 0, 1


class IntervalJoinFold(KeyedFold):
    """``interval_join(other, lower, upper, map_fn, how)``; see the module docstring."""

    timed = True

    def __init__(
        self, lower: int, upper: int, map_fn: Callable[[Any, Any], Any], how: str,
        clock: WindowClock,
    ) -> None:
        self.lower, self.upper, self.map_fn, self.how = lower, upper, map_fn, how
        self.clock = clock
        self._outer_left = how in ("left", "full")
        self._outer_right = how in ("right", "full")

    def terminal(self, stage: str, key_fn: Callable[[Any], Any] | None) -> Terminal:
        return Terminal(TerminalKind.EVENTS, stage, key_fn)

    def fold(
        self, group_key: Any, parts: list[Any], entry: Any, out: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        _pidx, _pos, key, _events = parts[0]
        if entry is MISSING:
            left: list[list[Any]] = []
            right: list[list[Any]] = []
        else:
            key, (left, right) = entry
        lower, upper, map_fn = self.lower, self.upper, self.map_fn
        j = 0
        for pidx, _first, _key, events in parts:
            for t, tagged, pos in events:
                tag, _k, item = tagged
                if tag == _LEFT:
                    mine, other, lo, hi = left, right, t + lower, t + upper
                else:
                    mine, other, lo, hi = right, left, t - upper, t - lower
                matched = False
                start = bisect.bisect_left(other, lo, key=_T)
                for buffered in other[start:]:
                    if buffered[0] > hi:
                        break
                    matched = buffered[2] = True
                    pair = (map_fn(item, buffered[1]) if tag == _LEFT
                            else map_fn(buffered[1], item))
                    if pair is not None:
                        out.append(((pidx, pos, j), pair))
                        j += 1
                bisect.insort_right(mine, [t, item, matched, pidx, pos], key=_T)
        return key, (key, (left, right))

    def _due(self, state: tuple[list[list[Any]], list[list[Any]]]) -> int | None:
        """The watermark at which the key's earliest item is evicted (None: nothing held)."""
        left, right = state
        dues = []
        if left:
            dues.append(left[0][0] + self.upper + 1)
        if right:
            dues.append(right[0][0] - self.lower + 1)
        return min(dues) if dues else None

    def due(self, entry: Any) -> int | None:
        """When the key of ``entry``, just folded, first has an item to evict."""
        return self._due(entry[1])

    @property
    def timers_for(self) -> str:
        """What the index's due times are computed for: the bounds."""
        return f"interval lower={self.lower} upper={self.upper}"

    def due_index(self, values: dict[Any, Any], timers: dict[str, DueIndex]) -> DueIndex:
        """The range's index of keys by next eviction, rebuilt where missing or for other bounds."""
        return ready_index(timers, INTERVAL_TIMERS, self.timers_for, values, self._due)

    def advance(
        self, values: dict[Any, Any], out: list[tuple[Any, Any]], changed: list[Any],
        removed: list[Any], index: DueIndex | None = None,
    ) -> None:
        clock = self.clock
        current = clock.current
        if current <= clock.previous:
            return
        if index is None:
            keys = list(values)
        else:
            keys = [k for k in dict.fromkeys(index.pop_due(current)) if k in values]
        for group_key in keys:
            key, (left, right) = values[group_key]
            # Left items whose t + upper is below the watermark, right ones whose t - lower is.
            gone_left = bisect.bisect_left(left, current - self.upper, key=_T)
            gone_right = bisect.bisect_left(right, current + self.lower, key=_T)
            if not gone_left and not gone_right:
                if index is not None:
                    self._refile(index, group_key, (left, right))
                continue
            if self._outer_left:
                self._outer(out, left[:gone_left], _LEFT)
            if self._outer_right:
                self._outer(out, right[:gone_right], _RIGHT)
            state = (left[gone_left:], right[gone_right:])
            if state[0] or state[1]:
                values[group_key] = (key, state)
                changed.append(group_key)
                if index is not None:
                    self._refile(index, group_key, state)
            else:
                del values[group_key]
                removed.append(group_key)

    def _refile(self, index: DueIndex, group_key: Any, state: Any) -> None:
        due = self._due(state)
        if due is not None:
            index.add(group_key, due)

    def _outer(self, out: list[tuple[Any, Any]], evicted: list[list[Any]], tag: int) -> None:
        map_fn = self.map_fn
        for _t, item, matched, pidx, pos in evicted:
            if matched:
                continue
            row = map_fn(item, None) if tag == _LEFT else map_fn(None, item)
            if row is not None:
                # After the pairs of the same position: a batch job puts them in input order.
                out.append(((pidx, pos, 1 << 30), row))
