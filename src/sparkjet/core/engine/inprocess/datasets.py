"""A run's datasets as lists of partitions in this process.

Each partition is a list; a task runs over it when its node is reached (a
flow's stateless stages are fused into one task anyway). The partitioning is
Spark's: one source descriptor per partition, so partition indexes (dead
letters' positions, event times' source partitions) are the same; a
micro-batch's records go to the state task owning their key group by the
same :class:`~sparkjet.core.state.keygroups.KeyGroupPartition`, so the driver
writes the same ranges' state files that executors read.

Items are pickled where Spark pickles them (a shuffle, a shared flow, what
reaches the driver, descriptors sent out), and an item that cannot be is the
failure of the stage that emitted it: a job does not pass in this process
and fail on its first large batch on Spark. A task is pickled once per plan,
as Spark pickles it for its workers, for the same reason.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from sparkjet.core.engine.tasks.passes import ReduceTask, SortTask
from sparkjet.core.engine.tasks.pickling import unpicklable
from sparkjet.core.engine.tasks.read import ReadTask
from sparkjet.core.engine.tasks.reports import Counters
from sparkjet.core.engine.tasks.runs import PartitionTask
from sparkjet.core.errors import JobFailedError
from sparkjet.core.state.keygroups import KeyGroupPartition

__all__ = ["LocalData", "LocalDatasets"]

_first = itemgetter(0)


def _dumps(value: Any) -> bytes:
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


@dataclass
class LocalData:
    """A dataset in this process: its partitions, and the stage whose items they are.

    ``blobs`` (a shared flow): each partition pickled once; every consumer
    reads its own copy, as consumers of a persisted RDD do.
    """

    parts: list[list[Any]] | None
    #: The stage whose output the items are (None: not named), and where they
    #: were found (for the message).
    emitter: str | None = None
    via: str = ""
    blobs: list[bytes] | None = None

    def partitions(self) -> list[list[Any]]:
        """The partitions' items (a fresh copy of a shared flow's)."""
        if self.blobs is not None:
            return [pickle.loads(blob) for blob in self.blobs]
        assert self.parts is not None
        return self.parts


class LocalDatasets:
    """The :class:`~sparkjet.core.engine.tasks.runs.Datasets` of one run in this process.

    ``cancelled`` is asked before each item reaches a task, or a task reads
    it from its source itself: a cancelled job stops at the next item (a
    user function is not interrupted mid-call, as a Spark task's worker is
    killed: one that blocks holds the cancel until it returns). ``check_tasks``:
    pickle each task once, as Spark would to send it to its workers.
    ``pickle_items`` False skips pickling items at the boundaries (benchmarks).
    """

    on_driver = True

    def __init__(
        self,
        parallelism: int | Callable[[], int],
        cancelled: Callable[[], bool],
        *,
        check_tasks: bool = True,
        pickle_items: bool = True,
    ) -> None:
        #: A number, or a function asked when a batch reduce or sort needs it (a
        #: micro-batch never does: its plan fixes its state tasks).
        self._parallelism = parallelism
        self._cancelled = cancelled
        self._check_tasks = check_tasks
        self._pickle_items = pickle_items

    def parallelism(self) -> int:
        parallelism = self._parallelism
        return max(1, parallelism if isinstance(parallelism, int) else parallelism())

    def reports(
        self, *, counts: bool, event_times: bool, dead_letters: bool, state_ranges: bool
    ) -> Counters:
        return Counters(counting=counts, timing=event_times)

    def source(self, descriptors: list[Any], stage: str) -> LocalData:
        sent = self._pickled(descriptors, stage)
        return LocalData([[d] for d in sent] or [[]])

    def map_partitions(
        self, data: LocalData, task: PartitionTask, emitter: str | None, via: str = ""
    ) -> LocalData:
        if self._check_tasks:
            self._check_task(task)
        task = self._reading_until_cancelled(task)
        out: list[list[Any]] = []
        for pidx, part in enumerate(data.partitions()):
            self._check_cancelled()
            out.append(list(task(pidx, self._until_cancelled(part))))
        return LocalData(out, emitter, via)

    def union(self, parts: list[LocalData]) -> LocalData:
        return LocalData([p for data in parts for p in data.partitions()])

    def share(self, data: LocalData) -> LocalData:
        parts = data.partitions()
        if not self._pickle_items:
            return LocalData(parts)
        return LocalData(None, blobs=[self._dump(part, data, data.emitter) for part in parts])

    def shuffle_to_tasks(self, data: LocalData, tasks: int, groups: int, stage: str) -> LocalData:
        to_task = KeyGroupPartition(groups, tasks)
        out: list[list[Any]] = [[] for _ in range(tasks)]
        for part in self._moved(data, stage):
            for record in part:
                out[to_task(record[0])].append(record)
        return LocalData(out)

    def reduce(
        self, mapped: LocalData, task: ReduceTask, partitions: int, by_position: bool
    ) -> LocalData:
        # The driver reduce of Spark's small case: outputs in order of position.
        records = [r for part in self._moved(mapped, task.stage) for r in part]
        self._check_cancelled()
        outputs = sorted(task(self._until_cancelled(records)), key=_first)
        items = [item for _, item in outputs]
        return LocalData([self._pickled(items, task.stage)])

    def sort(self, keyed: LocalData, task: SortTask, partitions: int, stage: str) -> LocalData:
        pairs = [p for part in self._moved(keyed, stage) for p in part]
        self._check_cancelled()
        # One range: a stable sort is what Spark's ranges, each sorted, add up to.
        return LocalData([list(task(self._until_cancelled(pairs)))])

    def collect(self, data: LocalData) -> list[Any]:
        return [item for part in self._moved(data, data.emitter) for item in part]

    def release(self) -> None:
        return None

    def failure(self, exc: BaseException) -> str:
        return f"the job failed: {type(exc).__name__}: {exc}"

    # --- pickling where Spark pickles -------------------------------------------

    def _moved(self, data: LocalData, stage: str | None) -> Iterable[list[Any]]:
        """``data``'s partitions as they arrive where Spark sends them (pickled and back)."""
        parts = data.partitions()
        if not self._pickle_items or data.blobs is not None:
            return parts
        return [pickle.loads(self._dump(part, data, data.emitter or stage)) for part in parts]

    def _pickled(self, items: list[Any], stage: str) -> list[Any]:
        if not self._pickle_items:
            return items
        loaded: list[Any] = pickle.loads(self._dump(items, LocalData(None), stage))
        return loaded

    def _dump(self, part: list[Any], data: LocalData, stage: str | None) -> bytes:
        try:
            return _dumps(part)
        except Exception:
            failure = None if stage is None else unpicklable(stage, part, _dumps, data.via)
            if failure is None:
                raise
            raise failure from None

    def _check_task(self, task: Any) -> None:
        """Pickle ``task`` as Spark does for its workers; a failure names the task's stage."""
        try:
            _task_pickler()(task)
        except Exception as exc:
            stage = getattr(task, "stage", "?")
            raise JobFailedError(
                f"stage '{stage}': its functions cannot be pickled for Spark's workers "
                f"({type(exc).__name__}: {exc}); a job's functions must be picklable "
                "even where it runs in the driver, as its large micro-batches run on Spark",
                stage,
            ) from exc

    def _check_cancelled(self) -> None:
        if self._cancelled():
            raise JobFailedError("cancelled")

    def _reading_until_cancelled(self, task: PartitionTask) -> PartitionTask:
        """``task``, asking before each item it reads from its source whether the job was cancelled.

        A task that reads its source itself is handed descriptors, one per
        partition: the items it takes come from the source, not from here.
        """
        if isinstance(task, ReadTask):
            return _ReadingUntil(task, self._until_cancelled)
        reader = getattr(task, "reader", None)
        if reader is None:
            return task
        checked = copy.copy(task)
        checked.reader = _ReadingUntil(reader, self._until_cancelled)  # type: ignore[attr-defined]
        return checked

    def _until_cancelled(self, items: Iterable[Any]) -> Iterator[Any]:
        """``items``, asking before each whether the job was cancelled."""
        cancelled = self._cancelled
        for item in items:
            if cancelled():
                raise JobFailedError("cancelled")
            yield item


class _ReadingUntil:
    """A task's source reader whose items each pass ``until`` (the cancel check) first."""

    def __init__(self, reader: ReadTask, until: Callable[[Iterable[Any]], Iterator[Any]]) -> None:
        self.reader, self.until = reader, until
        self.stage, self.source = reader.stage, reader.source

    def items(self, pidx: int, descriptors: Iterable[Any]) -> Iterable[Any]:
        return self.until(self.reader.items(pidx, descriptors))

    def __call__(self, pidx: int, descriptors: Iterator[Any]) -> Iterator[Any]:
        return self.until(self.reader.items(pidx, descriptors))


def _task_pickler() -> Callable[[Any], bytes]:
    """A ``dumps`` pickling functions by value, as Spark ships a task to its workers.

    The run's :class:`~sparkjet.core.engine.tasks.reports.Counters` stand in for
    Spark's accumulators, which pickle as their ids: they are left out.
    """
    import cloudpickle

    class TaskPickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        def persistent_id(self, obj: Any) -> Any:
            return "reports" if isinstance(obj, Counters) else None

    def dumps(task: Any) -> bytes:
        out = io.BytesIO()
        TaskPickler(out, pickle.HIGHEST_PROTOCOL).dump(task)
        return out.getvalue()

    return dumps
