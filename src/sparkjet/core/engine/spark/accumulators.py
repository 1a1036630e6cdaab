"""Task reports on Spark: the accumulators that carry what the tasks report.

Each AccumulatorParam merges with the engine-neutral rule of
:mod:`sparkjet.core.engine.tasks.reports`. :class:`SparkReports` holds a run's four
accumulators and pickles with the tasks: an accumulator pickles as its id,
and what a task adds on an executor reaches the driver once the task
succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkjet.core.engine.tasks.reports import (
    RangeReport,
    Reported,
    merge_counts,
    merge_dead_letters,
    merge_event_times,
    merge_state_ranges,
)
from sparkjet.core.model import StageCount
from sparkjet.core.state.versions import StateRange

__all__ = [
    "CountsParam",
    "DeadLettersParam",
    "EventTimesParam",
    "RangeReportsParam",
    "SparkReports",
]


class CountsParam:
    """Accumulator of ``{StageCount: n}`` counts (PySpark AccumulatorParam protocol)."""

    def zero(self, value: dict[StageCount, int]) -> dict[StageCount, int]:
        return {}

    def addInPlace(
        self, left: dict[StageCount, int], right: dict[StageCount, int]
    ) -> dict[StageCount, int]:
        return merge_counts(left, right)


class EventTimesParam:
    """Accumulator of ``{(source stage, partition index): highest timestamp}`` (the max wins)."""

    def zero(self, value: dict[tuple[str, int], Any]) -> dict[tuple[str, int], Any]:
        return {}

    def addInPlace(
        self, left: dict[tuple[str, int], Any], right: dict[tuple[str, int], Any]
    ) -> dict[tuple[str, int], Any]:
        return merge_event_times(left, right)


class DeadLettersParam:
    """Accumulator of ``{(stage, partition, seq): letter}`` (PySpark AccumulatorParam protocol).

    Keys are positions, so a task that Spark runs again reports the same keys
    and its letters replace themselves.
    """

    def zero(self, value: dict[tuple[str, int, int], Any]) -> dict[tuple[str, int, int], Any]:
        return {}

    def addInPlace(
        self, left: dict[tuple[str, int, int], Any], right: dict[tuple[str, int, int], Any]
    ) -> dict[tuple[str, int, int], Any]:
        return merge_dead_letters(left, right)


class RangeReportsParam:
    """Accumulator of ``{StateRange: RangeReport}`` (PySpark AccumulatorParam protocol).

    Spark adds a task's update once it succeeded, so a failed attempt's file
    is never reported. Where a recomputed stage reports two attempts of one
    range, the first by file name is kept, so every driver picks the same.
    """

    def zero(self, value: dict[StateRange, RangeReport]) -> dict[StateRange, RangeReport]:
        return {}

    def addInPlace(
        self, left: dict[StateRange, RangeReport], right: dict[StateRange, RangeReport]
    ) -> dict[StateRange, RangeReport]:
        return merge_state_ranges(left, right)


@dataclass
class SparkReports:
    """A run's accumulators as :class:`~sparkjet.core.engine.tasks.reports.Reports`; picklable.

    A None accumulator drops what is reported to it: counts with metrics off,
    event times in a batch job, dead letters when no stage makes any, state
    ranges outside a micro-batch.
    """

    counts: Any = None
    event_times: Any = None
    dead_letters: Any = None
    state_ranges: Any = None

    @classmethod
    def make(
        cls, sc: Any, *, counts: bool, event_times: bool, dead_letters: bool, state_ranges: bool
    ) -> SparkReports:
        """The accumulators asked for, registered with SparkContext ``sc``."""
        return cls(
            sc.accumulator({}, CountsParam()) if counts else None,
            sc.accumulator({}, EventTimesParam()) if event_times else None,
            sc.accumulator({}, DeadLettersParam()) if dead_letters else None,
            sc.accumulator({}, RangeReportsParam()) if state_ranges else None,
        )

    @property
    def counting(self) -> bool:
        """Whether counts are collected."""
        return self.counts is not None

    def count(self, counts: dict[StageCount, int]) -> None:
        """Add ``{StageCount: n}`` to the counts accumulator."""
        if self.counts is not None:
            self.counts.add(counts)

    def event_time(self, times: dict[tuple[str, int], Any]) -> None:
        """Add the highest timestamps by source partition."""
        if self.event_times is not None:
            self.event_times.add(times)

    def dead(self, letters: dict[tuple[str, int, int], Any]) -> None:
        """Add dead letters by position."""
        if self.dead_letters is not None:
            self.dead_letters.add(letters)

    def state_range(self, ranges: dict[StateRange, RangeReport]) -> None:
        """Add state range reports."""
        if self.state_ranges is not None:
            self.state_ranges.add(ranges)

    def stage_counts(self) -> dict[StageCount, int]:
        """A copy of the counts so far (empty when not counting)."""
        return _value(self.counts)

    def snapshot(self) -> Reported:
        """Copies of the accumulators' values (on the driver)."""
        return Reported(_value(self.counts), _value(self.event_times),
                        _value(self.dead_letters), _value(self.state_ranges))

    def forget_letters(self) -> None:
        """Let go of the dead letters (PySpark's registry keeps every accumulator)."""
        if self.dead_letters is not None:
            self.dead_letters.value = {}


def _value(accumulator: Any) -> dict[Any, Any]:
    return {} if accumulator is None else dict(accumulator.value)
