"""Partition readers and client pools, kept per Python worker; reading an offset range.

What a task of the source (:mod:`~sparkjet.contrib.kafka.source`) or of the
direct sink (:mod:`~sparkjet.contrib.kafka.sink`) runs on an executor: the
pools that keep clients across tasks of one Python worker (the sink's
idempotent producers, the source's partition readers, swept when idle), a
partition reader (a consumer kept assigned to one partition), and the read of
one ``[start, end)`` offset range through it, which fails naming the range
when the partition no longer holds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sparkjet.contrib.kafka.clients import KafkaError, _confluent_kafka


class _ClientPool:
    """Kafka clients per configuration, reused across tasks of one executor's Python worker.

    A task takes a client out and gives it back when it is done with it, so
    no two tasks share one; a client whose task failed is not given back.
    """

    def __init__(self, make: Callable[[dict[str, Any]], Any], close: Callable[[Any], None]):
        self._make, self._close = make, close
        self._idle: dict[str, Any] = {}
        self._lock = threading.Lock()

    def take(self, config: dict[str, Any]) -> tuple[str, Any]:
        """A client for ``config`` (an idle one, else a new one), and the key to give it back."""
        key = json.dumps(config, sort_keys=True, default=str)
        with self._lock:
            client = self._idle.pop(key, None)
        return key, client if client is not None else self._make(config)

    def give_back(self, key: str, client: Any) -> None:
        """Keep ``client`` for the next task (or close it when one is kept already)."""
        with self._lock:
            if key not in self._idle:
                self._idle[key] = client
                return
        self._close(client)


#: Producers of the non-transactional sink (a producer holds no resources once flushed).
_PRODUCERS = _ClientPool(lambda config: _confluent_kafka().Producer(config),
                         lambda producer: producer.flush(0))


#: The source consumers' ``fetch.wait.max.ms`` unless configured (see _consumer_settings).
_FETCH_WAIT_MS = 10
#: How long a read blocks in one ``poll`` before it looks at its deadline again.
_POLL_SLICE_S = 0.1
#: How many idle partition readers one Python worker keeps (the oldest is closed first).
_READERS_KEPT = 64
#: Seconds a kept partition reader may go unused before it is closed.
_READER_IDLE_S = 30.0


class _PartitionReader:
    """A consumer assigned to one partition, kept across reads of that partition.

    Kept assigned, it fetches on between reads, so the next micro-batch's
    records are often local already; a read that starts where the last one
    stopped (:attr:`next`) needs no seek, any other seeks.
    """

    def __init__(self, consumer: Any, topic: str, partition: int) -> None:
        self.consumer, self.topic, self.partition = consumer, topic, partition
        #: The offset its queue delivers from next, when known; None: seek first.
        self.next: int | None = None
        self.assigned = False

    def assign(self, offset: int) -> None:
        """(Re)assign the partition at ``offset``: drops whatever was fetched."""
        ck = _confluent_kafka()
        if self.assigned:
            self.consumer.unassign()
        self.consumer.assign([ck.TopicPartition(self.topic, self.partition, offset)])
        self.assigned, self.next = True, offset

    def seek(self, offset: int) -> bool:
        """Make ``offset`` the next one read; whether it had to move (True: a fresh start)."""
        ck = _confluent_kafka()
        if self.assigned and self.next == offset:
            return False
        if not self.assigned:
            self.assign(offset)
            return True
        try:
            self.consumer.seek(ck.TopicPartition(self.topic, self.partition, offset))
            self.next = offset
        except ck.KafkaException:  # not fetching yet (an error state): assign afresh
            self.assign(offset)
        return True

    def close(self) -> None:
        """Close the consumer (leaves no group: sparkjet assigns, never subscribes)."""
        self.consumer.close()


class _ReaderPool:
    """Partition readers per (configuration, topic, partition) of one Python worker.

    Like :class:`_ClientPool`: a task takes a reader out and gives it back
    when its read succeeded; a reader whose read failed is closed. A kept
    reader fetches on (every ``fetch.wait.max.ms``), so one not used for
    :data:`_READER_IDLE_S` (its job ended, or moved) is closed by a sweeper
    thread.
    """

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], tuple[_PartitionReader, float]] = {}
        self._lock = threading.Lock()
        self._sweeper_pid = 0  # the process whose sweeper runs (none survives a fork)

    def take(
        self, config: dict[str, Any], topic: str, partition: int
    ) -> tuple[tuple[str, str, int], _PartitionReader]:
        """A reader of ``topic/partition`` (an idle one, else a new one), and its key."""
        key = (json.dumps(config, sort_keys=True, default=str), topic, partition)
        with self._lock:
            kept = self._idle.pop(key, None)
        if kept is not None:
            return key, kept[0]
        return key, _PartitionReader(_confluent_kafka().Consumer(config), topic, partition)

    def give_back(self, key: tuple[str, str, int], reader: _PartitionReader) -> None:
        """Keep ``reader`` for the next read (closing the oldest beyond :data:`_READERS_KEPT`)."""
        closing = []
        with self._lock:
            if key in self._idle:
                closing.append(reader)
            else:
                self._idle[key] = (reader, time.monotonic())
                while len(self._idle) > _READERS_KEPT:
                    closing.append(self._idle.pop(next(iter(self._idle)))[0])
            start_sweeper = self._sweeper_pid != os.getpid()
            if start_sweeper:
                self._sweeper_pid = os.getpid()
        for old in closing:
            old.close()
        if start_sweeper:
            threading.Thread(target=self._sweep, name="sparkjet-kafka-readers",
                             daemon=True).start()

    def sweep(self) -> int:
        """Close the readers idle for :data:`_READER_IDLE_S` or more; how many."""
        now = time.monotonic()
        with self._lock:
            stale = [k for k, (_, since) in self._idle.items() if now - since >= _READER_IDLE_S]
            closing = [self._idle.pop(k)[0] for k in stale]
        for reader in closing:
            with contextlib.suppress(Exception):
                reader.close()
        return len(closing)

    def _sweep(self) -> None:
        while True:
            time.sleep(max(_READER_IDLE_S / 2, 0.05))
            self.sweep()


_READERS = _ReaderPool()


def _consumer_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with what every consumer of the source needs (readers, the watcher).

    Assigned, never subscribed, it commits nothing, reads committed records
    only (unless configured) and sees the partition's end; the fetch settings
    keep a read's latency low.
    """
    config.update({
        "allow.auto.create.topics": False,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        # A range the partition no longer (or never) held is an error, never
        # a silent jump to other records (see readers._read_range).
        "auto.offset.reset": "error",
        "isolation.level": config.get("isolation.level", "read_committed"),
    })
    # Latency: a kept reader's fetch waits at most this long at the partition's
    # end (a seek, and a record produced meanwhile, wait for that fetch: 400 ms
    # with librdkafka's 500 ms default), and small requests are sent at once.
    config.setdefault("fetch.wait.max.ms", _FETCH_WAIT_MS)
    config.setdefault("socket.nagle.disable", True)
    # What a kept reader may hold fetched ahead, per partition (librdkafka: 64 MB).
    config.setdefault("queued.max.messages.kbytes", 16_384)
    return config


def _read_range(
    reader: _PartitionReader, start: int, end: int, timeout: float, what: str
) -> Iterator[Any]:
    """The records of ``[start, end)`` of the reader's partition; offsets may skip.

    Offsets skip transaction markers and compacted records.

    Stops as soon as it has the record at ``end - 1``, a record past it, or
    the partition's end (an EOF event) at or after ``end``: nothing waits
    out a timeout. Records already fetched (the reader is kept assigned
    between reads, and its fetches run ahead) are taken without a wait;
    otherwise it blocks in ``poll`` until the next record or EOF comes,
    checking every :data:`_POLL_SLICE_S` that one came within ``timeout``.
    ``what``: the stage, for errors.
    """
    ck = _confluent_kafka()
    if end <= start:
        return
    consumer, topic, partition = reader.consumer, reader.topic, reader.partition
    fresh = reader.seek(start)
    deadline = time.monotonic() + timeout
    first = True
    want = start  # the next offset this read needs
    try:
        while True:
            batch = consumer.consume(num_messages=min(max(end - want, 1), 10_000), timeout=0)
            if not batch:
                message = consumer.poll(min(_POLL_SLICE_S, max(deadline - time.monotonic(), 0)))
                if message is None:
                    if time.monotonic() > deadline:
                        _check_held(reader, start, end, timeout, what)
                        raise KafkaError(
                            f"{what}: reading {topic}/{partition} offsets "
                            f"{start}..{end}: no record for {timeout:g} s"
                        )
                    continue
                batch = [message]
            deadline = time.monotonic() + timeout
            for i, message in enumerate(batch):
                last = i + 1 == len(batch)
                error = message.error()
                if error is not None:
                    if error.code() == ck.KafkaError._PARTITION_EOF:
                        reader.next = message.offset()
                        if message.offset() >= end:
                            if not last:  # the rest of the batch left the queue
                                reader.next = None
                            return
                        continue
                    if error.code() == ck.KafkaError._AUTO_OFFSET_RESET:
                        reader.next = None
                        _check_held(reader, start, end, timeout, what)
                    elif not fresh:
                        # Left in a kept reader's queue while it waited between
                        # reads (a broker restart...): start this read afresh, once.
                        reader.assign(want)
                        fresh = True
                        break
                    reader.next = None
                    raise KafkaError(
                        f"{what}: reading {topic}/{partition} at offset "
                        f"{start}..{end}: {error.str()}"
                    )
                offset = message.offset()
                reader.next = offset + 1
                if first and offset > start:
                    # Offsets may skip (markers, compaction), but not below the
                    # log start: records deleted before the job read them. (The
                    # record came, so the end is not in question: Tansu reports
                    # it short, the start of its last record batch + 1.)
                    _check_held(reader, start, end, timeout, what, past_end=False)
                first = False
                if offset >= end - 1 and not last:  # the rest of the batch left the queue
                    reader.next = None
                if offset >= end:
                    return
                want = offset + 1
                yield message
                if offset >= end - 1:
                    return
    except BaseException:
        reader.next = None  # where its queue stands is unknown: seek next time
        raise


def _check_held(
    reader: _PartitionReader, start: int, end: int, timeout: float, what: str,
    *, past_end: bool = True,
) -> None:
    """Raise :class:`KafkaError` if the reader's partition does not hold ``[start, end)``.

    ``past_end`` False: only the start is checked.

    Records below the partition's log start were deleted (retention,
    DeleteRecords) before the job read them; offsets past its end belong
    to a topic that was deleted and made anew. Either would be data
    silently lost or replaced, so the stage fails naming the range.
    """
    topic, partition = reader.topic, reader.partition
    low, high = reader.consumer.get_watermark_offsets(
        _confluent_kafka().TopicPartition(topic, partition), timeout=timeout)
    where = f"{what}: reading {topic}/{partition} offsets {start}..{end}"
    if start < low:
        raise KafkaError(
            f"{where}: offsets {start}..{low - 1} are not in the partition any more "
            f"(it starts at {low}: deleted by retention before the job read them)"
        )
    if past_end and end > high:
        raise KafkaError(
            f"{where}: offsets {max(start, high)}..{end - 1} are not in the partition "
            f"(it ends at {high}: was the topic deleted and made anew?)"
        )


def _first_at(
    reader: _PartitionReader, start: int, end: int, timestamp: int, timeout: float, what: str
) -> int:
    """The offset of the first record of ``[start, end)`` at or after ``timestamp``.

    ``max(start, end)`` when there is none.
    """
    for record in _read_range(reader, start, end, timeout, what):
        if record.timestamp()[1] >= timestamp:
            return int(record.offset())
    return max(start, end)


def _deserialized(
    records: Iterable[Any],
    value_of: Callable[[bytes | None], Any],
    key_of: Callable[[bytes | None], Any] | None,
    what: str,
    where: str,
) -> tuple[list[Any], list[tuple[int, int]]]:
    """The items of ``records`` (``(key, value)`` with ``key_of``), and their offsets' runs.

    The runs say where runs of consecutive offsets start, ``[(index,
    offset), ...]``: offsets skip transaction markers and compacted records.
    ``where``: ``<topic>/<partition>``, for errors.
    """
    items: list[Any] = []
    runs: list[tuple[int, int]] = []
    for message in records:
        offset = message.offset()
        if not runs or offset - runs[-1][1] != len(items) - runs[-1][0]:
            runs.append((len(items), offset))  # offsets skipped (markers, compaction)
        try:
            value = value_of(message.value())
            items.append(value if key_of is None else (key_of(message.key()), value))
        except Exception as exc:
            raise KafkaError(
                f"{what}: cannot deserialize the record at "
                f"{where} offset {message.offset()}: {exc!r}"
            ) from exc
    return items, runs
