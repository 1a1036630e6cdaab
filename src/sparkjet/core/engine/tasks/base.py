"""The base of the per-partition tasks: failure attribution and reporting.

A task is a module-level class, so it pickles by reference plus its fields,
and is called once per partition by whatever engine runs it (on Spark,
``mapPartitions``/``mapPartitionsWithIndex``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from sparkjet.core.engine.tasks.reports import Reports
from sparkjet.core.model import StageCount
from sparkjet.core.pipeline.fusion import FusedPass, StageFailure

__all__ = ["SourceReader", "Task"]


class SourceReader(Protocol):
    """A task reading a source's partitions itself (:class:`~.read.ReadTask`)."""

    #: The source stage.
    stage: str
    #: The source (a :class:`~sparkjet.core.host.contracts.Source`).
    source: Any

    def items(self, pidx: int, descriptors: Iterable[Any]) -> Iterable[Any]:
        """Partition ``pidx``'s items, read from ``descriptors``."""
        ...


def _fail(stage: str, fused: FusedPass | None, exc: BaseException) -> StageFailure:
    if isinstance(exc, StageFailure):
        return exc
    found = fused.stage_of(exc) if fused is not None else None
    return StageFailure(found or stage, exc)


class Task:
    """Base of the per-partition tasks: failure attribution and reporting.

    A task runs a partition's work inside ``with self.attributing():``, which
    turns an exception into a :class:`StageFailure` naming the task's stage
    (or, when a fused pass's generated code raised, the stage of that line),
    and reports what it emitted with :meth:`count` or :meth:`count_pass`.
    Both happen once per partition, never per item: the fused pass's loop
    stays the hot loop.
    """

    stage: str
    #: Where the task reports counts, event times and dead letters (None: nowhere).
    reports: Reports | None
    #: The fused pass the task runs, whose stages failures may be attributed to.
    fused: FusedPass | None = None

    def attributing(self) -> _Attributing:
        """A context manager raising failures inside it as this task's StageFailure."""
        return _Attributing(self)

    def failure(self, exc: BaseException) -> StageFailure:
        """``exc`` as a StageFailure of the stage it belongs to."""
        return _fail(self.stage, self.fused, exc)

    def count(self, counts: dict[StageCount, int]) -> None:
        """Add ``counts`` (emitted items, dead letters, late items by stage) to the job's counts."""
        reports = self.reports
        if reports is not None and counts:
            reports.count(counts)

    def count_items(self, emitted: int) -> None:
        """Add the items this task's stage emitted to the job's counts."""
        self.count({StageCount(self.stage, "items"): emitted})

    def count_pass(self, raw: dict[str, int]) -> None:
        """Add what each stage of the fused pass emitted, from its raw counters."""
        reports = self.reports
        if reports is not None and reports.counting and self.fused is not None:
            stages = self.fused.stage_counts(raw)
            self.count({StageCount(stage, "items"): out for stage, (_, out) in stages.items()})

    def report_time(self, pidx: int, state: dict[str, Any]) -> None:
        """Report the partition's highest timestamp and late items the pass left in ``state``."""
        fused = self.fused
        if fused is None:
            return
        stamp = fused.stamp
        highest = state.get("hi")
        reports = self.reports
        if (reports is not None and highest is not None and stamp is not None
                and stamp.stage is not None):
            reports.event_time({(stamp.stage, pidx): highest})
        late = state.get("late")
        if late:
            self.count({StageCount(self.stage, "late"): late})

    #: The source the pass reads itself, if any (a :class:`~.read.ReadTask`).
    reader: SourceReader | None = None

    def report_dead(self, pidx: int, state: dict[str, Any], descriptors: list[Any] | None) -> None:
        """Report the dead letters the pass left in ``state`` (see :mod:`..dead_letters`).

        A pass that read a source itself says which source partition each
        letter's item came from (``index`` is its position there); after a
        shuffle that is unknown, and both are None.
        """
        letters = state.get("dead")
        reports = self.reports
        if not letters or self.fused is None or reports is None:
            return
        reader = self.reader
        descriptor = _MISSING_DESCRIPTOR
        if reader is not None and descriptors is not None and len(descriptors) == 1:
            descriptor = descriptors[0]
        counted: dict[StageCount, int] = {}
        reported = {}
        for seq, letter in enumerate(letters):
            counter = StageCount(letter["stage"], "dead")
            counted[counter] = counted.get(counter, 0) + 1
            where: dict[str, Any] = {"source": None, "partition": None, "offset": None,
                                     "index": None}
            if reader is not None and descriptor is not _MISSING_DESCRIPTOR:
                where = {"source": reader.stage,
                         "partition": _safely(reader.source.watermark_partition, descriptor),
                         "offset": _safely(reader.source.offset_of, descriptor,
                                           letter["index"]),
                         "index": letter["index"]}
            # Keyed by the letter's own stage: a merge's branches run passes under one
            # task stage and the same partition numbers, but a stage is in one pass only.
            reported[(letter["stage"], pidx, seq)] = {**letter, **where}
        reports.dead(reported)
        self.count(counted)


_MISSING_DESCRIPTOR = object()


def _safely(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` for a dead letter's where-abouts; None if the source cannot say."""
    try:
        return fn(*args)
    except Exception:
        return None


class _Attributing:
    __slots__ = ("task",)

    def __init__(self, task: Task) -> None:
        self.task = task

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        # Exception only: GeneratorExit and KeyboardInterrupt pass through as they are.
        if isinstance(exc, Exception):
            raise self.task.failure(exc) from None
