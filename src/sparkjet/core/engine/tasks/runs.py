"""The driver side of a run: a plan walked node by node over an engine's datasets.

Shape of the work, whatever the engine:

- a source becomes its partition descriptors, one partition each, read by
  the first pass (:class:`~sparkjet.core.engine.tasks.read.ReadTask`);
- stateless stages accumulate as pending ops and are compiled into one
  :class:`~sparkjet.core.pipeline.fusion.FusedPass` where the flow ends (a stateful
  stage, a sink, a branch or a merge);
- keyed stages do map-side work in that same pass, and finish on the reduce
  side: in a batch job, results are put back in order of first appearance
  (positions are ``(partition, index)``), so output is deterministic and
  matches plain Python; in a micro-batch, partials go to the state task that
  owns the key's key group (:class:`~sparkjet.core.engine.tasks.state.StateTask`);
- every sink writes its partitions, and only when all the work succeeded
  does the driver commit each sink (a failed run leaves its sinks untouched).

:class:`PlanRun` (a batch job) and :class:`MicroBatchRun` (one micro-batch)
hold that logic once. What a partition is, how records are shuffled and
where the tasks run is the engine's :class:`Datasets`: RDDs on Spark
(:mod:`sparkjet.core.engine.spark`), lists in this process
(:mod:`sparkjet.core.engine.inprocess`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, assert_never

from sparkjet.core.engine.boundary import BatchResult, BatchWork, JobRun, RunHooks, StateSize
from sparkjet.core.engine.tasks.passes import PassTask, ReduceTask, SinkTask, SortTask
from sparkjet.core.engine.tasks.read import ReadTask
from sparkjet.core.engine.tasks.reports import RangeReport, Reports
from sparkjet.core.engine.tasks.services import AsyncCalls, AsyncServiceTask, ServiceRef
from sparkjet.core.engine.tasks.state import StateTask
from sparkjet.core.engine.tasks.tables import TableRef, TableSet, load_tables, make_table
from sparkjet.core.errors import JobFailedError
from sparkjet.core.host.contracts import JobContext, TaskContext
from sparkjet.core.model import StageCount
from sparkjet.core.pipeline.dead_letters import commit_dead_letters
from sparkjet.core.pipeline.fusion import (
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
from sparkjet.core.pipeline.graph import (
    AggregateSpec,
    AsyncServiceSpec,
    HashJoinSpec,
    KeyedSpec,
    MergeSpec,
    OpKind,
    ServiceSpec,
    SinkSpec,
    SortSpec,
    SourceSpec,
    StatelessSpec,
    TimedSpec,
    Transform,
    WindowSpec,
    state_ttl_ms,
)
from sparkjet.core.pipeline.joins import Joiner
from sparkjet.core.pipeline.keyed import KeyedFold
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.pipeline.services import ServiceCall
from sparkjet.core.pipeline.window_fold import stage_fold
from sparkjet.core.state.versions import StateRange

__all__ = ["Datasets", "EngineReports", "Flow", "MicroBatchRun", "PlanRun"]

log = logging.getLogger("sparkjet.batch")

#: A task run over one partition: ``task(partition index, items)`` yields its output.
PartitionTask = Callable[[int, Iterator[Any]], Iterator[Any]]


class EngineReports(Reports, Protocol):
    """The :class:`~sparkjet.core.engine.tasks.reports.Reports` a run holds on the driver."""

    def stage_counts(self) -> dict[StageCount, int]:
        """The per-stage counts so far; safe from any thread."""
        ...

    def forget_letters(self) -> None:
        """Let go of the dead letters once the driver wrote them."""
        ...


class Datasets(Protocol):
    """What an engine does with partitioned data; a run's plan is walked over it.

    A dataset is the engine's own (an RDD, lists of partitions). Where the
    engine pickles items (a shuffle, a shared flow, what reaches the driver),
    an item that cannot be pickled fails as the
    :class:`~sparkjet.core.pipeline.fusion.StageFailure` of the stage that emitted it.
    """

    #: Whether the tasks run in the driver's own process (see ``Execution.on_driver``).
    on_driver: bool

    def parallelism(self) -> int:
        """How many partitions a reduce or a sort spreads over."""
        ...

    def reports(
        self, *, counts: bool, event_times: bool, dead_letters: bool, state_ranges: bool
    ) -> EngineReports:
        """Where the run's tasks report (what is not asked for is dropped)."""
        ...

    def source(self, descriptors: list[Any], stage: str) -> Any:
        """A dataset of one descriptor per partition (source stage ``stage``'s)."""
        ...

    def map_partitions(
        self, data: Any, task: PartitionTask, emitter: str | None, via: str = ""
    ) -> Any:
        """``task`` over each partition of ``data``; its output is ``emitter``'s (None: unnamed).

        ``via``: where an item that cannot be pickled was found, for the message.
        """
        ...

    def union(self, parts: list[Any]) -> Any:
        """The partitions of ``parts``, one after another."""
        ...

    def share(self, data: Any) -> Any:
        """``data`` computed once for several consumers, each getting its own items."""
        ...

    def shuffle_to_tasks(self, data: Any, tasks: int, groups: int, stage: str) -> Any:
        """``(key, part)`` records to partition ``p`` of ``tasks``, by the key's key group."""
        ...

    def reduce(self, mapped: Any, task: ReduceTask, partitions: int, by_position: bool) -> Any:
        """A batch reduce side over map-side ``(key, part)`` records, in encounter order.

        ``by_position``: outputs are ordered by their positions, which are not
        ``(partition, index, j)`` (a window's).
        """
        ...

    def sort(self, keyed: Any, task: SortTask, partitions: int, stage: str) -> Any:
        """``(SortKey, item)`` pairs (``stage``'s) sorted by key, each range by ``task``."""
        ...

    def collect(self, data: Any) -> list[Any]:
        """The items of ``data`` on the driver, partition by partition."""
        ...

    def release(self) -> None:
        """Let go of what the run kept (shared flows, reduce inputs)."""
        ...

    def failure(self, exc: BaseException) -> str:
        """What to tell of ``exc``, an error outside sparkjet's tasks, in one line."""
        ...


@dataclass
class Flow:
    """Items leaving a node: a dataset plus stateless ops not yet applied.

    When ``reader`` is set, the dataset holds a source's partition
    descriptors and the first pass reads them itself, so items go from the
    source's list into the fused loop with no generator in between.
    """

    data: Any
    ops: list[Op] = field(default_factory=list)
    reader: ReadTask | None = None
    #: How the items carry event time (None: they have none); see :class:`Stamp`.
    stamp: Stamp | None = None


class PlanRun:
    """Runs one batch job's plan over ``datasets``; raises JobFailedError on failure.

    ``job`` is the plan and how its stages run; ``hooks`` are the runner's
    callbacks: asked whether the job was cancelled between nodes, called just
    before the sinks commit.
    """

    #: Whether tasks report event times (the watermark) and state ranges: a micro-batch's do.
    _streaming = False
    #: Whether :meth:`run` commits the sinks (a batch job's); a micro-batch's
    #: commit is the checkpoint's (:meth:`commit`, see :class:`MicroBatchRun`).
    _commits_in_run = True

    def __init__(self, datasets: Datasets, job: JobRun, hooks: RunHooks) -> None:
        self.plan: Plan = job.plan
        self.data = datasets
        #: Whether the run's tasks run in the driver's process (its datasets say).
        self.on_driver = datasets.on_driver
        self.job_context = job.job_context
        self.metrics = job.metrics
        self.cancelled = hooks.cancelled
        self.before_commit = hooks.before_commit
        #: Where the job's dead letters go (None: no stage sets items aside).
        self.dead_letters = job.plan.dead_letters
        #: What the tasks report: counts (with metrics), dead letters (when a stage
        #: sets items aside); a micro-batch adds event times and state ranges.
        self.reports = datasets.reports(
            counts=job.metrics, event_times=self._streaming,
            dead_letters=self.dead_letters is not None, state_ranges=self._streaming)
        self._started_ms = int(time.time() * 1000)
        self._written: list[tuple[Transform, Any, Any, list[Any]]] = []
        #: Only the hash joins' tables are built (see ``JobRun.tables_only``).
        self.tables_only = job.tables_only
        self.table_max_bytes = job.join_table_max_bytes
        #: Per hash join stage, the tables it joins against (built or given).
        self._tables: dict[str, tuple[TableRef, ...]] = {}

    @property
    def parallelism(self) -> int:
        """How many partitions a batch reduce or sort spreads over (asked when one runs)."""
        return self.data.parallelism()

    def stage_counts(self) -> dict[StageCount, int]:
        """The per-stage counts so far (empty when metrics are off)."""
        return self.reports.stage_counts()

    def run(self) -> BatchResult:
        """Run the plan, commit its sinks and say what it did; raises JobFailedError."""
        flows: dict[Transform, Flow] = {}
        try:
            for node in self._walked():
                if self.cancelled():
                    raise JobFailedError("cancelled")
                flow = self._node(node, flows)
                if flow is not None and len(node.consumers) > 1:
                    flow = self._materialize_shared(node, flow)
                if flow is not None:
                    flows[node] = flow
            if self._commits_in_run:
                self._commit_all()
            return self._result()
        except BaseException as exc:
            self._abort_all()
            error = self._job_error(exc)
            raise error from error.__cause__
        finally:
            self.data.release()

    def commit(self) -> None:
        """Commit what :meth:`run` left to commit; raises JobFailedError naming the stage."""
        try:
            self._commit_all()
        except BaseException as exc:
            self._abort_all()
            error = self._job_error(exc)
            raise error from error.__cause__

    def abort(self) -> None:
        """Abort the sinks' writes not committed yet."""
        self._abort_all()

    def _result(self) -> BatchResult:
        """What the run did, once its work has ended."""
        return BatchResult(items=self.stage_counts(), tables=self._digests())

    def _digests(self) -> dict[str, tuple[str, ...]]:
        return {stage: tuple(ref.digest for ref in refs) for stage, refs in self._tables.items()}

    def _walked(self) -> list[Transform]:
        """The nodes this run walks: all; for a tables-only run, the build sides and joins."""
        if not self.tables_only:
            return self.plan.nodes
        return [n for n in self.plan.nodes
                if n in self.plan.build_nodes or isinstance(n.spec, HashJoinSpec)]

    # --- per node ------------------------------------------------------------

    def _node(self, node: Transform, flows: dict[Transform, Flow]) -> Flow | None:
        name = self.plan.name(node)
        spec = node.spec
        if isinstance(spec, SourceSpec):
            return self._source(node, spec, name)
        if isinstance(spec, StatelessSpec):
            upstream = flows[node.inputs[0]]
            dead = self.dead_letters is not None and name in self.dead_letters.stages
            return Flow(upstream.data, [*upstream.ops, Op(spec.op, name, spec.fn, dead)],
                        upstream.reader, upstream.stamp)
        if isinstance(spec, MergeSpec):
            # Items keep their timestamps through a merge of timestamped branches only.
            paired = all(flows[i].stamp is not None for i in node.inputs)
            parts = [self._materialize(flows[i], name, paired, self.plan.name(i))
                     for i in node.inputs]
            return Flow(self.data.union(parts), stamp=Stamp(StampKind.PAIRED) if paired else None)
        if isinstance(spec, SinkSpec):
            self._sink(node, spec, name, flows[node.inputs[0]])
            return None
        if isinstance(spec, KeyedSpec):
            return self._keyed(spec, name, flows[node.inputs[0]])
        if isinstance(spec, AggregateSpec):
            return self._global_aggregate(spec, name, flows[node.inputs[0]])
        if isinstance(spec, SortSpec):
            return self._sort(spec, name, flows[node.inputs[0]])
        if isinstance(spec, HashJoinSpec):
            return self._hash_join(node, spec, name, flows)
        if isinstance(spec, ServiceSpec):
            return self._service(node, spec, name, flows[node.inputs[0]])
        assert_never(spec)

    def _service(self, node: Transform, spec: ServiceSpec, name: str, upstream: Flow) -> Flow:
        """Service calls: one more op of the flow's pass, or (async) a task of their own after it.

        The task runs the pass of the stateless stages before it, then keeps
        up to ``max_concurrent_ops`` calls in flight; the stages after it fuse
        into a pass of their own.
        """
        ctx = self.job_context(node)
        dead = self.dead_letters is not None and name in self.dead_letters.stages
        ref = ServiceRef(ctx.store.files, ctx.job_id, name, spec.factory,
                         on_loop=isinstance(spec, AsyncServiceSpec), swept=not self.on_driver)
        if not isinstance(spec, AsyncServiceSpec):
            op = Op(OpKind.FLAT_MAP, name, ServiceCall(ref, spec.fn), dead)
            return Flow(upstream.data, [*upstream.ops, op], upstream.reader, upstream.stamp)
        calls = AsyncCalls(name, ref, spec.fn, spec.max_concurrent_ops, spec.preserve_order,
                           spec.timeout_ms, dead)
        task = AsyncServiceTask(self._pass(upstream, name, pairs_out=True), calls, self.reports,
                                upstream.reader)
        return Flow(self.data.map_partitions(upstream.data, task, name),
                    stamp=None if upstream.stamp is None else Stamp(StampKind.PAIRED))

    def _hash_join(
        self, node: Transform, spec: HashJoinSpec, name: str, flows: dict[Transform, Flow]
    ) -> Flow | None:
        """The join as one more stateless op on its primary flow, probing its stage's tables."""
        refs = self._tables.get(name)
        if refs is None:
            refs = self._tables[name] = self._join_tables(node, spec, name, flows)
        if self.tables_only:
            return None
        upstream = flows[node.inputs[0]]
        joiner = Joiner([clause.left_key for clause in spec.clauses], TableSet(refs),
                        spec.map_fn, inner=spec.inner, tagged=spec.tagged)
        return Flow(upstream.data, [*upstream.ops, Op(OpKind.FLAT_MAP, name, joiner)],
                    upstream.reader, upstream.stamp)

    def _join_tables(
        self, node: Transform, spec: HashJoinSpec, name: str, flows: dict[Transform, Flow]
    ) -> tuple[TableRef, ...]:
        """Read each build side in full and make its table.

        The table is stored unless only this process will probe it (a batch
        job's work in the driver).
        """
        ctx = self.job_context(node)
        refs = []
        for side, clause in zip(node.inputs[1:], spec.clauses, strict=True):
            side_name = self.plan.name(side)
            items = self.data.collect(self._materialize(flows[side], name, emitter=side_name))
            refs.append(make_table(
                items, clause, stage=name, side=side_name, files=ctx.store.files,
                job_id=ctx.job_id, max_bytes=self.table_max_bytes,
                write=self.tables_only or not self.on_driver))
        log.info("stage '%s': %s", name, ", ".join(
            f"build side '{self.plan.name(side)}' read ({len(ref()):,} keys)"
            for side, ref in zip(node.inputs[1:], refs, strict=True)))
        return tuple(refs)

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
        data = self.data.source(descriptors, name)
        return Flow(data, reader=ReadTask(source, name, task_ctx, self.reports),
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
        """The flow's items as a dataset: ``(t, item)`` pairs with ``pairs`` (timestamped flows).

        ``emitter`` is the stage whose items they are (default ``stage``),
        named if one cannot be pickled.
        """
        pairs = pairs and flow.stamp is not None
        computes = flow.stamp is not None and flow.stamp.kind != StampKind.PAIRED
        if not flow.ops and not computes and (pairs or flow.stamp is None):
            if flow.reader is not None:
                return self.data.map_partitions(flow.data, flow.reader, flow.reader.stage)
            return flow.data
        task = PassTask(self._pass(flow, stage, pairs_out=pairs), stage, self.reports,
                        flow.reader)
        return self.data.map_partitions(flow.data, task, emitter or stage)

    def _materialize_shared(self, node: Transform, flow: Flow) -> Flow:
        paired = flow.stamp is not None
        data = self.data.share(self._materialize(flow, self.plan.name(node), paired))
        return Flow(data, stamp=Stamp(StampKind.PAIRED) if paired else None)

    def _map_side(
        self, fold: KeyedFold, spec: KeyedSpec | AggregateSpec, name: str, flow: Flow
    ) -> Any:
        """The map side of a keyed stage, fused into the pass that feeds it.

        Yields ``(key, part)`` records (:mod:`sparkjet.core.pipeline.keyed`): a partial
        accumulator per key when the operation combines, the first item per
        key for ``distinct``, and every item otherwise (not combinable, or
        stateful transforms).
        """
        terminal = fold.terminal(name, None if isinstance(spec, AggregateSpec) else spec.key_fn)
        if isinstance(spec, TimedSpec) and self.dead_letters is not None:
            # A timed stage whose policy is dead-letter sets its late items aside.
            terminal.late_letters = name in self.dead_letters.stages
        clock = getattr(fold, "clock", None)
        task = PassTask(self._pass(flow, name, terminal), name, self.reports, flow.reader,
                        watermark=None if clock is None else clock.late_before)
        return self.data.map_partitions(flow.data, task, name)

    def _keyed(self, spec: KeyedSpec, name: str, flow: Flow) -> Flow:
        fold = stage_fold(spec)
        mapped = self._map_side(fold, spec, name, flow)
        task = ReduceTask(fold, name, self.reports)
        return Flow(self.data.reduce(mapped, task, self.parallelism,
                                     isinstance(spec, WindowSpec)))

    def _global_aggregate(self, spec: AggregateSpec, name: str, flow: Flow) -> Flow:
        fold = stage_fold(spec)
        mapped = self._map_side(fold, spec, name, flow)
        task = ReduceTask(fold, name, self.reports)
        return Flow(self.data.reduce(mapped, task, 1, False))

    def _sort(self, spec: SortSpec, name: str, flow: Flow) -> Flow:
        terminal = Terminal(TerminalKind.SORTKEY, name, spec.key_fn, reverse=spec.reverse)
        task = PassTask(self._pass(flow, name, terminal), name, self.reports, flow.reader)
        keyed = self.data.map_partitions(flow.data, task, name)
        return Flow(self.data.sort(keyed, SortTask(name, self.reports), self.parallelism, name))

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
        written = self.data.map_partitions(
            flow.data, task, self.plan.name(node.inputs[0]),
            via=f"in the commit message of sink stage {name!r}")
        messages = self.data.collect(written)
        log.debug("stage '%s': wrote %d partitions in %.3f s", name, len(messages),
                  time.perf_counter() - started)
        entry[3].extend(messages)

    # --- commit / abort ----------------------------------------------------------

    def _commit_all(self) -> None:
        if self.before_commit is not None:
            self.before_commit()
        if self.dead_letters is not None and self.plan.nodes:
            # Before the sinks: a letter is durable by the time results show its batch.
            letters = self.reports.snapshot().dead_letters
            try:
                written = commit_dead_letters(self.job_context(self.plan.nodes[0]),
                                              self.dead_letters.stream, letters)
            except Exception as exc:
                raise JobFailedError(
                    f"writing the dead letters to stream {self.dead_letters.stream!r} "
                    f"failed: {type(exc).__name__}: {exc}"
                ) from exc
            if written:
                log.warning("%d dead letter(s) written to stream %r", written,
                            self.dead_letters.stream)
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
            return _stage_error(*decoded)
        if isinstance(exc, KeyboardInterrupt):
            return exc
        error = JobFailedError(self.data.failure(exc))
        error.__cause__ = exc
        return error


def _stage_error(stage: str, user_exc: BaseException, remote_tb: str) -> JobFailedError:
    """The JobFailedError naming ``stage`` for its function's ``user_exc``."""
    if remote_tb:
        user_exc.add_note(f"Traceback on the Spark executor:\n{remote_tb}")
    if isinstance(user_exc, UnpicklableItem):  # "item of type ... cannot be pickled"
        message = f"stage '{stage}': {user_exc}"
    else:
        message = f"stage '{stage}' failed: {type(user_exc).__name__}: {user_exc}"
    error = JobFailedError(message, stage)
    error.__cause__ = user_exc
    return error


class MicroBatchRun(PlanRun):
    """Runs one micro-batch of a streaming plan.

    A micro-batch is a batch run (fused passes, map-side partial aggregation,
    sinks committing at the end) with three differences:

    - sources read the offset range the driver planned for this batch;
    - keyed stages keep state across batches: partials go by a stable hash of
      the key to the state task owning the key's *key group* (the batch's
      plan fixes how many tasks there are), and each task loads its key
      groups' state as of the last committed batch (or finds it still loaded
      from the batch before), folds the batch in, writes what changed and
      emits the updated results;
    - sinks commit with the batch id, so a replayed batch lands once, and
      only when the checkpoint's commit sequence calls :meth:`commit` after
      its fence check (:class:`sparkjet.core.microbatch.commit.BatchCommit`):
      :meth:`run` leaves them written, not committed.
    """

    _streaming = True
    _commits_in_run = False

    def __init__(
        self, datasets: Datasets, job: JobRun, work: BatchWork, hooks: RunHooks
    ) -> None:
        checkpoint_id = job.checkpoint_id
        if checkpoint_id is None:
            raise ValueError("a micro-batch needs its job's checkpoint_id (JobRun.checkpoint_id)")
        job_context = job.job_context

        def with_batch(node: Transform) -> JobContext:
            return dataclasses.replace(
                job_context(node), batch_id=work.batch, checkpoint_id=checkpoint_id
            )

        super().__init__(datasets, dataclasses.replace(job, job_context=with_batch), hooks)
        self.batch = work.batch
        self.committed = work.committed
        self.source_ranges = dict(work.source_ranges)
        self.state = work.state
        self.tasks = work.tasks
        # The batch's planned time, so a replay expires exactly what the first run did.
        self.now_ms = work.now_ms
        self.cache_owner = job.cache_owner
        self.windows = dict(work.windows)
        self.listed = dict(work.listed)
        self.given_tables = dict(work.tables)
        #: Per source stage, the partition each engine partition read (for the watermark).
        self._partitions: dict[str, list[str]] = {}

    def _now_ms(self) -> int:
        """Ingestion time: the batch's planned time, the same on a replay."""
        return self.now_ms

    def _result(self) -> BatchResult:
        """The batch's counts, and per stage its state and the files that count."""
        reported = self.reports.snapshot()
        reports: dict[StateRange, RangeReport] = reported.state_ranges
        state: dict[str, StateSize] = {}
        for key, report in reports.items():
            keys, size = state.get(key.stage, (0, 0))
            state[key.stage] = StateSize(keys + report.keys, size + report.bytes)
        seen: dict[str, dict[str, Any]] = {}
        for (stage, pidx), highest in reported.event_times.items():
            partition = self._partitions[stage][pidx]
            had = seen.setdefault(stage, {}).get(partition)
            seen[stage][partition] = highest if had is None or highest > had else had
        return BatchResult(
            items=reported.counts, state=state,
            state_files={key: report.file for key, report in reports.items()},
            event_times=seen,
        )

    def _walked(self) -> list[Transform]:
        """Every node but the build sides': the loop read those once, into its tables."""
        return [n for n in self.plan.nodes if n not in self.plan.build_nodes]

    def _join_tables(
        self, node: Transform, spec: HashJoinSpec, name: str, flows: dict[Transform, Flow]
    ) -> tuple[TableRef, ...]:
        """The tables the batch's plan names for the join (a replay: its first try's)."""
        digests = self.given_tables.get(name)
        if digests is None or len(digests) != len(spec.clauses):
            raise JobFailedError(
                f"stage '{name}': micro-batch {self.batch}'s plan names no tables for this hash "
                f"join (it names {sorted(self.given_tables)})", name)
        ctx = self.job_context(node)
        return load_tables(ctx.store.files, ctx.job_id, digests).refs

    def _descriptors(self, spec: SourceSpec, name: str, ctx: JobContext) -> Iterable[Any]:
        """The partition descriptors of source stage ``name``'s planned range this batch."""
        source = spec.source
        start, end = self.source_ranges[name]
        descriptors = list(source.plan_range(start, end, ctx))
        if spec.timestamps is not None:
            self._partitions[name] = [str(source.watermark_partition(d)) for d in descriptors]
        return descriptors

    def _keyed(self, spec: KeyedSpec, name: str, flow: Flow) -> Flow:
        fold = stage_fold(spec, self.windows.get(name))
        mapped = self._map_side(fold, spec, name, flow)
        task = StateTask(
            fold, name, state_ttl_ms(spec), self.state, self.batch, self.committed,
            self.now_ms, self.reports, self.tasks, self.cache_owner, self.listed.get(name),
        )
        shuffled = self.data.shuffle_to_tasks(mapped, self.tasks, self.state.key_groups, name)
        return Flow(self.data.map_partitions(shuffled, task, None))
