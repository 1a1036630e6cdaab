"""The sink conformance kit (sparkjet.testing.SinkConformance) run for the built-in sinks.

The store's stream, list and map sinks.
"""

from __future__ import annotations

from typing import Any

import pytest

import sparkjet
from sparkjet.pipeline import Pipeline
from sparkjet.testing import SinkConformance, SinkHarness


class TestStreamSink(SinkConformance):
    @pytest.fixture
    def harness(self, client: sparkjet.Client) -> SinkHarness:
        stream = client.get_stream("out", partitions=2)
        return SinkHarness(client, new_sink=lambda: Pipeline.to_stream("out"),
                           read=stream.read_all)


class TestListSink(SinkConformance):
    @pytest.fixture
    def harness(self, client: sparkjet.Client) -> SinkHarness:
        return SinkHarness(client, new_sink=lambda: Pipeline.to_list("out"),
                           read=client.get_list("out").get_all)


class TestMapSink(SinkConformance):
    """Read back as the map's committed upserts, not the folded map: a put twice shows twice."""

    @pytest.fixture
    def harness(self, client: sparkjet.Client) -> SinkHarness:
        def committed_puts() -> list[Any]:
            log = client.store.map_log("out")
            out: list[Any] = []
            for record in log.live_records():
                assert record.op == "put", record
                for kind, value in record.parts:
                    out.extend(value if kind == "items" else log.read_segment(value))
            return out

        return SinkHarness(client, new_sink=lambda: Pipeline.to_map("out"),
                           read=committed_puts, item=lambda n: (f"k{n}", n))
