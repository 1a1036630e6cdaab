"""Sources say how big a planned read is (``range_size``, ``estimated_size``) without reading it.

Driver-side only: no Spark job runs here. The counts are checked against what
planning and reading give, and the bytes against the files the reads fetch.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import sparkjet
import sparkjet.plugin
from sparkjet.contrib.files import FileSource
from sparkjet.contrib.kafka import KafkaSource
from sparkjet.core.host.contracts import JobContext, Source, TaskContext, source_lag
from sparkjet.core.store.commit_log import INLINE_LIMIT
from sparkjet.core.store.fs import Store
from sparkjet.core.store.stream_log import StreamLog
from sparkjet.plugin import InputSize
from sparkjet.plugins.lists import ListSource
from sparkjet.plugins.maps import MapSource
from sparkjet.plugins.streams import StreamSource
from sparkjet.testing import StoreLocation


def _context(store: Any) -> JobContext:
    return JobContext(job_id="sizes", job_name=None, store=store, parallelism=2, stage="s")


def _read_all(source: Source, descriptors: Any, ctx: JobContext) -> list[Any]:
    task = TaskContext(job_id=ctx.job_id, partition=0, store=ctx.store, stage=ctx.stage)
    return [item for d in descriptors for item in source.read(d, task)]


def test_input_size_is_public_and_says_unknown_with_none() -> None:
    assert sparkjet.plugin.InputSize is InputSize
    assert "InputSize" in sparkjet.plugin.__all__
    size = InputSize(items=3, bytes=None)
    assert size == (3, None) and size.items == 3 and size.bytes is None


# --- the default: items counted from offsets ----------------------------------------------


class _Plain(Source):
    """A source that keeps the default range_size and estimated_size."""

    kind = "sizes-plain"
    streaming = True

    def partitions(self, context: JobContext) -> list[Any]:
        return []

    def read(self, partition: Any, context: TaskContext) -> list[Any]:
        return []


@pytest.mark.parametrize(("start", "end", "items"), [
    (3, 10, 7),
    ([0, 5], [4, 5, 2], 6),  # a partition missing from start counts from 0
    ({"0": 1}, {"0": 3, "1": 2}, 4),
    ([5], [3], 0),  # never negative
])
def test_the_default_counts_items_from_offsets_and_leaves_bytes_unknown(
        start: Any, end: Any, items: int) -> None:
    ctx = _context(Store("memory://sizes-default"))
    assert _Plain("x").range_size(start, end, ctx) == InputSize(items, None)
    assert _Plain("x").estimated_size(ctx) is None


@pytest.mark.parametrize(("start", "end"), [
    (None, 4),
    ([0], ["a"]),
    ("x", "y"),
    (0, True),
    (True, 3),
    ({"0": 0}, {"0": 2.5}),
    ([0], [[1]]),
    ({"files": ["a"]}, {"files": ["a", "b"]}),
])
def test_offsets_that_do_not_count_give_none_not_an_error(start: Any, end: Any) -> None:
    ctx = _context(Store("memory://sizes-default"))
    assert source_lag(start, end) is None
    assert _Plain("x").range_size(start, end, ctx) is None


class _Bytes(_Plain):
    """Offsets that are byte positions: numbers, but not counts of items."""

    kind = "sizes-bytes"
    offsets_count_items = False


@pytest.mark.parametrize(("start", "end"), [(0, 1310), ([0, 5], [40, 5]), ({"a": 0}, {"a": 9})])
def test_opaque_offsets_count_nothing_whatever_their_shape(start: Any, end: Any) -> None:
    ctx = _context(Store("memory://sizes-default"))
    assert _Bytes("x").range_size(start, end, ctx) is None
    assert sparkjet.plugin.lag_of(_Bytes("x"), start, end) is None
    # The same numbers from a source that declares counts (the default) are items.
    assert sparkjet.plugin.lag_of(_Plain("x"), start, end) == source_lag(start, end) > 0
    assert Source.offsets_count_items is True and FileSource.offsets_count_items is False
    assert StreamSource.offsets_count_items is True and KafkaSource.offsets_count_items is True


def test_a_job_shows_lag_only_for_offsets_that_count_items(
        client: sparkjet.Client, tmp_path: Path) -> None:
    """``sourceLag`` in a job's metrics: the folder-lines source's byte offsets show none."""
    from sparkjet.pipeline import Pipeline
    from tests.kit_sources import FolderLinesHarness, FolderLinesSource

    class ByteCounts(FolderLinesSource):  # the same offsets, declared (wrongly) as counts
        offsets_count_items = True

    harness = FolderLinesHarness(str(tmp_path / "inbox"))
    harness.prepare(client)
    harness.add(client, [{"seq": i} for i in range(5)])
    lags = {}
    for source in (FolderLinesSource(harness.folder), ByteCounts(harness.folder)):
        p = Pipeline.create()
        p.read_from(source).set_name("lines").write_to(Pipeline.to_list(f"out-{uuid.uuid4()}"))
        job = client.get_jet().submit(p)
        try:
            deadline = time.monotonic() + 60
            while job.get_metrics().get("lastCommittedBatch", -1) < 0:
                assert time.monotonic() < deadline, "the job committed no micro-batch"
                time.sleep(0.05)
            lags[type(source).__name__] = job.get_metrics()["stages"]["lines"].get("sourceLag")
        finally:
            job.cancel()
    assert lags == {"FolderLinesSource": None, "ByteCounts": 0}


def test_source_lag_is_still_importable_from_the_loop() -> None:
    from sparkjet.core.microbatch import loop as microbatch_loop

    assert microbatch_loop.source_lag is source_lag


# --- streams: items from offsets, bytes from the listing's chunk sizes --------------------------


def _chunk_bytes(log: StreamLog, partition: int, start: int, end: int) -> int:
    """The bytes of the chunks holding ``[start, end)``, from the store's own listing."""
    _, chunks = log.chunks(partition)
    return sum(size for first, last, size, _ in chunks if first < end and last > start)


def _stream_case(store: Store) -> tuple[StreamSource, JobContext, StreamLog]:
    name = f"events-{uuid.uuid4().hex[:8]}"
    source = StreamSource(name, partitions=2)
    ctx = _context(store)
    source.initial_offsets(ctx)  # creates the stream
    return source, ctx, StreamLog(store, name)


def _check_stream(source: StreamSource, ctx: JobContext, log: StreamLog) -> None:
    start = source.latest_offsets(ctx)
    log.append(0, list(range(5)))
    log.append(0, list(range(5, 8)))
    log.append(1, ["a" * 1000])
    middle = source.latest_offsets(ctx)
    log.append(0, [{"k": i} for i in range(4)])
    end = source.latest_offsets(ctx)
    for begin, stop in ((start, middle), (middle, end), (start, end), ([1, 0], end)):
        items = _read_all(source, source.plan_range(begin, stop, ctx), ctx)
        pairs = enumerate(zip(begin, stop, strict=True))
        expected = sum(_chunk_bytes(log, p, s, e) for p, (s, e) in pairs)
        size = source.range_size(begin, stop, ctx)
        assert size == InputSize(len(items), expected), (begin, stop)
    assert source.range_size(end, end, ctx) == InputSize(0, 0)


def test_a_stream_range_counts_its_items_and_its_chunks_bytes_on_a_local_store(
        tmp_path: Path) -> None:
    source, ctx, log = _stream_case(Store(str(tmp_path / "store")))
    _check_stream(source, ctx, log)
    # The bytes are the chunk files' sizes on disk.
    folders = [log.paths.partition(p) for p in range(2)]
    on_disk = sum(os.path.getsize(os.path.join(f, name)) for f in folders for name in os.listdir(f))
    size = source.range_size([0, 0], source.latest_offsets(ctx), ctx)
    assert size is not None and size.bytes == on_disk


def test_a_stream_range_counts_its_items_and_its_chunks_bytes_in_memory() -> None:
    _check_stream(*_stream_case(Store(f"memory://sizes-{uuid.uuid4().hex[:8]}")))


@pytest.mark.storage
def test_on_s3_bytes_come_from_the_offsets_listing_and_are_unknown_without_one(
        s3_location: StoreLocation, monkeypatch: pytest.MonkeyPatch) -> None:
    source, ctx, log = _stream_case(s3_location.fresh().store())
    _check_stream(source, ctx, log)
    end = source.latest_offsets(ctx)
    log.append(1, ["late"])
    asked: list[str] = []

    def counting(method: str) -> Any:
        real = getattr(Store, method)

        def counted(*args: Any, **kwargs: Any) -> Any:
            asked.append(method)
            return real(*args, **kwargs)
        return counted

    for method in ("listdir", "entries", "info", "read_range", "read_bytes", "exists"):
        monkeypatch.setattr(Store, method, counting(method))
    # Planned from a listing this process has not made: asking would cost a request.
    later = [end[0], end[1] + 1]
    assert source.range_size(end, later, ctx) == InputSize(1, None)
    assert source.range_size([0, 0], end, ctx) == InputSize(sum(end), _chunk_bytes(
        log, 0, 0, end[0]) + _chunk_bytes(log, 1, 0, end[1]))
    source.latest_offsets(ctx)
    late = _chunk_bytes(log, 1, end[1], later[1])
    asked.clear()
    assert late > 0 and source.range_size(end, later, ctx) == InputSize(1, late)
    assert asked == [], f"range_size asked the store: {asked}"


def test_stream_offsets_of_another_shape_give_none(tmp_path: Path) -> None:
    source, ctx, _ = _stream_case(Store(str(tmp_path / "store")))
    for start, end in (([0], [1, 2]), ({"0": 0}, {"0": 1}), ([0, "a"], [1, 2]), (None, [1, 2])):
        assert source.range_size(start, end, ctx) is None
    assert source.range_size([0, 0], [1, 0], ctx) == InputSize(1, None)  # nothing there yet


def test_a_trimmed_stream_range_has_no_bytes(tmp_path: Path) -> None:
    source, ctx, log = _stream_case(Store(str(tmp_path / "store")))
    log.append(0, [1, 2])
    log.append(0, [3])
    end = source.latest_offsets(ctx)
    log.trim(0, 2)
    source.latest_offsets(ctx)  # lists again: partition 0 starts at 2 now
    assert source.range_size([0, 0], end, ctx) == InputSize(3, None)
    assert source.range_size([2, 0], end, ctx) == InputSize(1, _chunk_bytes(log, 0, 2, 3))


# --- lists and maps: batch sources count their items ----------------------------------------


def test_a_list_counts_inline_items_and_stored_ones_from_its_records(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    ctx = _context(store)
    assert ListSource("inline", range(7)).estimated_size(ctx) == InputSize(7, None)
    assert ListSource("empty").estimated_size(ctx) == InputSize(0, None)
    log = store.list_log("stored")
    log.commit("append", log.stage([1, 2, 3], "w"), writer="w")
    log.commit("append", log.stage(["a", "b"], "w"), writer="w")
    source = ListSource("stored")
    read = _read_all(source, source.partitions(ctx), ctx)
    assert source.estimated_size(ctx) == InputSize(len(read), None) == InputSize(5, None)
    log.commit("clear", [], writer="w")
    log.commit("append", log.stage([9], "w"), writer="w")
    assert source.estimated_size(ctx) == InputSize(1, None)


def test_a_list_with_a_segment_file_is_unknown(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    log = store.list_log("big")
    parts = log.stage(list(range(INLINE_LIMIT + 1)), "w")
    assert parts[0][0] == "segment"
    log.commit("append", parts, writer="w")
    assert ListSource("big").estimated_size(_context(store)) is None


def test_a_map_counts_its_entries_after_puts_and_removes(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    ctx = _context(store)
    log = store.map_log("m")
    log.commit("put", log.stage([("a", 1), ("b", 2), ("c", 3)], "w"), writer="w")
    log.commit("put", log.stage([("a", 9), ("d", 4)], "w"), writer="w")
    log.commit("remove", log.stage(["b", "zz"], "w"), writer="w")
    source = MapSource("m")
    read = _read_all(source, source.partitions(ctx), ctx)
    assert source.estimated_size(ctx) == InputSize(len(read), None) == InputSize(3, None)
    big = store.map_log("big")
    big.commit("put", big.stage([(i, i) for i in range(INLINE_LIMIT + 1)], "w"), writer="w")
    assert MapSource("big").estimated_size(ctx) is None


# --- files: bytes from the listing the offsets were planned with ------------------------------


def _write(folder: Path, name: str, lines: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    data = "".join(f'{{"i": {i}}}\n' for i in range(lines)).encode()
    (folder / name).write_bytes(data)
    return len(data)


def test_a_file_range_has_its_planned_bytes_and_unknown_items(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    sizes = [_write(inbox, "a.jsonl", 3), _write(inbox, "b.jsonl", 5)]
    source = FileSource(str(inbox), format="jsonl", settle_seconds=0, poll_seconds=0)
    ctx = _context(Store(str(tmp_path / "store")))
    start = source.initial_offsets(ctx)
    end = source.latest_offsets(ctx, start=start)
    assert source.range_size(start, end, ctx) == InputSize(None, sum(sizes))
    capped = FileSource(str(inbox), format="jsonl", settle_seconds=0, poll_seconds=0,
                        max_bytes_per_batch=10)
    first = capped.latest_offsets(ctx, start=start)
    assert capped.range_size(start, first, ctx) == InputSize(None, 10)
    # Offsets not planned from start, or of another shape: unknown, never an error.
    assert source.range_size(first, end, ctx) is None
    assert source.range_size([0], [1], ctx) is None
    assert source.range_size(start, {"after": "x"}, ctx) is None
    assert source.range_size(start, dict(end, batch=[["a.jsonl", "x", 3]]), ctx) is None


def test_a_bounded_file_source_says_nothing_of_its_size(tmp_path: Path) -> None:
    # Its items are unknown without reading the files, and a batch job of unknown
    # items runs on Spark: a listing only to tell bytes would be a wasted request.
    inbox = tmp_path / "inbox"
    _write(inbox, "a.jsonl", 4)
    ctx = _context(Store(str(tmp_path / "store")))
    assert FileSource(str(inbox), format="jsonl", streaming=False).estimated_size(ctx) is None


# --- Kafka: the default counts offsets, as its plan reads them --------------------------------


def test_a_kafka_range_counts_the_offsets_its_plan_reads() -> None:
    source = KafkaSource("topic", "127.0.0.1:9")  # no broker is asked: offsets only
    ctx = _context(Store("memory://sizes-kafka"))
    start, end = {"0": 3, "1": 10}, {"0": 8, "1": 10, "2": 4}  # partition 2 is new
    planned = source.plan_range(start, end, ctx)
    assert source.range_size(start, end, ctx) == InputSize(
        sum(last - first for _, first, last in planned), None) == InputSize(9, None)
    assert source.range_size({"0": 0}, {"0": "x"}, ctx) is None
