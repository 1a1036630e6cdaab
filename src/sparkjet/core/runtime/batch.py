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

import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, assert_never

from sparkjet.core.contracts import JobContext, TaskContext
from sparkjet.core.dead_letters import commit_dead_letters
from sparkjet.core.engine import BatchResult, BatchSpec
from sparkjet.core.errors import JobFailedError
from sparkjet.core.fusion import (
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
from sparkjet.core.keyed import KeyedFold
from sparkjet.core.model import StageCount
from sparkjet.core.planner import Plan
from sparkjet.core.runtime.output import name_output, parallelize, partition_by
from sparkjet.core.runtime.reports import SparkReports
from sparkjet.core.tasks.passes import PassTask, RangePartition, ReduceTask, SinkTask, SortTask
from sparkjet.core.tasks.read import ReadTask
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


# --- Spark helpers ----------------------------------------------------------------
# The tasks run per partition are sparkjet.core.tasks' (engine-neutral); what
# follows turns them into Spark work.


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

    def stage_counts(self) -> dict[StageCount, int]:
        """The per-stage counts so far (empty when metrics are off)."""
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

