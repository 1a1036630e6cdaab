"""Stream-stream interval joins against a plain-Python oracle: pairs, outer rows, eviction."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.errors import PipelineDefinitionError
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource, WindowDefinition
from tests.conftest import in_process_client, run_pipeline, wait_until

# Spark's workers cannot import tests/: this module's functions travel by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
KEYS = [1, 1.0, True, "a", None]
#: A far-future item on both inputs moves the watermark past every other bound.
FLUSH_KEY = "flush"


def key(event: Any) -> Any:
    return event[0]


def ts(event: Any) -> int:
    return int(event[1])


def pair(left: Any, right: Any) -> Any:
    return (left, right)


def oracle(lefts: list[Any], rights: list[Any], lower: int, upper: int, how: str) -> Counter[Any]:
    """Every pair once; every unmatched item once on the outer sides ``how`` asks for."""
    out: Counter[Any] = Counter()
    matched_right: set[int] = set()
    for left in lefts:
        found = False
        for j, right in enumerate(rights):
            same = key(left) == key(right) and hash(key(left)) == hash(key(right))
            if same and ts(left) + lower <= ts(right) <= ts(left) + upper:
                out[(left, right)] += 1
                found = True
                matched_right.add(j)
        if not found and how in ("left", "full"):
            out[(left, None)] += 1
    if how in ("right", "full"):
        for j, right in enumerate(rights):
            if j not in matched_right:
                out[(None, right)] += 1
    return out


def join_pipeline(left: Any, right: Any, lower: int, upper: int, how: str) -> Pipeline:
    p = left._node.pipeline
    (left.group_by(key).interval_join(right.group_by(key), lower, upper, pair, how=how)
     .set_name("ij").write_to(Pipeline.to_list("out")))
    return p


events = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 40)), max_size=10)


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lefts=events, rights=events, bounds=st.tuples(st.integers(-10, 10), st.integers(0, 12)),
       how=st.sampled_from(["inner", "left", "right", "full"]))
def test_batch_interval_join_equals_the_oracle(store_url: str, lefts: list[Any],
                                               rights: list[Any], bounds: tuple[int, int],
                                               how: str) -> None:
    lower, upper = bounds[0], bounds[0] + bounds[1]
    client = in_process_client(store_url)
    client.get_list("out").clear()
    p = Pipeline.create()
    left = p.read_from(Pipeline.from_list("l", lefts)).with_timestamps(ts, 0)
    right = p.read_from(Pipeline.from_list("r", rights)).with_timestamps(ts, 0)
    run_pipeline(client, join_pipeline(left, right, lower, upper, how))
    assert Counter(client.get_list("out").get_all()) == oracle(lefts, rights, lower, upper, how)


def stream_pipeline(lower: int, upper: int, how: str, lag: int = 1000) -> Pipeline:
    p = Pipeline.create()
    left = p.read_from(StreamSource("left")).set_name("left").with_timestamps(ts, lag)
    right = p.read_from(StreamSource("right")).set_name("right").with_timestamps(ts, lag)
    return join_pipeline(left, right, lower, upper, how)


def publish_in_batches(client: sparkjet.Client, job: Any, lefts: list[Any], rights: list[Any],
                       chunks: int) -> None:
    """Publish both inputs in ``chunks`` rounds, each processed before the next."""
    left, right = client.get_stream("left"), client.get_stream("right")
    for i in range(chunks):
        before = job.get_metrics()["lastCommittedBatch"]
        left.publish_all(lefts[i::chunks])
        right.publish_all(rights[i::chunks])
        wait_until(lambda before=before: job.get_metrics()["lastCommittedBatch"] > before,
                   timeout=120, what=f"round {i}")


@pytest.mark.parametrize(("partitions", "chunks"), [(1, 1), (2, 3), (3, 5)])
@pytest.mark.parametrize("how", ["inner", "full"])
def test_stream_interval_join_equals_the_oracle_and_ends_with_no_keys(
        client: sparkjet.Client, partitions: int, chunks: int, how: str) -> None:
    client.get_stream("left", partitions=partitions)
    client.get_stream("right", partitions=partitions)
    lefts = [(KEYS[i % 5], (i * 7) % 60) for i in range(40)]
    rights = [(KEYS[i % 4], (i * 11) % 60) for i in range(30)]
    job = client.get_jet().submit(stream_pipeline(-5, 8, how), JobConfig(
        name="ij", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=50))
    try:
        publish_in_batches(client, job, lefts, rights, chunks)
        # Far-future items on every partition of both inputs move the watermark past
        # every bound above: outer rows come out, and the buffers empty.
        for name in ("left", "right"):
            for _ in range(partitions * 4):
                client.get_stream(name).publish_all([(FLUSH_KEY, 100_000)])
        want = oracle(lefts, rights, -5, 8, how)

        def joined() -> Counter[Any]:
            return Counter(p for p in client.get_list("out").get_all()
                           if FLUSH_KEY not in (key(p[0] or p[1]),))

        wait_until(lambda: joined() == want, what="every pair and outer row once")
        # Only the flush items are left, under their one key.
        wait_until(lambda: job.get_metrics()["stages"]["ij"].get("snapshotKeys") == 1,
                   what="the join to hold the flush key alone")
        assert job.get_metrics()["stages"]["ij"]["lateEventsDropped"] == 0
    finally:
        job.cancel()


#: Round r's events have event time in [ROUND * r, ROUND * r + LAG - 1]: out of order
#: within a round and overlapping the next one, never behind a watermark (at most
#: ROUND * r - 1 while round r is read, its own items included), so the oracle needs
#: no late items.
ROUND, LAG = 4, 6
#: A round: its items, each (key, time offset, on the left input).
rounds = st.lists(st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, LAG - 1),
                                     st.booleans()), max_size=8), min_size=1, max_size=4)
_examples = iter(range(10**6))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batches=rounds, bounds=st.tuples(st.integers(-6, 6), st.integers(0, 6)),
       how=st.sampled_from(["inner", "left", "right", "full"]), partitions=st.integers(1, 3))
def test_stream_interval_join_equals_the_oracle_whatever_the_split(
        client: sparkjet.Client, batches: list[list[Any]], bounds: tuple[int, int], how: str,
        partitions: int) -> None:
    """A live EXACTLY_ONCE job, fed round by round (each its micro-batch or more), over
    random partition counts and splits (the stream deals each round from a random
    partition): every pair and outer row once, outer rows emitted mid-stream as the
    watermark passes them, and no keys held after the flush."""
    n = next(_examples)
    lower, upper = bounds[0], bounds[0] + bounds[1]
    split = [([(k, ROUND * r + dt) for k, dt, on_left in batch if on_left],
              [(k, ROUND * r + dt) for k, dt, on_left in batch if not on_left])
             for r, batch in enumerate(batches)]
    lefts = [e for batch, _ in split for e in batch]
    rights = [e for _, batch in split for e in batch]
    names = (f"left-{n}", f"right-{n}")
    for name in names:
        client.get_stream(name, partitions=partitions)
    client.get_list("out").clear()
    p = Pipeline.create()
    left = p.read_from(StreamSource(names[0])).set_name("left").with_timestamps(ts, LAG)
    right = p.read_from(StreamSource(names[1])).set_name("right").with_timestamps(ts, LAG)
    job = client.get_jet().submit(join_pipeline(left, right, lower, upper, how), JobConfig(
        name=f"ij-{n}", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=20))
    try:
        for round_lefts, round_rights in split:
            if not round_lefts and not round_rights:
                continue
            before = job.get_metrics()["lastCommittedBatch"]
            client.get_stream(names[0]).publish_all(round_lefts)
            client.get_stream(names[1]).publish_all(round_rights)
            wait_until(lambda before=before: job.get_metrics()["lastCommittedBatch"] > before,
                       timeout=120, what="the round's micro-batch")
        for name in names:  # one far-future item on each partition: the watermark passes all
            client.get_stream(name).publish_all([(FLUSH_KEY, 100_000)] * partitions)
        want = oracle(lefts, rights, lower, upper, how)

        def joined() -> Counter[Any]:
            return Counter(r for r in client.get_list("out").get_all()
                           if key(r[0] if r[0] is not None else r[1]) != FLUSH_KEY)

        wait_until(lambda: joined() == want, timeout=120, what="every pair and outer row once")
        wait_until(lambda: job.get_metrics()["stages"]["ij"].get("snapshotKeys") == 1,
                   timeout=120, what="the join to hold the flush key alone")
        assert job.get_metrics()["stages"]["ij"]["lateEventsDropped"] == 0
    finally:
        job.cancel()


@pytest.mark.parametrize("engine_kind", ["spark"], indirect=True)
def test_stream_interval_join_on_spark(client: sparkjet.Client, engine_kind: str,
                                       tmp_path: Path) -> None:
    """On Spark, against the oracle, and its pairs equal Spark's own stream-stream join's."""
    client.get_stream("left", partitions=2)
    client.get_stream("right", partitions=2)
    lefts = [("a", t) for t in range(0, 50, 5)]
    rights = [("a", t) for t in range(2, 50, 7)] + [("b", 3)]
    job = client.get_jet().submit(stream_pipeline(0, 4, "left"), JobConfig(
        name="ij-spark", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=50))
    try:
        publish_in_batches(client, job, lefts, rights, 2)
        for name in ("left", "right"):
            client.get_stream(name).publish_all([(FLUSH_KEY, 100_000)] * 8)
        want = oracle(lefts, rights, 0, 4, "left")
        wait_until(lambda: Counter(p for p in client.get_list("out").get_all()
                                   if key(p[0] or p[1]) != FLUSH_KEY) == want,
                   what="the pairs and left rows")
    finally:
        job.cancel()
    got = Counter(p for p in client.get_list("out").get_all() if key(p[0] or p[1]) != FLUSH_KEY)
    pairs = Counter({p: n for p, n in got.items() if None not in p})
    assert pairs == native_pairs(client, tmp_path, lefts, rights, 0, 4)
    assert sum(got.values()) - sum(pairs.values()) == 3  # lefts at 10, 25 and 40: no right


def native_pairs(client: sparkjet.Client, folder: Path, lefts: list[Any], rights: list[Any],
                 lower: int, upper: int) -> Counter[Any]:
    """Spark's own stream-stream inner join of the same items, watermarked, times exact.

    Two JSON-lines folders read as streams, event time through ``timestamp_millis``
    (a cast of ``t / 1000`` goes through a double and can lose pairs at the bounds),
    the bounds as a time-range condition, one ``availableNow`` run into a memory sink.
    Times are moved from the epoch: Spark drops an event at the epoch itself as late
    in its first micro-batch (its watermark is 0 there, and late is ``<=``).
    """
    base = 1_700_000_000_000
    from pyspark.sql import functions as F

    spark = client.spark
    sides = []
    for name, items in (("l", lefts), ("r", rights)):
        path = folder / f"native-{name}"
        path.mkdir()
        (path / "part.json").write_text(
            "".join(json.dumps({"k": k, "t": t + base}) + "\n" for k, t in items))
        sides.append(spark.readStream.schema("k STRING, t LONG").json(str(path)).select(
            F.col("k").alias(f"{name}k"), (F.col("t") - base).alias(f"{name}t"),
            F.timestamp_millis("t").alias(f"{name}ts")).withWatermark(f"{name}ts", "1 second"))
    condition = F.expr(f"lk = rk AND rts BETWEEN lts + INTERVAL {lower} MILLISECONDS "
                       f"AND lts + INTERVAL {upper} MILLISECONDS")
    query = (sides[0].join(sides[1], condition, "inner").select("lk", "lt", "rk", "rt")
             .writeStream.format("memory").queryName("native_interval_join")
             .option("checkpointLocation", str(folder / "native-checkpoint"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        rows = spark.sql("SELECT * FROM native_interval_join").collect()
    finally:
        query.stop()
    return Counter(((r.lk, r.lt), (r.rk, r.rt)) for r in rows)


def test_late_items_are_counted_and_dead_lettered(client: sparkjet.Client) -> None:
    client.get_stream("left", partitions=1)
    client.get_stream("right", partitions=1)
    p = Pipeline.create()
    left = p.read_from(StreamSource("left")).with_timestamps(ts, 0)
    right = p.read_from(StreamSource("right")).with_timestamps(ts, 0)
    (left.group_by(key).interval_join(right.group_by(key), 0, 5, pair)
     .set_name("ij").on_error("dead-letter").write_to(Pipeline.to_list("out")))
    job = client.get_jet().submit(p, JobConfig(
        name="late", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=50))
    try:
        publish_in_batches(client, job, [("a", 100)], [("a", 101)], 1)
        publish_in_batches(client, job, [("a", 200)], [("a", 200)], 1)  # watermark 200
        publish_in_batches(client, job, [("a", 10)], [], 1)  # behind it: late
        wait_until(lambda: job.get_metrics()["stages"]["ij"]["lateEventsDropped"] == 1,
                   what="the late item counted")
        letters = [e for part in range(1) for e in
                   client.get_stream("late.dead-letters").read(part)]
        assert [(d["stage"], d["item"]) for d in letters] == [("ij", (0, "a", ("a", 10)))]
        assert sorted(client.get_list("out").get_all()) == [
            (("a", 100), ("a", 101)), (("a", 200), ("a", 200))]
    finally:
        job.cancel()


def test_a_pair_straddling_an_export_is_emitted_once_by_the_new_job(
        client: sparkjet.Client) -> None:
    client.get_stream("left", partitions=1)
    client.get_stream("right", partitions=1)
    job = client.get_jet().submit(stream_pipeline(0, 10, "full"), JobConfig(
        name="v1", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=50))
    publish_in_batches(client, job, [("a", 5), ("b", 5)], [], 1)
    job.export_snapshot("ij-v1", cancel_job=True)
    client.get_stream("right").publish_all([("a", 9)])
    job2 = client.get_jet().submit(stream_pipeline(0, 10, "full"), JobConfig(
        name="v2", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=50,
        initial_snapshot_name="ij-v1"))
    try:
        wait_until(lambda: client.get_list("out").get_all() == [(("a", 5), ("a", 9))],
                   what="the pair across the export")
        for name in ("left", "right"):
            client.get_stream(name).publish_all([(FLUSH_KEY, 100_000)])
        wait_until(lambda: (("b", 5), None) in client.get_list("out").get_all(),
                   what="b's outer row, from the snapshot's buffer")
        assert Counter(p for p in client.get_list("out").get_all()
                       if key(p[0] or p[1]) != FLUSH_KEY) == Counter(
            [(("a", 5), ("a", 9)), (("b", 5), None)])
    finally:
        job2.cancel()


def test_bad_interval_joins_are_refused_naming_the_stage(client: sparkjet.Client) -> None:
    p = Pipeline.create()
    left = p.read_from(StreamSource("left")).set_name("left").with_timestamps(ts, 0)
    right = p.read_from(StreamSource("right")).set_name("right")
    grouped = left.group_by(key)
    with pytest.raises(PipelineDefinitionError, match="wrong way round"):
        grouped.interval_join(right.group_by(key), 5, 1, pair)
    with pytest.raises(PipelineDefinitionError, match="how is one of"):
        grouped.interval_join(right.group_by(key), 0, 1, pair, how="outer")
    with pytest.raises(PipelineDefinitionError, match="whole number"):
        grouped.interval_join(right.group_by(key), 0.5, 1, pair)  # type: ignore[arg-type]
    with pytest.raises(PipelineDefinitionError, match="takes a function"):
        grouped.interval_join(right.group_by(key), 0, 1, None)  # type: ignore[arg-type]
    grouped.interval_join(right.group_by(key), 0, 1, pair).set_name("ij") \
        .write_to(Pipeline.to_list("out"))
    with pytest.raises(PipelineDefinitionError, match=r"stage 'ij'.*'right'.*gives none"):
        client.get_jet().submit(p, JobConfig(processing_guarantee=EXACTLY_ONCE))


def test_a_window_after_an_interval_join_is_refused_naming_both(
        client: sparkjet.Client) -> None:
    from sparkjet.aggregate import counting

    p = Pipeline.create()
    left = p.read_from(StreamSource("left")).with_timestamps(ts, 0)
    right = p.read_from(StreamSource("right")).with_timestamps(ts, 0)
    (left.group_by(key).interval_join(right.group_by(key), 0, 1, pair).set_name("ij")
     .window(WindowDefinition.tumbling(10)).aggregate(counting()).set_name("per-10")
     .write_to(Pipeline.to_list("out")))
    with pytest.raises(PipelineDefinitionError, match=r"stage 'per-10'.*'ij'"):
        client.get_jet().submit(p, JobConfig(processing_guarantee=EXACTLY_ONCE))


@pytest.mark.parametrize("edit", ["bounds", "how", "swapped"])
def test_check_upgrade_decides_interval_join_edits_aloud(client: sparkjet.Client,
                                                         edit: str) -> None:
    client.get_stream("left", partitions=1)
    client.get_stream("right", partitions=1)
    job = client.get_jet().submit(stream_pipeline(0, 10, "inner"), JobConfig(
        name="v1", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=50))
    publish_in_batches(client, job, [("a", 5)], [], 1)
    job.export_snapshot("v1", cancel_job=True)
    same = {(r.kind, r.stage): r for r in client.get_jet().check_upgrade(
        stream_pipeline(0, 10, "inner"), "v1")}
    assert same["state", "ij"].status == "restored"
    if edit == "swapped":
        p = Pipeline.create()
        left = p.read_from(StreamSource("left")).set_name("left").with_timestamps(ts, 1000)
        right = p.read_from(StreamSource("right")).set_name("right").with_timestamps(ts, 1000)
        v2 = join_pipeline(right, left, 0, 10, "inner")
    else:
        v2 = stream_pipeline(0, 20, "inner") if edit == "bounds" else stream_pipeline(
            0, 10, "left")
    row = {(r.kind, r.stage): r for r in client.get_jet().check_upgrade(v2, "v1")}["state", "ij"]
    assert row.status == "changed" and row.refusal, (row.status, row.note)
