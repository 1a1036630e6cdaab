"""Streaming jobs in-process: stateful stages against oracles, guarantees, lifecycle."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.core.microbatch import loop as streaming_module
from sparkjet.errors import (
    ConfigError,
    JobCancelledError,
    JobStateError,
    PipelineDefinitionError,
    ProcessingGuaranteeError,
    StoreError,
)
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.plugin import ALL_GUARANTEES, StatefulTransform, hookimpl
from tests.conftest import TEST_SPARK
from tests.conftest import wait_until as wait_for

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE




def start(client, pipeline, name, guarantee=EXACTLY_ONCE, **config):  # type: ignore[no-untyped-def]
    config.setdefault("snapshot_interval_millis", 100)
    job = client.get_jet().submit(
        pipeline, JobConfig(name=name, processing_guarantee=guarantee, **config)
    )
    wait_for(lambda: job.status is JobStatus.RUNNING, what=f"{name} to run")
    return job


def stop(job) -> None:  # type: ignore[no-untyped-def]
    if not job.is_terminal():
        job.cancel()
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)


@pytest.mark.usefixtures("engine_kind")
def test_rolling_aggregate_matches_oracle_across_batches(client) -> None:  # type: ignore[no-untyped-def]
    stream = client.get_stream("events", partitions=2)
    p = Pipeline.create()
    counts = (p.read_from(StreamSource("events")).group_by(lambda e: e["k"])
              .aggregate(counting()).set_name("per-key"))
    counts.write_to(Pipeline.to_map("counts"))
    counts.write_to(Pipeline.to_list("updates"))
    job = start(client, p, "rolling")
    try:
        keys: list[Any] = [1, 1.0, True, "a", (1, "b"), None, 2]
        events = [{"k": keys[i % len(keys)]} for i in range(700)]
        oracle: dict[Any, int] = {}
        for chunk in (events[:300], events[300:650], events[650:]):
            stream.publish_all(chunk)
            for e in chunk:
                oracle[e["k"]] = oracle.get(e["k"], 0) + 1
            wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle,
                     what="the map to match the oracle")
        assert oracle[1] == 300  # 1, 1.0 and True are one key

        def last_updates() -> dict[Any, int]:
            # Each batch emits one update per key it touched; the last per key is the total.
            return dict(client.get_list("updates").get_all())

        # The two sinks commit one after the other: the list may land just after the map.
        wait_for(lambda: last_updates() == oracle, what="the list's last updates")
        # The sink commits before the batch's commit record and metrics are written;
        # a publish_all seen half-way (one partition's chunk) makes one batch more, so
        # the metrics are awaited until they count every event, not to a batch number.
        metrics = wait_for(
            lambda: (m := job.get_metrics())["lastCommittedBatch"] >= 2
            and m["stages"]["per-key"]["receivedCount"] == 700 and m, what="metrics")
        assert metrics["stages"]["per-key"]["snapshotKeys"] == len(oracle)
        assert metrics["snapshotCount"] == metrics["lastCommittedBatch"] + 1
        assert metrics["processingRate"] > 0 and metrics["inputRate"] > 0
    finally:
        stop(job)


@pytest.mark.usefixtures("engine_kind")
def test_order_sensitive_fold_without_combiner(client) -> None:  # type: ignore[no-untyped-def]
    stream = client.get_stream("one", partitions=1)  # one partition: publish order is order
    p = Pipeline.create()
    (p.read_from(StreamSource("one")).group_by(lambda x: x % 3)
     .aggregate(accumulator=lambda acc, x: acc * 31 + x, initial=7)
     .write_to(Pipeline.to_map("folds")))
    job = start(client, p, "folds")
    try:
        items = list(range(60))
        stream.publish_all(items[:25])
        wait_for(lambda: client.get_map("folds").size() == 3, what="first batch")
        stream.publish_all(items[25:])
        oracle: dict[int, int] = {}
        for x in items:
            oracle[x % 3] = oracle.get(x % 3, 7) * 31 + x
        wait_for(lambda: dict(client.get_map("folds").entry_set()) == oracle, what="oracle")
        assert dict(client.get_map("folds").entry_set()) == oracle
    finally:
        stop(job)


class _WallClock:
    """``time`` as the streaming loop sees it, with ``time()`` movable ahead."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def time(self) -> float:
        return time.time() + self.ahead

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.mark.usefixtures("engine_kind")
def test_distinct_by_value_with_ttl(client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A batch's clock is its plan's wall-clock time. The test moves that clock
    # past the TTL instead of sleeping, so a slow batch cannot outlive the TTL.
    clock = _WallClock()
    monkeypatch.setattr(streaming_module, "time", clock)
    stream = client.get_stream("d", partitions=2)
    p = Pipeline.create()
    p.read_from(StreamSource("d")).distinct(ttl_millis=60_000).write_to(
        Pipeline.to_list("firsts")
    )
    job = start(client, p, "distinct")
    try:
        stream.publish_all([{"a": 1}, {"a": 1.0}, [1, 2], "x"])
        wait_for(lambda: client.get_list("firsts").size() >= 3, what="first items")
        stream.publish_all([{"a": 1}, "x", "y"])  # within the TTL: only "y" is new
        wait_for(lambda: "y" in client.get_list("firsts").get_all(), what="y")
        clock.ahead = 61.0  # past the TTL: "x" was forgotten, so it passes again
        stream.publish_all(["x"])
        wait_for(lambda: client.get_list("firsts").get_all().count("x") == 2, what="x again")
        items = client.get_list("firsts").get_all()
        assert sum(1 for i in items if i == {"a": 1}) == 1
        assert items.count([1, 2]) == 1
    finally:
        stop(job)


@pytest.mark.usefixtures("engine_kind")
def test_map_stateful_keeps_per_key_state(client) -> None:  # type: ignore[no-untyped-def]
    stream = client.get_stream("ms", partitions=2)

    def running(state: list[int], key: str, item: dict[str, Any]) -> Any:
        state[0] += item["v"]
        return (key, state[0]) if item["v"] else None  # v == 0 emits nothing

    p = Pipeline.create()
    (p.read_from(StreamSource("ms")).group_by(lambda e: e["k"])
     .map_stateful(lambda: [0], running).write_to(Pipeline.to_map("sums")))
    job = start(client, p, "stateful")
    try:
        stream.publish_all([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 0}])
        wait_for(lambda: client.get_map("sums").get("a") == 1, what="a=1")
        stream.publish_all([{"k": "a", "v": 5}])
        wait_for(lambda: client.get_map("sums").get("a") == 6, what="a=6 (state kept)")
        assert client.get_map("sums").get("b") == 2
    finally:
        stop(job)


# Spark's workers cannot import this test module: ship its classes by value
# (PySpark serialises tasks with its own copy of cloudpickle).
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Dedup(StatefulTransform):
    """Emits each key's items that are larger than any seen before."""

    kind = "record-high"
    guarantees = ALL_GUARANTEES

    def create_state(self) -> Any:
        return None

    def process(self, state: Any, key: Any, items: list[Any]) -> tuple[Any, list[Any]]:
        out = []
        for item in items:
            if state is None or item > state:
                state = item
                out.append((key, item))
        return state, out


class _Plugin:
    @hookimpl
    def register_stateful_transforms(self, register):  # type: ignore[no-untyped-def]
        register(Dedup)


@pytest.mark.usefixtures("engine_kind")
def test_plugin_stateful_transform_in_a_stream(client) -> None:  # type: ignore[no-untyped-def]
    client.register_plugin(_Plugin(), "records")
    stream = client.get_stream("h", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("h")).group_by(lambda x: x % 2).apply(Dedup())
     .write_to(Pipeline.to_list("highs")))
    job = start(client, p, "highs")
    try:
        stream.publish_all([1, 3, 2, 4])
        wait_for(lambda: client.get_list("highs").size() >= 4, what="first highs")
        stream.publish_all([3, 5, 6, 0])
        wait_for(lambda: client.get_list("highs").size() >= 6, what="second highs")
        highs = client.get_list("highs").get_all()
        # Streams keep the order within a key (keys are not ordered among themselves).
        assert [v for k, v in highs if k == 1] == [1, 3, 5]
        assert [v for k, v in highs if k == 0] == [2, 4, 6]
    finally:
        stop(job)


def test_guarantees_and_stream_only_refusals(client) -> None:  # type: ignore[no-untyped-def]
    client.get_stream("g", partitions=1)
    jet = client.get_jet()
    p = Pipeline.create()
    p.read_from(StreamSource("g")).write_to(Pipeline.to_logger())
    with pytest.raises(ProcessingGuaranteeError, match=r"to-logger.*supports NONE, AT_LEAST_ONCE"):
        jet.submit(p, JobConfig(processing_guarantee=EXACTLY_ONCE))
    refused = ((lambda s: s.sort(), "sort"), (lambda s: s.aggregate(counting()), "aggregate"))
    for build, op in refused:
        q = Pipeline.create()
        build(q.read_from(StreamSource("g"))).write_to(Pipeline.to_list("x"))
        with pytest.raises(PipelineDefinitionError, match=rf"stage '{op}'.*cannot run in a stream"):
            jet.submit(q)
    assert jet.get_jobs() == []
    with pytest.raises(StoreError, match="stream 'missing' does not exist"):
        client.get_stream("missing").publish(1)
    with pytest.raises(ValueError, match="initial_position"):
        StreamSource("g", initial_position="newest")


def test_suspend_resume_update_config_and_control_from_another_client(  # type: ignore[no-untyped-def]
    client, store_url
) -> None:
    stream = client.get_stream("s", partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource("s")).group_by(lambda x: x % 5).aggregate(counting())
     .write_to(Pipeline.to_map("c")))
    job = start(client, p, "life")
    try:
        stream.publish_all(range(100))
        wait_for(lambda: sum(client.get_map("c").values()) == 100, what="100 counted")
        with pytest.raises(JobStateError, match="not SUSPENDED"):
            job.resume()
        # Another client (another process, as far as the job knows) asks to suspend.
        other = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK).get_jet()
        remote = other.get_job_by_name("life")
        remote.suspend()
        wait_for(lambda: job.status is JobStatus.SUSPENDED, what="suspended")
        assert job.get_suspension_cause() == "Requested by user"
        stream.publish_all(range(100, 150))
        time.sleep(0.5)
        assert sum(client.get_map("c").values()) == 100  # nothing runs while suspended
        config = job.update_config(snapshot_interval_millis=200)
        assert config.snapshot_interval_millis == 200 == job.config.snapshot_interval_millis
        with pytest.raises(ConfigError, match="processing_guarantee cannot change"):
            job.update_config(processing_guarantee=ProcessingGuarantee.NONE)
        remote.resume()
        wait_for(lambda: sum(client.get_map("c").values()) == 150, what="150 counted")
        assert job.status is JobStatus.RUNNING
        with pytest.raises(JobStateError, match="is not suspended"):
            job.get_suspension_cause()
    finally:
        stop(job)
    assert job.is_user_cancelled()


@pytest.mark.parametrize(
    ("guarantee", "replays"),
    [(ProcessingGuarantee.NONE, True), (EXACTLY_ONCE, False)],
    ids=["none-starts-over", "exactly-once-continues"],
)
def test_restart(client, guarantee, replays) -> None:  # type: ignore[no-untyped-def]
    stream = client.get_stream("r", partitions=1)
    p = Pipeline.create()
    p.read_from(StreamSource("r")).map(lambda x: x * 10).write_to(Pipeline.to_list("out"))
    job = start(client, p, "restarts", guarantee)
    try:
        stream.publish_all([1, 2, 3])
        wait_for(lambda: client.get_list("out").size() == 3, what="first output")
        job.restart()
        if replays:
            # Published once the replay is out: a loop that had not yet seen the
            # restart could otherwise take 4 into one more batch before it.
            wait_for(lambda: client.get_list("out").size() == 6, what="the replay")
        stream.publish_all([4])
        expected = [10, 20, 30, 10, 20, 30, 40] if replays else [10, 20, 30, 40]
        wait_for(lambda: client.get_list("out").size() >= len(expected), what="after restart")
        time.sleep(0.5)
        assert sorted(client.get_list("out").get_all()) == sorted(expected)
    finally:
        stop(job)


def test_failure_suspends_or_fails_per_config(client) -> None:  # type: ignore[no-untyped-def]
    from sparkjet.errors import JobFailedError

    stream = client.get_stream("f", partitions=1)

    def fragile(x: int) -> int:
        if x == 13:
            raise ValueError("unlucky")
        return x

    def pipeline() -> Pipeline:
        p = Pipeline.create()
        p.read_from(StreamSource("f")).map(fragile).set_name("fragile").write_to(
            Pipeline.to_list("ok")
        )
        return p

    job = start(client, pipeline(), "suspends", suspend_on_failure=True)
    try:
        stream.publish_all([1, 13])
        wait_for(lambda: job.status is JobStatus.SUSPENDED, what="suspended on failure")
        assert "stage 'fragile'" in job.get_suspension_cause()
        assert client.get_list("ok").get_all() == []  # the failed batch committed nothing
    finally:
        stop(job)
    # The stream holds 13 already: the job may fail before a poll could see it RUNNING.
    failing = client.get_jet().submit(pipeline(), JobConfig(
        name="fails", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=100))
    with pytest.raises(JobFailedError, match="stage 'fragile' failed: ValueError: unlucky") as info:
        failing.join(timeout=60)
    assert isinstance(info.value.__cause__, ValueError)
    assert failing.status is JobStatus.FAILED


@pytest.mark.spark  # the cluster is Spark's
def test_state_carries_over_when_the_cluster_grows_and_shrinks(  # type: ignore[no-untyped-def]
    client, monkeypatch
) -> None:
    """Suspended, resumed on a cluster running 3 tasks at once, then 1: counts go on exactly."""
    from sparkjet.core.state.checkpoint import Checkpoint
    from sparkjet.core.state.keygroups import task_range

    cluster = type(client.engine.spark)  # Spark's engine, or Spark Connect's

    stream = client.get_stream("grow", partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource("grow")).group_by(lambda x: x % 50).aggregate(counting())
     .set_name("per-key").write_to(Pipeline.to_map("grown")))
    job = start(client, p, "grow", key_groups=12)
    checkpoint = Checkpoint(client.store, client.store.layout.checkpoint(job.id, "checkpoint"))
    oracle: dict[int, int] = {}
    try:
        for tasks, values in ((2, range(0, 300)), (3, range(300, 700)), (1, range(700, 800))):
            if tasks != 2:
                job.suspend()
                wait_for(lambda: job.status is JobStatus.SUSPENDED, what="suspended")
                monkeypatch.setattr(cluster, "parallelism", lambda self, n=tasks: n)
                job.resume()
            stream.publish_all(values)
            for v in values:
                oracle[v % 50] = oracle.get(v % 50, 0) + 1
            wait_for(lambda: dict(client.get_map("grown").entry_set()) == oracle,
                     what=f"the counts with {tasks} tasks")
            # The sink commits before the batch's commit record: wait for the record.
            wait_for(lambda n=tasks: checkpoint.last_commit() >= 0
                     and checkpoint.planned(checkpoint.last_commit()).tasks == n,
                     what=f"a batch committed with {tasks} tasks")
            last = checkpoint.last_commit()
            files = checkpoint.state(12).versions("per-key")
            assert {(v.lo, v.hi) for v in files if v.batch == last} <= {
                task_range(t, tasks, 12) for t in range(tasks)
            }
        wait_for(lambda: job.get_metrics()["stages"]["per-key"]["snapshotKeys"] == 50,
                 what="the state's key count in the metrics")
        assert checkpoint.meta()["key_groups"] == 12
    finally:
        stop(job)


@pytest.mark.usefixtures("engine_kind")
def test_commit_records_name_the_state_files_that_count(client) -> None:  # type: ignore[no-untyped-def]
    """Another attempt's file of a committed batch (sorting first by name) is never read."""
    import cloudpickle

    from sparkjet.core.state.checkpoint import Checkpoint

    stream = client.get_stream("attempts", partitions=2)
    p = Pipeline.create()
    (p.read_from(StreamSource("attempts")).group_by(lambda x: x % 20).aggregate(counting())
     .set_name("per-key").write_to(Pipeline.to_map("attempted")))
    job = start(client, p, "attempts", key_groups=8)
    checkpoint = Checkpoint(client.store, client.store.layout.checkpoint(job.id, "checkpoint"))
    try:
        stream.publish_all(range(200))
        oracle = {k: 10 for k in range(20)}
        wait_for(lambda: dict(client.get_map("attempted").entry_set()) == oracle, what="counts")
        wait_for(lambda: checkpoint.last_commit() >= 0
                 and any(r.stage == "per-key" for r in
                         checkpoint.commit_record(checkpoint.last_commit()).state or {}),
                 what="a committed batch with state")
        last = checkpoint.last_commit()
        named = {r: name for r, name in (checkpoint.commit_record(last).state or {}).items()
                 if r.stage == "per-key"}
        state = checkpoint.state(8)
        listed = {v.name: v for v in state.versions("per-key")}
        written = [name for name in named.values() if name]
        assert written and all(name in listed for name in written)
        # A stray attempt of that batch: the same range, an attempt id sorting first,
        # and state that would double every count if it were read.
        version = listed[written[0]]
        stray = version.name.replace(version.attempt, "00000000")
        bogus = {k: (k, 1000) for k in range(20)}
        data = (cloudpickle.dumps({"values": bogus, "touched": {}}) if version.full else
                cloudpickle.dumps({"set": bogus, "touched": {}, "removed": []}))
        client.store.write_bytes(f"{state.stage_dir('per-key')}/{stray}", data)
        job.suspend()  # resumed, the tasks read their state from the store
        wait_for(lambda: job.status is JobStatus.SUSPENDED, what="suspended")
        job.resume()
        stream.publish_all(range(200, 240))
        oracle = {k: 12 for k in range(20)}
        wait_for(lambda: dict(client.get_map("attempted").entry_set()) == oracle,
                 what="counts that never saw the stray file")
    finally:
        stop(job)
