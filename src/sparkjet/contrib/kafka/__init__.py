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

The package's modules: :mod:`~sparkjet.contrib.kafka.source` (the source),
:mod:`~sparkjet.contrib.kafka.watcher` (the driver's watcher of its topic and
the records it read), :mod:`~sparkjet.contrib.kafka.readers` (the partition
readers and client pools of the executors, reading an offset range),
:mod:`~sparkjet.contrib.kafka.sink` (the sink) and
:mod:`~sparkjet.contrib.kafka.clients` (what they share: configuration,
errors, serializers). This module is the plugin the ``kafka`` entry point
names: it registers the source and sink.
"""

from __future__ import annotations

from typing import Any

from sparkjet.contrib.kafka.clients import (
    DEFAULT_METADATA_REFRESH_S as DEFAULT_METADATA_REFRESH_S,
)
from sparkjet.contrib.kafka.clients import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
from sparkjet.contrib.kafka.clients import (
    KafkaError,
    KafkaFencedError,
    json_deserializer,
    json_serializer,
)

# The worker's pools and the driver sources' kept records, one each per process:
# reachable here as before the split (the tests look into them).
from sparkjet.contrib.kafka.readers import _PRODUCERS as _PRODUCERS
from sparkjet.contrib.kafka.readers import _READERS as _READERS
from sparkjet.contrib.kafka.sink import KafkaSink
from sparkjet.contrib.kafka.source import KafkaSource
from sparkjet.contrib.kafka.watcher import _FOLLOWED as _FOLLOWED
from sparkjet.plugin import hookimpl

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

# Their public home is this module: ``sparkjet plugins`` names the classes
# sparkjet.contrib.kafka.KafkaSource and .KafkaSink, and pickles (of a source or
# sink, with its default serializer; of an error raised on an executor) refer
# to them here, as before the module became a package.
KafkaSource.__module__ = __name__
KafkaSink.__module__ = __name__
KafkaError.__module__ = __name__
KafkaFencedError.__module__ = __name__
json_deserializer.__module__ = __name__
json_serializer.__module__ = __name__


@hookimpl
def register_sources(register: Any) -> None:
    """Register the Kafka source."""
    register(KafkaSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the Kafka sink."""
    register(KafkaSink)
