"""Truncated files name themselves, and an unpicklable item names its stage (issue 17, item 5).

Each test lets a real job, stream, list or map write its files to a real
store, cuts one of them short, and does what a user would do next: read the
data, resume the job, list the jobs. The error must be a named one (the file's
path, "corrupt or truncated", the store), never a bare ``UnpicklingError`` or
``JSONDecodeError``; a streaming job that meets one suspends, the path in its
cause.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.core.jobs.record import this_driver
from sparkjet.errors import JobFailedError, StoreError
from sparkjet.job import Job, JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.plugin import ALL_GUARANTEES, JobContext, Sink, Source, TaskContext
from tests.conftest import TEST_SPARK, run_pipeline, wait_until
from tests.test_plugins import Registers

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
NAMED = "is corrupt or truncated"


def truncate(path: str | Path, keep: int | None = None) -> str:
    """Cut the file at ``path`` to ``keep`` bytes (default: half of it); returns the path."""
    target = Path(path)
    data = target.read_bytes()
    assert data, f"{target} is empty already"
    target.write_bytes(data[: len(data) // 2 if keep is None else keep])
    return str(target)


def assert_named(error: BaseException | str, path: str) -> None:
    """The error names the file (its path) and says what is wrong with it."""
    text = str(error)
    assert path in text, text
    assert NAMED in text, text


def committed(job: Job) -> int:
    return int(job.get_metrics().get("lastCommittedBatch", -1))


def stream_job(client: sparkjet.Client, name: str, sink: Any = None) -> Job:
    """A streaming job from stream ``events`` to ``sink`` (list ``out``) that suspends on failure.

    What the issue promises ("nothing is lost: the job suspends") holds with
    ``suspend_on_failure``; without it a failed streaming job ends FAILED.
    """
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).set_name("events")
     .write_to(sink if sink is not None else Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(
        name=name, processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=10,
        suspend_on_failure=True,
    ))
    return job


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process
    return child.pid


def kill_driver(client: sparkjet.Client, job: Job) -> None:
    """What the store sees when the driving process dies: its lease no longer renewed."""
    runner = client.get_jet().runners.get(job.id)
    runner.done.set()
    runner.watcher.join(timeout=10)
    record = dict(client.get_jet().records.read(job.id) or {})
    record["driver"] = {**this_driver().to_json(), "pid": dead_pid()}
    client.get_jet().records.write(record)


# --- lists, maps and streams -----------------------------------------------------------


def test_a_truncated_list_record_names_its_file(client: sparkjet.Client) -> None:
    client.get_list("l").add_all([1, 2, 3])
    log = client.store.list_log("l")
    path = truncate(log.paths.record(log.sequences()[-1]))
    with pytest.raises(StoreError) as info:
        client.get_list("l").get_all()
    assert_named(info.value, path)
    assert "list 'l'" in str(info.value)


def test_a_truncated_map_record_and_writer_index_name_their_files(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    stream = client.get_stream("events", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).set_name("events")
     .map(lambda x: (x, x * 10)).set_name("pairs").write_to(Pipeline.to_map("m")))
    job = client.get_jet().submit(p, JobConfig(
        name="to-map", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=10,
        suspend_on_failure=True,
    ))
    cancel_at_end.append(job)
    stream.publish_all([1, 2])
    wait_until(lambda: client.get_map("m").size() == 2, 60, "the map to fill")
    log = client.store.map_log("m")
    index = next(Path(log.paths.writers).glob("*.json"))
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=60)

    # The writer's index, read by the next micro-batch's commit: the job suspends.
    index_path = truncate(index)
    stream.publish_all([3])
    job.resume()
    wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the job to suspend")
    assert_named(job.get_suspension_cause(), index_path)
    assert client.get_map("m").size() == 2  # nothing lost, nothing committed twice

    # A record of the map, read by everyone who reads the map.
    record = truncate(log.paths.record(log.sequences()[-1]))
    with pytest.raises(StoreError) as info:
        client.get_map("m").entry_set()
    assert_named(info.value, record)


def damage(path: Path, how: str) -> None:
    """Spoil the file at ``path``: cut short, unreadable (a folder in its place), or wrong."""
    if how == "truncated":
        truncate(path)
    elif how == "unreadable":
        path.unlink()
        path.mkdir()
    else:  # valid JSON that names no record
        path.write_text('{"seq": -3}')


@pytest.mark.usefixtures("engine_kind")
@pytest.mark.parametrize("how", ["truncated", "unreadable", "wrong"])
def test_a_map_sinks_damaged_writer_index_fails_its_job_naming_the_file(
    client: sparkjet.Client, cancel_at_end: list[Job], how: str
) -> None:
    """The writer index ``maps/<map>/writers/<job>.<stage>.json``, read by each
    micro-batch's commit: the job's failure names the file, the map and the
    stage, whether its batches run on Spark or in process, and nothing is
    committed past it."""
    stream = client.get_stream("events", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).set_name("events")
     .map(lambda x: (x, x * 10)).set_name("pairs").write_to(Pipeline.to_map("m")))
    job = client.get_jet().submit(p, JobConfig(
        name="to-map", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=10))
    cancel_at_end.append(job)
    stream.publish_all([1, 2])
    wait_until(lambda: client.get_map("m").size() == 2, 60, "the map to fill")
    index = Path(client.store.map_log("m").paths.writer_index(f"{job.id}.to-map(m)"))
    assert index.is_file()
    damage(index, how)
    stream.publish_all([3])
    with pytest.raises(JobFailedError) as info:
        job.join(timeout=60)
    text = str(info.value)
    assert str(index) in text, text
    assert text.startswith(f"stage 'to-map(m)' failed: StoreError: map 'm': writer index "
                           f"'{index}' "), text
    assert ("cannot be read" if how == "unreadable" else NAMED) in text, text
    assert "collectAndServe" not in text
    assert info.value.stage == "to-map(m)"
    assert dict(client.get_map("m").entry_set()) == {1: 10, 2: 20}  # nothing committed past it


def test_a_truncated_stream_meta_names_its_file(client: sparkjet.Client, store_url: str) -> None:
    client.get_stream("events", partitions=2).publish_all(range(4))
    meta = truncate(client.store.stream_log("events").paths.meta)
    fresh = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
    with pytest.raises(StoreError) as info:
        fresh.get_stream("events").size()
    assert_named(info.value, meta)


def test_a_truncated_stream_writer_index_names_its_file(client: sparkjet.Client) -> None:
    log = client.store.stream_log("s")
    log.create(1)
    log.append_batch("w", "b0", [[1, 2]])
    index = truncate(log.paths.writer_index("w"))
    with pytest.raises(StoreError) as info:
        log.append_batch("w", "b1", [[3]])
    assert_named(info.value, index)


# --- streaming jobs: the frozen pipeline and the checkpoint --------------------------------


def test_a_truncated_pipeline_is_named_when_another_process_takes_the_job_over(
    client: sparkjet.Client, store_url: str, cancel_at_end: list[Job]
) -> None:
    client.get_stream("events", partitions=1)
    job = stream_job(client, "frozen")
    cancel_at_end.append(job)
    job.wait_for_status(JobStatus.RUNNING, timeout=60)
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=60)
    kill_driver(client, job)
    pipeline = truncate(client.get_jet().records.layout.pipeline(job.id))
    orphan = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK).get_jet().get_job(job.id)
    assert orphan is not None
    with pytest.raises(StoreError) as info:
        orphan.resume()
    assert_named(info.value, pipeline)
    assert orphan.status is JobStatus.SUSPENDED  # nothing changed: it can be repaired


@pytest.mark.parametrize("which", ["meta", "commit"])
def test_a_truncated_checkpoint_file_suspends_the_job_naming_it(
    client: sparkjet.Client, cancel_at_end: list[Job], which: str
) -> None:
    stream = client.get_stream("events", partitions=1)
    job = stream_job(client, f"checkpoint-{which}")
    cancel_at_end.append(job)
    stream.publish_all([1, 2, 3])
    wait_until(lambda: client.get_list("out").size() == 3, 60, "batch 0 to land")
    wait_until(lambda: committed(job) >= 0, 60, "batch 0 to commit")
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=60)
    root = Path(client.get_jet().records.layout.checkpoint(job.id, "checkpoint"))
    if which == "meta":
        path = truncate(root / "meta.json")
    else:
        path = truncate(sorted((root / "commits").glob("*.json"))[-1])
    stream.publish_all([4])
    job.resume()
    wait_until(lambda: job.status is JobStatus.SUSPENDED, 60, "the job to suspend again")
    assert_named(job.get_suspension_cause(), path)
    assert sorted(client.get_list("out").get_all()) == [1, 2, 3]  # nothing lost or doubled


# --- job records: the CLI ------------------------------------------------------------------


def test_list_jobs_names_a_truncated_job_record(
    client: sparkjet.Client, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkjet.cli import main
    from tests.test_cli import write_config

    p = Pipeline.create()
    p.read_from(Pipeline.from_list("in", [1, 2])).write_to(Pipeline.to_list("copy"))
    job = run_pipeline(client, p, "copier")
    record = truncate(client.get_jet().records.layout.job_record(job.id))
    write_config(client)
    assert main(["list-jobs", "-a"]) == 0
    err = capsys.readouterr().err
    assert_named(err, record)
    elsewhere = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
    with pytest.raises(StoreError) as info:
        elsewhere.get_jet().get_job(job.id)
    assert_named(info.value, record)


def test_a_truncated_file_in_a_store_with_a_secret_never_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SJ_SECRET_DIR", "hunter2-secret")
    (tmp_path / "cwd" / "sparkjet.toml").write_text(
        f'[store]\nurl = "{tmp_path}/${{env:SJ_SECRET_DIR}}/store"\n'
    )
    client = sparkjet.connect()
    client.get_stream("events", partitions=1).publish_all([1])
    truncate(client.store.stream_log("events").paths.meta)
    with pytest.raises(StoreError) as info:
        client.store.stream_log("events").partitions  # noqa: B018 - reads meta.json
    text = str(info.value)
    assert "hunter2" not in text and "***" in text and NAMED in text
    assert "streams/events/meta.json" in text


# --- a stage emitting an item that cannot be pickled ------------------------------------


class LockingSource(Source):
    """A source plugin whose partition descriptors cannot be pickled."""

    kind = "locking"
    guarantees = ALL_GUARANTEES

    def partitions(self, context: JobContext) -> list[Any]:
        return [threading.Lock()]

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        return []  # pragma: no cover - never reached


def test_a_source_planning_unpicklable_descriptors_names_its_stage(
    client: sparkjet.Client,
) -> None:
    client.register_plugin(Registers(sources=(LockingSource,)), "locking")
    p = Pipeline.create()
    p.read_from(LockingSource("x")).write_to(Pipeline.to_list("never"))
    with pytest.raises(JobFailedError) as info:
        client.get_jet().submit(p).join(timeout=120)
    assert info.value.stage == "from-locking(x)"
    assert "item of type _thread.lock cannot be pickled" in str(info.value)


def test_a_batch_map_emitting_an_unpicklable_item_names_the_stage(
    client: sparkjet.Client,
) -> None:
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", [1, 2, 3])).map(lambda x: threading.Lock())
     .set_name("locker").write_to(Pipeline.to_list("never")))
    job = client.get_jet().submit(p, JobConfig(name="locks"))
    with pytest.raises(JobFailedError) as info:
        job.join(timeout=120)
    assert info.value.stage == "locker"
    assert "stage 'locker': item of type _thread.lock cannot be pickled" in str(info.value)
    assert client.get_list("never").get_all() == []


# The sink below runs on Spark's workers, which cannot import this module: pickle it by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


class LockingSink(Sink):
    """A sink plugin whose commit messages cannot be pickled."""

    kind = "locking"
    guarantees = ALL_GUARANTEES

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        return threading.Lock()

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        raise AssertionError("never reached")  # pragma: no cover


def test_an_unpicklable_sink_message_names_the_sink_and_its_input(
    client: sparkjet.Client,
) -> None:
    """A commit message is pickled where Spark collects it: the error names the sink stage
    it came from, and the input stage (a stream sink's messages carry that stage's items)."""
    client.register_plugin(Registers(sinks=(LockingSink,)), "locking-sink")
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", [1, 2])).map(lambda x: x).set_name("feeder")
     .write_to(LockingSink("x")).set_name("locked-out"))
    with pytest.raises(JobFailedError) as info:
        client.get_jet().submit(p).join(timeout=120)
    assert info.value.stage == "feeder"
    assert ("stage 'feeder': item of type _thread.lock cannot be pickled (in the commit "
            "message of sink stage 'locked-out')") in str(info.value)
    # A stream sink's message is the items: an item the map emitted is named the same way.
    q = Pipeline.create()
    (q.read_from(Pipeline.from_list("in", [1, 2])).map(lambda x: threading.Lock())
     .set_name("locker").write_to(Pipeline.to_stream("never")))
    with pytest.raises(JobFailedError) as info:
        client.get_jet().submit(q).join(timeout=120)
    assert info.value.stage == "locker"
    assert ("stage 'locker': item of type _thread.lock cannot be pickled (in the commit "
            "message of sink stage 'to-stream(never)')") in str(info.value)


def test_a_keyed_batch_stage_fed_an_unpicklable_item_names_the_stage(
    client: sparkjet.Client,
) -> None:
    """The keyed stage's map side shuffles what it was fed: its records name it."""
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("in", [1, 2, 3])).map(lambda x: (x, threading.Lock()))
     .set_name("locker").distinct().set_name("last").write_to(Pipeline.to_list("never")))
    job = client.get_jet().submit(p, JobConfig(name="keyed-locks"))
    with pytest.raises(JobFailedError) as info:
        job.join(timeout=120)
    assert info.value.stage == "last"
    assert "stage 'last': item of type _thread.lock cannot be pickled" in str(info.value)


def test_a_streaming_map_emitting_an_unpicklable_item_names_the_stage(
    client: sparkjet.Client, cancel_at_end: list[Job]
) -> None:
    stream = client.get_stream("events", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("events")).set_name("events").map(lambda x: threading.Lock())
     .set_name("locker").write_to(Pipeline.to_list("never")))
    job = client.get_jet().submit(p, JobConfig(name="stream-locks"))
    cancel_at_end.append(job)
    stream.publish_all([1, 2])
    with pytest.raises(JobFailedError) as info:
        job.join(timeout=120)
    assert info.value.stage == "locker"
    assert "stage 'locker': item of type _thread.lock cannot be pickled" in str(info.value)
    assert client.get_list("never").get_all() == []


def test_records_json_reads_are_named_in_unit(client: sparkjet.Client) -> None:
    """The helper itself: a JSON file cut short, read through the store."""
    store = client.store
    path = store.path("plugin", "x.json")
    store.write_bytes(path, json.dumps({"a": 1}).encode()[:4])
    with pytest.raises(StoreError) as info:
        store.read_json(path, "plugin file")
    assert_named(info.value, path)
    assert "plugin file" in str(info.value) and "JSONDecodeError" in str(info.value)
    assert f"in store {store.shown_url!r}" in str(info.value)
    with pytest.raises(FileNotFoundError):
        store.read_json(store.path("plugin", "absent.json"))


@pytest.mark.spark
def test_a_shuffle_defined_during_another_jobs_swap_does_not_take_its_name(
    client: sparkjet.Client,
) -> None:
    """Shuffles name their stage by swapping the SparkContext's serializer for a moment
    (under a lock): a shuffle defined meanwhile by another job must not pick that up."""
    from sparkjet.core.engine.spark import output
    from sparkjet.core.pipeline.fusion import decode_failure

    sc = client.spark.sparkContext
    swapped, release = threading.Event(), threading.Event()

    def other_job() -> None:
        with output._SHUFFLE_LOCK:
            original = sc._unbatched_serializer
            sc._unbatched_serializer = output.StageOutput("other-jobs-stage", original)
            swapped.set()
            release.wait(0.5)
            sc._unbatched_serializer = original

    holder = threading.Thread(target=other_job)
    holder.start()
    swapped.wait(10)
    locks = sc.parallelize([1, 2], 2).map(lambda x: (x, threading.Lock()))
    shuffled = output.partition_by(locks, 2, lambda _k: 0, None)  # waits for the lock
    release.set()
    holder.join()
    with pytest.raises(Exception, match=r"_thread\.lock") as info:
        shuffled.collect()
    assert decode_failure(str(info.value)) is None  # no stage's failure: not the other job's
    named = output.partition_by(locks, 2, lambda _k: 0, "mine")
    with pytest.raises(Exception, match="SPARKJET_STAGE_FAILURE") as info:
        named.collect()
    failure = decode_failure(str(info.value))
    assert failure is not None and failure[0] == "mine"
