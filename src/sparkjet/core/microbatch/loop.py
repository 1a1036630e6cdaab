"""The micro-batch loop of a streaming job, and its checkpoint.

Each micro-batch is one consistent cut. Before running batch ``b`` the driver
writes its plan (every source's start and end offsets) to
``offsets/<b>`` (a write-ahead log); after the Spark work and the sinks'
idempotent commits it writes ``commits/<b>``. After a failure the job starts
from the last commit: a planned but uncommitted batch is replayed with the
same offsets from the same state, and the sinks skip what already landed, so
EXACTLY_ONCE holds with sinks that commit idempotently per batch id.

The checkpoint's layout and records (:class:`~sparkjet.core.state.checkpoint.BatchPlan`,
:class:`~sparkjet.core.state.checkpoint.CommitRecord`) are :mod:`sparkjet.core.state.checkpoint`'s;
what the loop asks of the job it runs for is :class:`LoopHost`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sparkjet.core.config import DEFAULT_JOIN_TABLE_MAX_BYTES
from sparkjet.core.engine.boundary import BatchResult, BatchWork, Engine, JobRun, RunHooks
from sparkjet.core.errors import SourceOffsetsError
from sparkjet.core.host.contracts import JobContext, Source, lag_of
from sparkjet.core.host.contracts import source_lag as source_lag  # moved; still importable here
from sparkjet.core.microbatch.commit import BatchCommit
from sparkjet.core.model import DEFAULT_KEY_GROUPS, StageCount
from sparkjet.core.pipeline.event_time import NO_WATERMARK, EventTime, WindowClock, stage_watermark
from sparkjet.core.pipeline.graph import KeyedSpec, TimedSpec, Transform, WindowSpec
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.state.cache import CacheOwner
from sparkjet.core.state.checkpoint import BatchPlan, Checkpoint, CommitRecord
from sparkjet.core.store import requests as store_requests
from sparkjet.core.store.upkeep import Upkeep

log = logging.getLogger("sparkjet.streaming")

#: The longest an idle job waits before it looks at its sources and the
#: host's stop requests again (a source that can tell wakes it sooner).
IDLE_POLL_SECONDS = 0.05
#: With several sources that can tell when data comes, each is asked in
#: turn for at most this long.
WAIT_SLICE_SECONDS = 0.005
#: While every source says no data came, the loop still looks at their
#: offsets this often (in case one's wait missed an append); on S3 or GCS at
#: the idle poll's most (``[engine] idle_poll_max_seconds``) if that is longer,
#: since a wait there says "nothing" only until its next look is due.
RELIST_SECONDS = 1.0


def waits_for_data(source: Any) -> bool:
    """Whether ``source`` overrides :meth:`Source.wait_for_data` (it can tell when data comes)."""
    return getattr(type(source), "wait_for_data", None) is not Source.wait_for_data


def initial_offsets(plan: Plan, job_context: Callable[[Transform], JobContext]) -> dict[str, Any]:
    """Each source's offsets, by stage name, where a job with no committed batch starts."""
    return {plan.name(n): spec.source.initial_offsets(job_context(n))
            for n, spec in plan.sources().items()}


def latest_offsets(source: Any, context: Any, start: Any) -> Any:
    """``source.latest_offsets(context)``, told where the next micro-batch starts if it asks.

    A source that declares ``accepts_start = True`` (``Source.accepts_start``)
    gets the offsets the last committed (or planned) micro-batch ended at, so
    it can cap how much one micro-batch reads (Spark's ``latestOffset(start,
    limit)`` for a ``SupportsAdmissionControl`` stream). The declaration is
    checked against the method when the class registers (plugin manager).
    """
    if getattr(source, "accepts_start", False):
        return source.latest_offsets(context, start=start)
    return source.latest_offsets(context)


def offsets_behind(start: Any, latest: Any) -> str | None:
    """Where ``latest`` offsets are behind ``start`` (a partition, or "" for a number); None if not.

    Offsets that are a number, a list of numbers or a dict of numbers (one
    per partition, as a stream's and Kafka's) are compared partition by
    partition, for the partitions both have; other shapes are the source's
    own and are not compared.
    """
    def number(value: Any) -> bool:
        return type(value) is int

    if number(start) and number(latest):
        return "" if latest < start else None
    if isinstance(start, list) and isinstance(latest, list):
        pairs: list[tuple[str, Any, Any]] = [
            (str(i), s, a) for i, (s, a) in enumerate(zip(start, latest, strict=False))]
        values = [*start, *latest]
    elif isinstance(start, dict) and isinstance(latest, dict):
        pairs = [(str(k), start[k], latest[k]) for k in start if k in latest]
        values = [*start.values(), *latest.values()]
    else:
        return None
    if not all(number(v) for v in values):
        return None  # not one number per partition: the source's own shape
    return next((p for p, s, a in pairs if a < s), None)


@dataclass
class StreamProgress:
    """What the loop reports for metrics."""

    last_committed: int = -1
    snapshots: int = 0
    durations_ms: list[int] = field(default_factory=list)
    input_rows: list[int] = field(default_factory=list)
    #: The job's per-stage counts since it started (emitted items, dead letters, late
    #: items): read from the last commit record when the loop starts, and written
    #: into every commit record, so they go on across suspends and drivers.
    stage_totals: dict[StageCount, int] = field(default_factory=dict)
    state: dict[str, tuple[int, int]] = field(default_factory=dict)  # stage -> (keys, bytes)
    last_batch_end_ms: int = -1
    previous_batch_end_ms: int = -1
    #: Per windowed stage, the watermark its last batch emitted up to.
    watermarks: dict[str, int] = field(default_factory=dict)
    #: Per source stage, how many items its source had that the job had not read
    #: when it last looked (sources whose offsets count items; see :func:`lag_of`).
    lag: dict[str, int] = field(default_factory=dict)
    #: Micro-batches run here on the driver (small ones, adaptive) and on Spark.
    local_batches: int = 0
    spark_batches: int = 0
    #: The store requests the driver made for the last micro-batch, by kind: from
    #: the look at the sources that found its data to its commit point (requests
    #: of tasks that ran on Spark executors are not in it).
    batch_requests: dict[str, int] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, Any]:
        """Jet-style names: rates are items per second of the last micro-batch.

        ``processingRate`` divides its items by its duration; ``inputRate`` by
        the time since the batch before it ended (how fast data arrived).
        """
        recent = self.durations_ms[-100:]
        last_rows = self.input_rows[-1] if self.input_rows else 0
        last_ms = recent[-1] if recent else 0
        span = self.last_batch_end_ms - self.previous_batch_end_ms
        return {
            "lastCommittedBatch": self.last_committed,
            "snapshotCount": self.snapshots,
            "batchDurationsMillis": recent,
            "lastBatchDurationMillis": last_ms,
            "processingRate": (last_rows * 1000 / last_ms) if last_ms else 0.0,
            "inputRate": (last_rows * 1000 / span)
            if self.previous_batch_end_ms > 0 and span > 0 else 0.0,
            "localBatches": self.local_batches,
            "sparkBatches": self.spark_batches,
            "lastBatchStoreRequests": sum(self.batch_requests.values()),
        }


class StopReason(enum.StrEnum):
    """Why the micro-batch loop stopped (asked between micro-batches)."""

    CANCEL = "cancel"
    SUSPEND = "suspend"
    RESTART = "restart"


class LoopHost(Protocol):
    """What the micro-batch loop asks of the job it runs for (the job runner implements it)."""

    def stop_reason(self) -> StopReason | None:
        """Why to stop before the next batch (cancel, suspend, restart, cluster change), or None."""

    def cancelled(self) -> bool:
        """True once the job is cancelled: a running micro-batch is abandoned."""

    def between_batches(self) -> None:
        """Serve the snapshot exports waiting for a cut.

        Asked before each batch is planned (and so once when the loop stops).
        """

    def batch_committed(self) -> None:
        """After every committed batch (the runner writes progress to the job record)."""

    def check_fence(self) -> None:
        """Raise JobFencedError once another driver took the job over.

        Asked before every write-ahead plan and commit point.
        """

    def pinned_batch(self) -> int:
        """The newest batch a snapshot export is reading, -1 for none."""


@dataclass(frozen=True)
class LoopSettings:
    """How the loop runs: from the job's config."""

    #: Count what each stage emits (and the state's keys and bytes) for the metrics.
    metrics: bool
    #: The least time from one batch's start to the next's (0: back to back).
    trigger_seconds: float
    #: Key groups of a new checkpoint (an existing one keeps its own).
    key_groups: int = DEFAULT_KEY_GROUPS
    #: The job whose state the workers keep loaded between batches, and their budget
    #: (None: reloaded from the checkpoint every batch).
    cache_owner: CacheOwner | None = None
    #: The job's ``JobConfig.adaptive_micro_batches``, handed to the engine with
    #: each batch (None: as the engine's ``[engine] adaptive`` setting says).
    adaptive: bool | None = None
    #: The job as logs name it.
    label: str = ""
    #: How often the loop lists its sources while their waits say nothing came.
    relist_seconds: float = RELIST_SECONDS
    #: The most bytes a hash join's table may take pickled (``[engine]``).
    join_table_max_bytes: int = DEFAULT_JOIN_TABLE_MAX_BYTES


class StreamLoop:
    """Runs micro-batches on the engine until asked to stop; returns why it stopped."""

    def __init__(
        self,
        plan: Plan,
        engine: Engine,
        job_context: Callable[[Transform], JobContext],
        checkpoint: Checkpoint,
        settings: LoopSettings,
        host: LoopHost,
        progress: StreamProgress,
    ) -> None:
        self.plan = plan
        self.engine = engine
        self.job_context = job_context
        self.checkpoint = checkpoint
        self.settings = settings
        self.host = host
        self.progress = progress
        self.sources = plan.sources()
        #: The sources' offsets the loop goes on from: the end offsets of its
        #: last committed batch (before the first, where it started).
        self.ends: dict[str, Any] = {}
        #: The windowed stages' definitions, by name.
        self.windows = {plan.name(n): n.spec.window for n in plan.nodes
                        if isinstance(n.spec, WindowSpec)}
        #: The stages that follow event time (windows, interval joins): a watermark each.
        self.timed = [plan.name(n) for n in plan.nodes if isinstance(n.spec, TimedSpec)]
        #: Event time as of the last committed batch.
        self.event_time = EventTime()
        #: Set by :meth:`wake`: ends a pause between batches early.
        self._woken = threading.Event()
        #: The names of the keyed stages, whose state the checkpoint keeps.
        self._state_stages = [plan.name(n) for n in plan.nodes if isinstance(n.spec, KeyedSpec)]
        #: Whether the job keeps keyed state.
        self._stateful = bool(self._state_stages)
        #: Whether :attr:`progress` knows the size of the job's keyed state (once
        #: a batch ran here, or from the start for a new checkpoint).
        self._state_known = not self._stateful

    def wake(self) -> None:
        """Cut short the loop's current pause (a trigger interval or an idle wait).

        For a host that was asked to stop: the loop then asks it at once
        rather than at its next look (at most :data:`IDLE_POLL_SECONDS` on).
        """
        self._woken.set()

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` unless :meth:`wake` is called first."""
        if self._woken.wait(max(seconds, 0.0)):
            self._woken.clear()

    def _wait_cap(self, now_ms: int) -> float:
        """How long an idle wait may last: until the next early-results period turns, 50 ms at most.

        Every wait ends within :data:`IDLE_POLL_SECONDS`, so stop requests,
        cluster checks and idle-partition timeouts are seen as often as before.
        """
        cap = IDLE_POLL_SECONDS
        for definition in self.windows.values():
            period = definition.early_period
            if period:
                cap = min(cap, (period - now_ms % period) / 1000)
        return max(cap, 0.001)

    def _wait_for_data(self, ends: dict[str, Any], now_ms: int) -> bool:
        """Wait until a source may have data past ``ends``, or the cap (:meth:`_wait_cap`).

        Sources that can tell (:func:`waits_for_data`) are asked: one for the
        whole wait; several in turn, :data:`WAIT_SLICE_SECONDS` each. Without
        any, the loop sleeps the cap. Nothing spins. False when every source
        can tell and each said nothing came (the loop need not list them).
        """
        cap = self._wait_cap(now_ms)
        telling = [n for n, spec in self.sources.items() if waits_for_data(spec.source)]
        if not telling:
            self._pause(cap)
            return True
        silent = len(telling) == len(self.sources)
        deadline = time.monotonic() + cap
        if len(telling) == 1:
            node = telling[0]
            came = self.sources[node].source.wait_for_data(
                ends.get(self.plan.name(node)), cap, self.job_context(node))
            return bool(came) or not silent
        while True:
            for node in telling:
                rest = deadline - time.monotonic()
                if rest <= 0 or self._woken.is_set():
                    self._woken.clear()
                    return not silent
                if self.sources[node].source.wait_for_data(
                        ends.get(self.plan.name(node)), min(rest, WAIT_SLICE_SECONDS),
                        self.job_context(node)):
                    return True

    def _check_forward(self, ends: dict[str, Any], latest: dict[str, Any]) -> None:
        """Fail naming the source whose data now ends before the offsets the batch starts at."""
        for stage, offsets in latest.items():
            partition = offsets_behind(ends.get(stage), offsets)
            if partition is not None:
                where = f" (partition {partition})" if partition else ""
                raise SourceOffsetsError(
                    f"source {stage!r}: its data ends at {json.dumps(offsets)} now, before "
                    f"the offsets the next micro-batch starts from, {json.dumps(ends.get(stage))}"
                    f"{where}; the source reads other data than the job read (deleted and "
                    "created again, or rewritten). The job stops rather than skip or repeat "
                    "items: start it anew, or from a snapshot with source_starts")

    def _know_partitions(self, latest: dict[str, Any], now_ms: int) -> None:
        """Add the timestamped sources' partitions at ``latest`` to the event-time record."""
        if not self.timed:
            return
        known = {self.plan.name(n): list(spec.source.watermark_partitions(
            latest[self.plan.name(n)])) for n, spec in self.sources.items()
            if spec.timestamps is not None}
        self.event_time = self.event_time.knowing(known, now_ms)

    def _watermarks(self, now_ms: int) -> dict[str, int]:
        """Each windowed stage's watermark for a batch planned at ``now_ms``."""
        return {stage: stage_watermark(self.event_time, stage, self.plan.event_sources[stage],
                                       now_ms) for stage in self.timed}

    def _early(self, now_ms: int) -> tuple[str, ...]:
        """The windowed stages whose early-results period turned since the last batch."""
        last = self.event_time.time_ms
        return tuple(stage for stage, d in self.windows.items()
                     if d.early_period and last and now_ms // d.early_period
                     != last // d.early_period)

    def _time_due(self, now_ms: int) -> bool:
        """Whether a batch without input has work: a watermark moved, or early results are due."""
        if not self.timed:
            return False
        had = self.event_time.watermarks
        moved = any(w > had.get(stage, NO_WATERMARK) for stage, w in
                    self._watermarks(now_ms).items())
        return moved or bool(self._early(now_ms))

    def _clocks(self, planned: BatchPlan) -> dict[str, WindowClock]:
        """Each timed stage's event time in the batch of ``planned``."""
        if not self.timed:
            return {}
        watermarks = planned.watermarks
        if watermarks is None:  # planned by a version without windows
            watermarks = self._watermarks(planned.time_ms)
        had = self.event_time.watermarks
        return {stage: WindowClock(had.get(stage, NO_WATERMARK),
                                   watermarks.get(stage, had.get(stage, NO_WATERMARK)),
                                   stage in planned.early)
                for stage in self.timed}

    def _stop_asked(self) -> StopReason | None:
        self.host.between_batches()
        return self.host.stop_reason()

    def run(self) -> StopReason:
        """Run micro-batches from the checkpoint's last commit until the host says stop.

        A batch's tidying (folding a sink's log, pruning the checkpoint's)
        runs on an upkeep thread while the next batch runs; the loop waits
        for what is left of it before it returns.
        """
        with Upkeep(f"sparkjet-upkeep-{self.checkpoint.id}"):
            return self._run()

    def _run(self) -> StopReason:
        host = self.host
        groups = self.checkpoint.key_groups(self.settings.key_groups,
                                            list(self.plan.names.values()))
        committed = self.checkpoint.last_commit()
        self._state_known = not self._stateful or committed < 0
        if committed >= 0:
            record = self.checkpoint.commit_record(committed)
            ends = record.ends
            self.event_time = record.event_time or EventTime()
            # The counts go on from the checkpoint, as the batch numbers do.
            self.progress.stage_totals = dict(record.totals or {})
        else:
            ends = initial_offsets(self.plan, self.job_context)
            self.progress.stage_totals = {}
        self.ends = ends
        self.progress.last_committed = committed
        self.progress.snapshots = committed + 1  # batches are numbered from 0
        # The one owner of each batch's plan, fence, sink commits and commit point.
        commits = BatchCommit(self.checkpoint, self.checkpoint.state(groups), host.check_fence)
        batch = committed + 1
        # What every micro-batch of this run shares: the job, and the host's callbacks.
        job = JobRun(self.plan, self.job_context, metrics=self.settings.metrics,
                     cache_owner=self.settings.cache_owner, checkpoint_id=self.checkpoint.id,
                     adaptive=self.settings.adaptive, label=self.settings.label,
                     join_table_max_bytes=self.settings.join_table_max_bytes)
        hooks = RunHooks(cancelled=host.cancelled)
        tables = self._build_tables(job, hooks)
        quiet_until = 0.0  # till then the sources said nothing came: no need to list them
        listed = 0.0  # when the loop last listed the sources' offsets
        # The batch found unplanned, or the one after a batch this driver
        # committed: only this driver plans it from then on (a plan is created
        # only if absent, and write_plan returns one that stands), so neither
        # an idle loop's looks nor each new batch read the plan's file.
        unplanned = -1
        while True:
            # What this look costs in store requests, and if it runs a batch, the batch.
            with store_requests.tally() as spent:
                reason = self._stop_asked()
                if reason is not None:
                    return reason
                started = time.monotonic()
                planned = None if batch == unplanned else commits.planned(batch)
                if planned is None:
                    unplanned = batch
                    if time.monotonic() < quiet_until:
                        latest = {self.plan.name(n): ends.get(self.plan.name(n))
                                  for n in self.sources}
                    else:
                        latest = {
                            self.plan.name(n): latest_offsets(
                                self.sources[n].source, self.job_context(n),
                                ends.get(self.plan.name(n)))
                            for n in self.sources
                        }
                        listed = time.monotonic()
                    quiet_until = 0.0
                    self._check_forward(ends, latest)
                    now_ms = int(time.time() * 1000)
                    self._know_partitions(latest, now_ms)
                    for n in self.sources:
                        stage = self.plan.name(n)
                        # Opaque offsets (bytes, names) count no items: no lag shown.
                        behind = lag_of(self.sources[n].source, ends.get(stage), latest[stage])
                        if behind is not None:
                            self.progress.lag[stage] = behind
                    if latest == ends and not self._time_due(now_ms):
                        if not self._wait_for_data(ends, now_ms):
                            quiet_until = listed + self.settings.relist_seconds
                        continue
                    # As many state tasks as the cluster runs at once, at most one
                    # per key group; the plan fixes it so a replay runs the same.
                    planned = BatchPlan(batch, ends, latest, now_ms,
                                        max(1, min(self.engine.parallelism(), groups)),
                                        self._watermarks(now_ms) if self.timed else None,
                                        self._early(now_ms), tables or None)
                    planned = commits.plan(planned)
                else:
                    log.info("replaying micro-batch %d with its recorded offsets", batch)
                clocks = self._clocks(planned)
                work = BatchWork(
                    batch=batch, committed=batch - 1, source_ranges=planned.source_ranges(),
                    state=commits.state(host.pinned_batch()),
                    tasks=planned.state_tasks(groups), now_ms=planned.time_ms, windows=clocks,
                    listed=commits.listed(self._state_stages),
                    tables=tables if planned.tables is None else planned.tables,
                    state_bytes=(sum(size for _, size in self.progress.state.values())
                                 if self._state_known else None),
                )
                run = self.engine.micro_batch(job, work, hooks)
                local = run.on_driver
                result = run.run()
                duration_ms = int((time.monotonic() - started) * 1000)
                event_time = self.event_time.after(
                    result.event_times, planned.time_ms,
                    {stage: clock.current for stage, clock in clocks.items()})
                totals = dict(self.progress.stage_totals)
                for key, value in result.items.items():
                    totals[key] = totals.get(key, 0) + value
                mine = CommitRecord(batch, planned.ends, int(time.time() * 1000), duration_ms,
                                    dict(result.state_files), event_time=event_time, totals=totals,
                                    engine="local" if local else "spark")
                standing = commits.commit(run, mine)
                if standing is not mine:  # another driver's record of the batch stands
                    event_time = standing.event_time or EventTime()
                    totals = standing.totals if standing.totals is not None else totals
                self.event_time = event_time
                self.progress.stage_totals = totals
                self._record(result, batch, duration_ms)
                self.progress.batch_requests = dict(spent)
                self._state_known = True
                if local:
                    self.progress.local_batches += 1
                else:
                    self.progress.spark_batches += 1
                ends = planned.ends
                self.ends = ends
                batch += 1
                unplanned = batch
                host.batch_committed()
                trigger = self.settings.trigger_seconds
                rest = trigger - (time.monotonic() - started)
                while rest > 0 and self._stop_asked() is None:
                    self._pause(min(rest, IDLE_POLL_SECONDS))
                    rest = trigger - (time.monotonic() - started)

    def _build_tables(self, job: JobRun, hooks: RunHooks) -> dict[str, tuple[str, ...]]:
        """Read the hash joins' build sides, once per run of the loop, as Jet does at start.

        Returns each join stage's table digests, which every batch planned in
        this run records; a batch replayed from an earlier run's plan joins
        against the tables that plan names instead.
        """
        if not self.plan.joins():
            return {}
        started = time.monotonic()
        result = self.engine.batch(dataclasses.replace(job, tables_only=True), hooks).run()
        log.info("job %s: read the build sides of its hash joins (%s) in %.0f ms: a job reads "
                 "them when it starts, resumes or restarts", self.settings.label,
                 ", ".join(sorted(result.tables)), (time.monotonic() - started) * 1000)
        return dict(result.tables)

    def _record(self, result: BatchResult, batch: int, duration_ms: int) -> None:
        p = self.progress
        p.last_committed = batch
        p.snapshots += 1
        p.durations_ms.append(duration_ms)
        del p.durations_ms[:-1000]
        counts = result.items
        rows = sum(counts.get(StageCount(self.plan.name(n), "items"), 0) for n in self.sources)
        p.input_rows.append(rows)
        del p.input_rows[:-1000]
        for stage, size in result.state.items():
            p.state[stage] = (size.keys, size.bytes)
        p.previous_batch_end_ms = p.last_batch_end_ms
        p.last_batch_end_ms = int(time.time() * 1000)
        p.watermarks = dict(self.event_time.watermarks)
