"""State kept loaded in worker processes: out of the collector's way, owned by its job, bounded.

The first part drives :class:`StateCache` directly in this process; the second
runs real streaming jobs and asks PySpark's Python workers, with tasks of
their own, what they hold.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.core.pipeline.window_fold import Frames
from sparkjet.core.state import cache as state_cache
from sparkjet.core.state.cache import CacheOwner, StateCache, estimate_bytes
from sparkjet.core.state.files import RangeState
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords
from sparkjet.errors import ConfigError
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource, WindowDefinition
from tests.conftest import cancel_job, wait_until

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Tests here freeze this process's objects (as a state put does); thaw them after."""
    yield
    gc.unfreeze()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "store"))


def record(store: Store, job_id: str, status: str) -> None:
    JobRecords(store).write({"id": job_id, "status": status})


def window_state(keys: int, tag: str = "") -> RangeState:
    """A windowed stage's state: per key, its frames (container objects the collector walks)."""
    return RangeState(
        {f"{tag}user-{i}": (f"{tag}user-{i}", Frames(1000, {3_600_000: [i, 1]}))
         for i in range(keys)},
        {}, [])


class Held:
    """A value a weak reference can follow, holding itself (a cycle)."""

    def __init__(self) -> None:
        self.me = self


# --- the cache in this process ----------------------------------------------------------


def test_a_put_state_is_frozen_out_of_the_collectors_walk(store: Store) -> None:
    cache = StateCache()
    state = window_state(20_000)
    some_frames = next(iter(state.values.values()))[1].frames
    cache.put(("root", "per-key", 0, 64), 3, state, CacheOwner(store, "j", 1 << 30))
    walked = gc.get_objects()
    assert gc.get_freeze_count() >= 3 * 20_000
    assert not any(o is some_frames for o in walked)  # frozen: a collection skips it
    taken = cache.take(("root", "per-key", 0, 64))
    assert taken is not None and taken.batch == 3 and taken.state is state
    assert cache.take(("root", "per-key", 0, 64)) is None  # taken out while a task works


def test_state_files_unpickle_with_the_collector_paused_and_restore_it() -> None:
    import cloudpickle

    from sparkjet.core.state import files as state_files

    seen = _COLLECTOR_SEEN
    seen.clear()

    class Probe:
        def __reduce__(self) -> Any:
            return (_collector_state, ())

    raw = cloudpickle.dumps({"values": {"k": Probe()}})
    assert state_files._loads_paused(raw)["values"]["k"] is None
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        state_files._loads_paused(raw)
        assert not gc.isenabled()  # a caller's pause is left as it was
    finally:
        gc.enable()


#: Whether the collector ran, as seen while unpickling.
_COLLECTOR_SEEN: list[bool] = []


def _collector_state() -> None:
    _COLLECTOR_SEEN.append(gc.isenabled())


def test_the_estimate_follows_what_the_state_takes() -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        state = window_state(50_000)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.7 * taken <= estimate_bytes(state) <= 1.4 * taken
    ints = RangeState({i * 7919: i for i in range(50_000)}, {}, [])
    assert estimate_bytes(ints) < estimate_bytes(state) / 3


def test_the_estimate_counts_the_timer_index() -> None:
    """A windowed range files every key by when it is next due: a set slot per key."""
    import tracemalloc

    from sparkjet.core.pipeline.timers import DueIndex

    state = window_state(50_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = DueIndex("tumbling")
        for i, key in enumerate(state.values):
            index.add(key, 3_600_000 * (1 + i % 3))
        index.changes()  # as after a fold: the recent keys are written out
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    timed = state._replace(timers={"window": index})
    assert 0.7 * taken <= estimate_bytes(timed) - estimate_bytes(state) <= 1.4 * taken


def test_a_jobs_ranges_stay_within_its_budget_least_recently_used_first(store: Store) -> None:
    cache = StateCache()
    one = estimate_bytes(window_state(2_000))
    owner = CacheOwner(store, "j", int(2.5 * one))
    other = CacheOwner(store, "k", 1 << 30)
    cache.put(("r", "s", 0, 1), 1, window_state(2_000, "a"), owner)
    cache.put(("r", "s", 1, 2), 1, window_state(2_000, "b"), owner)
    cache.put(("r2", "s", 0, 1), 1, window_state(2_000, "x"), other)
    used = cache.take(("r", "s", 0, 1))  # a task runs range [0, 1): now the most recent
    assert used is not None
    cache.put(("r", "s", 0, 1), 2, used.state, owner)
    cache.put(("r", "s", 2, 3), 2, window_state(2_000, "c"), owner)
    assert cache.jobs()["j"][0] == 2 and cache.jobs()["j"][1] <= owner.budget
    assert cache.take(("r", "s", 1, 2)) is None  # the least recently used went
    assert cache.take(("r", "s", 0, 1)) is not None
    assert cache.take(("r2", "s", 0, 1)) is not None  # another job's budget is its own


def test_a_range_bigger_than_the_budget_or_a_zero_budget_keeps_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The process-wide cache's sweeper (another test's job) may freeze on its own
    # thread meanwhile: count only the freezes these puts make, on this thread.
    froze: list[int] = []
    real = state_cache.gc

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def freeze(self) -> None:
            if threading.get_ident() == me:
                froze.append(1)
            real.freeze()

    me = threading.get_ident()
    monkeypatch.setattr(state_cache, "gc", Counting())
    cache = StateCache()
    state = window_state(1_000)
    cache.put(("r", "s", 0, 1), 1, state, CacheOwner(store, "j", estimate_bytes(state) // 2))
    cache.put(("r", "s", 1, 2), 1, state, CacheOwner(store, "j", 0))
    assert cache.jobs() == {}
    assert froze == []  # nothing kept: no collection, nothing frozen


def test_a_sweep_drops_the_state_of_jobs_that_no_longer_run(store: Store) -> None:
    cache = StateCache(sweep_seconds=3600)
    for job, status in [("running", "RUNNING"), ("starting", "STARTING"),
                        ("suspended", "SUSPENDED"), ("completed", "COMPLETED"),
                        ("failed", "FAILED"), ("exporting", "SUSPENDED_EXPORTING_SNAPSHOT")]:
        record(store, job, status)
        cache.put(("r", job, 0, 1), 1, window_state(10, job), CacheOwner(store, job, 1 << 30))
    cache.put(("r", "gone", 0, 1), 1, window_state(10), CacheOwner(store, "gone", 1 << 30))
    store.write_bytes(store.layout.job_record("away"), b"{not json")  # cannot be read
    cache.put(("r", "away", 0, 1), 1, window_state(10), CacheOwner(store, "away", 1 << 30))
    assert sorted(cache.sweep()) == ["completed", "exporting", "failed", "gone", "suspended"]
    assert sorted(cache.jobs()) == ["away", "running", "starting"]


def test_dropped_state_is_freed_cycles_too(store: Store) -> None:
    cache = StateCache(sweep_seconds=3600)
    held = Held()
    ref = weakref.ref(held)
    cache.put(("r", "s", 0, 1), 1, RangeState({"k": held}, {}, []),
              CacheOwner(store, "j", 1 << 30))
    del held
    gc.collect()
    assert ref() is not None  # kept
    assert cache.drop_job("j") == 1
    assert ref() is None  # frozen and in a cycle, and still freed


class _Records(logging.Handler):
    """Keeps what a logger emits, whatever its parents' handlers do."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _drop_of_j(record: logging.LogRecord) -> bool:
    """Whether ``record`` is a sweeper's line about dropping job ``j``'s state."""
    message = record.getMessage()
    return "of job j:" in message and "no longer runs" in message


def test_the_sweeper_drops_a_stopped_jobs_state_with_no_task_running(store: Store) -> None:
    logger = logging.getLogger("sparkjet.core.state.cache")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        cache = StateCache(sweep_seconds=0.05)
        record(store, "j", "RUNNING")
        cache.put(("r", "s", 0, 1), 1, window_state(100), CacheOwner(store, "j", 1 << 30))
        time.sleep(0.3)
        assert "j" in cache.jobs()
        record(store, "j", "FAILED")
        wait_until(lambda: cache.jobs() == {}, 10, "the sweeper to drop the job's state")
        # Housekeeping on a background thread stays below INFO: a CLI command
        # running in the same process would print it on its stderr (CI caught one).
        wait_until(lambda: any(_drop_of_j(r) for r in handler.records),
                   10, "the sweeper to log the drop")  # it logs once the entries are gone
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    # Only this job's: the process-wide cache's sweeper drops other tests' jobs meanwhile.
    drops = [r for r in handler.records if _drop_of_j(r)]
    assert [r.levelno for r in drops] == [logging.DEBUG]


def test_the_budget_is_checked_in_job_config() -> None:
    assert JobConfig().state_cache_bytes == 1 << 30
    assert JobConfig(state_cache_bytes=0).state_cache_bytes == 0
    for bad in (-1, 1.5, "1GiB", True):
        with pytest.raises(ConfigError, match="state_cache_bytes"):
            JobConfig(state_cache_bytes=bad)


# --- real jobs and PySpark's workers ------------------------------------------------------


def probe_workers(client: sparkjet.Client, tasks: int = 2) -> list[dict[str, Any]]:
    """What the Python workers that run ``tasks`` tasks hold: one dict per task."""

    def probe(_: Iterator[int]) -> Iterator[dict[str, Any]]:
        import gc as worker_gc
        import os

        from sparkjet.core.state.cache import CACHE

        yield {"pid": os.getpid(), "jobs": CACHE.jobs(), "walked": len(worker_gc.get_objects()),
               "frozen": worker_gc.get_freeze_count()}

    if client.config.spark_remote:  # Spark Connect: no RDDs, the same probe in mapInArrow
        import pickle

        def arrow_probe(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            for _ in batches:
                pass
            rows = [pickle.dumps(row) for row in probe(iter(()))]
            yield pa.RecordBatch.from_pydict({"row": rows})

        table = (client.spark.range(0, tasks, 1, tasks)
                 .mapInArrow(arrow_probe, "row binary").toArrow())
        return [pickle.loads(blob) for blob in table.column("row").to_pylist()]
    sc = client.spark.sparkContext
    return list(sc.parallelize(range(tasks), tasks).mapPartitions(probe).collect())


def windowed_job(client: sparkjet.Client, name: str, keys: int, **config: Any) -> Job:
    """A 1-hour tumbling window counting per key, fed ``keys`` distinct keys, all held."""
    stream = client.get_stream(name, partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource(name)).with_timestamps(lambda e: 1, 0)
     .window(WindowDefinition.tumbling(3_600_000)).group_by(lambda e: e)
     .aggregate(counting()).set_name("per-key").write_to(Pipeline.to_list(f"{name}-out")))
    # These tests are about the state Spark's workers keep: every batch runs there.
    job = client.get_jet().submit(p, JobConfig(
        name=name, processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100,
        adaptive_micro_batches=False, **config))
    for lo in range(0, keys, 50_000):
        stream.publish_all([f"user-{i}" for i in range(lo, min(keys, lo + 50_000))])
    wait_until(lambda: job.get_metrics()["stages"].get("per-key", {}).get("snapshotKeys") == keys,
               240, f"{keys} keys held by {name}")
    return job


@pytest.mark.slow
@pytest.mark.spark
def test_a_job_holding_many_keys_does_not_slow_another_jobs_tasks(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    """100k keys of window frames in the workers: the collector never walks them.

    PySpark's daemon runs ``gc.collect()`` in a worker after every task, any
    job's; it walked all the held state, so every task in the application
    slowed with it (the issue: a trivial job's 0.43 s became 7.3 s at 1M
    keys). A collection's work is the objects it walks: here the objects the
    held state is made of are frozen, out of every collection's walk (before,
    a worker holding these keys walked 152k objects, 32k with nothing held).
    """
    keys = 100_000
    nothing_held = max(w["walked"] for w in probe_workers(client, 4))
    job = windowed_job(client, "held", keys)
    cancel_at_end.append(job)
    holding = wait_until(
        lambda: [w for w in probe_workers(client, 4) if job.id in w["jobs"]], 60,
        "a worker to report the job's state")
    for worker in holding:
        assert worker["frozen"] >= keys  # half the keys at least, three containers each
        assert worker["walked"] <= nothing_held + 5_000, (nothing_held, worker)


def wait_dropped(client: sparkjet.Client, job: Job, held: set[int], ended_ok: bool) -> None:
    """Wait until every worker in ``held`` is seen holding nothing of ``job``.

    ``ended_ok``: a worker Spark ended meanwhile (a task the cancel
    interrupted) counts too: its state went with it.
    """
    seen: set[int] = set()
    last: list[dict[str, Any]] = []

    def gone_everywhere() -> bool:
        last[:] = probe_workers(client)
        for worker in last:
            if job.id in worker["jobs"]:
                return False
            seen.add(worker["pid"])
        return all(pid in seen or (ended_ok and not Path(f"/proc/{pid}").exists())
                   for pid in held)

    try:
        wait_until(gone_everywhere, 60, "the workers to drop the job's state")
    except pytest.fail.Exception:
        pytest.fail(f"workers {sorted(held)} held job {job.id}; now: {last}")


@pytest.mark.spark  # the workers of Spark keep state loaded
def test_a_suspended_or_cancelled_jobs_state_leaves_the_workers(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    """No task of the job runs in the workers after it stops: their sweepers drop its state."""
    job = windowed_job(client, "leaving", 5_000)
    cancel_at_end.append(job)

    def holders() -> set[int]:
        return wait_until(
            lambda: {w["pid"] for w in probe_workers(client) if job.id in w["jobs"]}, 60,
            "a worker to report the job's state")

    held = holders()
    job.suspend()
    wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the job suspended")
    wait_dropped(client, job, held, ended_ok=False)  # a suspend interrupts no task
    job.resume()
    client.get_stream("leaving").publish_all(["user-1", "user-5000"])
    wait_until(lambda: job.get_metrics()["stages"].get("per-key", {}).get("snapshotKeys")
               == 5_001, 60, "the resumed job to count on from its checkpoint")
    held = holders()
    cancel_job(job)
    wait_dropped(client, job, held, ended_ok=True)


@pytest.mark.spark
def test_a_budget_smaller_than_the_state_still_gives_exact_results(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    """Ranges dropped for the budget reload from the checkpoint: counts stay exact."""
    budget = 150_000  # one range of the two (1,500 keys, about 117 kB each) fits, not both
    stream = client.get_stream("budget", partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource("budget")).group_by(lambda e: e).aggregate(counting())
     .set_name("per-key").write_to(Pipeline.to_map("budget-counts")))
    job = client.get_jet().submit(p, JobConfig(
        name="budget", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=50,
        state_cache_bytes=budget, key_groups=8, adaptive_micro_batches=False))
    cancel_at_end.append(job)
    expected: Counter[str] = Counter()
    counts = client.get_map("budget-counts")
    for round_ in range(6):
        items = [f"k{(round_ * 37 + i) % 3_000}" for i in range(1_500)]
        stream.publish_all(items)
        expected.update(items)
        wait_until(lambda: dict(counts.entry_set()) == dict(expected), 60,
                   f"round {round_} counted")
    workers = probe_workers(client, 4)
    assert all(w["jobs"].get(job.id, (0, 0))[1] <= budget for w in workers), workers
    assert all(w["jobs"].get(job.id, (0, 0))[0] <= 1 for w in workers), workers


def test_the_budget_from_the_command_line_and_an_apply_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkjet.cli import main
    from sparkjet.cli.apply import parse
    from sparkjet.cli.commands import job_config, parse_size
    from sparkjet.cli.errors import CliError

    assert [parse_size(t) for t in ("0", "1000", "512MiB", "2GB", "1.5KiB")] == [
        0, 1000, 512 << 20, 2 * 10**9, 1536]
    assert job_config("j", [], state_cache_bytes=4 << 30).state_cache_bytes == 4 << 30
    assert main(["submit", "--state-cache", "lots", "p.py"]) == 2
    assert "argument --state-cache: expected a size such as 512MiB" in capsys.readouterr().err
    jobs = tmp_path / "jobs.toml"
    (tmp_path / "p.py").write_text("pipeline = None\n")
    jobs.write_text('[[job]]\nname = "a"\npipeline = "p.py"\nstate_cache_bytes = "4GiB"\n'
                    '[[job]]\nname = "b"\npipeline = "p.py"\nstate_cache_bytes = 1000\n'
                    '[[job]]\nname = "c"\npipeline = "p.py"\n')
    specs, _ = parse(jobs)
    assert [s.state_cache_bytes for s in specs] == [4 << 30, 1000, None]
    jobs.write_text('[[job]]\nname = "a"\npipeline = "p.py"\nstate_cache_bytes = -5\n')
    with pytest.raises(CliError, match=r"jobs.toml: \[\[job\]\] 'a': state_cache_bytes: "
                                       r"expected bytes \(an int, 0 or more\)"):
        parse(jobs)
