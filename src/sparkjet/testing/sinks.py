"""The sink conformance kit: :class:`SinkConformance`, the promises every sink must keep.

A plugin author subclasses :class:`SinkConformance` in a test module and gives
it a ``harness`` fixture returning a :class:`SinkHarness`: a client (its store
and Spark session), a factory of fresh sink objects that all write one target
(each call is what a new driver of the same job builds), and a reader
returning what a consumer of that target sees now::

    import pytest
    import sparkjet
    from sparkjet.testing import SinkConformance, SinkHarness

    class TestMySink(SinkConformance):
        @pytest.fixture
        def harness(self, client: sparkjet.Client, tmp_path) -> SinkHarness:
            out = str(tmp_path / "out")
            return SinkHarness(client, new_sink=lambda: MySink(out),
                               read=lambda: read_my_output(out))

The kit drives the sink's own API (``prepare`` on the driver, ``write`` per
partition with a :class:`~sparkjet.plugin.TaskContext`, ``commit`` or
``abort``), with contexts built as the runtime builds them for a micro-batch,
and once through a real streaming job that is stopped between the sinks'
commit and the checkpoint's, then resumed (a sink of the kit's own, after
the sink under test, stops it there: sinks commit in the pipeline's order,
and the checkpoint's commit follows them all). Each promise is its own test,
so a failure names the promise that broke.

Which checks run follows what the sink declares (its ``guarantees``), and
the kit drives it under the strongest one it declares:

- every sink: a committed micro-batch is visible, every item of it;
- ``AT_LEAST_ONCE``: a replayed micro-batch (committed twice, replayed by a
  new driver after a crash, written by two task attempts) loses no item;
- ``EXACTLY_ONCE``: those replays also show each item once; nothing is
  visible from a batch that was aborted or never committed; a driver fenced
  by a newer one changes nothing; the real job resumed after a crash between
  the commits shows each item once.

A check whose promise the sink does not declare is skipped, and the skip
says which guarantee it needs and what the sink declares: a skip is a
promise not made, never a failure hidden.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import cloudpickle
import pytest

from sparkjet import Client
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.plugin import ALL_GUARANTEES, JobContext, Sink, TaskContext, hookimpl

__all__ = ["SinkConformance", "SinkHarness"]

#: How long the kit waits for a streaming job's progress or output.
JOB_TIMEOUT_SECONDS = 180.0


def _default_item(n: int) -> Any:
    return {"seq": n}


@dataclass
class SinkHarness:
    """What :class:`SinkConformance` needs to drive one sink and read its output back."""

    #: The client whose store the sink's contexts carry, and whose Spark session
    #: and plugins run the kit's streaming job (the sink's plugin registered on it).
    client: Client
    #: A new sink object writing the target under test: the same target every call.
    new_sink: Callable[[], Sink]
    #: What a consumer of the target sees now, as items (committed output only).
    read: Callable[[], Sequence[Any]]
    #: The ``n``-th distinct item the kit writes, as :attr:`read` gives it back
    #: (a ``(key, value)`` pair for a map sink; JSON-able for a file or Kafka sink).
    item: Callable[[int], Any] = _default_item
    #: The sink's plugin options, as :attr:`~sparkjet.plugin.JobContext.options`.
    options: Mapping[str, Any] = field(default_factory=dict)


def strongest(guarantees: frozenset[ProcessingGuarantee]) -> ProcessingGuarantee:
    """The strongest guarantee of ``guarantees`` (what the kit drives a sink under)."""
    for guarantee in (ProcessingGuarantee.EXACTLY_ONCE, ProcessingGuarantee.AT_LEAST_ONCE):
        if guarantee in guarantees:
            return guarantee
    return ProcessingGuarantee.NONE


class _Driver:
    """One driver of the kit's job: a sink object of its own, contexts as the runtime builds them.

    Drivers of one kit test share the job id, the stage and the checkpoint (a
    driver that takes over a job goes on in its checkpoint), as the
    micro-batch loop's contexts do.
    """

    def __init__(self, harness: SinkHarness, job_id: str, guarantee: ProcessingGuarantee) -> None:
        self.harness = harness
        self.sink = harness.new_sink()
        self.job_id = job_id
        self.guarantee = guarantee
        self.stage = f"to-{self.sink.kind}(conformance)"

    def context(self, batch: int) -> JobContext:
        """The sink stage's driver context of micro-batch ``batch``."""
        base = JobContext(
            job_id=self.job_id, job_name="sink-conformance", stage=self.stage,
            store=self.harness.client.store, parallelism=2, options=self.harness.options,
            processing_guarantee=self.guarantee,
        )
        return replace(base, batch_id=batch, checkpoint_id="kit-checkpoint")

    def task(self, context: JobContext, partition: int) -> TaskContext:
        """The context of the task writing ``partition``."""
        task = TaskContext(context.job_id, 0, context.store, context.options, stage=context.stage)
        return replace(task, partition=partition)

    def prepare(self, batch: int) -> Any:
        return self.sink.prepare(self.context(batch))

    def write(self, state: Any, batch: int, partitions: Sequence[Sequence[Any]]) -> list[Any]:
        """Each partition written by its own task: the commit messages, in partition order.

        Each task gets its own pickled copy of the sink and of ``prepare``'s
        state, and its message comes back pickled, as Spark ships them.
        """
        context = self.context(batch)
        messages = []
        for p, items in enumerate(partitions):
            sink, shipped = _shipped((self.sink, state))
            messages.append(_shipped(sink.write(shipped, iter(list(items)),
                                                self.task(context, p))))
        return messages

    def commit(self, state: Any, batch: int, messages: list[Any]) -> None:
        self.sink.commit(state, messages, self.context(batch))

    def abort(self, state: Any, batch: int, messages: list[Any]) -> None:
        self.sink.abort(state, messages, self.context(batch))

    def run(self, batch: int, partitions: Sequence[Sequence[Any]]) -> None:
        """Prepare, write every partition, commit: one whole micro-batch."""
        state = self.prepare(batch)
        self.commit(state, batch, self.write(state, batch, partitions))


class SinkConformance:
    """What every sink must do under the guarantees it declares; subclass with a ``harness``."""

    @pytest.fixture
    def harness(self) -> SinkHarness:
        """The sink under test: override it (a fresh target per test)."""
        raise NotImplementedError("give the SinkConformance subclass a 'harness' fixture")

    # --- helpers ------------------------------------------------------------------------

    @staticmethod
    def declared(harness: SinkHarness) -> frozenset[ProcessingGuarantee]:
        """The guarantees the sink declares."""
        return frozenset(type(harness.new_sink()).guarantees)

    def needs(self, harness: SinkHarness, guarantee: ProcessingGuarantee, promise: str) -> None:
        """Skip, saying so, when the sink does not declare ``guarantee`` (``promise`` needs it)."""
        declared = self.declared(harness)
        if guarantee not in declared:
            names = ", ".join(sorted(g.name for g in declared)) or "nothing"
            pytest.skip(f"{promise} is an {guarantee.name} promise; "
                        f"{type(harness.new_sink()).__qualname__} declares {names}")

    def drivers(self, harness: SinkHarness) -> Callable[[], _Driver]:
        """A factory of drivers of one new job, under the sink's strongest guarantee."""
        job_id = f"kit-{uuid.uuid4().hex[:10]}"
        guarantee = strongest(self.declared(harness))
        return lambda: _Driver(harness, job_id, guarantee)

    @staticmethod
    def items(harness: SinkHarness, start: int, count: int) -> list[Any]:
        """Items ``start`` to ``start + count - 1``."""
        return [harness.item(n) for n in range(start, start + count)]

    @staticmethod
    def split(items: list[Any], parts: int = 2) -> list[list[Any]]:
        """``items`` dealt into ``parts`` partitions."""
        return [items[p::parts] for p in range(parts)]

    def assert_shows(self, harness: SinkHarness, expected: list[Any], what: str) -> None:
        """The target shows each of ``expected``: once under EXACTLY_ONCE, else at least once."""
        seen = Counter(_key(item) for item in harness.read())
        wanted = Counter(_key(item) for item in expected)
        missing = wanted - seen
        extra = seen - wanted
        assert not missing, f"{what}: {sum(missing.values())} item(s) lost, e.g. " \
            f"{_sample(missing)}"
        if strongest(self.declared(harness)) is ProcessingGuarantee.EXACTLY_ONCE:
            assert not extra, f"{what}: {sum(extra.values())} item(s) too many " \
                f"(duplicated or never committed), e.g. {_sample(extra)}"
        else:
            strangers = {k for k in extra if k not in wanted}
            assert not strangers, f"{what}: items that were never committed: " \
                f"{_sample(Counter(strangers))}"

    # --- every sink -----------------------------------------------------------------------

    def test_committed_batches_are_visible(self, harness: SinkHarness) -> None:
        """Two micro-batches, each written by two tasks and committed: every item shows."""
        driver = self.drivers(harness)()
        first, second = self.items(harness, 0, 6), self.items(harness, 6, 5)
        driver.run(0, self.split(first))
        self.assert_shows(harness, first, "after micro-batch 0 committed")
        driver.run(1, [second, []])  # an empty partition too
        self.assert_shows(harness, first + second, "after micro-batch 1 committed")

    # --- replays: at least once, or exactly once --------------------------------------------

    def test_a_batch_committed_twice_shows_once(self, harness: SinkHarness) -> None:
        """The same batch id with the same items, written and committed twice by one driver."""
        self.needs(harness, ProcessingGuarantee.AT_LEAST_ONCE, "a replayed batch keeps its items")
        driver = self.drivers(harness)()
        items = self.items(harness, 0, 6)
        driver.run(0, self.split(items))
        driver.run(0, self.split(items))
        self.assert_shows(harness, items, "micro-batch 0 committed twice")

    def test_two_task_attempts_of_a_partition_commit_once(self, harness: SinkHarness) -> None:
        """A partition written by two task attempts (a retry, a speculative copy); one commit.

        Spark hands the driver one attempt's message; the other attempt's
        output must stay invisible.
        """
        self.needs(harness, ProcessingGuarantee.AT_LEAST_ONCE, "a retried task keeps its items")
        driver = self.drivers(harness)()
        items = self.items(harness, 0, 6)
        partitions = self.split(items)
        state = driver.prepare(0)
        driver.write(state, 0, partitions)  # the first attempt of every task: messages lost
        messages = driver.write(state, 0, partitions)
        driver.commit(state, 0, messages)
        self.assert_shows(harness, items, "micro-batch 0 written by two attempts of each task")

    def test_a_batch_replayed_after_a_crash_shows_once(self, harness: SinkHarness) -> None:
        """Batch 1 committed, the driver dies before its checkpoint commit; a new one replays it.

        The new driver (a new sink object) replays batch 1 with the same items,
        here in one partition where the first run had two (a replay may run on
        another engine or cluster), then goes on with batch 2.
        """
        self.needs(harness, ProcessingGuarantee.AT_LEAST_ONCE, "a replayed batch keeps its items")
        new_driver = self.drivers(harness)
        first, second, third = (self.items(harness, 0, 4), self.items(harness, 4, 6),
                                self.items(harness, 10, 3))
        dead = new_driver()
        dead.run(0, self.split(first))
        dead.run(1, self.split(second))  # committed; its checkpoint commit never written
        self.assert_shows(harness, first + second, "before the crash")
        taking_over = new_driver()
        taking_over.run(1, [second])
        self.assert_shows(harness, first + second, "batch 1 replayed by a new driver")
        taking_over.run(2, self.split(third))
        self.assert_shows(harness, first + second + third, "after the replay and batch 2")

    # --- exactly once: nothing from a batch that did not commit -------------------------------

    def test_an_aborted_batch_shows_nothing(self, harness: SinkHarness) -> None:
        """Batch 1 written by its tasks, then aborted: none of it shows, before or after batch 2."""
        self.needs(harness, ProcessingGuarantee.EXACTLY_ONCE, "an aborted batch stays invisible")
        driver = self.drivers(harness)()
        first, doomed, later = (self.items(harness, 0, 4), self.items(harness, 100, 4),
                                self.items(harness, 4, 4))
        driver.run(0, self.split(first))
        state = driver.prepare(1)
        messages = driver.write(state, 1, self.split(doomed))
        self.assert_shows(harness, first, "batch 1 written, not yet committed")
        driver.abort(state, 1, messages)
        self.assert_shows(harness, first, "batch 1 aborted")
        # The job's next batch commits; the aborted items must not ride along.
        driver.run(2, self.split(later))
        self.assert_shows(harness, first + later, "batch 1 aborted, batch 2 committed")

    def test_an_abort_with_lost_messages_shows_nothing(self, harness: SinkHarness) -> None:
        """A failed Spark action loses the messages of tasks that wrote: abort gets none."""
        self.needs(harness, ProcessingGuarantee.EXACTLY_ONCE, "an aborted batch stays invisible")
        driver = self.drivers(harness)()
        first, doomed = self.items(harness, 0, 4), self.items(harness, 100, 4)
        driver.run(0, self.split(first))
        state = driver.prepare(1)
        driver.write(state, 1, self.split(doomed))
        driver.abort(state, 1, [])
        self.assert_shows(harness, first, "batch 1 aborted with its messages lost")
        replayed = self.items(harness, 4, 4)
        driver.run(1, self.split(replayed))  # the job goes on: batch 1 again, other items
        self.assert_shows(harness, first + replayed, "batch 1 aborted, then committed")

    def test_a_batch_written_but_never_committed_shows_nothing(self, harness: SinkHarness) -> None:
        """Tasks wrote batch 1, the driver died before committing; a new driver replays it once."""
        self.needs(harness, ProcessingGuarantee.EXACTLY_ONCE,
                   "an uncommitted batch stays invisible")
        new_driver = self.drivers(harness)
        first, second = self.items(harness, 0, 4), self.items(harness, 4, 6)
        dead = new_driver()
        dead.run(0, self.split(first))
        state = dead.prepare(1)
        dead.write(state, 1, self.split(second))  # and the driver dies here
        self.assert_shows(harness, first, "batch 1 written by its tasks, never committed")
        new_driver().run(1, self.split(second))
        self.assert_shows(harness, first + second, "batch 1 replayed by a new driver")

    # --- exactly once: a fenced driver ----------------------------------------------------

    def _fenced_commit(self, stale: _Driver, state: Any, batch: int, messages: list[Any]) -> None:
        """The fenced driver's commit: refused (any exception) or without effect (checked after)."""
        with contextlib.suppress(Exception):
            stale.commit(state, batch, messages)

    def test_a_fenced_driver_cannot_commit(self, harness: SinkHarness) -> None:
        """Driver A writes batch 1 and stalls; B takes over, commits 1 and 2; then A commits 1.

        A's late commit (here with other items, so its effect would show) must
        be refused or change nothing: what shows is what B committed.
        """
        self.needs(harness, ProcessingGuarantee.EXACTLY_ONCE, "a fenced driver changes nothing")
        new_driver = self.drivers(harness)
        first, stale_items = self.items(harness, 0, 4), self.items(harness, 100, 4)
        second, third = self.items(harness, 4, 4), self.items(harness, 8, 4)
        old = new_driver()
        old.run(0, self.split(first))
        state = old.prepare(1)
        stale_messages = old.write(state, 1, self.split(stale_items))
        new = new_driver()  # takes the job over
        new.run(1, self.split(second))
        new.run(2, self.split(third))
        self._fenced_commit(old, state, 1, stale_messages)
        self.assert_shows(harness, first + second + third, "the fenced driver's late commit")

    def test_a_fenced_drivers_late_tasks_change_nothing(self, harness: SinkHarness) -> None:
        """A's tasks for batch 1 still run after B committed batch 1; then A commits and aborts.

        Nothing A's tasks write after the takeover, nor A's commit or abort,
        may change or remove what B committed.
        """
        self.needs(harness, ProcessingGuarantee.EXACTLY_ONCE, "a fenced driver changes nothing")
        new_driver = self.drivers(harness)
        first, stale_items = self.items(harness, 0, 4), self.items(harness, 100, 4)
        second = self.items(harness, 4, 4)
        old = new_driver()
        old.run(0, self.split(first))
        state = old.prepare(1)
        new = new_driver()
        new.run(1, self.split(second))
        stale_messages = old.write(state, 1, self.split(stale_items))  # late tasks
        self.assert_shows(harness, first + second, "the fenced driver's late tasks")
        self._fenced_commit(old, state, 1, stale_messages)
        self.assert_shows(harness, first + second, "the fenced driver's late commit")
        with contextlib.suppress(Exception):
            old.abort(state, 1, stale_messages)
        self.assert_shows(harness, first + second, "the fenced driver's abort")

    # --- a real streaming job --------------------------------------------------------------

    def test_a_job_stopped_between_sink_and_checkpoint_commits_resumes_once(
        self, harness: SinkHarness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A streaming job whose driver stops after batch 1's sink commit, before its checkpoint's.

        The job suspends there (its checkpoint says batch 0); resumed, it
        replays batch 1 from its recorded offsets and goes on: each item
        shows once (at least once, for a sink that promises only that).
        """
        self.needs(harness, ProcessingGuarantee.AT_LEAST_ONCE,
                   "a job resumed after a crash keeps every item")
        guarantee = strongest(self.declared(harness))
        client = harness.client
        stream_name = f"kit-in-{uuid.uuid4().hex[:8]}"
        # One partition: each publish is one append, so it lands in one micro-batch whole.
        stream = client.get_stream(stream_name, partitions=1)
        crashed: list[int] = []
        monkeypatch.setitem(_STOPPED, stream_name, crashed)  # forgotten after the test
        _register_stop_sink(client)
        p = Pipeline.create()
        read = p.read_from(StreamSource(stream_name))
        read.write_to(harness.new_sink()).set_name("to-kit")
        # After the sink under test in the pipeline, so it commits after it: it stops
        # the driver between the sinks' commits and the checkpoint's.
        read.write_to(_StopAfterTheSinks(stream_name)).set_name("kit-stop")
        job = client.get_jet().submit(p, JobConfig(
            name=f"sink-conformance-{stream_name}", processing_guarantee=guarantee,
            snapshot_interval_millis=50, suspend_on_failure=True,
        ))
        try:
            first, second, third = (self.items(harness, 0, 10), self.items(harness, 10, 10),
                                    self.items(harness, 20, 10))
            stream.publish_all(first)
            _wait(lambda: _last_committed(job) >= 0, "micro-batch 0 to commit", job)
            stream.publish_all(second)
            _wait(lambda: job.status is JobStatus.SUSPENDED, "the job to stop at batch 1", job)
            assert crashed, "the job stopped for another reason: " \
                f"{job.get_suspension_cause()}"
            self.assert_shows(harness, first + second,
                              "stopped between the sink's and the checkpoint's commits")
            stream.publish_all(third)
            job.resume()
            expected = first + second + third
            _wait(lambda: Counter(map(_key, harness.read())) >= Counter(map(_key, expected)),
                  "the resumed job to deliver every item", job)
            time.sleep(0.3)  # a replay landing twice would show now
            self.assert_shows(harness, expected, "the job resumed after the stop")
        finally:
            with contextlib.suppress(Exception):
                if not job.is_terminal():
                    job.cancel()
            with contextlib.suppress(Exception):
                job.join(timeout=60)


class _DriverStopped(RuntimeError):
    """Raised by the kit where a driver stops between the sinks' and the checkpoint's commits."""


#: Per kit job (by its input stream's name): the batches whose commit
#: :class:`_StopAfterTheSinks` stopped, on the driver (the test's process).
_STOPPED: dict[str, list[int]] = {}
#: The name the kit's own plugin registers under, on the harness's client.
_KIT_PLUGIN = "sparkjet-testing"


class _StopAfterTheSinks(Sink):
    """The kit job's last sink: the first commit of a batch from 1 on stops the driver.

    It writes nothing. Sinks commit in the order of the pipeline and the
    checkpoint's commit comes after them all, so raising here is a driver
    stopping after the sink under test committed batch ``b``, before the
    checkpoint recorded it: the job fails (and suspends), its checkpoint
    still at ``b - 1``.
    """

    kind = "sparkjet-testing-stop"
    guarantees = ALL_GUARANTEES

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        for _ in items:
            pass
        return None

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        stopped = _STOPPED[self.name]
        if context.batch_id is not None and context.batch_id >= 1 and not stopped:
            stopped.append(context.batch_id)
            raise _DriverStopped(f"the driver stopped before batch {context.batch_id}'s "
                                 "checkpoint commit (sink conformance kit)")


class _KitPlugin:
    """The kit's plugin: registers :class:`_StopAfterTheSinks`."""

    @hookimpl
    def register_sinks(self, register: Callable[[type[Sink]], None]) -> None:
        register(_StopAfterTheSinks)


def _register_stop_sink(client: Client) -> None:
    """Register the kit's plugin on ``client``, once."""
    if _KIT_PLUGIN not in {info.name for info in client.list_plugins()}:
        client.register_plugin(_KitPlugin(), _KIT_PLUGIN)


def _shipped(value: Any) -> Any:
    """``value`` through cloudpickle, as Spark sends it to an executor or back."""
    return cloudpickle.loads(cloudpickle.dumps(value))


def _last_committed(job: Any) -> int:
    return int(job.get_metrics().get("lastCommittedBatch", -1))


def _wait(predicate: Callable[[], Any], what: str, job: Any) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    while not predicate():
        if job.is_terminal():
            job.join(timeout=10)  # raises the job's failure
            pytest.fail(f"the job ended while the kit waited for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {JOB_TIMEOUT_SECONDS:g} s waiting for {what}")
        time.sleep(0.1)


def _key(item: Any) -> Any:
    """A hashable stand-in for ``item``, equal for equal items (dicts, lists, tuples)."""
    if isinstance(item, dict):
        return ("dict", tuple(sorted((repr(k), _key(v)) for k, v in item.items())))
    if isinstance(item, list | tuple):
        return ("seq", tuple(_key(v) for v in item))
    try:
        hash(item)
    except TypeError:
        return ("repr", repr(item))
    return item


def _sample(counter: Counter[Any], n: int = 3) -> str:
    return ", ".join(repr(k) for k in list(counter)[:n])
