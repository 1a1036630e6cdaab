"""The sink conformance kit (sparkjet.testing.SinkConformance) run for the built-in sinks.

The store's stream, list and map sinks, and the file sink on a local folder
and on S3 (moto's server on 127.0.0.1). The Kafka sink runs it in
tests/test_sink_conformance_kafka.py, against a real broker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.contrib.files import FileSink, read_committed
from sparkjet.pipeline import Pipeline
from sparkjet.testing import SinkConformance, SinkHarness, StoreLocation
from tests.test_files import with_files_plugin


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


class TestFileSinkOnAFolder(SinkConformance):
    @pytest.fixture
    def harness(self, client: sparkjet.Client, tmp_path: Path) -> SinkHarness:
        out = str(tmp_path / "out")
        return SinkHarness(with_files_plugin(client), new_sink=lambda: FileSink(out),
                           read=lambda: read_committed(out))


class TestParquetFileSinkOnS3(SinkConformance):
    @pytest.fixture
    def harness(self, client: sparkjet.Client, s3_location: StoreLocation) -> SinkHarness:
        where = s3_location.fresh()
        out, options = f"{where.url}/out", where.options

        return SinkHarness(
            with_files_plugin(client),
            new_sink=lambda: FileSink(out, "parquet", storage_options=options),
            read=lambda: read_committed(out, "parquet", options),
        )
