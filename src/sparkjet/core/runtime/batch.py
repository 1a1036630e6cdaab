"""Runs a batch Plan as Spark RDD work.

Shape of the work:

- a source becomes ``parallelize(descriptors)`` read on executors;
- stateless stages accumulate as pending ops and are compiled into one
  :class:`~sparkjet.core.fusion.FusedPass` where the flow ends (a stateful
  stage, a sink, a branch or a merge);
- keyed stages do map-side work in that same pass, shuffle partial results
  by key, and finish on the reduce side; results are then put back in order
  of first appearance (positions are ``(partition, index)``), so batch output
  is deterministic and matches plain Python;
- every sink writes its partitions, and only when all Spark work succeeded
  does the driver commit each sink (a failed job leaves its sinks untouched).
"""

from __future__ import annotations

import bisect
import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, assert_never

from sparkjet.core.contracts import JobContext, TaskContext
from sparkjet.core.dead_letters import commit_dead_letters, dead_counter
from sparkjet.core.engine import BatchResult, BatchSpec
from sparkjet.core.errors import JobFailedError
from sparkjet.core.event_time import late_counter
from sparkjet.core.fusion import (
    FOLDING,
    FusedPass,
    Op,
    StageFailure,
    Stamp,
    StampKind,
    Terminal,
    TerminalKind,
    UnpicklableItem,
    decode_failure,
)
from sparkjet.core.graph import (
    AggregateSpec,
    KeyedSpec,
    MergeSpec,
    SinkSpec,
    SortSpec,
    SourceSpec,
    StatelessSpec,
    Transform,
    WindowSpec,
)
from sparkjet.core.keyed import KeyedFold, folded_records, reduce_batch
from sparkjet.core.planner import Plan
from sparkjet.core.runtime.output import name_output, parallelize, partition_by
from sparkjet.core.runtime.reports import SparkReports
from sparkjet.core.tasks.reports import Reports
from sparkjet.core.windowing import stage_fold

log = logging.getLogger("sparkjet.batch")

_first = itemgetter(0)


@dataclass
class Flow:
    """Items leaving a node: an RDD plus stateless ops not yet applied.

    When ``reader`` is set, the RDD holds a source's partition descriptors and
    the first pass reads them itself, so items go from the source's list into
    the fused loop with no generator in between.
    """

    rdd: Any
    ops: list[Op] = field(default_factory=list)
    reader: ReadTask | None = None
    #: How the items carry event time (None: they have none); see :class:`Stamp`.
    stamp: Stamp | None = None


# --- executor-side tasks -------------------------------------------------------
# Module-level classes, so they pickle by reference plus their fields.


def _fail(stage: str, fused: FusedPass | None, exc: BaseException) -> StageFailure:
    if isinstance(exc, StageFailure):
        return exc
    found = fused.stage_of(exc) if fused is not None else None
    return StageFailure(found or stage, exc)


class Task:
    """Base of the executor-side tasks: failure attribution and counting.

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

    def count(self, emitted: dict[str, int]) -> None:
        """Add ``{stage: emitted}`` (and other named counts) to the job's counts."""
        reports = self.reports
        if reports is not None and emitted:
            reports.count(emitted)

    def count_pass(self, raw: dict[str, int]) -> None:
        """Add what each stage of the fused pass emitted, from its raw counters."""
        reports = self.reports
        if reports is not None and reports.counting and self.fused is not None:
            stages = self.fused.stage_counts(raw)
            self.count({stage: out for stage, (_, out) in stages.items()})

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
            self.count({late_counter(self.stage): late})

    #: The source the pass reads itself, if any (a :class:`ReadTask`).
    reader: ReadTask | None = None

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
        counted: dict[str, int] = {}
        reported = {}
        for seq, letter in enumerate(letters):
            counter = dead_counter(letter["stage"])
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


class ReadTask(Task):
    """Reads one source partition descriptor per Spark partition."""

    def __init__(
        self, source: Any, stage: str, context: TaskContext, reports: Reports | None
    ) -> None:
        self.source, self.stage, self.context, self.reports = source, stage, context, reports

    def __call__(self, pidx: int, descriptors: Iterator[Any]) -> Iterator[Any]:
        yield from self.items(pidx, descriptors)

    def items(self, pidx: int, descriptors: Iterable[Any]) -> Iterable[Any]:
        """The partition's items: the source's own list when it returns one."""
        wanted = list(descriptors)
        if len(wanted) == 1:
            with self.attributing():
                items = self.source.read(wanted[0], self._context(pidx))
            if isinstance(items, list | tuple):
                self.count({self.stage: len(items)})
                return items
            return self._counted(pidx, [], items)
        return self._counted(pidx, wanted, None)

    def _context(self, pidx: int) -> TaskContext:
        return replace(self.context, partition=pidx)

    def _counted(self, pidx: int, descriptors: list[Any], first: Any) -> Iterator[Any]:
        n = 0
        with self.attributing():
            if first is not None:
                for item in first:
                    n += 1
                    yield item
            for descriptor in descriptors:
                for item in self.source.read(descriptor, self._context(pidx)):
                    n += 1
                    yield item
        self.count({self.stage: n})


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
        self.count({self.stage: n})


_PYTHON_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.*)$")


def _spark_failure_summary(exc: BaseException) -> str:
    """The Python error a Spark worker raised outside sparkjet's tasks, in one line.

    Spark's message starts with a generic line and buries the worker's own
    traceback in a JVM stack trace; its last ``SomethingError: ...`` line is
    what a user needs (typically a module the workers cannot import).
    """
    text = str(exc)
    found = None
    for line in text.splitlines():
        match = _PYTHON_ERROR_LINE.match(line.strip())
        if match and not match.group(1).startswith(("org.", "java.", "py4j.", "scala.")):
            found = line.strip()
    if found is None:
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return first
    if found.startswith("ModuleNotFoundError"):
        found += (
            " (Spark's Python workers cannot import it: install the module where the "
            "workers run, or define the function in the submitted script)"
        )
    return found


#: Up to this many map-side partial records are reduced on the driver.
DRIVER_REDUCE_LIMIT = 100_000


def _count_records(records: Iterator[Any]) -> Iterator[int]:
    n = 0
    for _ in records:
        n += 1
    yield n


def _to_partition_of_origin(record: tuple[Any, Any]) -> tuple[int, Any]:
    return (record[0][0], record)


def _identity_partition(pidx: int) -> int:
    return pidx


def _restore_order(records: Iterator[tuple[int, Any]]) -> Iterator[Any]:
    ordered = sorted((record for _, record in records), key=_first)
    for _, output in ordered:
        yield output


class SortTask(Task):
    """Sorts one range partition of ``(key, item)`` pairs, yielding the items.

    ``reports`` None: the items are counted elsewhere (a windowed stage's reduce).
    """

    def __init__(self, stage: str, reports: Reports | None) -> None:
        self.stage, self.reports = stage, reports

    def __call__(self, pairs: Iterator[tuple[Any, Any]]) -> Iterator[Any]:
        with self.attributing():
            ordered = sorted(pairs, key=_first)
        self.count({self.stage: len(ordered)})
        for _, item in ordered:
            yield item


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


# --- driver side ----------------------------------------------------------------


class BatchRun:
    """Plans and runs one batch job on a SparkContext; raises JobFailedError on failure."""

    #: Whether tasks report event times (the watermark) and state ranges: a micro-batch's do.
    _streaming = False

    def __init__(self, sc: Any, spec: BatchSpec) -> None:
        self.plan: Plan = spec.plan
        self.sc = sc
        self.job_context = spec.job_context
        self.metrics = spec.metrics
        self.cancelled = spec.cancelled
        self.on_commit = spec.on_commit
        #: Where the job's dead letters go (None: no stage sets items aside).
        self.dead_letters = spec.plan.dead_letters
        #: What the tasks report: counts (with metrics), dead letters (when a stage
        #: sets items aside); a micro-batch adds event times and state ranges.
        self.reports = SparkReports.make(
            sc, counts=spec.metrics, event_times=self._streaming,
            dead_letters=self.dead_letters is not None, state_ranges=self._streaming)
        self.parallelism = max(1, int(sc.defaultParallelism))
        self._persisted: list[Any] = []
        self._started_ms = int(time.time() * 1000)
        self._written: list[tuple[Transform, Any, Any, list[Any]]] = []

    def stage_counts(self) -> dict[str, int]:
        """Emitted items per stage so far (empty when metrics are off)."""
        counts = self.reports.counts
        return dict(counts.value) if counts is not None else {}

    def run(self) -> BatchResult:
        """Run the plan, commit its sinks and say what it did; raises JobFailedError."""
        flows: dict[Transform, Flow] = {}
        try:
            for node in self.plan.nodes:
                if self.cancelled():
                    raise JobFailedError("cancelled")
                flow = self._node(node, flows)
                if flow is not None and len(node.consumers) > 1:
                    flow = self._materialize_shared(node, flow)
                if flow is not None:
                    flows[node] = flow
            self._commit_all()
            return self._result()
        except BaseException as exc:
            self._abort_all()
            error = self._job_error(exc)
            raise error from error.__cause__
        finally:
            for rdd in self._persisted:
                rdd.unpersist()

    def _result(self) -> BatchResult:
        """What the run did, once its Spark work has ended."""
        return BatchResult(items=self.stage_counts())

    # --- per node ------------------------------------------------------------

    def _node(self, node: Transform, flows: dict[Transform, Flow]) -> Flow | None:
        name = self.plan.name(node)
        spec = node.spec
        if isinstance(spec, SourceSpec):
            return self._source(node, spec, name)
        if isinstance(spec, StatelessSpec):
            upstream = flows[node.inputs[0]]
            dead = self.dead_letters is not None and name in self.dead_letters.stages
            return Flow(upstream.rdd, [*upstream.ops, Op(spec.op, name, spec.fn, dead)],
                        upstream.reader, upstream.stamp)
        if isinstance(spec, MergeSpec):
            # Items keep their timestamps through a merge of timestamped branches only.
            paired = all(flows[i].stamp is not None for i in node.inputs)
            rdds = [self._materialize(flows[i], name, paired, self.plan.name(i))
                    for i in node.inputs]
            return Flow(self.sc.union(rdds), stamp=Stamp(StampKind.PAIRED) if paired else None)
        if isinstance(spec, SinkSpec):
            self._sink(node, spec, name, flows[node.inputs[0]])
            return None
        if isinstance(spec, KeyedSpec):
            return self._keyed(spec, name, flows[node.inputs[0]])
        if isinstance(spec, AggregateSpec):
            return self._global_aggregate(spec, name, flows[node.inputs[0]])
        if isinstance(spec, SortSpec):
            return self._sort(spec, name, flows[node.inputs[0]])
        assert_never(spec)

    def _source(self, node: Transform, spec: SourceSpec, name: str) -> Flow:
        source = spec.source
        ctx = self.job_context(node)
        try:
            descriptors = list(self._descriptors(spec, name, ctx))
        except Exception as exc:
            raise JobFailedError(
                f"stage '{name}': source {source.describe()} failed to plan its partitions: "
                f"{type(exc).__name__}: {exc}",
                name,
            ) from exc
        task_ctx = TaskContext(ctx.job_id, 0, ctx.store, ctx.options, stage=name)
        # A descriptor that cannot be pickled is the source stage's failure, named.
        rdd = parallelize(self.sc, descriptors, max(1, len(descriptors)), name)
        return Flow(rdd, reader=ReadTask(source, name, task_ctx, self.reports),
                    stamp=self._stamp(spec, name))

    def _stamp(self, spec: SourceSpec, name: str) -> Stamp | None:
        """How a source's items get their timestamps (None: they have none)."""
        timestamps = spec.timestamps
        if timestamps is None:
            return None
        if timestamps.fn is None:
            return Stamp(StampKind.NOW, name, now_ms=self._now_ms())
        return Stamp(StampKind.FN, name, timestamps.fn)

    def _now_ms(self) -> int:
        """Ingestion time: when the batch job started."""
        return self._started_ms

    def _descriptors(self, spec: SourceSpec, name: str, ctx: JobContext) -> Iterable[Any]:
        """The partition descriptors source stage ``name`` reads (all of its input)."""
        return spec.source.partitions(ctx)

    def _pass(
        self, flow: Flow, stage: str, terminal: Terminal | None = None, pairs_out: bool = False
    ) -> FusedPass:
        terminal = terminal or Terminal(TerminalKind.YIELD)
        return FusedPass(list(flow.ops), terminal, self.metrics,
                         flow.stamp, pairs_out and flow.stamp is not None)

    def _materialize(
        self, flow: Flow, stage: str, pairs: bool = False, emitter: str | None = None
    ) -> Any:
        """The flow's items as an RDD: ``(t, item)`` pairs with ``pairs`` (timestamped flows).

        ``emitter`` is the stage whose items they are (default ``stage``),
        named if one cannot be pickled.
        """
        pairs = pairs and flow.stamp is not None
        computes = flow.stamp is not None and flow.stamp.kind != StampKind.PAIRED
        if not flow.ops and not computes and (pairs or flow.stamp is None):
            if flow.reader is not None:
                return name_output(flow.rdd.mapPartitionsWithIndex(flow.reader, True),
                                   flow.reader.stage)
            return flow.rdd
        return name_output(flow.rdd.mapPartitionsWithIndex(
            PassTask(self._pass(flow, stage, pairs_out=pairs), stage, self.reports, flow.reader),
            True,
        ), emitter or stage)

    def _materialize_shared(self, node: Transform, flow: Flow) -> Flow:
        from pyspark import StorageLevel

        paired = flow.stamp is not None
        rdd = self._materialize(flow, self.plan.name(node), paired)
        rdd = rdd.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(rdd)
        return Flow(rdd, stamp=Stamp(StampKind.PAIRED) if paired else None)

    def _map_side(
        self, fold: KeyedFold, spec: KeyedSpec | AggregateSpec, name: str, flow: Flow
    ) -> Any:
        """The map side of a keyed stage, fused into the pass that feeds it.

        Yields ``(key, part)`` records (:mod:`sparkjet.core.keyed`): a partial
        accumulator per key when the operation combines, the first item per
        key for ``distinct``, and every item otherwise (not combinable, or
        stateful transforms).
        """
        terminal = fold.terminal(name, None if isinstance(spec, AggregateSpec) else spec.key_fn)
        if isinstance(spec, WindowSpec) and self.dead_letters is not None:
            # A window whose policy is dead-letter sets its late items aside.
            terminal.late_letters = name in self.dead_letters.stages
        clock = getattr(fold, "clock", None)
        return name_output(flow.rdd.mapPartitionsWithIndex(
            PassTask(self._pass(flow, name, terminal), name, self.reports, flow.reader,
                     watermark=None if clock is None else clock.late_before),
            True,
        ), name)

    def _keyed(self, spec: KeyedSpec, name: str, flow: Flow) -> Flow:
        fold = stage_fold(spec)
        mapped = self._map_side(fold, spec, name, flow)
        task = ReduceTask(fold, name, self.reports)
        return Flow(self._reduce(mapped, task, self.parallelism, isinstance(spec, WindowSpec)))

    def _reduce(
        self, mapped: Any, task: ReduceTask, partitions: int, by_position: bool = False
    ) -> Any:
        """Reduce map-side partials keyed by key; the result RDD is in encounter order.

        The map side runs once, cached. When its partials are few (the usual
        case for aggregations), the driver reduces them, which saves two
        shuffle stages; otherwise they are shuffled to ``partitions`` reducers
        and the results put back in order by a second shuffle.
        """
        from pyspark import StorageLevel
        from pyspark.rdd import portable_hash

        mapped = mapped.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(mapped)
        if sum(mapped.mapPartitions(_count_records).collect()) <= DRIVER_REDUCE_LIMIT:
            outputs = sorted(task(iter(mapped.collect())), key=_first)
            items = [item for _, item in outputs]
            slices = self.parallelism if len(items) > DRIVER_REDUCE_LIMIT // 10 else 1
            return parallelize(self.sc, items, slices, task.stage)
        reduced = partition_by(mapped, partitions, portable_hash, None).mapPartitions(task)
        if by_position:  # positions that are not (pidx, pos, j): a sort by them
            return self._by_position(reduced, partitions, task.stage)
        return self._reorder(reduced, mapped.getNumPartitions(), task.stage)

    def _by_position(self, tagged: Any, partitions: int, stage: str) -> Any:
        """``(position, item)`` records (``stage``'s output), their items in order of position.

        What ``sortByKey`` does, but ``sortByKey`` computes its input three
        times (a count, a sample, the shuffle), so the reduce side ran, and
        counted its output, three times. Here it runs once, persisted, and an
        item that cannot be pickled is named as ``stage``'s.
        """
        from pyspark import StorageLevel

        tagged = name_output(tagged, stage).persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(tagged)
        bounds = self._range_bounds(tagged, partitions, stage)
        ranged = partition_by(tagged, len(bounds) + 1, RangePartition(bounds), None)
        return ranged.mapPartitions(SortTask(stage, None), True)

    def _range_bounds(self, keyed: Any, partitions: int, stage: str) -> list[Any]:
        """Bounds splitting ``(key, item)`` records into ``partitions`` ranges of keys.

        From a sample of about 30 keys per range, as Spark's own range sort
        samples; a key that does not compare fails as ``stage``'s.
        """
        total = keyed.count() if partitions > 1 else 0
        if total <= 1:
            return []
        fraction = min(1.0, 30.0 * partitions / total)
        sample = keyed.map(_first).sample(False, fraction, 17).collect()
        try:
            sample.sort()
        except Exception as exc:
            raise StageFailure(stage, exc) from None
        step = len(sample) / partitions
        return [sample[int(step * i)] for i in range(1, partitions) if sample]

    def _reorder(self, tagged: Any, partitions: int, stage: str) -> Any:
        """Put ``((pidx, pos, j), item)`` records (``stage``'s output) back in encounter order."""
        origin = tagged.map(_to_partition_of_origin)
        return partition_by(origin, max(1, partitions), _identity_partition, stage).mapPartitions(
            _restore_order, True)

    def _global_aggregate(self, spec: AggregateSpec, name: str, flow: Flow) -> Flow:
        fold = stage_fold(spec)
        mapped = self._map_side(fold, spec, name, flow)
        task = ReduceTask(fold, name, self.reports)
        return Flow(self._reduce(mapped, task, 1))

    def _sort(self, spec: SortSpec, name: str, flow: Flow) -> Flow:
        from pyspark import StorageLevel

        terminal = Terminal(TerminalKind.SORTKEY, name, spec.key_fn, reverse=spec.reverse)
        keyed = name_output(flow.rdd.mapPartitionsWithIndex(
            PassTask(self._pass(flow, name, terminal), name, self.reports, flow.reader),
            True,
        ), name).persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(keyed)
        bounds = self._range_bounds(keyed, self.parallelism, name)
        ranged = partition_by(keyed, len(bounds) + 1, RangePartition(bounds), None)
        return Flow(ranged.mapPartitions(SortTask(name, self.reports), True))

    def _sink(self, node: Transform, spec: SinkSpec, name: str, flow: Flow) -> None:
        sink = spec.sink
        ctx = self.job_context(node)
        try:
            state = sink.prepare(ctx)
        except Exception as exc:
            raise StageFailure(name, exc) from None
        task_ctx = TaskContext(ctx.job_id, 0, ctx.store, ctx.options, stage=name)
        task = SinkTask(
            self._pass(flow, name), sink, state, name, task_ctx, self.reports, flow.reader,
        )
        entry: tuple[Transform, Any, Any, list[Any]] = (node, sink, state, [])
        self._written.append(entry)
        started = time.perf_counter()
        # A sink's commit messages may carry the items its input emitted (the
        # stream sink's do): one that cannot be pickled names the input stage
        # and says it was found in the sink's message.
        written = name_output(flow.rdd.mapPartitionsWithIndex(task), self.plan.name(node.inputs[0]),
                              via=f"in the commit message of sink stage {name!r}")
        messages = written.collect()
        log.debug("stage '%s': wrote %d partitions in %.3f s", name, len(messages),
                  time.perf_counter() - started)
        entry[3].extend(messages)

    # --- commit / abort ----------------------------------------------------------

    def _commit_all(self) -> None:
        if self.on_commit is not None:
            self.on_commit()
        dead = self.reports.dead_letters
        if self.dead_letters is not None and dead is not None and self.plan.nodes:
            # Before the sinks: a letter is durable by the time results show its batch.
            try:
                written = commit_dead_letters(self.job_context(self.plan.nodes[0]),
                                              self.dead_letters.stream, dead.value)
            except Exception as exc:
                raise JobFailedError(
                    f"writing the dead letters to stream {self.dead_letters.stream!r} "
                    f"failed: {type(exc).__name__}: {exc}"
                ) from exc
            if written:
                log.warning("%d dead letter(s) written to stream %r", written,
                            self.dead_letters.stream)
                # PySpark's registry keeps every accumulator: let go of the letters.
                self.reports.forget_letters()
        while self._written:
            if self.cancelled():
                raise JobFailedError("cancelled before commit")
            node, sink, state, messages = self._written[0]
            try:
                sink.commit(state, messages, self.job_context(node))
            except Exception as exc:
                raise StageFailure(self.plan.name(node), exc) from None
            self._written.pop(0)  # committed: never aborted

    def _abort_all(self) -> None:
        for node, sink, state, messages in self._written:
            try:
                sink.abort(state, messages, self.job_context(node))
            except Exception:
                log.exception("sink of stage '%s' failed to abort", self.plan.name(node))
        self._written = []

    def _job_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, JobFailedError):
            return exc
        decoded = decode_failure(str(exc))
        if decoded is not None:
            stage, user_exc, remote_tb = decoded
            if remote_tb:
                user_exc.add_note(f"Traceback on the Spark executor:\n{remote_tb}")
            if isinstance(user_exc, UnpicklableItem):  # "item of type ... cannot be pickled"
                message = f"stage '{stage}': {user_exc}"
            else:
                message = f"stage '{stage}' failed: {type(user_exc).__name__}: {user_exc}"
            error = JobFailedError(message, stage)
            error.__cause__ = user_exc
            return error
        if isinstance(exc, KeyboardInterrupt):
            return exc
        error = JobFailedError(f"the job failed in Spark: {_spark_failure_summary(exc)}")
        error.__cause__ = exc
        return error

