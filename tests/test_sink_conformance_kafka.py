"""The sink conformance kit run for the Kafka sink, against a real Kafka-protocol broker.

The broker is tests/kafka_broker.py's (a Kafka container where Docker
answers, else the Tansu binary as a local process). The kit drives the sink
under EXACTLY_ONCE (one transaction per micro-batch) and reads the topic
with ``read_committed``, as a consumer of a transactional topic must.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import sparkjet
from sparkjet.contrib.kafka import KafkaSink
from sparkjet.testing import SinkConformance, SinkHarness
from tests import kafka_broker
from tests.test_kafka import new_topic, with_kafka


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with kafka_broker.kafka_broker() as servers:
        yield servers


class TestKafkaSink(SinkConformance):
    @pytest.fixture
    def harness(self, client: sparkjet.Client, bootstrap: str) -> SinkHarness:
        topic = new_topic(bootstrap, 2)

        def committed() -> list[Any]:
            return [json.loads(v) for v in kafka_broker.read_all(bootstrap, topic)]

        return SinkHarness(with_kafka(client), new_sink=lambda: KafkaSink(topic, bootstrap),
                           read=committed)
