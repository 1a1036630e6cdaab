"""A plain-Python oracle of windowed aggregation, written from the docs' rules alone.

Events are ``(partition, ts, key, value)``; a run is a list of micro-batches.
The watermark a batch uses is computed from the batches before it: the
lowest over the partitions seen so far of their highest timestamp, minus the
lag, never decreasing. In batch ``b`` an event is late when its frame ends at
or before that watermark (sessions: when its timestamp is below it). A
window is emitted when its end is at or below the watermark of the last batch
run, and holds every event not dropped as late.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

NO_WATERMARK = -(2**63)

Event = tuple[int, int, Any, int]


def watermarks(batches: list[list[Event]], lag: int) -> list[int]:
    """The watermark each batch uses, plus one more: the one a batch after the last would."""
    highest: dict[int, int] = {}
    out = []
    current = NO_WATERMARK
    for batch in [*batches, []]:
        if highest:
            current = max(current, min(highest.values()) - lag)
        out.append(current)
        for partition, ts, _key, _value in batch:
            highest[partition] = max(highest.get(partition, ts), ts)
    return out


def kept(
    batches: list[list[Event]], marks: list[int], late: Callable[[int, int], bool]
) -> tuple[list[Event], int]:
    """The events not dropped as late, and how many were."""
    out: list[Event] = []
    dropped = 0
    for batch, mark in zip(batches, marks, strict=False):
        for event in batch:
            if late(event[1], mark):
                dropped += 1
            else:
                out.append(event)
    return out, dropped


def frame_end(ts: int, slide: int) -> int:
    return ts - ts % slide + slide


def sliding(
    events: Iterable[Event], size: int, slide: int, until: int,
    result: Callable[[list[int]], Any] = sum,
) -> list[tuple[int, int, Any, Any]]:
    """``(start, end, key, result)`` of every window ending at or before ``until`` with events."""
    windows: dict[tuple[int, Any], list[int]] = defaultdict(list)
    for _p, ts, key, value in events:
        first = frame_end(ts, slide)
        for end in range(first, first + size, slide):  # windows [end - size, end) holding ts
            windows[(end, key)].append(value)
    return sorted((end - size, end, key, result(values))
                  for (end, key), values in windows.items() if end <= until)


def sessions(
    events: Iterable[Event], timeout: int, until: int,
    result: Callable[[list[int]], Any] = sum,
) -> list[tuple[int, int, Any, Any]]:
    """``(start, end, key, result)`` of every session ending at or before ``until``."""
    by_key: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    for _p, ts, key, value in events:
        by_key[key].append((ts, value))
    out = []
    for key, items in by_key.items():
        items.sort()
        start, end, values = items[0][0], items[0][0] + timeout, [items[0][1]]
        for ts, value in items[1:]:
            if ts < end:
                end = max(end, ts + timeout)
                values.append(value)
            else:
                out.append((start, end, key, result(values)))
                start, end, values = ts, ts + timeout, [value]
        out.append((start, end, key, result(values)))
    return sorted(w for w in out if w[1] <= until)
