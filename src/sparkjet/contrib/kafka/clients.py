"""The Kafka clients' configuration, errors and their descriptions, serializers.

What the source (:mod:`~sparkjet.contrib.kafka.source`), the sink
(:mod:`~sparkjet.contrib.kafka.sink`) and the partition readers
(:mod:`~sparkjet.contrib.kafka.readers`) share: the exceptions and how a
librdkafka error is described in them, the JSON (de)serializers, importing
confluent-kafka only when a class is used, the librdkafka settings merged from
``[plugins.kafka]`` and the instance's, and a topic's partitions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from sparkjet.errors import SparkjetError
from sparkjet.plugin import JobContext, TaskContext

#: How long a metadata or offsets request may take before the broker counts as unreachable.
DEFAULT_TIMEOUT_S = 10.0
#: How often a source looks for new partitions (latest_offsets runs before each micro-batch).
DEFAULT_METADATA_REFRESH_S = 5.0
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


class _Staged(Protocol):
    """A source or sink, as far as its messages go: the stage name it gets."""

    @property
    def stage_name(self) -> str: ...


def _stage_of(plugin: _Staged, context: JobContext | TaskContext) -> str:
    """The stage's name for messages: the job's name for it, else the default one."""
    return context.stage or plugin.stage_name


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
