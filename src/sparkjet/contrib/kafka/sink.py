"""The Kafka sink: records produced from the executors, or in one transaction per batch.

:class:`KafkaSink` produces under ``NONE`` and ``AT_LEAST_ONCE`` from each
executor with an idempotent producer kept across tasks (``_PRODUCERS`` of
:mod:`~sparkjet.contrib.kafka.readers`), and under ``EXACTLY_ONCE`` from the
driver in one Kafka transaction per micro-batch that also commits the batch
id, fenced by a newer driver of the job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sparkjet.contrib.kafka.clients import (
    DEFAULT_TIMEOUT_S,
    KafkaError,
    KafkaFencedError,
    _client_config,
    _confluent_kafka,
    _describe_kafka_error,
    _kafka_error_in,
    _stage_of,
    _topic_partitions,
    json_serializer,
)
from sparkjet.contrib.kafka.readers import _PRODUCERS
from sparkjet.plugin import ALL_GUARANTEES, JobContext, ProcessingGuarantee, Sink, TaskContext


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
