"""The sink conformance kit (sparkjet.testing.SinkConformance) run for the built-in sinks.

The store's stream, list and map sinks, and the file sink on a local folder
and on S3 (moto's server on 127.0.0.1). The Kafka sink runs it in
tests/test_sink_conformance_kafka.py, against a real broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sparkjet
from sparkjet.contrib.files import FileSink, read_committed
from sparkjet.pipeline import ListSink, Pipeline
from sparkjet.plugin import AT_LEAST_ONCE_AT_MOST, JobContext, TaskContext
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


# --- the kit catches broken sinks ---------------------------------------------------------


class _ReplayingListSink(ListSink):
    """Commits every call as a new record: a replayed batch lands again."""

    kind = "kit-replaying-list"

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        self.log(context.store).commit(self.record_op, [p for m in messages for p in m],
                                       writer=context.job_id)


class _LosingListSink(ListSink):
    """Commits only the first partition's message."""

    kind = "kit-losing-list"

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        super().commit(state, messages[:1], context)


class _EagerListSink(ListSink):
    """Makes each partition visible as its task writes it: an abort cannot take it back."""

    kind = "kit-eager-list"

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        self.log(context.store).commit(self.record_op, [("items", list(items))],
                                       writer=context.job_id)
        return []


class _AtLeastOnceReplayingListSink(_ReplayingListSink):
    kind = "kit-alo-replaying-list"
    guarantees = AT_LEAST_ONCE_AT_MOST


def _harness(client: sparkjet.Client, sink: type[ListSink]) -> SinkHarness:
    return SinkHarness(client, new_sink=lambda: sink("out"), read=client.get_list("out").get_all)


def test_the_kit_catches_a_replayed_batch_landing_twice(client: sparkjet.Client) -> None:
    kit = SinkConformance()
    with pytest.raises(AssertionError, match=r"committed twice: 6 item\(s\) too many"):
        kit.test_a_batch_committed_twice_shows_once(_harness(client, _ReplayingListSink))


def test_the_kit_catches_a_replay_by_a_new_driver_landing_twice(client: sparkjet.Client) -> None:
    kit = SinkConformance()
    with pytest.raises(AssertionError, match=r"batch 1 replayed by a new driver: 6 item"):
        kit.test_a_batch_replayed_after_a_crash_shows_once(_harness(client, _ReplayingListSink))


def test_the_kit_catches_lost_items(client: sparkjet.Client) -> None:
    kit = SinkConformance()
    with pytest.raises(AssertionError, match=r"after micro-batch 0 committed: 3 item\(s\) lost"):
        kit.test_committed_batches_are_visible(_harness(client, _LosingListSink))


def test_the_kit_catches_output_visible_before_its_commit(client: sparkjet.Client) -> None:
    kit = SinkConformance()
    with pytest.raises(AssertionError, match=r"batch 1 written, not yet committed: 4 item"):
        kit.test_an_aborted_batch_shows_nothing(_harness(client, _EagerListSink))


def test_the_kit_holds_an_at_least_once_sink_to_at_least_once(client: sparkjet.Client) -> None:
    """Duplicates are allowed, a check it does not promise skips and says why."""
    kit = SinkConformance()
    harness = _harness(client, _AtLeastOnceReplayingListSink)
    kit.test_a_batch_committed_twice_shows_once(harness)  # each item twice: allowed
    assert len(client.get_list("out").get_all()) == 12
    with pytest.raises(pytest.skip.Exception, match=(
        r"an aborted batch stays invisible is an EXACTLY_ONCE promise; "
        r"_AtLeastOnceReplayingListSink declares AT_LEAST_ONCE, NONE"
    )):
        kit.test_an_aborted_batch_shows_nothing(harness)
