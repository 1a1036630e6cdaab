"""Readers after a trim: each starts where a partition starts now, or says what is gone.

A reader asking for "the oldest item" (``IStream.read(p)``, ``read_all``,
``sparkjet get stream``, a new job reading from the oldest) starts at the
partition's trimmed start; one asking for an offset below it (an explicit
``read(p, offset)`` or ``--from``, a job's committed offsets) gets an error
naming the stream, the partition and the range trimmed, and a job fails
naming its source stage rather than skip ahead.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.core.store import stream_follow
from sparkjet.errors import JobFailedError, StoreError
from sparkjet.job import JobConfig, JobStatus
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.testing import StoreLocation
from tests.conftest import wait_until
from tests.test_cli import no_spark, write_config
from tests.test_retention import publish_chunks

__all__ = ["no_spark"]  # the fixture, used by name


def test_keep_items_0_keeps_nothing_and_offsets_go_on(client: sparkjet.Client) -> None:
    publish_chunks(client, "events", 5)  # offsets 0-49 in chunks of 10
    [part] = client.trim_stream("events", keep_items=0).partitions
    assert (part.start_before, part.start_after, part.trimmed) == (0, 50, 50)
    stream = client.get_stream("events")
    assert stream.end_offsets() == [50]  # offsets are never handed out twice
    assert stream.size() == 50
    assert (stream.read(0), stream.read_all()) == ([], [])
    with pytest.raises(StoreError, match=r"stream 'events' partition 0: offsets 0 to 49 were "
                                         r"trimmed \(retention\); the partition starts at "
                                         r"offset 50 now"):
        stream.read(0, 0)
    # A trim of an empty partition changes nothing, and publishing goes on from 50.
    assert client.trim_stream("events", keep_items=0).trimmed == 0
    stream.publish_all(["next", "after"])
    assert stream.end_offsets() == [50 + 2]
    assert stream.read(0) == stream.read(0, 50) == ["next", "after"]
    [part] = client.trim_stream("events", keep_items=1).partitions  # whole chunks only
    assert (part.start_before, part.start_after) == (50, 50)
    [part] = client.trim_stream("events", keep_bytes=0).partitions
    assert (part.start_before, part.start_after) == (50, 52)
    assert stream.read_all() == []
    # Bounded: what is left of the partition is one marker of where it starts.
    folder = Path(client.store.layout.stream_paths("events").partition(0))
    assert len(list(folder.iterdir())) == 1


def test_readers_from_the_oldest_start_where_the_partition_starts(
    client: sparkjet.Client,
) -> None:
    publish_chunks(client, "events", 5)
    assert client.trim_stream("events", keep_items=25).partitions[0].start_after == 20
    stream = client.get_stream("events")
    assert stream.read(0) == list(range(20, 50))
    assert stream.read(0, end=30) == list(range(20, 30))
    assert stream.read(0, end=10) == []  # nothing of [oldest, 10) is held
    assert stream.read_all() == list(range(20, 50))
    assert stream.start_offsets() == [20]
    # Asked for explicitly, a trimmed offset is an error naming what is gone.
    with pytest.raises(StoreError, match=r"stream 'events' partition 0: offsets 0 to 19 were "
                                         r"trimmed \(retention\); the partition starts at "
                                         r"offset 20 now"):
        stream.read(0, 0)


@pytest.mark.usefixtures("no_spark")
def test_get_stream_after_a_trim(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(client)
    stream = client.get_stream("events", partitions=2)
    for _ in range(2):  # two chunks per partition: 0 2 4 | 6 8 10 and 1 3 5 | 7 9 11
        stream._log.publish_all(range(_ * 6, _ * 6 + 6),  # type: ignore[attr-defined]
                                partition_of=lambda i: i % 2)
    assert main(["trim", "events", "--keep-items", "3"]) == 0
    capsys.readouterr()
    assert main(["get", "stream", "events"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["0:3  6", "0:4  8", "0:5  10",
                                         "1:3  7", "1:4  9", "1:5  11"]
    assert captured.err.splitlines() == [
        "stream 'events' partition 0: offsets 0 to 2 were trimmed (3 items); reading from 3",
        "stream 'events' partition 1: offsets 0 to 2 were trimmed (3 items); reading from 3",
    ]
    assert main(["get", "stream", "events", "--from", "4", "--partition", "1"]) == 0
    assert capsys.readouterr() == ("1:4  9\n1:5  11\n", "")
    # An explicit offset below the start: an error, and nothing printed.
    assert main(["get", "stream", "events", "--from", "1"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "ERROR: stream 'events' partition 0: offsets 1 to 2 were trimmed (retention); "
        "the partition starts at offset 3 now (leave out --from to read from there)\n")
    # Everything trimmed: nothing to print, and stderr says why.
    assert main(["trim", "events", "--keep-items", "0"]) == 0
    capsys.readouterr()
    assert main(["get", "stream", "events", "--partition", "0"]) == 0
    assert capsys.readouterr() == (
        "", "stream 'events' partition 0: offsets 0 to 5 were trimmed (6 items); "
        "reading from 6\n")


def stream_job(client: sparkjet.Client, name: str) -> sparkjet.job.Job:
    p = Pipeline.create()
    p.read_from(StreamSource("events")).write_to(Pipeline.to_list(f"{name}-out"))
    return client.get_jet().submit(p, JobConfig(
        name=name, processing_guarantee="EXACTLY_ONCE", snapshot_interval_millis=100))


def test_a_new_job_reads_from_where_a_trimmed_stream_starts(client: sparkjet.Client) -> None:
    publish_chunks(client, "events", 3)
    assert client.trim_stream("events", keep_items=0).partitions[0].start_after == 30
    client.get_stream("events").publish_all(range(30, 35))
    job = stream_job(client, "late")
    try:
        out = client.get_list("late-out")
        wait_until(lambda: len(out.get_all()) >= 5, 120, "the new job to read what is left")
        assert sorted(out.get_all()) == list(range(30, 35))
    finally:
        job.cancel()


def test_a_job_whose_offsets_were_trimmed_fails_naming_its_source(
    client: sparkjet.Client,
) -> None:
    """Never skips ahead: the items between its offsets and the new start would be lost."""
    publish_chunks(client, "events", 3)
    job = stream_job(client, "reader")
    out = client.get_list("reader-out")
    wait_until(lambda: len(out.get_all()) == 30, 120, "the job to read 30 items")
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=60)
    publish_chunks(client, "events", 2)  # offsets 30-49, not read yet
    # What `trim` would never do (the job holds offset 30 back), as a store
    # shared with a careless tool, or files removed by hand, would.
    client.store.stream_log("events").trim(0, 40)
    job.resume()
    with pytest.raises(JobFailedError) as failed:
        job.join()
    message = str(failed.value)
    assert "from-stream(events)" in message, message
    assert ("stream 'events' partition 0: offsets 30 to 39 were trimmed (retention)"
            in message), message
    assert sorted(out.get_all()) == list(range(30))  # nothing read past the gap


# --- the start marker in every store ----------------------------------------------------------


def trim_everything_while_publishing(location: StoreLocation) -> None:
    """A trim that empties a partition races publishers: no offset is handed out twice."""
    from sparkjet.core.store.stream_log import StreamLog

    StreamLog(location.store(), "raced").create(1)
    trims: list[int] = []

    def work(worker: int) -> None:
        stream = StreamLog(location.store(separate_client=True), "raced")
        for i in range(4):
            if worker == 0:
                trims.append(stream.trim(0, 2**62))  # keep nothing
            else:
                stream.append(0, [(worker, i)])

    threads = [threading.Thread(target=work, args=(w,)) for w in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stream = StreamLog(location.store(), "raced")
    assert stream.end_offset(0) == 8  # every append took offsets of its own
    assert trims == sorted(trims)  # the start never goes back
    held = stream.read_held(0)
    start = stream.start_offset(0)
    assert len(held) == 8 - start
    assert stream.trim(0, 2**62) == 8
    other = StreamLog(location.store(separate_client=True), "raced")
    assert (other.start_offset(0), other.end_offset(0), other.read_held(0)) == (8, 8, [])
    other.append(0, ["after"])
    assert stream.read(0, 8, 9) == ["after"]
    assert stream.start_offset(0) == 8
    assert stream.trim(0, 2**62) == 9
    # One marker is left where the partition starts; the one at 8 went.
    assert location.store().listdir(stream.paths.partition(0)) == [f"{9:020d}.start"]


def test_a_trim_that_empties_a_partition_on_a_local_store(tmp_path: Path) -> None:
    trim_everything_while_publishing(StoreLocation(str(tmp_path / "store"), {}))


@pytest.mark.storage
def test_a_trim_that_empties_a_partition_on_s3(s3_location: StoreLocation) -> None:
    trim_everything_while_publishing(s3_location.fresh())


@pytest.mark.storage
def test_a_trim_that_empties_a_partition_on_gcs(gcs_location: StoreLocation) -> None:
    trim_everything_while_publishing(gcs_location.fresh())


def test_the_newest_chunk_trimmed_between_a_listing_and_its_header(
    client: sparkjet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher or reader that listed the newest chunk just before a trim removed it."""
    from sparkjet.core.store.stream_log import StreamLog

    publish_chunks(client, "events", 2)
    stream = client.store.stream_log("events")
    listing = StreamLog._sized_listing  # every listing of a partition goes through it
    trimmed: list[int] = []
    armed = [False]

    def then_trimmed(
        self: StreamLog, partition: int
    ) -> tuple[list[int], list[int], dict[int, int] | None]:
        listed = listing(self, partition)
        if armed[0]:  # another process empties the partition right after
            armed[0] = False
            trimmed.append(client.store.stream_log("events").trim(partition, 2**62))
        return listed

    monkeypatch.setattr(StreamLog, "_sized_listing", then_trimmed)
    # As in a process that has not seen the stream yet (one that has follows
    # the partition instead of listing it: see the test below).
    monkeypatch.setattr(stream_follow, "_CHUNKS", {})
    armed[0] = True
    assert stream.end_offset(0) == 20
    stream_follow._CHUNKS.clear()  # not seen: listed
    armed[0] = True
    assert stream.append(0, ["next"]) == 20
    armed[0] = True
    assert stream.read_held(0) == []
    assert trimmed == [20, 20, 21]


@pytest.mark.parametrize("when", ["before its newest chunk is read",
                                  "before the next is looked for"])
def test_a_followed_partition_trimmed_while_it_is_followed(
    client: sparkjet.Client, monkeypatch: pytest.MonkeyPatch, when: str,
) -> None:
    """A process following a partition (seen before) while another empties it."""
    from sparkjet.core.store.stream_log import StreamLog

    publish_chunks(client, "events", 2)
    stream = client.store.stream_log("events")
    assert stream.end_offset(0) == 20  # seen: followed from now on
    seen = stream_follow._CHUNKS[stream.paths.partition(0)]
    header = StreamLog._header
    at = seen[0][-1] if when == "before its newest chunk is read" else 20
    armed = [True]
    trimmed: list[int] = []

    def then_trimmed(self: StreamLog, partition: int, start: int) -> tuple[int, str]:
        if start == at and armed[0]:  # another process empties the partition first
            armed[0] = False
            trimmed.append(client.store.stream_log("events").trim(partition, 2**62))
            stream_follow._CHUNKS[self.paths.partition(partition)] = seen  # not this one's
        return header(self, partition, start)

    monkeypatch.setattr(StreamLog, "_header", then_trimmed)
    assert stream.end_offset(0) == 20
    assert trimmed == [20]
    assert stream.append(0, ["next"]) == 20
    assert stream.read_held(0) == ["next"]
    with pytest.raises(StoreError, match="offsets 0 to 19 were trimmed"):
        stream.read(0, 0, 21)


def test_a_job_started_from_a_snapshot_whose_offsets_were_trimmed_fails(
    client: sparkjet.Client,
) -> None:
    publish_chunks(client, "events", 3)
    job = stream_job(client, "first")
    out = client.get_list("first-out")
    wait_until(lambda: len(out.get_all()) == 30, 120, "the job to read 30 items")
    job.cancel_and_export_snapshot("kept")
    wait_until(job.is_terminal, 60, "the job to end")
    publish_chunks(client, "events", 2)  # offsets 30-49
    held = client.trim_stream("events", keep_items=0).partitions[0]
    assert (held.start_after, held.held_at) == (30, 30)  # trim keeps what the snapshot needs
    client.store.stream_log("events").trim(0, 40)  # what trim never does, done by hand
    p = Pipeline.create()
    p.read_from(StreamSource("events")).write_to(Pipeline.to_list("second-out"))
    second = client.get_jet().submit(p, JobConfig(
        name="second", processing_guarantee="EXACTLY_ONCE", snapshot_interval_millis=100,
        initial_snapshot_name="kept"))
    with pytest.raises(JobFailedError) as failed:
        second.join()
    message = str(failed.value)
    assert message.startswith("stage 'from-stream(events)' failed: StoreError: stream 'events' "
                              "partition 0: offsets 30 to 39 were trimmed (retention)"), message
    assert client.get_list("second-out").get_all() == []
