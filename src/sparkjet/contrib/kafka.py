"""Kafka topics as a streaming source and a sink (``pip install sparkjet[kafka]``).

:class:`KafkaSource` reads a topic's partitions by offset ranges that sparkjet
records in the job's checkpoint, so a replayed micro-batch reads exactly the
same records (no consumer-group commits needed). :class:`KafkaSink` produces
to a topic: from the executors with an idempotent producer under ``NONE`` and
``AT_LEAST_ONCE``, and under ``EXACTLY_ONCE`` from the driver in one Kafka
transaction per micro-batch, which also commits the batch id (as the offset of
a consumer group named after the sink's checkpoint), so a batch replayed after
a driver crash finds its id committed and is skipped. The transactional id is
the job's and the stage's: a new driver's ``init_transactions`` fences the old
one's producer, which then cannot commit.

confluent-kafka is imported when a source or sink is used, not when the plugin
loads: a user without the extra still connects, and only using these classes
says which extra to install.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sparkjet.errors import SparkjetError
from sparkjet.plugin import (
    ALL_GUARANTEES,
    JobContext,
    ProcessingGuarantee,
    Sink,
    Source,
    TaskContext,
    hookimpl,
)

__all__ = [
    "KafkaError",
    "KafkaFencedError",
    "KafkaSink",
    "KafkaSource",
    "json_deserializer",
    "json_serializer",
]

#: What the plugin needs beyond sparkjet (read by the plugin manager): without it the
#: plugin is listed as unavailable, naming the extra, and other plugins load as usual.
sparkjet_requires = {"confluent_kafka": "pip install 'sparkjet[kafka]'"}

#: How long a metadata or offsets request may take before the broker counts as unreachable.
DEFAULT_TIMEOUT_S = 10.0
#: How often a source looks for new partitions (latest_offsets runs before each micro-batch).
DEFAULT_METADATA_REFRESH_S = 5.0
_START_POSITIONS = ("earliest", "latest")
#: How many descriptors' offset runs a source keeps on an executor (for dead letters,
#: asked right after the read).
_RUNS_KEPT = 64
#: Where librdkafka's own log lines go (connection retries and the like).
_LIBRDKAFKA_LOG = logging.getLogger("sparkjet.kafka.librdkafka")


class KafkaError(SparkjetError):
    """A Kafka source or sink failed; the message names the stage, topic and brokers."""


class KafkaFencedError(KafkaError):
    """A sink's transactional producer was fenced by a newer one: another driver took over."""


def json_deserializer(data: bytes | None) -> Any:
    """The default value deserializer: JSON text (``None`` for a null value)."""
    return None if data is None else json.loads(data)


def json_serializer(value: Any) -> bytes:
    """The default value serializer: compact JSON text in UTF-8."""
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _confluent_kafka() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin  # a submodule: not imported by the package
    except ImportError as exc:
        raise KafkaError(
            "the Kafka plugin needs confluent-kafka: pip install 'sparkjet[kafka]' "
            f"(importing it failed: {exc})"
        ) from exc
    return confluent_kafka


def _client_config(
    bootstrap_servers: str | None, config: Mapping[str, Any] | None,
    options: Mapping[str, Any], what: str,
) -> dict[str, Any]:
    """The librdkafka settings: ``[plugins.kafka] config``, then the instance's."""
    merged: dict[str, Any] = dict(options.get("config", {}) or {})
    merged.update(config or {})
    servers = bootstrap_servers or merged.get("bootstrap.servers") or options.get(
        "bootstrap_servers"
    )
    if not servers:
        raise KafkaError(
            f"{what}: no bootstrap servers: pass bootstrap_servers=... or set "
            "[plugins.kafka] bootstrap_servers"
        )
    merged["bootstrap.servers"] = servers
    merged.setdefault("logger", _LIBRDKAFKA_LOG)  # librdkafka's log lines, not raw stderr
    return merged


def _describe_kafka_error(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "str"):
        return str(args[0].str())
    return repr(exc)


def _topic_partitions(
    client: Any, topic: str, servers: str, timeout: float, what: str, *, by_name: bool
) -> list[int]:
    """The partition ids of ``topic``; errors name the topic and the brokers.

    ``by_name`` asks for the one topic: only for a consumer, which never makes
    brokers that auto-create topics create it; others list every topic.
    """
    ck = _confluent_kafka()
    try:
        if by_name:
            metadata = client.list_topics(topic, timeout=timeout)
        else:
            metadata = client.list_topics(timeout=timeout)
    except ck.KafkaException as exc:
        raise KafkaError(
            f"{what}: cannot reach the Kafka brokers at {servers} within {timeout:g} s: "
            f"{_describe_kafka_error(exc)}"
        ) from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        reason = f" ({found.error.str()})" if found is not None and found.error else ""
        raise KafkaError(f"{what}: topic '{topic}' does not exist on {servers}{reason}")
    return sorted(found.partitions)


def _stage_of(plugin: KafkaSource | KafkaSink, context: JobContext | TaskContext) -> str:
    """The stage's name for messages: the job's name for it, else the default one."""
    return context.stage or plugin.stage_name


# --- the source --------------------------------------------------------------------------


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


#: The source consumers' ``fetch.wait.max.ms`` unless configured (see KafkaSource._config).
_FETCH_WAIT_MS = 10
#: How long a read blocks in one ``poll`` before it looks at its deadline again.
_POLL_SLICE_S = 0.1
#: How many idle partition readers one Python worker keeps (the oldest is closed first).
_READERS_KEPT = 64
#: Seconds a kept partition reader may go unused before it is closed.
_READER_IDLE_S = 30.0
#: How long the driver's watcher may lag behind a ListOffsets answer before
#: latest_offsets lists at every look (it is reading a backlog).
_WATCHER_CATCH_UP_S = 0.5


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

#: Most records a driver's watcher keeps for the reads of its process.
_FOLLOWED_KEPT = 100_000


class _Span:
    """What a watcher read of one partition: every record from ``first`` to ``reached``."""

    def __init__(self, first: int) -> None:
        self.first = self.reached = first
        self.offsets: list[int] = []
        self.messages: list[Any] = []


class _Followed:
    """The records a driver's watcher read, kept for reads in the same process.

    The in-process engine reads a micro-batch's ranges on the driver, just
    after the watcher read the same records (that is how the batch's ends were
    known): a read takes them from here, with no consumer and no fetch to
    wait for (a partition reader fetches every ``fetch.wait.max.ms``, and
    five of them kept Tansu busy). A range not wholly here (read on an
    executor, before the watcher started, or after it dropped records over
    :data:`_FOLLOWED_KEPT`) is read by a partition reader as before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[int, _Span] = {}
        self._kept = 0

    def follow(self, partition: int, offset: int) -> None:
        """Keep ``partition``'s records from ``offset`` on (what the watcher reads next)."""
        with self._lock:
            old = self._spans.pop(partition, None)
            self._kept -= len(old.offsets) if old else 0
            self._spans[partition] = _Span(offset)

    def add(self, partition: int, message: Any, reached: int) -> None:
        """Note the watcher's next event of ``partition``: a record (or None: an EOF)."""
        with self._lock:
            span = self._spans.get(partition)
            if span is None:
                return
            if message is not None and reached > span.first:
                if self._kept >= _FOLLOWED_KEPT:  # keep none until the job catches up
                    self._drop_all()
                    return
                span.offsets.append(reached - 1)
                span.messages.append(message)
                self._kept += 1
            span.reached = max(span.reached, reached)

    def _drop_all(self) -> None:
        self._spans.clear()
        self._kept = 0

    def prune(self, partition: int, below: int, position: int) -> None:
        """Forget records below ``below``; follow anew from ``position`` if dropped."""
        with self._lock:
            span = self._spans.get(partition)
            if span is None:
                self._spans[partition] = _Span(position)
                return
            cut = bisect.bisect_left(span.offsets, below)
            del span.offsets[:cut], span.messages[:cut]
            self._kept -= cut
            span.first = max(span.first, below)

    def take(self, partition: int, start: int, end: int) -> list[Any] | None:
        """The records of ``[start, end)`` if every one of them is here, else None."""
        with self._lock:
            span = self._spans.get(partition)
            if span is None or not span.first <= start or end > span.reached:
                return None
            lo = bisect.bisect_left(span.offsets, start)
            hi = bisect.bisect_left(span.offsets, end)
            return span.messages[lo:hi]


#: Each driver source's kept records, by the source's token (its copies on the
#: in-process engine find them here); gone with the driver's source.
_FOLLOWED: weakref.WeakValueDictionary[str, _Followed] = weakref.WeakValueDictionary()


class KafkaSource(Source):
    """Reads a Kafka topic as an unbounded, replayable source (Jet's ``KafkaSources.kafka``).

    Offsets are kept in the job's checkpoint as ``{"<partition>": offset}``:
    each micro-batch reads, per partition, the records from its start offset
    to the topic's end offsets when it was planned, on executors, so a
    replayed batch reads the same records and every guarantee holds.

    - ``topic``: the topic to read.
    - ``bootstrap_servers``: ``"host:port,..."``; defaults to
      ``[plugins.kafka] bootstrap_servers``.
    - ``start``: where a job without a checkpoint starts: ``"earliest"`` (every
      record kept), ``"latest"`` (records produced after the job started) or a
      timestamp in milliseconds since the epoch (the first record at or after
      it, per partition). Partitions added later are read from their start.
    - ``value_deserializer``: bytes (or ``None``) to item; JSON by default.
    - ``key_deserializer``: when given, items are ``(key, value)`` tuples.
    - ``config``: more librdkafka consumer settings (``security.protocol``...).
      ``isolation.level`` is ``read_committed``: records of aborted
      transactions are never read.
    - ``commit_group``: a consumer group to commit the offsets each planned
      micro-batch starts at, for lag tools only (off by default; sparkjet
      never reads them back).
    """

    kind = "kafka"
    guarantees = ALL_GUARANTEES
    streaming = True
    accepts_start = True  # latest_offsets follows the topic from where the next batch starts

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str | None = None,
        *,
        start: str | int = "earliest",
        value_deserializer: Callable[[bytes | None], Any] = json_deserializer,
        key_deserializer: Callable[[bytes | None], Any] | None = None,
        config: Mapping[str, Any] | None = None,
        commit_group: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        metadata_refresh: float = DEFAULT_METADATA_REFRESH_S,
    ) -> None:
        super().__init__(topic)
        _confluent_kafka()  # without the extra, say so now
        if not (start in _START_POSITIONS or (isinstance(start, int) and start >= 0)):
            raise ValueError(
                f"KafkaSource({topic!r}): start must be 'earliest', 'latest' or a timestamp "
                f"in milliseconds, got {start!r}"
            )
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.start = start
        self.value_deserializer = value_deserializer
        self.key_deserializer = key_deserializer
        self.config = dict(config or {})
        self.commit_group = commit_group
        self.timeout = timeout
        self.metadata_refresh = metadata_refresh
        self._consumer: Any = None
        #: On the driver: a consumer following every partition (see wait_for_data), and
        #: per partition the offset it has seen records or the end up to.
        self._watcher: Any = None
        self._watched: dict[int, int] = {}
        #: Whether the watcher met an error (not an EOF): latest_offsets then lists afresh.
        self._watch_failed = False
        #: On the driver: the last ListOffsets answer, and when it came (see latest_offsets).
        self._listed: dict[int, int] = {}
        self._listed_at = 0.0
        #: The records the watcher read, for reads in this process (see _Followed);
        #: found by copies of this source through the token.
        self._token = uuid.uuid4().hex
        self._followed: _Followed | None = None
        self._partitions: list[int] = []
        self._partitions_at = 0.0
        #: On executors, per descriptor read: where runs of consecutive offsets start,
        #: ``[(index, offset), ...]`` (see :meth:`offset_of`).
        self._runs: dict[tuple[int, int, int], list[tuple[int, int]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # driver-only, not picklable; executor-only
        state.update(_consumer=None, _watcher=None, _watched={}, _watch_failed=False,
                     _listed={}, _listed_at=0.0, _followed=None, _runs={})
        return state

    @property
    def stage_name(self) -> str:
        """The stage name this source gets: ``from-kafka(<topic>)``."""
        return f"from-{self.kind}({self.name})"

    def _config(
        self, context: JobContext | TaskContext, group: str | None = None
    ) -> dict[str, Any]:
        config = _client_config(self.bootstrap_servers, self.config, context.options,
                                _stage_of(self, context))
        config.setdefault("group.id", group or self.commit_group or f"sparkjet-{self.topic}")
        config.update({
            "allow.auto.create.topics": False,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # A range the partition no longer (or never) held is an error, never
            # a silent jump to other records (see _records).
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

    # --- driver ---------------------------------------------------------------------

    def _driver_consumer(self, context: JobContext) -> Any:
        if self._consumer is None:
            self._consumer = _confluent_kafka().Consumer(self._config(context))
        return self._consumer

    def _servers(self, context: JobContext) -> str:
        return str(self._config(context)["bootstrap.servers"])

    def _partition_ids(self, context: JobContext) -> list[int]:
        """The topic's partitions, refreshed every ``metadata_refresh`` seconds."""
        now = time.monotonic()
        if not self._partitions or now - self._partitions_at >= self.metadata_refresh:
            self._partitions = _topic_partitions(
                self._driver_consumer(context), self.topic, self._servers(context),
                self.timeout, _stage_of(self, context), by_name=True,
            )
            self._partitions_at = now
        return self._partitions

    def _list_offsets(
        self, context: JobContext, partitions: Sequence[int], timestamp: int
    ) -> dict[int, int]:
        """One ListOffsets request: ``-2`` earliest, ``-1`` latest, else by timestamp."""
        ck = _confluent_kafka()
        asked = [ck.TopicPartition(self.topic, p, timestamp) for p in partitions]
        try:
            answered = self._driver_consumer(context).offsets_for_times(
                asked, timeout=self.timeout
            )
        except ck.KafkaException as exc:
            self._partitions = []  # look again next time
            raise KafkaError(
                f"{_stage_of(self, context)}: cannot list the offsets of topic '{self.topic}' at "
                f"{self._servers(context)} within {self.timeout:g} s: "
                f"{_describe_kafka_error(exc)}"
            ) from exc
        for tp in answered:
            if tp.error is not None:
                raise KafkaError(
                    f"{_stage_of(self, context)}: listing offsets of {self.topic}/{tp.partition} "
                    f"failed: {tp.error.str()}"
                )
        return {tp.partition: tp.offset for tp in answered}

    def _ends(self, context: JobContext, partitions: Sequence[int]) -> dict[int, int]:
        return self._list_offsets(context, partitions, -1)

    def initial_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: the start offset of every partition (``start``)."""
        partitions = self._partition_ids(context)
        if self.start == "earliest":
            found = self._list_offsets(context, partitions, -2)
        elif self.start == "latest":
            found = self._ends(context, partitions)
        else:
            found = self._from_timestamp(context, partitions, int(self.start))
        return {str(p): found[p] for p in partitions}

    def _from_timestamp(
        self, context: JobContext, partitions: Sequence[int], timestamp: int
    ) -> dict[int, int]:
        """The first offset at or after ``timestamp`` per partition (the end if none).

        Brokers answer at record-batch granularity (Tansu does), so the answer
        is a lower bound: records before it in its batch are skipped here.
        """
        ck = _confluent_kafka()
        ends = self._ends(context, partitions)
        found = self._list_offsets(context, partitions, timestamp)
        result: dict[int, int] = {}
        readers: list[_PartitionReader] = []
        config = self._config(context)
        try:
            for p in partitions:
                offset = found[p] if found[p] >= 0 else ends[p]
                reader = _PartitionReader(ck.Consumer(config), self.topic, p)
                readers.append(reader)
                for record in self._records(reader, offset, ends[p],
                                            _stage_of(self, context)):
                    if record.timestamp()[1] >= timestamp:
                        offset = record.offset()
                        break
                else:
                    offset = max(offset, ends[p])
                result[p] = offset
        finally:
            for reader in readers:
                reader.close()
        return result

    def latest_offsets(self, context: JobContext, start: Any = None) -> Any:
        """Runs on the driver: how far every partition's committed records go.

        Under ``read_committed`` that is the last stable offset: records of
        open transactions wait for their commit or abort. The watcher (see
        :meth:`wait_for_data`) follows every partition from ``start`` (where
        the next micro-batch starts), so the answer is where it has read up
        to, with no request: a ``ListOffsets`` request took 7-25 ms of each
        micro-batch on a busy broker, and Tansu answers it with the start of
        a partition's last record batch, hiding the batch's other records.
        ``ListOffsets`` is still asked every ``metadata_refresh`` seconds, for
        a partition the watcher does not follow yet, while the watcher lags
        behind the last answer for :data:`_WATCHER_CATCH_UP_S` (a backlog), and
        after the watcher met an error (then alone, so a topic deleted and
        made anew shows as offsets going back).
        """
        partitions = self._partition_ids(context)
        now = time.monotonic()
        if not isinstance(start, Mapping) or not start:
            return self._listing(context, partitions, now)
        starts = {p: int(start.get(str(p), 0)) for p in partitions}
        self._follow(context, starts)
        self._take_watched(0.0)
        if self._followed is not None:  # what batches before this one read is not read again
            for p, offset in starts.items():
                self._followed.prune(p, offset, self._watched[p])
        if self._watch_failed:
            self._unwatch()
            return self._listing(context, partitions, now)
        watched, listed = self._watched, self._listed
        age = now - self._listed_at
        behind = any(watched[p] < listed.get(p, 0) for p in partitions)
        if (age >= self.metadata_refresh or any(p not in listed for p in partitions)
                or (behind and age >= _WATCHER_CATCH_UP_S)):
            listed = self._list_ends(context, partitions, now)
        # Both are committed ends seen at some moment: the larger is the later.
        return {str(p): max(watched[p], listed[p]) for p in partitions}

    def _listing(self, context: JobContext, partitions: Sequence[int], now: float) -> Any:
        """The ends from one ``ListOffsets`` request alone."""
        ends = self._list_ends(context, partitions, now)
        return {str(p): ends[p] for p in partitions}

    def _list_ends(
        self, context: JobContext, partitions: Sequence[int], now: float
    ) -> dict[int, int]:
        self._listed, self._listed_at = self._ends(context, partitions), now
        return self._listed

    def _follow(self, context: JobContext, offsets: Mapping[int, int]) -> None:
        """Have the watcher follow every partition of ``offsets`` (a new one from there)."""
        ck = _confluent_kafka()
        if self._watcher is None:
            self._watcher = ck.Consumer(self._config(context))
            self._followed = _FOLLOWED[self._token] = _Followed()
        new = [p for p in offsets if p not in self._watched]
        if new:
            self._watcher.incremental_assign(
                [ck.TopicPartition(self.topic, p, offsets[p]) for p in new])
            self._watched.update({p: offsets[p] for p in new})
            for p in new:
                self._followed.follow(p, offsets[p])  # type: ignore[union-attr]

    def _unwatch(self) -> None:
        """Close the watcher: the next look starts a new one from the job's offsets."""
        watcher, self._watcher = self._watcher, None
        self._watched, self._watch_failed = {}, False
        _FOLLOWED.pop(self._token, None)
        self._followed = None
        if watcher is not None:
            with contextlib.suppress(Exception):
                watcher.close()

    def close(self, context: JobContext) -> None:
        """Runs on the driver when the job stops running: close the watcher and the consumer.

        Neither would otherwise go on fetching (and reconnecting to a broker
        that went away) for as long as the process lives; a resumed job opens
        them again from its checkpoint's offsets.
        """
        self._unwatch()
        consumer, self._consumer = self._consumer, None
        self._listed, self._listed_at = {}, 0.0
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()

    def _take_watched(self, wait: float) -> bool:
        """Note what the watcher fetched; if nothing, block up to ``wait`` s for the next.

        False when nothing came. An error of a partition (its offsets out of
        range, the topic gone) sets :attr:`_watch_failed` and counts as
        something: let :meth:`latest_offsets` see (and name) what is wrong.
        Other errors (a broker unreachable for a while) librdkafka retries:
        the positions stand still, and the periodic ``ListOffsets`` fails the
        job if the brokers stay away.
        """
        ck = _confluent_kafka()
        failed = {ck.KafkaError._AUTO_OFFSET_RESET, ck.KafkaError.OFFSET_OUT_OF_RANGE,
                  ck.KafkaError.UNKNOWN_TOPIC_OR_PART, ck.KafkaError._UNKNOWN_PARTITION,
                  ck.KafkaError._UNKNOWN_TOPIC}
        watcher, followed, came = self._watcher, self._followed, False
        while True:
            messages = watcher.consume(num_messages=10_000, timeout=0)
            if not messages:
                if came or wait <= 0:
                    return came
                message = watcher.poll(wait)
                if message is None:
                    return False
                messages = [message]
            came = True
            for message in messages:
                error = message.error()
                if error is None:
                    reached = message.offset() + 1
                elif error.code() == ck.KafkaError._PARTITION_EOF:
                    reached = message.offset()
                elif error.code() in failed:
                    self._watch_failed = True
                    return True
                else:
                    continue
                p = message.partition()
                self._watched[p] = max(self._watched.get(p, 0), reached)
                if followed is not None:
                    followed.add(p, message if error is None else None, reached)
            if len(messages) < 10_000:
                return True

    def wait_for_data(self, offsets: Any, timeout: float, context: JobContext) -> bool:
        """Runs on the driver: wake as soon as a partition has a record past ``offsets``.

        A watcher consumer on the driver, assigned to every partition from
        where the job stood when it first looked, follows the topic (under the
        source's isolation level, so a record counts once it is committed) and
        notes how far each partition went; it blocks in ``poll``, never spins.
        Without it the job looked at the end offsets every 50 ms: 25 ms of
        waiting per record on average. A True may be spurious (a transaction
        marker moves the end too); the job then asks :meth:`latest_offsets`.
        """
        if not isinstance(offsets, Mapping) or not offsets:
            return super().wait_for_data(offsets, timeout, context)
        wanted = {int(p): int(o) for p, o in offsets.items()}
        self._follow(context, wanted)
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if self._watch_failed or any(self._watched[p] > o for p, o in wanted.items()):
                return True
            if not self._take_watched(deadline - time.monotonic()):
                return False

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: ``(partition, start, end)`` per partition with new records.

        A partition that ``start`` does not have (added to the topic since) is
        read from offset 0, that is from its beginning.
        """
        ranges = []
        for key in sorted(end, key=int):
            first, last = int(start.get(key, 0)), int(end[key])
            if last > first:
                ranges.append((int(key), first, last))
        if self.commit_group:
            self._commit_for_lag_tools(start, context)
        return ranges

    def _commit_for_lag_tools(self, start: Any, context: JobContext) -> None:
        """Commit where this batch starts: what the previous batches consumed."""
        ck = _confluent_kafka()
        offsets = [ck.TopicPartition(self.topic, int(p), int(o)) for p, o in start.items()]
        try:
            self._driver_consumer(context).commit(offsets=offsets, asynchronous=True)
        except ck.KafkaException as exc:  # informational only: never fail the job for it
            context.logger.warning(
                "%s: committing offsets for group %s failed: %s",
                _stage_of(self, context), self.commit_group, _describe_kafka_error(exc),
            )

    def watermark_partition(self, descriptor: Any) -> str:
        """``<topic>/<partition>``: the Kafka partition a descriptor reads."""
        return f"{self.topic}/{descriptor[0]}"

    def watermark_partitions(self, offsets: Any) -> Sequence[str]:
        """Every partition the topic has at ``offsets``."""
        return [f"{self.topic}/{p}" for p in sorted(offsets, key=int)]

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """A topic has no batch plan: streaming jobs call :meth:`plan_range`."""
        raise NotImplementedError("KafkaSource is read by streaming jobs only")

    # --- executors ------------------------------------------------------------------

    def _records(
        self, reader: _PartitionReader, start: int, end: int, what: str
    ) -> Iterator[Any]:
        """The records of ``[start, end)``; offsets may skip (transaction markers, compaction).

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
        consumer, partition = reader.consumer, reader.partition
        fresh = reader.seek(start)
        deadline = time.monotonic() + self.timeout
        first = True
        want = start  # the next offset this read needs
        try:
            while True:
                batch = consumer.consume(num_messages=min(max(end - want, 1), 10_000), timeout=0)
                if not batch:
                    message = consumer.poll(min(_POLL_SLICE_S, max(deadline - time.monotonic(), 0)))
                    if message is None:
                        if time.monotonic() > deadline:
                            self._check_held(consumer, partition, start, end, what)
                            raise KafkaError(
                                f"{what}: reading {self.topic}/{partition} offsets "
                                f"{start}..{end}: no record for {self.timeout:g} s"
                            )
                        continue
                    batch = [message]
                deadline = time.monotonic() + self.timeout
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
                            self._check_held(consumer, partition, start, end, what)
                        elif not fresh:
                            # Left in a kept reader's queue while it waited between
                            # reads (a broker restart...): start this read afresh, once.
                            reader.assign(want)
                            fresh = True
                            break
                        reader.next = None
                        raise KafkaError(
                            f"{what}: reading {self.topic}/{partition} at offset "
                            f"{start}..{end}: {error.str()}"
                        )
                    offset = message.offset()
                    reader.next = offset + 1
                    if first and offset > start:
                        # Offsets may skip (markers, compaction), but not below the
                        # log start: records deleted before the job read them. (The
                        # record came, so the end is not in question: Tansu reports
                        # it short, the start of its last record batch + 1.)
                        self._check_held(consumer, partition, start, end, what,
                                         past_end=False)
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
        self, consumer: Any, partition: int, start: int, end: int, what: str,
        *, past_end: bool = True,
    ) -> None:
        """Raise :class:`KafkaError` if the partition does not hold ``[start, end)``.

        ``past_end`` False: only the start is checked.

        Records below the partition's log start were deleted (retention,
        DeleteRecords) before the job read them; offsets past its end belong
        to a topic that was deleted and made anew. Either would be data
        silently lost or replaced, so the stage fails naming the range.
        """
        low, high = consumer.get_watermark_offsets(
            _confluent_kafka().TopicPartition(self.topic, partition), timeout=self.timeout)
        where = f"{what}: reading {self.topic}/{partition} offsets {start}..{end}"
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

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: the items of one partition's offset range, in order."""
        p, start, end = partition
        what = _stage_of(self, context)
        followed = _FOLLOWED.get(self._token)
        kept = followed.take(p, start, end) if followed is not None else None
        reader: _PartitionReader | None = None
        records: Iterable[Any] | None = kept
        if records is None:
            key, reader = _READERS.take(self._config(context), self.topic, p)
            records = self._records(reader, start, end, what)
        items: list[Any] = []
        runs: list[tuple[int, int]] = []
        ok = False
        try:
            value_of, key_of = self.value_deserializer, self.key_deserializer
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
                        f"{self.topic}/{p} offset {message.offset()}: {exc!r}"
                    ) from exc
            ok = True
        finally:
            if reader is not None and ok:
                _READERS.give_back(key, reader)
            elif reader is not None:
                reader.close()
        if len(self._runs) >= _RUNS_KEPT:
            self._runs.clear()
        self._runs[(p, start, end)] = runs
        return items

    def offset_of(self, descriptor: Any, index: int) -> Any:
        """Runs on an executor: the Kafka offset of the ``index``-th record ``descriptor`` read.

        Offsets skip transaction markers and compacted records, so :meth:`read`
        notes where they skip. None for a descriptor not read here.
        """
        p, start, end = descriptor
        runs = self._runs.get((p, start, end))
        if not runs:
            return None
        first, offset = runs[bisect.bisect_right(runs, (index, 2**63)) - 1]
        return offset + index - first


def _kafka_error_in(exc: BaseException) -> Any:
    """The librdkafka error behind ``exc`` (its causes and contexts too), or None.

    librdkafka raises a fatal error (a fenced producer) from inside a delivery
    callback too, where Python reports it as the context of another error.
    """
    ck = _confluent_kafka()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ck.KafkaException) and current.args:
            return current.args[0]
        current = current.__cause__ or current.__context__
    return None


# --- the sink ----------------------------------------------------------------------------


class KafkaSink(Sink):
    """Produces each item to a Kafka topic (Jet's ``KafkaSinks.kafka``).

    - ``topic``: the topic to write; it must exist.
    - ``bootstrap_servers``: as for :class:`KafkaSource`.
    - ``value_serializer``: item (or its value) to bytes; JSON by default.
    - ``key``: a function of the item giving its record key (records with
      equal keys go to one partition); without it records have no key.
    - ``key_serializer``: key to bytes; ``str(key)`` in UTF-8 by default.
    - ``config``: more librdkafka producer settings.
    - ``transactional_id``: the id of the ``EXACTLY_ONCE`` producer; by
      default ``sparkjet-<job id>.<stage>``, the same for every driver of the
      job, so each new one fences the previous.

    Under ``NONE`` and ``AT_LEAST_ONCE`` every executor produces its partition
    with an idempotent producer and waits for the brokers' acknowledgements
    before the micro-batch counts as written. Under ``EXACTLY_ONCE`` executors
    serialize the records and the driver produces them in one transaction per
    micro-batch, together with the batch id, which it reads back before
    committing: a replayed batch is a no-op.
    """

    kind = "kafka"
    guarantees = ALL_GUARANTEES

    def __init__(
        self,
        topic: str,
        bootstrap_servers: str | None = None,
        *,
        value_serializer: Callable[[Any], bytes] = json_serializer,
        key: Callable[[Any], Any] | None = None,
        key_serializer: Callable[[Any], bytes] | None = None,
        config: Mapping[str, Any] | None = None,
        transactional_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(topic)
        _confluent_kafka()  # without the extra, say so now
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.value_serializer = value_serializer
        self.key = key
        self.key_serializer = key_serializer
        self.config = dict(config or {})
        self.transactional_id = transactional_id
        self.timeout = timeout
        self._checked = False
        self._producer: Any = None
        self._producer_id: str | None = None
        self._group_consumers: dict[str, Any] = {}
        self._next_batch: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_producer=None, _group_consumers={}, _next_batch={})  # driver-only
        return state

    @property
    def stage_name(self) -> str:
        """The stage name this sink gets: ``to-kafka(<topic>)``."""
        return f"to-{self.kind}({self.name})"

    def _config(self, context: JobContext | TaskContext) -> dict[str, Any]:
        return _client_config(self.bootstrap_servers, self.config, context.options,
                              _stage_of(self, context))

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver: checks the topic once; says how executors write."""
        if not self._checked:
            config = self._config(context)
            admin = _confluent_kafka().admin.AdminClient(config)
            _topic_partitions(
                admin, self.topic, config["bootstrap.servers"], self.timeout,
                _stage_of(self, context),
                by_name=False,
            )
            self._checked = True
        transactional = context.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
        return "transactional" if transactional else "direct"

    def _serialize(self, items: Iterator[Any], what: str) -> list[tuple[bytes | None, bytes]]:
        records: list[tuple[bytes | None, bytes]] = []
        key_of, value_of = self.key, self.value_serializer
        key_bytes = self.key_serializer or (lambda k: str(k).encode("utf-8"))
        for item in items:
            try:
                key = None if key_of is None else key_bytes(key_of(item))
                records.append((key, value_of(item)))
            except Exception as exc:
                raise KafkaError(
                    f"{what}: cannot serialize item {item!r}: {exc!r}"
                ) from exc
        return records

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: produce and flush (``direct``), or serialize for the driver."""
        what = _stage_of(self, context)
        records = self._serialize(items, what)
        if state == "transactional":
            return records
        config = self._config(context)
        config.setdefault("enable.idempotence", True)
        key, producer = _PRODUCERS.take(config)
        # Given back only when every record was acknowledged: a producer that failed
        # (a fatal error, unacknowledged records) is dropped.
        self._produce_all(producer, records, config["bootstrap.servers"], what)
        _PRODUCERS.give_back(key, producer)
        return len(records)

    def _produce_all(
        self, producer: Any, records: list[tuple[bytes | None, bytes]], servers: str, what: str
    ) -> None:
        errors: list[Any] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                errors.append(error)

        for key, value in records:
            while True:
                try:
                    producer.produce(self.topic, value, key, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.05)
        left = producer.flush(self.timeout)
        if errors or left:
            reason = errors[0].str() if errors else f"{left} records not acknowledged"
            cause = _confluent_kafka().KafkaException(errors[0]) if errors else None
            raise KafkaError(
                f"{what}: producing to topic '{self.topic}' at {servers} failed "
                f"within {self.timeout:g} s: {reason}"
            ) from cause

    # --- EXACTLY_ONCE on the driver ---------------------------------------------------

    def _transactional_producer(self, context: JobContext) -> Any:
        ck = _confluent_kafka()
        txid = self.transactional_id or f"sparkjet-{context.writer_id}"
        if self._producer is not None and self._producer_id == txid:
            return self._producer
        config = self._config(context)
        config["transactional.id"] = txid
        # A batch's records go out as they are produced, while the batch id's
        # offset commit is sent: nothing waits for more records to come.
        config.setdefault("linger.ms", 0)
        producer = ck.Producer(config)
        try:
            producer.init_transactions(self.timeout)  # fences the previous driver's producer
        except ck.KafkaException as exc:
            raise KafkaError(
                f"{_stage_of(self, context)}: cannot start transactional id '{txid}' at "
                f"{config['bootstrap.servers']}: {_describe_kafka_error(exc)}"
            ) from exc
        self._producer, self._producer_id = producer, txid
        self._next_batch.clear()  # read what is committed afresh
        return producer

    def _group(self, context: JobContext) -> str:
        """The consumer group whose offset is this checkpoint's next batch id."""
        return f"sparkjet-sink.{context.producer_id}"

    def _group_consumer(self, context: JobContext, group: str) -> Any:
        consumer = self._group_consumers.get(group)
        if consumer is None:
            config = self._config(context)
            config.update({"group.id": group, "enable.auto.commit": False,
                           "isolation.level": "read_committed"})
            consumer = _confluent_kafka().Consumer(config)
            self._group_consumers[group] = consumer
        return consumer

    def committed_batches(self, context: JobContext) -> int:
        """How many micro-batches of ``context``'s checkpoint are committed (next batch id)."""
        ck = _confluent_kafka()
        group = self._group(context)
        if group not in self._next_batch:
            consumer = self._group_consumer(context, group)
            try:
                found = consumer.committed(
                    [ck.TopicPartition(self.topic, 0)], timeout=self.timeout
                )
            except ck.KafkaException as exc:
                raise KafkaError(
                    f"{_stage_of(self, context)}: cannot read the committed batch of group "
                    f"'{group}': {_describe_kafka_error(exc)}"
                ) from exc
            self._next_batch[group] = max(0, found[0].offset)
        return self._next_batch[group]

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: nothing (``direct``) or one transaction per micro-batch."""
        if state != "transactional":
            return
        ck = _confluent_kafka()
        batch = context.batch_id if context.batch_id is not None else 0
        producer = self._transactional_producer(context)
        group = self._group(context)
        if batch < self.committed_batches(context):
            context.logger.info(
                "%s: micro-batch %d was committed to Kafka before: not again",
                _stage_of(self, context), batch,
            )
            return
        try:
            producer.begin_transaction()
            # No delivery callbacks and no flush: commit_transaction flushes, and
            # fails (abortably) if any record was not delivered. The records are
            # in flight while the batch id is added; a callback per record took
            # the interpreter's lock once per record.
            for message in messages:
                for key, value in message:
                    while True:
                        try:
                            producer.produce(self.topic, value, key)
                            break
                        except BufferError:  # the local queue is full: let it drain
                            producer.poll(0.05)
            producer.send_offsets_to_transaction(
                [ck.TopicPartition(self.topic, 0, batch + 1)],
                self._group_consumer(context, group).consumer_group_metadata(),
                self.timeout,
            )
            producer.commit_transaction(self.timeout)
        except Exception as exc:
            self._fail(producer, exc, batch, _stage_of(self, context))
        self._next_batch[group] = batch + 1

    def _fail(self, producer: Any, exc: Exception, batch: int, what: str) -> None:
        ck = _confluent_kafka()
        self._producer = None  # a fresh producer (and a fresh read of the batch) next time
        self._next_batch.clear()
        error = _kafka_error_in(exc)
        fenced_codes = {ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED,
                        ck.KafkaError.INVALID_PRODUCER_EPOCH}
        if error is not None and error.code() in fenced_codes:
            raise KafkaFencedError(
                f"{what}: transactional id '{self._producer_id}' was fenced by a "
                f"newer producer (another driver of this job took over): micro-batch {batch} "
                "is not committed by this one"
            ) from exc
        if error is not None and error.txn_requires_abort():
            # If this fails too, the next producer's init_transactions aborts it.
            with contextlib.suppress(ck.KafkaException):
                producer.abort_transaction(self.timeout)
        if isinstance(exc, KafkaError):
            raise exc
        raise KafkaError(
            f"{what}: committing micro-batch {batch} to topic '{self.topic}' "
            f"failed: {_describe_kafka_error(exc)}"
        ) from exc

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: nothing was made visible by a failed batch's ``write``.

        Under ``EXACTLY_ONCE`` the records wait in the messages; under the
        other guarantees they were produced and stay (at least once).
        """


@hookimpl
def register_sources(register: Any) -> None:
    """Register the Kafka source."""
    register(KafkaSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the Kafka sink."""
    register(KafkaSink)
