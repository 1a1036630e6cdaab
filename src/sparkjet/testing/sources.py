"""The source conformance kit: what every source, built-in, contrib or third-party, must do.

:class:`SourceConformance` is a pytest class a source's author subclasses,
giving it a ``source_harness`` fixture: a :class:`SourceHarness` that makes a
fresh source reading the test's data and makes more items available to it.
The kit generates distinguishable items (``{"seq": i, "key": ..., "kit": token}``),
hands them to the harness, and drives the source through sparkjet's real
micro-batch loop (real EXACTLY_ONCE jobs through the test's client, the
store's list sink recording what was read), then checks what was read against
what it gave:

- every item is read once (:meth:`~SourceConformance.test_reads_every_item_once`);
- the same offsets read the same items, also by a copy of the source as a
  restarted driver has (``test_replay_reads_the_same_items``);
- sizes are honest: ``range_size`` of a planned range (``estimated_size`` of
  a bounded source) is None or an ``InputSize`` of non-negative ints, and its
  ``items``, when known, is what planning and reading give
  (``test_range_size_is_honest``);
- a restore finds the snapshot's partitions: ``watermark_partitions`` of
  offsets a job read up to names nothing that
  ``watermark_partitions(initial_offsets(...))`` of a fresh source does not
  (what starting a job from a snapshot compares), checked on the source's
  methods before any job (``test_restore_sees_the_snapshots_partitions``);
- a job stopped at every micro-batch boundary, suspended and resumed
  (``test_suspend_and_resume_at_every_batch_boundary``) or cancelled with an
  exported snapshot and started again from it
  (``test_cancel_and_restart_from_a_snapshot_at_every_batch_boundary``)
  reads every item exactly once;
- a real driver process killed while it holds a micro-batch it planned and
  read but did not commit (the kit's pausing list sink), and another killed
  at a random moment, each resumed by a new process: the held batch is
  replayed (the drivers report ``REPLAYING <batch>``) and every item is read
  exactly once (``test_a_killed_driver_process_resumes_exactly_once``, ``slow``);
- offsets never go backwards: each micro-batch starts where the last ended,
  and offsets shaped as numbers per partition never decrease
  (``test_offsets_never_go_backwards``);
- a declared cap holds: ``latest_offsets(context, start=...)`` never plans
  more than :attr:`SourceHarness.max_items_per_batch` items
  (``test_latest_offsets_respect_the_cap``);
- offsets the source declares as item counts (``Source.offsets_count_items``,
  the default) count them: ``source_lag`` is 0 once all was read and N over
  the range of N new items (``test_lag_is_honest``; skipped for a source that
  declares opaque offsets, which shows no lag);
- ``wait_for_data`` returns within its timeout (plus slack) and says True
  once items came
  (``test_wait_for_data_returns_in_time_and_wakes_on_new_items``);
- partitions added while a job runs are read (``test_partitions_added_while_running_are_read``);
- a trimmed or compacted range is reported, never skipped: the job fails
  naming the stage (``test_a_trimmed_range_is_reported_not_skipped``).

Each check is its own test, so a report shows which promise broke, and each
fails with a message naming the promise and what differed. A wait for items
fails within seconds (``SPARKJET_KIT_SETTLE_SECONDS``, default 3) once the
job has caught up with the source and items are still missing, never after
the whole ``SPARKJET_KIT_WAIT_SECONDS``. What a harness cannot do it
declares (``can_add_partitions = False``, ``can_trim = False``,
``max_items_per_batch = None``, ``streaming = False`` for a bounded source);
those tests are then skipped with the declaration as the reason, visible in
``pytest -rs``. A bounded (batch) source runs the first three checks: a
batch job reads every item once, planning and reading twice give the same
items, and ``estimated_size`` is honest; the others are about offsets and
micro-batches it has not got.

Set-up: ``pip install sparkjet pytest`` (``'sparkjet[spark]'`` to run the
jobs on Spark), ``pytest_plugins = ["sparkjet.testing"]`` in ``conftest.py``,
a ``client`` fixture, and the ``slow`` marker declared (docs/plugins.md,
"Proving a source", has the whole of it and what each check takes).

A complete third-party example, for a source whose data lives in the store's
streams (any source works alike: write the data where the source reads it)::

    # conftest.py
    pytest_plugins = ["sparkjet.testing"]

    @pytest.fixture
    def client(tmp_path):          # the kit runs its jobs through this client
        return sparkjet.connect(store={"url": str(tmp_path / "store")},
                                engine={"driver_only": True})  # no JVM; omit to use Spark

    # test_my_source.py
    import uuid
    import pytest
    from sparkjet.testing import SourceConformance, SourceHarness
    from my_plugin import MySource

    class MyHarness(SourceHarness):
        max_items_per_batch = 10   # what MySource(max_per_batch=10) promises
        can_trim = True

        def __init__(self) -> None:
            self.name = f"data-{uuid.uuid4().hex[:8]}"

        def new_source(self, *, capped=True):
            return MySource(self.name, max_per_batch=10 if capped else None)

        def add(self, client, items):
            client.get_stream(self.name, partitions=2).publish_all(items)

        def trim(self, client):
            log = client.store.stream_log(self.name)
            for p, end in enumerate(log.end_offsets()):
                log.trim(p, end)

    class TestMySource(SourceConformance):
        @pytest.fixture
        def source_harness(self):
            return MyHarness()

The harness is pickled with cloudpickle for the driver-kill test, which runs
``python -m sparkjet.testing.source_driver`` with the test's ``sys.path``: keep
it to plain attributes (names, URLs, options), never a client or a connection.

This module holds the suite, :class:`SourceConformance`; its checks of jobs
stopped and drivers killed are its base, in
:mod:`sparkjet.testing.source_restarts`; the harness base class,
:func:`kit_items` and the machinery the suite drives live in
:mod:`sparkjet.testing.source_harness`, and are importable from here too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from sparkjet import Client
from sparkjet.job import JobStatus
from sparkjet.plugin import Source, latest_offsets, source_lag
from sparkjet.testing.source_harness import (
    STAGE,
    WAIT_SECONDS,
    SourceHarness,
    _Run,
    _skip_unless,
    _wait,
    assert_exactly_once,
    check_forward,
    check_size,
    counts_items,
    describe_multiset,
    kit_items,
    offsets_hint,
)
from sparkjet.testing.source_restarts import StopAndResumeChecks

__all__ = [
    "SourceConformance",
    "SourceHarness",
    "kit_items",
]


class SourceConformance(StopAndResumeChecks):
    """What every source must do; subclass it with a ``source_harness`` fixture.

    The kit also uses a ``client`` fixture (a :class:`sparkjet.Client` on a
    fresh store, as sparkjet's own tests have): give one in your conftest.
    See the module's docstring for a complete example.
    """

    @pytest.fixture
    def source_harness(self) -> SourceHarness:
        """The harness of the source under test: override this in the subclass."""
        raise NotImplementedError("give the SourceConformance subclass a 'source_harness' fixture")

    @pytest.fixture
    def run(self, client: Client, source_harness: SourceHarness) -> Iterator[_Run]:
        """The test's jobs and reads; every job still running is cancelled at teardown."""
        if client.runs_on_spark:
            client.spark  # noqa: B018 - started here, so no wait of the kit counts its start
        run = _Run(client, source_harness)
        yield run
        run.stop_all()

    # --- checks every source has ---------------------------------------------------

    def test_reads_every_item_once(self, run: _Run, source_harness: SourceHarness) -> None:
        """Items given before and while a job runs are each read once."""
        if not source_harness.streaming:
            run.add(self.ROUND)
            run.add(self.ROUND)
            job = run.submit(source_harness.new_source())
            job.join(timeout=WAIT_SECONDS)
            assert_exactly_once(run.seen(), range(run.given), "a batch job")
            return
        run.add(self.ROUND)
        job = run.submit(source_harness.new_source())
        run.wait_read(job, run.given, "the first round")
        run.add(self.ROUND)
        run.add(self.ROUND)
        seen = run.wait_read(job, run.given, "rounds given while the job ran")
        assert_exactly_once(seen, range(run.given), "a running job")

    def test_replay_reads_the_same_items(self, run: _Run, source_harness: SourceHarness) -> None:
        """The same offsets read the same items, also by a pickled copy of the source."""
        if not source_harness.streaming:
            run.add(self.ROUND)
            source = source_harness.new_source()
            first = run.read_batch(source)
            again = run.read_batch(cloudpickle.loads(cloudpickle.dumps(source)))
            if first != again:
                pytest.fail(f"the same partitions must read the same items: partitions() and "
                            f"read() gave other items the second time: "
                            f"{describe_multiset(again, range(run.given))}")
            assert_exactly_once(first, range(run.given), "a batch read")
            return
        given = run.add(self.ROUND)
        source = source_harness.new_source(capped=False)
        ctx = run.context(source)
        start = source.initial_offsets(ctx)
        end, first = run.drain(source, start, len(given))
        assert_exactly_once(first, given, "reading the first round")
        # Every range again, each by a fresh copy of the source (a restarted driver's).
        copy = cloudpickle.loads(cloudpickle.dumps(source_harness.new_source(capped=False)))
        again = run.read_range(copy, start, end, run.context(copy))
        if again != first:
            pytest.fail(f"the same offsets must read the same items: {start!r} to {end!r} read "
                        f"other items the second time, by a fresh copy of the source (a "
                        f"restarted driver's): {describe_multiset(again, given)}")
        same = run.read_range(source, start, end, ctx)
        if same != first:
            pytest.fail(f"the same offsets must read the same items: {start!r} to {end!r} read "
                        f"other items the second time by the same source: "
                        f"{describe_multiset(same, given)}")

    def test_range_size_is_honest(self, run: _Run, source_harness: SourceHarness) -> None:
        """``range_size`` (``estimated_size``) is None or an InputSize whose items are right."""
        if not source_harness.streaming:
            run.add(self.ROUND)
            source = source_harness.new_source()
            check_size(source.estimated_size(run.context(source)), len(run.read_batch(source)),
                       "estimated_size")
            return
        given = run.add(self.ROUND)
        source = source_harness.new_source(capped=False)
        ctx = run.context(source)
        start = source.initial_offsets(ctx)
        sizes: list[Any] = []

        # The default range_size counts what the offsets count: tell its author so.
        hint = (offsets_hint(source) if counts_items(source)
                and type(source).range_size is Source.range_size else "")
        countable: list[bool] = []

        def honest(begin: Any, end: Any, seqs: list[int]) -> None:
            sizes.append(source.range_size(begin, end, ctx))
            countable.append(source_lag(begin, end) is not None)
            check_size(sizes[-1], len(seqs), f"range_size({begin!r}, {end!r})", hint)

        end, _ = run.drain(source, start, len(given), honest)
        check_size(source.range_size(end, end, ctx), 0, f"range_size({end!r}, {end!r})")
        more = run.add(7)
        _wait(lambda: latest_offsets(source, ctx, end) != end, "the new items")
        run.drain(source, end, len(more), honest)
        if counts_items(source) and any(countable) and not any(
                size is not None and size.items is not None for size in sizes):
            pytest.fail(f"{type(source).__qualname__} declares that its offsets count items "
                        f"(offsets_count_items = True, the default) and they are numbers per "
                        f"partition, but range_size never knew how many items a range holds "
                        f"({sizes}): return them, or declare offsets_count_items = False")

    # --- streaming checks ---------------------------------------------------------------

    def test_restore_sees_the_snapshots_partitions(
        self, run: _Run, source_harness: SourceHarness
    ) -> None:
        """A restore finds every partition of a snapshot's offsets in ``initial_offsets`` now.

        Starting a job from a snapshot compares ``watermark_partitions`` of the
        snapshot's offsets with ``watermark_partitions(initial_offsets(...))``
        of the source now; a partition of the first missing from the second
        counts as gone and refuses the job. Checked on the source's methods,
        before any job: offsets a job would have read up to, and a fresh
        source's initial offsets. Also: ``watermark_partition`` of every
        planned descriptor names one of ``watermark_partitions``.
        """
        self._streaming_only(source_harness)
        given = run.add(self.ROUND)
        source = source_harness.new_source(capped=False)
        ctx = run.context(source)
        start = source.initial_offsets(ctx)
        end, _ = run.drain(source, start, len(given))
        had = list(source.watermark_partitions(end))
        for name in had:
            if not isinstance(name, str):
                pytest.fail(f"watermark_partitions({end!r}) named {name!r}, not a str: "
                            f"partitions are named by strings")
        for descriptor in source.plan_range(start, end, ctx):
            part = source.watermark_partition(descriptor)
            if part not in had:
                pytest.fail(f"watermark_partition({descriptor!r}) is {part!r}, which "
                            f"watermark_partitions({end!r}) does not name ({had}): the two must "
                            f"agree")
        fresh = source_harness.new_source(capped=False)
        initial = fresh.initial_offsets(run.context(fresh))
        has = list(fresh.watermark_partitions(initial))
        gone = [p for p in had if p not in has]
        if gone:
            pytest.fail(
                f"a job restored from a snapshot at offsets {end!r} would be refused: "
                f"watermark_partitions of those offsets names {had}, but "
                f"watermark_partitions(initial_offsets()) of a fresh source, of {initial!r}, "
                f"names {has}, so partition(s) {gone} would count as gone. A restore compares "
                f"the two: return every partition the source has now from initial_offsets, "
                f"each at its first offset (e.g. {{name: 0 for name in partitions}}, not {{}}), "
                f"or let watermark_partitions name the source's partitions whatever the "
                f"offsets hold")

    def test_offsets_never_go_backwards(self, run: _Run, source_harness: SourceHarness) -> None:
        """Each micro-batch starts where the last ended; numeric offsets never decrease."""
        self._streaming_only(source_harness)
        run.add(self.ROUND)
        # Directly: each next plan starts where the last ended (the kit passes it on).
        source = source_harness.new_source()
        ctx = run.context(source)
        start = source.initial_offsets(ctx)
        _, direct = run.drain(source, start, self.ROUND,
                              lambda s, e, _: check_forward(s, e, "latest_offsets"))
        assert_exactly_once(direct, range(self.ROUND), "planning step by step")
        # In a job, across a suspend and new items: the plans in its checkpoint.
        job = run.submit(source_harness.new_source())
        run.wait_read(job, run.given, "the first round")
        job.suspend()
        job.wait_for_status(JobStatus.SUSPENDED, timeout=WAIT_SECONDS)
        run.add(self.ROUND)
        job.resume()
        seen = run.wait_read(job, run.given, "after a suspend")
        assert_exactly_once(seen, range(run.given), "the job")
        plans = job.get_planned_batches()
        assert plans, "the job's checkpoint holds no plan"
        for before, after in itertools.pairwise(plans):
            where = f"micro-batch {after.batch}"
            check_forward(before.starts[STAGE], before.ends[STAGE], f"micro-batch {before.batch}")
            if after.batch == before.batch + 1:
                assert after.starts[STAGE] == before.ends[STAGE], (
                    f"{where} starts at {after.starts[STAGE]!r}, not where micro-batch "
                    f"{before.batch} ended ({before.ends[STAGE]!r})")
            check_forward(before.ends[STAGE], after.starts[STAGE], where)

    def test_latest_offsets_respect_the_cap(self, run: _Run, source_harness: SourceHarness) -> None:
        """No micro-batch of the capped source plans more than the declared cap."""
        self._streaming_only(source_harness)
        cap = source_harness.max_items_per_batch
        _skip_unless(source_harness, "cap", cap is not None, "no cap (max_items_per_batch = None)")
        assert cap is not None
        given = run.add(max(self.ROUND, 3 * cap))
        sizes: list[int] = []

        def capped(start: Any, end: Any, seqs: list[int]) -> None:
            sizes.append(len(seqs))
            if len(seqs) > cap:
                pytest.fail(f"latest_offsets(start={start!r}) planned {len(seqs)} items, "
                            f"over the declared cap of {cap}")

        source = source_harness.new_source(capped=True)
        _, read = run.drain(source, source.initial_offsets(run.context(source)), len(given),
                            capped)
        assert_exactly_once(read, given, f"micro-batches of at most {cap}")
        if len(sizes) < len(given) / cap:
            pytest.fail(f"{len(given)} items in {len(sizes)} micro-batches of at most {cap}")

    def test_lag_is_honest(self, run: _Run, source_harness: SourceHarness) -> None:
        """Offsets that count items count them: ``source_lag`` over N new items' range says N.

        A source that declares opaque offsets (``offsets_count_items = False``)
        shows no lag, and the check is skipped with that declaration.
        """
        self._streaming_only(source_harness)
        source = source_harness.new_source(capped=False)
        if not counts_items(source):
            pytest.skip(f"{type(source).__qualname__} declares opaque offsets "
                        f"(offsets_count_items = False): a job shows no lag for it")
        first = run.add(self.ROUND)
        ctx = run.context(source)
        start, _ = run.drain(source, source.initial_offsets(ctx), len(first))
        latest = latest_offsets(source, ctx, start)
        caught_up = source_lag(start, latest)
        if caught_up is None:
            pytest.skip(f"the offsets of {type(source).__qualname__} ({latest!r}) are not "
                        f"numbers per partition: no lag is counted from them")
        if caught_up != 0:
            pytest.fail(f"lag counts the items not read yet: source_lag({start!r}, {latest!r}) "
                        f"is {caught_up} after every item was read, not 0"
                        f"{offsets_hint(source)}")
        new = run.add(17)
        end, seqs = run.drain(source, start, len(new))
        assert_exactly_once(seqs, new, "reading the 17 new items")
        lag = source_lag(start, end)
        if lag != len(new):
            pytest.fail(f"lag counts the items not read yet: source_lag({start!r}, {end!r}) says "
                        f"{lag}, but planning and reading from {start!r} to {end!r} gave the "
                        f"{len(new)} new items{offsets_hint(source)}")

    def test_wait_for_data_returns_in_time_and_wakes_on_new_items(
        self, run: _Run, source_harness: SourceHarness
    ) -> None:
        """``wait_for_data`` returns within its timeout (plus slack), and True once items came."""
        self._streaming_only(source_harness)
        first = run.add(self.ROUND)
        source = source_harness.new_source(capped=False)
        ctx = run.context(source)
        start, _ = run.drain(source, source.initial_offsets(ctx), len(first))
        at = latest_offsets(source, ctx, start)
        slack = 2.0  # a loaded machine's scheduling, not the source's doing
        for timeout in (0.0, 0.2):
            began = time.monotonic()
            said = source.wait_for_data(at, timeout, ctx)
            took = time.monotonic() - began
            assert isinstance(said, bool), f"wait_for_data returned {said!r}, not a bool"
            assert took < timeout + slack, (
                f"wait_for_data(timeout={timeout}) took {took:.2f} s with nothing new")
        run.add(3)
        began = time.monotonic()
        said = source.wait_for_data(at, 1.0, ctx)
        took = time.monotonic() - began
        assert said is True, "wait_for_data said no data may be there after items were added"
        assert took < 1.0 + slack, f"wait_for_data(timeout=1.0) took {took:.2f} s"

    def test_partitions_added_while_running_are_read(
        self, run: _Run, source_harness: SourceHarness
    ) -> None:
        """Items in partitions added while a job runs are read, each once."""
        self._streaming_only(source_harness)
        _skip_unless(source_harness, "partitions", source_harness.can_add_partitions,
                     "it cannot add partitions (can_add_partitions = False)")
        run.add(self.ROUND)
        job = run.submit(source_harness.new_source())
        run.wait_read(job, run.given, "before partitions were added")
        source_harness.add_partitions(run.client)
        run.add(self.ROUND)
        seen = run.wait_read(job, run.given, "after partitions were added")
        assert_exactly_once(seen, range(run.given), "a job whose data grew partitions")

    def test_a_trimmed_range_is_reported_not_skipped(
        self, run: _Run, source_harness: SourceHarness
    ) -> None:
        """A job whose next range was trimmed fails naming its stage; it never jumps ahead."""
        self._streaming_only(source_harness)
        _skip_unless(source_harness, "trim", source_harness.can_trim,
                     "it cannot trim (can_trim = False)")
        read = run.add(self.ROUND)
        job = run.submit(source_harness.new_source(capped=False))
        run.wait_read(job, run.given, "before the trim")
        job.suspend()
        job.wait_for_status(JobStatus.SUSPENDED, timeout=WAIT_SECONDS)
        trimmed = run.add(self.ROUND)
        kept = run.add(self.ROUND)
        source_harness.trim(run.client)
        job.resume()
        settled = run.settled(job, lambda: len(run.seen()) <= len(read))
        stuck: list[str] = []

        def moved() -> bool:
            if job.is_terminal() or len(run.seen()) > len(read):
                return True
            where = settled()
            if where is not None:
                stuck.append(where)
            return bool(stuck)

        _wait(moved, "the job to fail or read on", 60)
        if stuck:
            pytest.fail(f"a trimmed range must be reported, never skipped: the job neither "
                        f"failed nor read anything given after the trim, and caught up with the "
                        f"source ({stuck[0]})")
        time.sleep(1.0)
        seen = set(run.seen())
        jumped = seen & set(kept)
        if not job.is_terminal() and not jumped and set(trimmed) <= seen:
            return  # the trim left the range readable: nothing was lost
        assert not (jumped and not set(trimmed) <= seen), (
            f"the job skipped the trimmed range silently: it read {len(jumped)} items given "
            f"after it, and {len(seen & set(trimmed))} of the {len(trimmed)} trimmed ones")
        assert job.status is JobStatus.FAILED, f"the job is {job.status.name}, not FAILED"
        failure = job.get_failure() or ""
        assert STAGE in failure, f"the failure does not name the stage {STAGE!r}: {failure}"
