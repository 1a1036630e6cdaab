"""Stream retention: trimming the oldest items, never what a job or a snapshot needs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import sparkjet
from sparkjet.cli import main
from sparkjet.errors import ConfigError, StoreError
from sparkjet.job import JobConfig, JobStatus
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import wait_until
from tests.test_cli import write_config


def publish_chunks(client: sparkjet.Client, name: str, chunks: int, size: int = 10) -> None:
    """``chunks`` publishes of ``size`` items each to partition 0 of a 1-partition stream."""
    stream = client.get_stream(name, partitions=1)
    for c in range(chunks):
        stream.publish_all(range(c * size, (c + 1) * size))


def test_keep_items_trims_whole_old_chunks_and_readers_are_told(client: sparkjet.Client) -> None:
    publish_chunks(client, "events", 5)
    report = client.trim_stream("events", keep_items=25)
    [part] = report.partitions
    # 50 items: keeping the newest 25 lets offsets below 25 go; chunk 20-29 holds 25.
    assert (part.start_before, part.start_after, part.trimmed) == (0, 20, 20)
    stream = client.get_stream("events")
    assert stream.end_offsets() == [50]
    assert stream.read(0, 20) == list(range(20, 50))
    with pytest.raises(StoreError, match=r"stream 'events' partition 0: offsets 5 to 19 were "
                                         r"trimmed \(retention\); the partition starts at "
                                         r"offset 20 now"):
        stream.read(0, 5, 30)
    # Keeping nothing: the partition starts at its end; offsets are never handed out again.
    assert client.trim_stream("events", keep_items=0).partitions[0].start_after == 50
    stream.publish_all(["next"])
    assert stream.end_offsets() == [51]
    assert stream.read(0, 50) == ["next"]


def test_keep_bytes_and_keep_seconds_and_the_strictest_wins(client: sparkjet.Client) -> None:
    publish_chunks(client, "events", 4)
    partition = Path(client.store.layout.stream_paths("events").partition(0))
    chunks = sorted(partition.iterdir())
    sizes = [c.stat().st_size for c in chunks]
    # Keep about two chunks' worth of bytes.
    report = client.trim_stream("events", keep_bytes=sizes[-1] + sizes[-2], dry_run=True)
    assert (report.dry_run, report.trimmed) == (True, 20)
    assert len(list(partition.iterdir())) == 4  # a dry run removes nothing
    # The two oldest chunks are an hour old: keep_seconds=60 lets them go; keep_items
    # alone would keep everything; together the strictest wins.
    hour_ago = time.time() - 3600
    for chunk in chunks[:2]:
        os.utime(chunk, (hour_ago, hour_ago))
    assert client.trim_stream("events", keep_items=40, keep_seconds=60).trimmed == 20
    assert client.get_stream("events").read(0, 20) == list(range(20, 40))


def test_retention_is_checked_and_configured(
    tmp_path: Path, client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="stream 'events': stream retention: keep_items must "
                                         "be 0 or more, got -1"):
        client.trim_stream("events", keep_items=-1)
    publish_chunks(client, "events", 2)
    with pytest.raises(ValueError, match=r"stream 'events': no retention given, and none "
                                         r"configured \(\[streams.events\] keep_items"):
        client.trim_stream("events")
    with pytest.raises(StoreError, match="stream 'nope' does not exist"):
        client.trim_stream("nope", keep_items=1)
    bad = tmp_path / "bad.toml"
    bad.write_text('[streams.events]\nkeep_items = "ten"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[streams.events\] keep_items: expected a whole "
                                          r"number of items, 0 or more, got 'ten'"):
        sparkjet.connect(str(bad))
    bad.write_text("[streams.events]\nkeep_forever = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown key 'keep_forever' in \[streams.events\]"):
        sparkjet.connect(str(bad))
    bad.write_text("[streams.events]\n", encoding="utf-8")  # gc would have nothing to apply
    with pytest.raises(ConfigError, match=r"\[streams.events\] sets no limit \(expected one or "
                                          r"more of: keep_items, keep_seconds, keep_bytes\)"):
        sparkjet.connect(str(bad))

    # Configured retention: trim without limits, and gc applies it.
    config = write_config(client, "[streams.events]\nkeep_items = 10\n")
    configured = sparkjet.connect(str(config))
    assert configured.trim_stream("events", dry_run=True).trimmed == 10
    assert main(["gc"]) == 0
    out = capsys.readouterr().out
    assert "stream items past their retention  1" in out
    assert configured.get_stream("events").read(0, 10) == list(range(10, 20))


def stream_job(client: sparkjet.Client, name: str) -> sparkjet.job.Job:
    p = Pipeline.create()
    p.read_from(StreamSource("events")).write_to(Pipeline.to_list(f"{name}-out"))
    return client.get_jet().submit(p, JobConfig(
        name=name, processing_guarantee="EXACTLY_ONCE", snapshot_interval_millis=100))


def test_a_live_job_and_a_snapshot_hold_a_stream_back(
    client: sparkjet.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(client)
    publish_chunks(client, "events", 3)  # offsets 0-29
    job = stream_job(client, "reader")
    out = client.get_list("reader-out")
    wait_until(lambda: len(out.get_all()) == 30, 120, "the job to read 30 items")
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=60)
    publish_chunks_more = client.get_stream("events")
    for c in range(3, 6):  # offsets 30-59, not read yet
        publish_chunks_more.publish_all(range(c * 10, (c + 1) * 10))

    # The suspended job has read up to 30: nothing from there on may go.
    assert main(["trim", "events", "--keep-items", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"partition 0: removed offsets 0 to 29 (30 items); starts at 30; "
                        f"held back at offset 30 by job 'reader' ({job.id}) "
                        "(stage 'from-stream(events)')")
    assert lines[1] == "Removed 30 items of stream 'events' (keep 0 items)."
    job.resume()
    wait_until(lambda: len(out.get_all()) == 60, 120, "the resumed job to read the rest")
    assert sorted(out.get_all()) == list(range(60))  # nothing lost, nothing twice

    # A snapshot holds its offsets after its job is gone.
    job.cancel_and_export_snapshot("kept")
    wait_until(job.is_terminal, 60, "the job to end")
    publish_chunks_more.publish_all(range(60, 70))
    report = client.trim_stream("events", keep_items=0)
    [part] = report.partitions
    assert part.held_by == "snapshot 'kept' (stage 'from-stream(events)')"
    assert (part.held_at, part.start_after) == (60, 60)
    client.snapshots.delete("kept")
    publish_chunks_more.publish_all(range(70, 80))
    assert client.trim_stream("events", keep_items=10).partitions[0].start_after == 70
    # A new job reading from the oldest item starts where the stream starts now.
    late = stream_job(client, "late")
    late_out = client.get_list("late-out")
    wait_until(lambda: len(late_out.get_all()) == 10, 120, "the new job to read what is left")
    assert sorted(late_out.get_all()) == list(range(70, 80))
    late.cancel()


def test_a_job_that_committed_nothing_holds_the_whole_stream(
    client: sparkjet.Client, tmp_path: Path,
) -> None:
    publish_chunks(client, "events", 3)
    gate = str(tmp_path / "gate")

    def held(x: int) -> int:
        """Each item waits for the test to open the gate (60 s at most)."""
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)
        return x

    p = Pipeline.create()
    p.read_from(StreamSource("events")).map(held).write_to(Pipeline.to_list("slow-out"))
    job = client.get_jet().submit(p, JobConfig(name="slow", processing_guarantee="EXACTLY_ONCE",
                                               snapshot_interval_millis=100))
    try:
        wait_until(lambda: job.status is JobStatus.RUNNING, 60, "the job to run")
        [part] = client.trim_stream("events", keep_items=0).partitions
        assert part.trimmed == 0
        assert part.held_at == 0
        assert part.held_by is not None
        assert part.held_by.startswith(f"job 'slow' ({job.id}), which has committed no "
                                       "micro-batch yet")
    finally:
        job.cancel()
        Path(gate).touch()
    # Its micro-batch on Spark stops first (the items pass the opened gate): seconds on a
    # quiet machine, more on a loaded one; the wait ends when the job does.
    wait_until(job.is_terminal, 120, "the cancelled job to end")


def test_gc_reads_what_holds_streams_back_once_and_lists_each_partition_once(
    client: sparkjet.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc trims every configured stream with one read of the jobs' commits and the snapshots,
    and sizes and dates a partition's chunks from one listing (no stat per chunk)."""
    from sparkjet.core.state.checkpoint import Checkpoint
    from sparkjet.core.state.snapshots import SnapshotStore
    from sparkjet.core.store.fs import Store

    for name in ("events", "clicks", "views"):
        publish_chunks(client, name, 3)
    job = stream_job(client, "reader")  # reads "events"
    out = client.get_list("reader-out")
    wait_until(lambda: len(out.get_all()) == 30, 120, "the job to read 30 items")
    job.suspend()
    job.wait_for_status(JobStatus.SUSPENDED, timeout=60)
    publish_chunks(client, "events", 1)  # items 0-9 again at offsets 30-39, not read yet
    configured = sparkjet.connect(str(write_config(client, "\n".join(
        f"[streams.{name}]\nkeep_items = 0" for name in ("events", "clicks", "views")))))

    calls = {"commit_record": 0, "snapshot list": 0, "chunk stat": 0}

    def counted(key: str, original: object) -> object:
        def call(*args: object, **kwargs: object) -> object:
            calls[key] += 1
            return original(*args, **kwargs)  # type: ignore[operator]
        return call

    def chunk_stat(original: object) -> object:
        def call(self: Store, path: str) -> object:
            if path.endswith(".chunk"):
                calls["chunk stat"] += 1
            return original(self, path)  # type: ignore[operator]
        return call

    monkeypatch.setattr(Checkpoint, "commit_record",
                        counted("commit_record", Checkpoint.commit_record))
    monkeypatch.setattr(SnapshotStore, "list", counted("snapshot list", SnapshotStore.list))
    monkeypatch.setattr(Store, "info", chunk_stat(Store.info))
    monkeypatch.setattr(Store, "modified", chunk_stat(Store.modified))
    report = configured.collect_garbage()
    assert calls == {"commit_record": 1, "snapshot list": 1, "chunk stat": 0}
    assert sorted(report.removed["stream items past their retention"]) == [
        "stream 'clicks' partition 0: offsets 0 to 29",
        "stream 'events' partition 0: offsets 0 to 29",
        "stream 'views' partition 0: offsets 0 to 29",
    ]
    assert configured.get_stream("events").read(0, 30) == list(range(10))  # offsets 30-39
    job.cancel()


def test_trimmed_start_keeps_the_chunk_holding_before_or_nothing_at_the_end() -> None:
    from sparkjet.core.store.stream_log import trimmed_start

    starts = [0, 10, 20, 30]  # the newest chunk holds 30-39
    assert [trimmed_start(starts, 40, b) for b in (0, 9, 10, 25, 30, 39, 40, 99)] == [
        0, 0, 10, 20, 30, 30, 40, 40]
    assert trimmed_start([], 0, 5) == 0
    assert trimmed_start([], 40, 5) == 40  # emptied already: starts at its end
