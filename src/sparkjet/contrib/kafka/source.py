"""The Kafka source: a topic's partitions read by offset ranges kept in the checkpoint.

:class:`KafkaSource` plans, on the driver, each micro-batch's ``(partition,
start, end)`` ranges from where its watcher (:mod:`~sparkjet.contrib.kafka.watcher`)
or a ``ListOffsets`` request saw the topic end, and reads them on executors
through kept partition readers (:mod:`~sparkjet.contrib.kafka.readers`), or
from the records the watcher read when the range is read in the driver's
process, so a replayed micro-batch reads exactly the same records.
"""

from __future__ import annotations

import bisect
import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sparkjet.contrib.kafka.clients import (
    DEFAULT_METADATA_REFRESH_S,
    DEFAULT_TIMEOUT_S,
    KafkaError,
    _client_config,
    _confluent_kafka,
    _describe_kafka_error,
    _stage_of,
    _topic_partitions,
    json_deserializer,
)
from sparkjet.contrib.kafka.readers import (
    _READERS,
    _consumer_settings,
    _deserialized,
    _first_at,
    _PartitionReader,
    _read_range,
)
from sparkjet.contrib.kafka.watcher import _FOLLOWED, _Followed, _take_watched
from sparkjet.plugin import ALL_GUARANTEES, JobContext, Source, TaskContext

_START_POSITIONS = ("earliest", "latest")
#: How many descriptors' offset runs a source keeps on an executor (for dead letters,
#: asked right after the read).
_RUNS_KEPT = 64
#: How long the driver's watcher may lag behind a ListOffsets answer before
#: latest_offsets lists at every look (it is reading a backlog).
_WATCHER_CATCH_UP_S = 0.5


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
        return _consumer_settings(config)

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
                result[p] = _first_at(reader, offset, ends[p], timestamp, self.timeout,
                                      _stage_of(self, context))
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
        something: let :meth:`latest_offsets` see (and name) what is wrong
        (see :func:`~sparkjet.contrib.kafka.watcher._take_watched`).
        """
        came, failed = _take_watched(self._watcher, self._watched, self._followed, wait)
        if failed:
            self._watch_failed = True
        return came


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
            records = _read_range(reader, start, end, self.timeout, what)
        ok = False
        try:
            items, runs = _deserialized(records, self.value_deserializer,
                                        self.key_deserializer, what, f"{self.topic}/{p}")
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
