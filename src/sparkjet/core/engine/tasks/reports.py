"""What tasks report to the driver, whatever the engine carries it.

A task reports four things, each once per partition (never per item, so the
fused pass's loop stays the hot loop):

- counts: ``{StageCount(stage, kind): n}``, a stage's emitted items, dead
  letters and late items (:class:`~sparkjet.core.model.StageCount`); summed;
- event times: ``{(source stage, partition index): highest timestamp}``; the
  highest wins;
- dead letters: ``{(stage, partition index, seq): letter}``; keyed by
  position, so a task run again replaces its own letters;
- state ranges: ``{StateRange: RangeReport}``; where two attempts of one
  range report, the first by file name wins, so every driver picks the same.

The merge rules are plain functions here; an engine carries the reports its
own way behind the :class:`Reports` protocol (Spark: accumulators, in
``sparkjet.core.engine.spark``; in one process: :class:`Counters`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from sparkjet.core.model import StageCount
from sparkjet.core.state.versions import StateRange

__all__ = [
    "Counters",
    "RangeReport",
    "Reported",
    "Reports",
    "merge_counts",
    "merge_dead_letters",
    "merge_event_times",
    "merge_state_ranges",
]


class RangeReport(NamedTuple):
    """What one state task reports of its range after the batch."""

    #: Keys in the range.
    keys: int
    #: Bytes of the files the range's state is made of.
    bytes: int
    #: The file the task wrote (``""``: none).
    file: str


def merge_counts(
    left: dict[StageCount, int], right: dict[StageCount, int]
) -> dict[StageCount, int]:
    """Add the counts of ``right`` to ``left`` (in place); returns ``left``."""
    for key, value in right.items():
        left[key] = left.get(key, 0) + value
    return left


def merge_event_times(
    left: dict[tuple[str, int], Any], right: dict[tuple[str, int], Any]
) -> dict[tuple[str, int], Any]:
    """Merge ``right`` into ``left`` (in place), the highest timestamp winning; returns ``left``."""
    for key, value in right.items():
        had = left.get(key)
        left[key] = value if had is None or value > had else had
    return left


def merge_dead_letters(
    left: dict[tuple[str, int, int], Any], right: dict[tuple[str, int, int], Any]
) -> dict[tuple[str, int, int], Any]:
    """Merge ``right`` into ``left`` (in place), a letter replacing one at its position."""
    left.update(right)
    return left


def merge_state_ranges(
    left: dict[StateRange, RangeReport], right: dict[StateRange, RangeReport]
) -> dict[StateRange, RangeReport]:
    """Merge ``right`` into ``left`` (in place), the first report of a range by file name winning.

    An engine adds a task's reports once it succeeded, so a failed attempt's
    file is never reported; where a recomputed stage reports two attempts of
    one range, every driver keeps the same one.
    """
    for key, report in right.items():
        had = left.get(key)
        left[key] = report if had is None or report.file < had.file else had
    return left


@dataclass(frozen=True)
class Reported:
    """What the tasks of a run reported so far (copies)."""

    counts: dict[StageCount, int] = field(default_factory=dict)
    event_times: dict[tuple[str, int], Any] = field(default_factory=dict)
    dead_letters: dict[tuple[str, int, int], Any] = field(default_factory=dict)
    state_ranges: dict[StateRange, RangeReport] = field(default_factory=dict)


class Reports(Protocol):
    """Where a task reports to; the engine merges the reports with the rules above.

    A report an engine does not collect (counts with metrics off, event times
    of a batch job) is dropped, quietly.
    """

    @property
    def counting(self) -> bool:
        """Whether counts are collected (a task need not work them out otherwise)."""
        ...

    def count(self, counts: dict[StageCount, int]) -> None:
        """Add ``{StageCount: n}``."""
        ...

    def event_time(self, times: dict[tuple[str, int], Any]) -> None:
        """Report ``{(source stage, partition index): highest timestamp}``."""
        ...

    def dead(self, letters: dict[tuple[str, int, int], Any]) -> None:
        """Report ``{(stage, partition index, seq): letter}``."""
        ...

    def state_range(self, ranges: dict[StateRange, RangeReport]) -> None:
        """Report ``{StateRange: RangeReport}``."""
        ...

    def snapshot(self) -> Reported:
        """What was reported so far (on the driver)."""
        ...


class Counters:
    """Plain :class:`Reports` for tasks run in this process, safe from any thread.

    ``counting`` False drops counts (metrics off); ``timing`` False drops event
    times (a batch job has no watermark).
    """

    def __init__(self, counting: bool = True, timing: bool = True) -> None:
        self._counting = counting
        self._timing = timing
        self._lock = threading.Lock()
        self._counts: dict[StageCount, int] = {}
        self._event_times: dict[tuple[str, int], Any] = {}
        self._dead: dict[tuple[str, int, int], Any] = {}
        self._ranges: dict[StateRange, RangeReport] = {}

    @property
    def counting(self) -> bool:
        """Whether counts are collected."""
        return self._counting

    def count(self, counts: dict[StageCount, int]) -> None:
        """Add ``{StageCount: n}`` (dropped when not counting)."""
        if self._counting:
            with self._lock:
                merge_counts(self._counts, counts)

    def event_time(self, times: dict[tuple[str, int], Any]) -> None:
        """Report the highest timestamps by source partition (dropped when not timing)."""
        if self._timing:
            with self._lock:
                merge_event_times(self._event_times, times)

    def dead(self, letters: dict[tuple[str, int, int], Any]) -> None:
        """Report dead letters by position."""
        with self._lock:
            merge_dead_letters(self._dead, letters)

    def state_range(self, ranges: dict[StateRange, RangeReport]) -> None:
        """Report state ranges."""
        with self._lock:
            merge_state_ranges(self._ranges, ranges)

    def stage_counts(self) -> dict[StageCount, int]:
        """A copy of the counts so far."""
        with self._lock:
            return dict(self._counts)

    def snapshot(self) -> Reported:
        """Copies of what was reported so far."""
        with self._lock:
            return Reported(dict(self._counts), dict(self._event_times), dict(self._dead),
                            dict(self._ranges))

    def forget_letters(self) -> None:
        """Let go of the dead letters (written by the driver)."""
        with self._lock:
            self._dead = {}
