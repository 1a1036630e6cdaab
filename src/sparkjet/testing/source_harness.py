"""The source conformance kit's harness and machinery, driven by :mod:`sparkjet.testing.sources`.

:class:`SourceHarness` is what a source's author subclasses to make and feed
the source under test; :func:`kit_items` makes the kit's items. The rest is
the suite's own: the constants of its jobs, ``_Run`` (a test's jobs and
reads), the waits and checks the tests share, ``_Driver`` (a driver
process of the kill test) and ``_PausingSink`` (the list sink of the kill
test's jobs, which can hold a micro-batch between its read and its commit).
It calls a source as the micro-batch loop does
(:func:`sparkjet.plugin.latest_offsets`, :func:`sparkjet.plugin.lag_of`) and
reads a job's plans from its handle (``job.get_planned_batches()``).

A wait for items never waits out :data:`WAIT_SECONDS` for an item that will
not come: once the job has caught up with the source (its last committed
micro-batch ends where the source's latest offsets are, nothing planned after
it) for :data:`SETTLE_SECONDS`, what it read is compared at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import cloudpickle
import pytest

from sparkjet import Client
from sparkjet.job import Job, JobConfig, ProcessingGuarantee
from sparkjet.pipeline import ListSink, Pipeline
from sparkjet.plugin import InputSize, JobContext, Source, TaskContext, latest_offsets

#: The name the kit gives the source's stage in every job it runs.
STAGE = "conformance-source"
#: The list the kit's jobs write what they read to.
SEEN = "conformance-seen"
#: How long any one wait of the kit may take before the test fails
#: (``SPARKJET_KIT_WAIT_SECONDS`` sets it, for a slow or crowded machine).
WAIT_SECONDS = float(os.environ.get("SPARKJET_KIT_WAIT_SECONDS", "120"))
#: How long a job (or a direct read) must have caught up with the source, with
#: items still missing, before the kit fails rather than waits on
#: (``SPARKJET_KIT_SETTLE_SECONDS`` sets it): a source whose listings or
#: watchers lag behind its data gets this long to show the last items.
SETTLE_SECONDS = float(os.environ.get("SPARKJET_KIT_SETTLE_SECONDS", "3"))


def kit_items(start: int, count: int, token: str = "kit") -> list[dict[str, Any]]:
    """The kit's items ``start`` to ``start + count - 1``: ``{"seq", "key", "kit"}`` dicts.

    JSON-serialisable, small, and told apart by ``seq``; ``key`` spreads them
    over a few keys (a harness may use it as a partition key).
    """
    return [{"seq": i, "key": f"k{i % 5}", "kit": token} for i in range(start, start + count)]


class SourceHarness(ABC):
    """How the kit makes and feeds the source under test; subclass it for your source.

    Every method runs in the test process, and :meth:`new_source` and
    :meth:`prepare` also in the driver process of the kill test (the harness
    travels there pickled with cloudpickle, so keep it to plain attributes).
    """

    #: False for a bounded (batch) source: only the checks a batch job has are run.
    streaming: ClassVar[bool] = True
    #: The most items one micro-batch of ``new_source(capped=True)`` may read (None: no cap).
    max_items_per_batch: ClassVar[int | None] = None
    # What the source's offsets mean is the source's own declaration
    # (``Source.offsets_count_items``); the kit reads it from the source. A
    # harness's old ``lag_countable`` is ignored, with a DeprecationWarning.
    #: Whether :meth:`add_partitions` can give the source's data more partitions.
    can_add_partitions: ClassVar[bool] = False
    #: Whether :meth:`trim` can remove (trim, compact) items the source has not read.
    can_trim: ClassVar[bool] = False
    #: Why a capability is missing, shown in the report of a skipped check.
    why_not: ClassVar[dict[str, str]] = {}

    def prepare(self, client: Client) -> None:  # noqa: B027 - optional hook
        """Make the client ready for the source (register a plugin); default: nothing."""

    @abstractmethod
    def new_source(self, *, capped: bool = True) -> Source:
        """A fresh source reading this harness's data from its start.

        ``capped``: with the cap :attr:`max_items_per_batch` declares (small
        micro-batches, so the kit stops jobs between many of them); False: uncapped.
        """

    @abstractmethod
    def add(self, client: Client, items: list[dict[str, Any]]) -> None:
        """Make ``items`` available to the source (publish, write a file, produce)."""

    def decode(self, item: Any) -> dict[str, Any]:
        """The kit's item from what the source read (default: the item itself)."""
        return dict(item)

    def add_partitions(self, client: Client) -> None:
        """Give the data more partitions; later :meth:`add` calls use them too."""
        raise NotImplementedError(f"{type(self).__qualname__} cannot add partitions")

    def trim(self, client: Client) -> None:
        """Remove the oldest items (retention, compaction): all but those of the last :meth:`add`.

        The items of the last add may stay; at least those of the add before
        it must go.
        """
        raise NotImplementedError(f"{type(self).__qualname__} cannot trim")


# --- helpers --------------------------------------------------------------------------


def _wait(predicate: Callable[[], Any], what: str | Callable[[], str],
          timeout: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for "
                        f"{what() if callable(what) else what}")
        time.sleep(0.05)


def describe_multiset(seqs: list[int], expected: range) -> str:
    """Why a multiset of sequence numbers differs from ``expected`` (missing, duplicated, extra)."""
    counts = Counter(seqs)
    missing = [i for i in expected if i not in counts]
    dups = sorted((i, c) for i, c in counts.items() if c > 1)
    extra = sorted(i for i in counts if i not in expected)
    return (f"{len(seqs)} items read, {len(expected)} given: {len(missing)} missing "
            f"(first {missing[:10]}), {len(dups)} duplicated (first {dups[:10]}), "
            f"{len(extra)} never given (first {extra[:10]})")


def assert_exactly_once(seqs: list[int], expected: range, what: str) -> None:
    """Fail unless ``seqs`` holds every number of ``expected`` once and nothing else."""
    if sorted(seqs) != list(expected):
        pytest.fail(f"{what}: not every item exactly once: {describe_multiset(seqs, expected)}")


def counts_items(source: Source) -> bool:
    """Whether ``source`` declares that its offsets count items (``offsets_count_items``)."""
    return bool(getattr(source, "offsets_count_items", True))


def offsets_hint(source: Source) -> str:
    """What to do when offsets a source declares as item counts do not count its items."""
    return (f". {type(source).__qualname__} declares that its offsets count items "
            f"(offsets_count_items = True, the default), so the numbers above must be item "
            f"counts: if its offsets are positions of another kind (byte positions, times, "
            f"names), declare offsets_count_items = False on the class")


class _Run:
    """One test's jobs and direct reads of the source, on the test's client."""

    def __init__(self, client: Client, harness: SourceHarness) -> None:
        self.client = client
        self.harness = harness
        self.jobs: list[Job] = []
        self.given = 0
        self.token = uuid.uuid4().hex[:8]
        self._probe: tuple[Source, JobContext] | None = None
        if "lag_countable" in {name for cls in type(harness).__mro__ for name in vars(cls)}:
            warnings.warn(
                f"{type(harness).__qualname__}.lag_countable is ignored: a source declares "
                f"what its offsets are itself (offsets_count_items = False on the Source "
                f"class for offsets that do not count items)", DeprecationWarning, stacklevel=2)
        harness.prepare(client)

    # items
    def add(self, count: int) -> range:
        items = kit_items(self.given, count, self.token)
        self.harness.add(self.client, items)
        self.given += count
        return range(self.given - count, self.given)

    def seqs_of(self, items: list[Any]) -> list[int]:
        seqs = []
        for raw in items:
            item = self.harness.decode(raw)
            if item.get("kit") != self.token:
                pytest.fail(f"read an item the kit did not give in this test: {raw!r}")
            seqs.append(int(item["seq"]))
        return seqs

    def seen(self) -> list[int]:
        return self.seqs_of(self.client.get_list(SEEN).get_all())

    # jobs
    def pipeline(self, source: Source, control: str | None = None) -> Pipeline:
        """The kit's job: ``source`` into the list :data:`SEEN` (pausable with ``control``)."""
        sink = Pipeline.to_list(SEEN) if control is None else _PausingSink(SEEN, control)
        p = Pipeline.create()
        p.read_from(source).set_name(STAGE).write_to(sink)
        return p

    def submit(self, source: Source, snapshot: str | None = None) -> Job:
        job = self.client.get_jet().submit(self.pipeline(source), JobConfig(
            name=f"conformance-{uuid.uuid4().hex[:8]}",
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
            snapshot_interval_millis=100, initial_snapshot_name=snapshot))
        self.jobs.append(job)
        return job

    def wait_read(self, job: Job | None, count: int, what: str) -> list[int]:
        """Wait until the list holds ``count`` items and, 0.5 s later, still as many.

        Fails at once, naming the promise, once ``job`` has caught up with the
        source (:meth:`caught_up`) for :data:`SETTLE_SECONDS` with items still
        missing: they were lost, and waiting longer would not bring them.
        """
        size = self.client.get_list(SEEN).size
        watch = self.watch(job, count, what)

        def reached() -> bool:
            if job is not None and job.is_terminal():
                job.join(timeout=30)  # raises the job's failure
            if size() >= count:
                return True
            watch()
            return False

        def status() -> str:
            if job is None:
                return ""
            return f"; job {job.status.name}, last committed batch {self.committed(job)}"

        _wait(reached, lambda: (f"{count} items read ({what}): "
                                f"{describe_multiset(self.seen(), range(self.given))}{status()}"))
        time.sleep(0.5)
        return self.seen()

    def watch(self, job: Job | None, count: int, what: str) -> Callable[[], None]:
        """A check to call while waiting for ``count`` items: fails once they are lost.

        Lost: ``job`` has caught up with the source (:meth:`caught_up`) and
        stayed so for :data:`SETTLE_SECONDS`, with fewer than ``count`` items
        read. Looks at most every 0.25 s.
        """
        size = self.client.get_list(SEEN).size
        settled = self.settled(job, lambda: size() < count)

        def check() -> None:
            where = settled()
            if where is not None:
                pytest.fail(
                    f"{what}: every item given must be read exactly once, but the job caught "
                    f"up with the source ({where}) {SETTLE_SECONDS:g} s ago and read "
                    f"{size()} of {count} items: "
                    f"{describe_multiset(self.seen(), range(count))}")

        return check

    def settled(self, job: Job | None,
                short: Callable[[], bool] = lambda: True) -> Callable[[], str | None]:
        """A look that says where ``job`` stands once it has been caught up for a while.

        It answers None until ``job`` has been caught up with the source
        (:meth:`caught_up`) for :data:`SETTLE_SECONDS` while ``short()`` held
        all along; then what :meth:`caught_up` said. Looks at most every 0.25 s.
        """
        since: list[float] = []  # when the job was first seen caught up (and short)
        looked = [0.0]

        def look() -> str | None:
            now = time.monotonic()
            if job is None or now - looked[0] < 0.25:
                return None
            looked[0] = now
            where = self.caught_up(job)
            if where is None or not short():
                since.clear()
                return None
            if not since:
                since.append(now)
            return where if now - since[0] >= SETTLE_SECONDS else None

        return look

    def probe(self) -> tuple[Source, JobContext]:
        """A source of the harness's own, and its context, to ask for the latest offsets."""
        if self._probe is None:
            source = self.harness.new_source(capped=False)
            self._probe = (source, self.context(source, "conformance-probe"))
        return self._probe

    def caught_up(self, job: Job) -> str | None:
        """Where ``job`` has read all the source has (what it says of it), or None if not.

        Caught up: its last committed micro-batch is its last planned one, and
        the source's latest offsets from that batch's end are that end.
        """
        plans = job.get_planned_batches()
        if not plans or plans[-1].batch != self.committed(job):
            return None
        ends = plans[-1].ends.get(STAGE)
        source, ctx = self.probe()
        latest = latest_offsets(source, ctx, ends)
        if latest != ends:
            return None
        return (f"its last micro-batch, {plans[-1].batch}, is committed and ends at offsets "
                f"{_short(ends)}, where the source's latest offsets are")

    @staticmethod
    def committed(job: Job) -> int:
        """The job's last committed micro-batch (counted on from a snapshot it started from)."""
        return int(job.get_metrics().get("lastCommittedBatch", -1))

    @staticmethod
    def batches_run(job: Job) -> int:
        """How many micro-batches this job has run (up to the 100 its metrics keep)."""
        return len(job.get_metrics().get("batchDurationsMillis", []))

    def stop_all(self) -> None:
        if self._probe is not None:
            with contextlib.suppress(Exception):
                self._probe[0].close(self._probe[1])
        for job in self.jobs:
            with contextlib.suppress(Exception):
                if not job.is_terminal():
                    job.cancel()
            with contextlib.suppress(Exception):
                job.join(timeout=60)

    # direct calls, as the loop makes them
    def context(self, source: Source, job_id: str = "conformance-direct") -> JobContext:
        return JobContext(job_id=job_id, job_name=None, store=self.client.store,
                          parallelism=2, stage=STAGE,
                          options=dict(self.client.config.plugin_options.get(source.kind, {})),
                          processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE, batch_id=0)

    def read_range(self, source: Source, start: Any, end: Any, ctx: JobContext) -> list[int]:
        """The kit's seqs ``plan_range`` and ``read`` give for ``[start, end)``."""
        items: list[Any] = []
        for i, descriptor in enumerate(source.plan_range(start, end, ctx)):
            task = TaskContext(job_id=ctx.job_id, partition=i, store=ctx.store,
                               options=ctx.options, stage=STAGE)
            items.extend(cloudpickle.loads(cloudpickle.dumps(source)).read(
                cloudpickle.loads(cloudpickle.dumps(descriptor)), task))
        return self.seqs_of(items)

    def read_batch(self, source: Source) -> list[int]:
        """What a bounded source's ``partitions`` and ``read`` give."""
        ctx = self.context(source)
        items: list[Any] = []
        for i, descriptor in enumerate(source.partitions(ctx)):
            task = TaskContext(job_id=ctx.job_id, partition=i, store=ctx.store,
                               options=ctx.options, stage=STAGE)
            items.extend(source.read(descriptor, task))
        return self.seqs_of(items)

    def drain(self, source: Source, start: Any, count: int,
              check: Callable[[Any, Any, list[int]], None] | None = None) -> tuple[Any, list[int]]:
        """Plan and read from ``start`` until ``count`` items came; returns (end offsets, seqs).

        ``check(start, end, seqs)`` sees every non-empty step. Once the source
        planned something, it fails when it plans nothing more for
        :data:`SETTLE_SECONDS` with items still unread (they were lost).
        """
        ctx = self.context(source)
        read: list[int] = []
        began = start
        deadline = time.monotonic() + WAIT_SECONDS
        stalled: float | None = None
        while len(read) < count:
            end = latest_offsets(source, ctx, start)
            if end == start:
                now = time.monotonic()
                stalled = now if stalled is None else stalled
                if now > deadline or (read and now - stalled >= SETTLE_SECONDS):
                    pytest.fail(
                        f"every item given must be planned and read once, but the source "
                        f"planned nothing more after {len(read)} of {count} items "
                        f"(from offsets {_short(began)} to {_short(start)}, its latest, for "
                        f"{now - stalled:.1f} s); read: {sorted(read)[:20]}")
                time.sleep(0.1)
                continue
            stalled = None
            seqs = self.read_range(source, start, end, ctx)
            if check is not None:
                check(start, end, seqs)
            read.extend(seqs)
            start = end
        return start, read


def _short(value: Any, most: int = 160) -> str:
    """``repr(value)``, cut to ``most`` characters for a message."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def _numeric_partitions(offsets: Any) -> dict[str, int] | None:
    """Offsets shaped as numbers (one, a list or a dict of them) per partition; else None."""
    if isinstance(offsets, bool):
        return None
    if isinstance(offsets, int):
        return {"0": offsets}
    if isinstance(offsets, list) and all(type(o) is int for o in offsets):
        return {str(i): o for i, o in enumerate(offsets)}
    if isinstance(offsets, dict) and all(type(o) is int for o in offsets.values()):
        return {str(k): o for k, o in offsets.items()}
    return None


def check_forward(start: Any, end: Any, where: str) -> None:
    """Fail if numeric-shaped ``end`` offsets are behind ``start`` in any partition."""
    before, after = _numeric_partitions(start), _numeric_partitions(end)
    if before is None or after is None:
        return
    lost = sorted(set(before) - set(after))
    if lost:
        pytest.fail(f"{where}: partitions {lost} vanished from the offsets ({start!r} -> {end!r})")
    back = {p: (before[p], after[p]) for p in before if after[p] < before[p]}
    if back:
        pytest.fail(f"{where}: offsets went backwards in partitions {back} "
                    f"({start!r} -> {end!r})")


def check_size(size: Any, items: int, what: str, hint: str = "") -> None:
    """Fail unless ``size`` is None or an honest :class:`InputSize` of a read of ``items`` items.

    ``hint`` ends the message of a wrong item count (what the author may do).
    """
    if size is None:
        return
    if not isinstance(size, InputSize):
        pytest.fail(f"{what} returned {size!r}, not an InputSize or None")
    for field_name, value in zip(size._fields, size, strict=True):
        if value is not None and (type(value) is not int or value < 0):
            pytest.fail(f"{what}: {field_name} is {value!r}, not None or a non-negative int")
    if size.items is not None and size.items != items:
        pytest.fail(f"{what} says {size.items} items, but planning and reading gave "
                    f"{items}{hint}")


def _skip_unless(harness: SourceHarness, capability: str, declared: bool, what: str) -> None:
    """Skip, naming the harness's declaration, when it declares it cannot do ``capability``."""
    if not declared:
        why = harness.why_not.get(capability, "")
        pytest.skip(f"{type(harness).__name__} declares {what}" + (f": {why}" if why else ""))


# --- the kill test's driver processes -------------------------------------------------


class _Driver:
    """One ``python -m sparkjet.testing.source_driver`` process, in its own process group."""

    def __init__(self, spec: Path, log_dir: Path, index: int) -> None:
        self.out = log_dir / f"driver-{index}.out"
        self.err = log_dir / f"driver-{index}.err"
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = env.get("PYSPARK_PYTHON", sys.executable)
        # The harness's module must import there as it does here (a test module).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sparkjet.testing.source_driver", str(spec)],
                stdout=out, stderr=err, env=env, start_new_session=True)

    def lines(self, prefix: str | tuple[str, ...]) -> list[str]:
        """Every line of its output so far that starts with ``prefix``."""
        return [line for line in self.out.read_text().splitlines() if line.startswith(prefix)]

    def line(self, prefix: str | tuple[str, ...]) -> str | None:
        """Its first line starting with ``prefix``; None while none; fails once it exited."""
        found = self.lines(prefix)
        if found:
            return found[0]
        if self.proc.poll() is not None:
            tail = "\n".join(self.err.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"driver exited ({self.proc.returncode}) before {prefix!r}:\n{tail}")
        return None

    def kill(self) -> None:
        """SIGKILL the driver with its JVM and Python workers; reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


class _PausingSink(ListSink):
    """The list sink of the kill test's jobs, which can hold a micro-batch before its commit.

    The store's list sink (the kit reads what the job read from the list),
    with one addition. The kit arms it by creating the file
    ``<control>/pause``: the next commit of a micro-batch that wrote items
    claims that file (renames it to ``paused-<batch>``), prints ``PAUSED
    <batch>`` and blocks until its process is killed. A sink's commit runs
    on the driver after the batch's source ranges were planned (written
    ahead) and read, and before anything of the batch shows or its commit
    point is written: so the next driver finds the batch planned and not
    committed, and must replay it, reading the same range of the source
    again. The kit's deterministic fault, made through the public sink API
    only (a subclass of the list sink is the list sink to the plugin host).
    """

    def __init__(self, name: str, control: str) -> None:
        super().__init__(name)
        self.control = control

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Block here when armed (see the class); else the list sink's commit."""
        batch = context.batch_id
        if batch is not None and any(messages):
            armed = os.path.join(self.control, "pause")
            with contextlib.suppress(FileNotFoundError):
                os.rename(armed, os.path.join(self.control, f"paused-{batch}"))
                print(f"PAUSED {batch}", flush=True)
                while True:  # until SIGKILL
                    time.sleep(1)
        super().commit(state, messages, context)


# --- the suite -------------------------------------------------------------------------
