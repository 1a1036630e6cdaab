"""Task reports on Spark Connect: report rows instead of accumulators.

Connect has no accumulators. A task on a Python worker reports into its own
copy of the run's :class:`ConnectReports` (unpickled with the task); after
each partition, :class:`~sparkjet.core.engine.connect.arrow.ArrowTask` drains
that copy into a report row keyed ``(call, partition)``, which travels with
the data to the driver. There :meth:`ConnectReports.ingest` merges each key
once, by the rules of :mod:`sparkjet.core.engine.tasks.reports`: a flow read
twice (a shared flow, a persisted reduce input) reports once, and a failed
attempt's rows never reach the driver, as a failed task's accumulator
updates never do.

What a task on the driver reports (a batch reduce run there) goes straight
into the driver's copy. Counts are known per sink, as each sink's writes
come back, not live while Spark runs.
"""

from __future__ import annotations

import threading
from typing import Any

from sparkjet.core.engine.tasks.reports import Counters, RangeReport, Reported
from sparkjet.core.model import StageCount
from sparkjet.core.state.versions import StateRange

__all__ = ["ConnectReports"]


class ConnectReports:
    """A run's :class:`~sparkjet.core.engine.tasks.reports.Reports` on Connect; see the module doc.

    Pickles as what it collects (``counts`` etc.), not what it holds, so each
    worker starts with an empty copy.
    """

    def __init__(self, *, counts: bool, event_times: bool, dead_letters: bool,
                 state_ranges: bool) -> None:
        self._asked = (counts, event_times, dead_letters, state_ranges)
        self._local = Counters(counting=counts, timing=event_times)
        self._seen: set[Any] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> tuple[bool, bool, bool, bool]:
        return self._asked

    def __setstate__(self, asked: tuple[bool, bool, bool, bool]) -> None:
        counts, event_times, dead_letters, state_ranges = asked
        self.__init__(counts=counts, event_times=event_times,  # type: ignore[misc]
                      dead_letters=dead_letters, state_ranges=state_ranges)

    @property
    def counting(self) -> bool:
        """Whether counts are collected."""
        return self._asked[0]

    def count(self, counts: dict[StageCount, int]) -> None:
        """Add ``{StageCount: n}`` (dropped when not counting)."""
        self._local.count(counts)

    def event_time(self, times: dict[tuple[str, int], Any]) -> None:
        """Report the highest timestamps by source partition (dropped in a batch job)."""
        self._local.event_time(times)

    def dead(self, letters: dict[tuple[str, int, int], Any]) -> None:
        """Report dead letters by position."""
        if self._asked[2]:
            self._local.dead(letters)

    def state_range(self, ranges: dict[StateRange, RangeReport]) -> None:
        """Report state ranges."""
        if self._asked[3]:
            self._local.state_range(ranges)

    def drain(self) -> Reported:
        """On a worker: what was reported since the last drain, and forget it."""
        with self._lock:
            local = self._local
            self._local = Counters(counting=self._asked[0], timing=self._asked[1])
        return local.snapshot()

    def ingest(self, key: Any, reported: Reported) -> None:
        """On the driver: merge a report row's ``reported`` unless ``key`` was merged before."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            local = self._local
        local.count(reported.counts)
        local.event_time(reported.event_times)
        if reported.dead_letters:
            local.dead(reported.dead_letters)
        if reported.state_ranges:
            local.state_range(reported.state_ranges)

    def stage_counts(self) -> dict[StageCount, int]:
        """A copy of the counts so far (the sinks' writes that came back)."""
        return self._local.stage_counts()

    def snapshot(self) -> Reported:
        """Copies of what was reported so far."""
        return self._local.snapshot()

    def forget_letters(self) -> None:
        """Let go of the dead letters (written by the driver)."""
        self._local.forget_letters()
