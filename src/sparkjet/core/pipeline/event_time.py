"""The watermark of a streaming job: what its sources have seen, and each window's clock.

A micro-batch judges event time against the watermark of the batches before
it, so a replay judges alike and a window's result never depends on how
items fell into batches within the allowed lag:

- after each batch the driver records, per source stage and source
  partition, the highest timestamp seen and the planned time of the last
  batch that had events there (:class:`EventTime`, in the commit record and in
  an exported snapshot);
- planning batch ``b``, it computes each windowed stage's watermark
  ``W(b)``: per source, the lowest of its partitions' highest timestamps,
  minus the source's allowed lag; a partition without events for the
  source's idle timeout (Jet's default, 60 s) does not hold it back, and when
  all are idle the highest counts (Jet forwards it too); over several
  sources, the lowest; never below the watermark the stage had. ``W(b)`` is
  written in the batch's plan, so a replay uses the same;
- in batch ``b`` a windowed stage drops as late every event whose frame ends
  at or before ``W(b)`` (sessions: whose timestamp is below ``W(b)``), counts
  them (``lateEventsDropped``), folds in the rest, and emits each window
  whose end lies in ``(W(b-1), W(b)]``: each window once, in order of end.

Every partition the source names (``Source.watermark_partitions``: a
stream's partitions) holds the watermark back from the first batch planned
after it appeared, until it sends an event or is idle for the timeout. With no new data, the
loop runs a batch without input when a window is due (the watermark moved
past it, by an idle timeout or by the last batch's data) or early results are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.pipeline.windows import Timestamps

__all__ = ["NO_WATERMARK", "EventTime", "WindowClock", "stage_watermark"]

#: The watermark before any event: below every timestamp.
NO_WATERMARK = -(2**63)
#: A watermark above every timestamp: a batch job's input is one event-time range.
END_OF_TIME = 2**63 - 1


@dataclass(frozen=True)
class WindowClock:
    """A windowed stage's event time in one batch: what is late, what is due, what is early."""

    #: The watermark the batch before used: windows ending at or before it were emitted.
    previous: int
    #: This batch's watermark: late events are judged and windows emitted by it.
    current: int
    #: Whether this batch emits early results of the open windows.
    early: bool = False

    @classmethod
    def batch_job(cls) -> WindowClock:
        """A batch job's: nothing is late, and every window is emitted at the end."""
        return cls(NO_WATERMARK, END_OF_TIME)

    @property
    def late_before(self) -> int:
        """Events of frames ending at or before this (sessions: timestamps below) are late."""
        return self.current if self.current != END_OF_TIME else NO_WATERMARK


@dataclass(frozen=True)
class EventTime:
    """What a streaming job's checkpoint keeps of event time after a committed batch."""

    #: Per source stage, per source partition (its key as a string): the highest
    #: timestamp seen and the planned time of the last batch with events there.
    partitions: Mapping[str, Mapping[str, tuple[int, int]]] = field(default_factory=dict)
    #: Per windowed stage, the watermark its last batch emitted up to.
    watermarks: Mapping[str, int] = field(default_factory=dict)
    #: The planned time of the batch (early results count periods from it; 0: none yet).
    time_ms: int = 0

    def after(
        self, seen: Mapping[str, Mapping[str, int]], time_ms: int, watermarks: Mapping[str, int]
    ) -> EventTime:
        """The record after a batch planned at ``time_ms`` that saw ``seen``.

        ``watermarks`` are the ones the batch used.
        """
        partitions = {source: dict(parts) for source, parts in self.partitions.items()}
        for source, highest in seen.items():
            parts = partitions.setdefault(source, {})
            for key, ts in highest.items():
                had = parts.get(key)
                parts[key] = (ts if had is None else max(had[0], ts), time_ms)
        merged = dict(self.watermarks)
        merged.update(watermarks)
        return EventTime(partitions, merged, time_ms)

    def knowing(self, known: Mapping[str, Sequence[str]], time_ms: int) -> EventTime:
        """The record with every partition in ``known`` (by source) it lacks added.

        A partition known but without events yet holds the watermark back
        (its highest timestamp is :data:`NO_WATERMARK`) until it has been idle,
        counted from ``time_ms``, for its source's idle timeout.
        """
        missing = {source: [key for key in keys if key not in self.partitions.get(source, {})]
                   for source, keys in known.items()}
        if not any(missing.values()):
            return self
        partitions = {source: dict(parts) for source, parts in self.partitions.items()}
        for source, keys in missing.items():
            for key in keys:
                partitions.setdefault(source, {})[key] = (NO_WATERMARK, time_ms)
        return EventTime(partitions, self.watermarks, self.time_ms)

    def renamed(self, names: Mapping[str, str]) -> EventTime:
        """Only the sources and stages ``names`` maps (old name -> new), under their new names."""
        return EventTime({names[s]: p for s, p in self.partitions.items() if s in names},
                         {names[s]: w for s, w in self.watermarks.items() if s in names},
                         self.time_ms)

    def restricted(self, sources: set[str], stages: set[str]) -> EventTime:
        """Only what a pipeline with these source and windowed stages carries over."""
        return EventTime({s: p for s, p in self.partitions.items() if s in sources},
                         {s: w for s, w in self.watermarks.items() if s in stages}, self.time_ms)

    def to_json(self) -> dict[str, Any]:
        """The record as a commit record and a manifest hold it."""
        return {
            "partitions": {source: {key: list(v) for key, v in parts.items()}
                           for source, parts in self.partitions.items()},
            "watermarks": dict(self.watermarks),
            "time": self.time_ms,
        }

    @classmethod
    def from_json(cls, data: Any) -> EventTime:
        """The record :meth:`to_json` wrote (an empty one for None)."""
        if not isinstance(data, Mapping):
            return cls()
        partitions = {
            str(source): {str(key): (int(v[0]), int(v[1])) for key, v in parts.items()}
            for source, parts in dict(data.get("partitions", {})).items()
        }
        watermarks = {str(k): int(v) for k, v in dict(data.get("watermarks", {})).items()}
        return cls(partitions, watermarks, int(data.get("time", 0)))

    def empty(self) -> bool:
        """Whether nothing was seen or emitted yet."""
        return not self.partitions and not self.watermarks


def source_watermark(
    partitions: Mapping[str, tuple[int, int]], timestamps: Timestamps, now_ms: int
) -> int:
    """One source's watermark at ``now_ms`` from its partitions' ``(highest, last seen)``."""
    if not partitions:
        return NO_WATERMARK
    horizon = now_ms - timestamps.idle_timeout_ms
    active = [highest for highest, seen in partitions.values() if seen > horizon]
    highest = min(active) if active else max(h for h, _ in partitions.values())
    if highest == NO_WATERMARK:  # a partition without events yet holds it back
        return NO_WATERMARK
    return highest - timestamps.allowed_lag_ms


def stage_watermark(
    event_time: EventTime, stage: str, sources: Mapping[str, Timestamps], now_ms: int
) -> int:
    """A windowed stage's watermark for a batch planned at ``now_ms``.

    The lowest of its ``sources``' watermarks, never below the one it had.
    """
    had = event_time.watermarks.get(stage, NO_WATERMARK)
    if not sources:
        return had
    lowest = min(source_watermark(event_time.partitions.get(source, {}), ts, now_ms)
                 for source, ts in sources.items())
    return max(had, lowest)
