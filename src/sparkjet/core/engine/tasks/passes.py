"""The fused passes, a batch reduce side, a range sort and a sink's write, per partition."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import replace
from operator import itemgetter
from typing import Any

from sparkjet.core.engine.tasks.base import Task
from sparkjet.core.engine.tasks.read import ReadTask
from sparkjet.core.engine.tasks.reports import Reports
from sparkjet.core.host.contracts import TaskContext
from sparkjet.core.pipeline.fusion import FOLDING, FusedPass, StageFailure
from sparkjet.core.pipeline.keyed import KeyedFold, folded_records, reduce_batch

__all__ = [
    "DRIVER_REDUCE_LIMIT", "PassTask", "RangePartition", "ReduceTask", "SinkTask", "SortTask",
    "range_bounds", "sample_fraction",
]

_first = itemgetter(0)

#: Up to this many map-side partial records a batch reduce reduces on the driver
#: (the Spark engines read it when a reduce runs; tests lower it).
DRIVER_REDUCE_LIMIT = 100_000


class PassTask(Task):
    """Runs a fused pass over one partition; its terminal shapes what it yields."""

    fused: FusedPass

    def __init__(
        self,
        fused: FusedPass,
        stage: str,
        reports: Reports | None,
        reader: ReadTask | None = None,
        *,
        watermark: Any = None,
    ) -> None:
        self.fused, self.stage, self.reports, self.reader = fused, stage, reports, reader
        #: A windowed terminal's watermark: items before it are late.
        self.watermark = watermark

    def __call__(self, pidx: int, items: Iterator[Any]) -> Iterator[Any]:
        fused = self.fused
        counts: dict[str, int] = {}
        state: dict[str, Any] = {"pidx": pidx, "wm": self.watermark}
        descriptors = None
        with self.attributing():
            if self.reader is not None:
                descriptors = list(items)
                items = iter(self.reader.items(pidx, descriptors))
            if fused.terminal.kind in FOLDING:
                yield from folded_records(fused, state, items, counts)
            else:
                yield from fused.run(items, counts, state)
        self.count_pass(counts)
        self.report_time(pidx, state)
        self.report_dead(pidx, state, descriptors)


class ReduceTask(Task):
    """Reduce side of a keyed stage or the global aggregate; yields ``(position, output)``."""

    def __init__(self, fold: KeyedFold, stage: str, reports: Reports | None) -> None:
        self.fold, self.stage, self.reports = fold, stage, reports

    def __call__(self, records: Iterator[tuple[Any, Any]]) -> Iterator[Any]:
        n = 0
        with self.attributing():
            for out in reduce_batch(self.fold, records):
                n += 1
                yield out
        self.count_items(n)


class SortTask(Task):
    """Sorts one range partition of ``(key, item)`` pairs, yielding the items.

    ``reports`` None: the items are counted elsewhere (a windowed stage's reduce).
    """

    def __init__(self, stage: str, reports: Reports | None) -> None:
        self.stage, self.reports = stage, reports

    def __call__(self, pairs: Iterator[tuple[Any, Any]]) -> Iterator[Any]:
        with self.attributing():
            ordered = sorted(pairs, key=_first)
        self.count_items(len(ordered))
        for _, item in ordered:
            yield item


def sample_fraction(total: int, partitions: int) -> float:
    """The fraction of ``total`` keys to sample for ``partitions`` ranges: about 30 per range."""
    return min(1.0, 30.0 * partitions / total)


def range_bounds(sample: list[Any], partitions: int, stage: str) -> list[Any]:
    """Bounds splitting keys into ``partitions`` ranges, from a ``sample`` of them.

    A key that does not compare with another fails as ``stage``'s.
    """
    try:
        sample.sort()
    except Exception as exc:
        raise StageFailure(stage, exc) from None
    step = len(sample) / partitions
    return [sample[int(step * i)] for i in range(1, partitions) if sample]


class RangePartition:
    """Partition function for a range sort: the range a key (a SortKey, a position) falls into."""

    def __init__(self, bounds: list[Any]) -> None:
        self.bounds = bounds

    def __call__(self, key: Any) -> int:
        return bisect.bisect_left(self.bounds, key)


class SinkTask(Task):
    """Writes one partition to a sink (after the fused pass feeding it)."""

    fused: FusedPass

    def __init__(
        self,
        fused: FusedPass,
        sink: Any,
        state: Any,
        stage: str,
        context: TaskContext,
        reports: Reports | None,
        reader: ReadTask | None = None,
    ) -> None:
        self.fused, self.sink, self.state, self.stage = fused, sink, state, stage
        self.context, self.reports, self.reader = context, reports, reader

    def __call__(self, pidx: int, items: Iterator[Any]) -> Iterator[Any]:
        counts: dict[str, int] = {}
        state: dict[str, Any] = {"pidx": pidx}
        ctx = replace(self.context, partition=pidx)
        descriptors = None
        with self.attributing():
            source: Any = items
            if self.reader is not None:
                descriptors = list(items)
                source = self.reader.items(pidx, descriptors)
            if self.fused.ops or self.reader is None or self.fused.stamp is not None:
                source = self.fused.run(iter(source), counts, state)
            message = self.sink.write(self.state, source, ctx)
        self.count_pass(counts)
        self.report_time(pidx, state)
        self.report_dead(pidx, state, descriptors)
        yield message
