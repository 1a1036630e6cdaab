"""Durable state on a store other processes share: what the store and the checkpoint
promise when files go missing, get truncated or tampered with, when a filesystem
client retries a create, and when a second driver takes a job over from one that
is still alive (fencing). No Spark here: jobs run their real tasks on the
in-process engine (:mod:`tests.engine_knobs`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from sparkjet.core.client import Client
from sparkjet.core.jobs import handle as handle_module
from sparkjet.core.jobs import heartbeat as heartbeat_module
from sparkjet.core.jobs import record as record_module
from sparkjet.core.jobs import stream_run as streaming_module
from sparkjet.core.state.checkpoint import BatchPlan, Checkpoint, CommitRecord
from sparkjet.core.state.files import RangeState, StatePaths
from sparkjet.core.store.commit_log import CommitLog
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords
from sparkjet.core.store.stream_log import StreamLog
from sparkjet.errors import (
    JobCancelledError,
    JobFencedError,
    ProcessingGuaranteeError,
    StoreError,
)
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from tests.conftest import wait_until
from tests.engine_knobs import Clients, ControlledEngine, sink_items, stream_pipeline

S = JobStatus
EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE

_clients = Clients()


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "file":
        return Store(str(tmp_path / "store"))
    return Store(f"memory://durable-{tmp_path.name}")


# --- create-only writes ---------------------------------------------------------------


def test_a_retried_create_that_landed_counts_as_ours_and_a_rival_does_not(
    tmp_path: Path,
) -> None:
    """s3fs and gcsfs retry a PUT whose answer was lost; the retry then hears "exists"."""
    store = Store(f"memory://retry-{tmp_path.name}")
    path = store.path("log", "0001.rec")
    store.fs.pipe_file(path, b"mine")  # the first attempt landed, its answer was lost
    assert store.create_exclusive(path, b"mine") is True  # recognised by reading back
    assert store.create_exclusive(path, b"someone else's") is False
    assert store.read_bytes(path) == b"mine"


def test_commit_records_and_chunks_are_unique_so_read_back_cannot_confuse_writers(
    store: Store,
) -> None:
    log = store.list_log("l")
    first, second = log.commit("append", [("items", [1])]), log.commit("append", [("items", [1])])
    assert second == first + 1
    stream = StreamLog(store, "s")
    stream.create(1)
    stream.append(0, ["same"])
    stream.append(0, ["same"])  # equal items from two publishers: two chunks, two tokens
    assert stream.read(0, 0, 2) == ["same", "same"]
    assert stream._header(0, 0)[1] != stream._header(0, 1)[1]


class IgnoresConditionsFS(MemoryFileSystem):
    """A filesystem whose server ignores create-only conditions (as some S3 look-alikes do)."""

    protocol = "ignorescond"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        return super()._open(path, mode.replace("x", "w"), **kwargs)


fsspec.register_implementation("ignorescond", IgnoresConditionsFS, clobber=True)


def test_a_store_that_ignores_create_only_writes_is_found_and_refuses_exactly_once(
    tmp_path: Path,
) -> None:
    url = f"ignorescond://cond-{tmp_path.name}"
    assert Store(url).conditional_writes is False
    assert Store(f"memory://cond-{tmp_path.name}").conditional_writes is True
    assert Store(str(tmp_path / "local")).conditional_writes is True

    client = _clients.make(url)
    client.get_stream("events", partitions=1)
    with pytest.raises(ProcessingGuaranteeError, match=rf"store '{url}' does not") as info:
        client.get_jet().submit(stream_pipeline(), JobConfig(processing_guarantee=EXACTLY_ONCE))
    assert "create-only writes" in str(info.value)


# --- the store never reaches outside its root --------------------------------------------


def test_remove_refuses_paths_outside_the_store(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    with pytest.raises(StoreError, match="outside store"):
        store.remove(store.path("jobs", "..", "..", "precious"), recursive=True)
    with pytest.raises(StoreError, match="the whole store"):
        store.remove(store.path(), recursive=True)
    assert (outside / "keep.txt").exists()


def test_a_tampered_checkpoint_field_is_refused_and_deletes_nothing(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    records = JobRecords(store)
    outside = tmp_path / "precious"
    outside.mkdir()
    for bad in ["../../../precious", "/etc", "checkpoint/../..", 7]:
        with pytest.raises(StoreError, match=r"checkpoint field .* is not a checkpoint folder"):
            records.checkpoint_path({"id": "ab12-cd34-ef56-7890", "checkpoint": bad})
    assert records.checkpoint_path({"id": "j", "checkpoint": "scratch-0a1b2c3d"}).endswith(
        "/jobs/j/scratch-0a1b2c3d"
    )
    assert outside.exists()


# --- corrupt and truncated files name themselves -----------------------------------------


def test_a_corrupt_job_record_is_named_and_skipped_in_listings(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    records = JobRecords(store)
    records.write({"id": "good", "status": "RUNNING"})
    store.write_bytes(store.layout.job_record("bad"), b'{"id": "bad", "sta')
    with pytest.raises(StoreError, match=r"job record '.*/jobs/bad/job.json' is corrupt"):
        records.read("bad")
    with caplog.at_level(logging.WARNING, logger="sparkjet.store"):
        assert [r["id"] for r in records.all()] == ["good"]
    assert "jobs/bad/job.json" in caplog.text


def chunk_bytes(items: list[Any], count: int | None = None, token: bytes = b"") -> bytes:
    header = struct.pack(">QH", len(items) if count is None else count, len(token))
    return header + token + pickle.dumps(items)


def test_stream_reads_check_what_the_offsets_promise(store: Store) -> None:
    stream = StreamLog(store, "s")
    stream.create(1)
    stream.append(0, [0, 1, 2])
    stream.append(0, [3, 4])
    stream.append(0, [5])
    assert stream.read(0, 1, 6) == [1, 2, 3, 4, 5]
    folder = stream.paths.partition(0)

    # A missing middle chunk: offsets 3 and 4 are gone, never silently skipped.
    middle = store.read_bytes(f"{folder}/{3:020d}.chunk")
    store.remove(f"{folder}/{3:020d}.chunk")
    with pytest.raises(StoreError, match=r"offsets 3 to 4 are missing"):
        stream.read(0, 0, 6)
    store.write_bytes(f"{folder}/{3:020d}.chunk", middle)

    # A chunk that overstates its count.
    store.write_bytes(f"{folder}/{3:020d}.chunk", chunk_bytes([3, 4], count=3))
    with pytest.raises(StoreError, match=r"00000000000000000003.chunk' says it holds 3 items"):
        stream.read(0, 0, 6)

    # A truncated chunk.
    store.write_bytes(f"{folder}/{3:020d}.chunk", middle[:-5])
    with pytest.raises(StoreError, match=r"00000000000000000003.chunk' is corrupt or truncated"):
        stream.read(0, 0, 6)
    store.write_bytes(f"{folder}/{3:020d}.chunk", middle[:4])
    with pytest.raises(StoreError, match=r"is truncated \(4 bytes, no header\)"):
        stream.read(0, 3, 5)

    # Offsets past the end were promised but are not there.
    store.write_bytes(f"{folder}/{3:020d}.chunk", middle)
    with pytest.raises(StoreError, match=r"offsets 4 to 8 were promised but 2 items"):
        stream.read(0, 4, 9)


def test_a_partition_seen_once_is_followed_not_listed_however_many_chunks(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local or in-memory partition is listed once; then its end is followed.

    A listing there costs a stat per chunk (a long-lived stream has
    thousands): appends, end offsets and reads of what was seen list nothing.
    """
    stream = StreamLog(store, "s")
    stream.create(1)
    for i in range(30):
        stream.append(0, [i])
    assert stream.end_offset(0) == 30
    listed: list[str] = []
    for name in ("listdir", "entries"):
        original = getattr(Store, name)

        def counting(self: Store, path: str, _original: Any = original) -> Any:
            listed.append(path)
            return _original(self, path)

        monkeypatch.setattr(Store, name, counting)
    for i in range(30, 40, 2):
        assert stream.append(0, [i, i + 1]) == i
    # Another process's chunk, written as it would be: found by following.
    folder = stream.paths.partition(0)
    assert store.create_exclusive(f"{folder}/{40:020d}.chunk", chunk_bytes([40, 41, 42],
                                                                           token=b"~other"))
    assert stream.end_offset(0) == 43
    assert stream.end_offsets() == [43]
    assert stream.read(0, 28, 43) == list(range(28, 43))
    assert listed == []


def test_a_partition_removed_and_written_again_is_listed_not_followed(store: Store) -> None:
    stream = StreamLog(store, "s")
    stream.create(1)
    stream.append(0, [0, 1, 2])
    stream.append(0, [3, 4])
    assert stream.end_offset(0) == 5
    assert stream.read(0, 0, 5) == [0, 1, 2, 3, 4]
    # Removed from under this process and written again by another: the newest
    # chunk starts at the same offset and ends at the same one, with another
    # writer's token; the chunks before it are not the ones seen.
    folder = stream.paths.partition(0)
    for name in store.listdir(folder):
        store.remove(f"{folder}/{name}")
    for start, items in [(0, ["a"]), (1, ["b", "c"]), (3, ["d", "e"])]:
        store.write_bytes(f"{folder}/{start:020d}.chunk",
                          chunk_bytes(items, token=f"~again{start}".encode()))
    assert stream.end_offset(0) == 5
    assert stream.read(0, 0, 5) == ["a", "b", "c", "d", "e"]
    # Trimmed by another process: what was seen is gone, and a read says so.
    for start in (0, 1):
        store.remove(f"{folder}/{start:020d}.chunk")
    with pytest.raises(StoreError, match=r"offsets 0 to 2 were trimmed"):
        stream.read(0, 0, 5)
    assert stream.read(0, 3, 5) == ["d", "e"]
    assert stream.end_offset(0) == 5


def test_corrupt_segments_and_state_files_name_their_file(store: Store) -> None:
    log = CommitLog(store, store.path("lists", "l"), "list 'l'")
    path = log.new_segment_path("w")
    store.write_bytes(path, pickle.dumps(list(range(100)))[:-10])
    with pytest.raises(StoreError, match=r"list 'l': segment '.*' is corrupt or truncated"):
        log.read_segment(path)

    paths = StatePaths(store, store.path("jobs", "j", "checkpoint", "state"))
    write_full(paths, 3, {"a": 1, "b": 2})
    version = paths.versions("counts")[0]
    file = paths.path("counts", version)
    store.write_bytes(file, store.read_bytes(file)[:-7])
    with pytest.raises(
        StoreError, match=r"stage 'counts': state file '.*-2-\d+-[0-9a-z]{8}.state' is corrupt"
    ):
        paths.read("counts", 0, 128, committed=3)


def write_full(paths: StatePaths, batch: int, values: dict[Any, Any]) -> None:
    """Write ``batch``'s state of all key groups of stage ``counts`` (a full copy: no chain)."""
    paths.write("counts", 0, paths.key_groups, batch, RangeState(values, {}, []), list(values),
                [], paths.versions("counts"))


# --- checkpoint writes that two drivers may race ------------------------------------------


def test_a_batch_has_one_plan_and_one_commit(store: Store) -> None:
    checkpoint = Checkpoint(store, store.path("jobs", "j", "checkpoint"))
    first = BatchPlan(4, {"s": [0]}, {"s": [10]}, 1, 1)
    late = BatchPlan(4, {"s": [0]}, {"s": [25]}, 2, 1)
    assert checkpoint.write_plan(first) == first
    assert checkpoint.write_plan(late) == first  # the late driver runs the standing plan
    assert checkpoint.write_commit(CommitRecord(4, {"s": [10]}, 3)) is True
    assert checkpoint.write_commit(CommitRecord(4, {"s": [25]}, 4)) is False
    assert checkpoint.commit_record(4).ends == {"s": [10]}
    assert checkpoint.key_groups(2, ["s"]) == 2
    assert checkpoint.key_groups(8, ["s"]) == 2  # fixed for the checkpoint's life


def test_a_late_attempt_of_an_old_batch_never_deletes_a_newer_version(store: Store) -> None:
    paths = StatePaths(store, store.path("jobs", "j", "checkpoint", "state"))
    write_full(paths, 5, {"a": 5})
    write_full(paths, 3, {"a": 3, "b": 1})  # a stray attempt of 3
    assert [(v.batch, v.keys) for v in paths.versions("counts")] == [(3, 2), (5, 1)]
    write_full(paths, 3, {"a": 3})  # another, other key count: both stay, 5 stays
    assert [(v.batch, v.keys) for v in paths.versions("counts")] == [(3, 1), (3, 2), (5, 1)]
    assert paths.read("counts", 0, 128, committed=5)[0].values == {"a": 5}
    # As of 3, the first by name stands, whichever attempt a reader lists first.
    assert paths.read("counts", 0, 128, committed=3)[0].values == {"a": 3}


# --- jobs: control files and fencing ----------------------------------------------------


make_client = _clients.make


@pytest.fixture(autouse=True)
def _fast_and_tidy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(streaming_module, "CLUSTER_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(heartbeat_module, "CONTROL_POLL_SECONDS", 0.02)
    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_SECONDS", 0.05)
    yield
    _clients.close()


def submit(client: Client, name: str) -> Any:
    job = client.get_jet().submit(stream_pipeline(), JobConfig(
        name=name, processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=10,
    ))
    wait_until(lambda: job.status is S.RUNNING, timeout=10, what=f"{name} to run")
    return job


def test_malformed_control_files_are_quarantined_and_never_stop_the_heartbeat(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(store_url)
    client.get_stream("events", partitions=1)
    job = submit(client, "steady")
    control = Path(client.store.root) / "jobs" / job.id / "control"
    control.mkdir(parents=True, exist_ok=True)
    with caplog.at_level(logging.WARNING, logger="sparkjet.store"):
        (control / "garbage.req").write_text("{}")  # no action in its name
        (control / "00000000000000000001-suspend.req").write_text('{"action": "susp')
        record = client.get_jet().records.read(job.id) or {}
        beat = record["heartbeat"]
        wait_until(lambda: sorted(p.name for p in (control / "quarantine").glob("*")) == [
            "00000000000000000001-suspend.req", "garbage.req"], timeout=10,
            what="both files quarantined")
        wait_until(lambda: (client.get_jet().records.read(job.id) or {})["heartbeat"] > beat,
                   timeout=10, what="the heartbeat to go on")
    assert job.status is S.RUNNING  # the truncated "suspend" was not acted on
    assert "garbage.req' does not parse" in caplog.text
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)


def test_a_tampered_checkpoint_field_stops_cancel_before_it_deletes(
    store_url: str, tmp_path: Path
) -> None:
    client = make_client(store_url)
    client.get_stream("events", partitions=1)
    job = submit(client, "tampered")
    job.suspend()
    job.wait_for_status(S.SUSPENDED, timeout=10)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    runner = client.get_jet().runners.get(job.id)
    runner.lease.stage(lambda r: replace(r, checkpoint="../../../precious"))
    with pytest.raises(StoreError, match=r"checkpoint field '\.\./\.\./\.\./precious'"):
        runner.folder.discard()
    assert (outside / "keep.txt").exists()
    runner.lease.stage(lambda r: replace(r, checkpoint="checkpoint"))
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)


def test_a_driver_taken_over_while_alive_is_fenced_and_stops_writing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driver A looks dead to B (a long pause, a partition) but lives on. B takes the
    job over at epoch 1; A finds itself fenced at its next write and stops; no batch is
    planned or committed twice, the record stays B's, and the sink holds every item once."""
    engine_a, engine_b = ControlledEngine(), ControlledEngine()
    a = make_client(store_url, engine_a)
    stream = a.get_stream("events", partitions=1)
    job_a = submit(a, "zombie")
    stream.publish_all(range(3))
    wait_until(lambda: job_a.get_metrics()["lastCommittedBatch"] >= 0, timeout=10,
               what="A's first batch")

    b = make_client(store_url, engine_b)
    job_b = b.get_jet().get_job(job_a.id)
    assert job_b is not None
    engine_a.hold.clear()  # A "pauses" in its next micro-batch, its work done, before its commit
    stream.publish_all(range(3, 6))
    checkpoint = Path(a.store.root) / "jobs" / job_a.id / "checkpoint"
    wait_until(engine_a.holding.is_set, timeout=10, what="A to plan batch 1 and run it")
    assert (checkpoint / "offsets" / f"{1:020d}.json").exists()
    assert [w.batch for w in engine_a.micro_batches(job_a.id)] == [0, 1]
    assert sink_items(a) == [0, 1, 2]  # A's batch 1 is written, not committed
    # B judges A dead (its heartbeat looked stale from where B stands).
    monkeypatch.setattr(handle_module, "driver_alive", lambda records, record: False)
    job_b.resume()
    assert job_b.is_driven_here()
    assert job_b.wait_for_status(S.RUNNING, timeout=10) is S.RUNNING
    stream.publish_all(range(6, 9))
    wait_until(lambda: job_b.get_metrics()["lastCommittedBatch"] >= 2, timeout=10,
               what="B to commit batches 1 and 2")
    assert sink_items(b) == list(range(9))

    engine_a.hold.set()  # A wakes up
    with pytest.raises(JobFencedError, match=r"epoch 0\) was fenced off: .* at epoch 1") as info:
        job_a.join(timeout=10)
    assert info.value.epoch == 1
    record = b.get_jet().records.read(job_a.id) or {}
    assert record["epoch"] == 1 and record["status"] == S.RUNNING.value
    assert not job_a.is_driven_here()  # A's handle now reads the store: B drives the job

    commits = sorted(p.name for p in (checkpoint / "commits").iterdir())
    ends = [json.loads((checkpoint / "commits" / n).read_text())["ends"]["events"]
            for n in commits]
    # One plan and one commit per batch: B replayed A's batch 1 with A's plan.
    assert [int(n[:-5]) for n in commits] == [0, 1, 2] and ends == [[3], [6], [9]]
    assert [(c.batch, c.source_ranges["events"]) for c in engine_b.micro_batches(job_a.id)] == [
        (1, ([3], [6])), (2, ([6], [9]))]
    assert sink_items(a) == list(range(9))  # A's batch 1 was aborted, B's replay landed once
    job_b.cancel()
    with pytest.raises(JobCancelledError):
        job_b.join(timeout=10)


def test_the_lease_checks_its_fence_before_every_write(store_url: str) -> None:
    store = Store(store_url)
    records = JobRecords(store)
    data = record_module.JobRecord("f00d-f00d-f00d-f00d", "n", JobStatus.RUNNING)
    lease = record_module.Lease(records, data)
    lease.write()
    rival = record_module.Lease(records, data)
    assert rival.claim(1) and not rival.claim(1)
    with pytest.raises(JobFencedError, match=r"job 'n' \(f00d-f00d-f00d-f00d\): this driver "
                       r"\(epoch 0\) was fenced off: host '.*', pid \d+ took the job over at "
                       r"epoch 1"):
        lease.write(lambda r: replace(r, status=JobStatus.SUSPENDED))
    assert (records.read(data.id) or {})["status"] == "RUNNING"  # nothing stored


# --- secrets never reach the store ----------------------------------------------------------


def test_a_canary_secret_reaches_no_store_file(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "canary-7f3a9c1e-do-not-persist"
    monkeypatch.setenv("SPARKJET_TEST_CANARY", canary)
    client = make_client(
        store_url, plugins={"some-plugin": {"token": "${env:SPARKJET_TEST_CANARY}"}})
    stream = client.get_stream("events", partitions=1)

    # A function that captured the client would carry the configuration into
    # pipeline.pkl: refused at submit, naming the stage.
    captured = Pipeline.create()
    captured.read_from(StreamSource("events")).map(lambda x: (client, x)).set_name("leaky") \
        .write_to(Pipeline.to_list("out"))
    with pytest.raises(Exception, match=r"stage 'leaky'.*a sparkjet Client cannot be pickled"):
        client.get_jet().submit(captured, JobConfig(processing_guarantee=EXACTLY_ONCE))

    job = client.get_jet().submit(stream_pipeline(), JobConfig(
        name="plain", processing_guarantee=EXACTLY_ONCE, snapshot_interval_millis=10,
        arguments=["--token", canary],
    ))
    stream.publish_all(range(5))
    wait_until(lambda: len(sink_items(client)) >= 5, timeout=10, what="the items in the sink")
    assert sink_items(client) == list(range(5))  # the sink's files are among those scanned
    record = client.get_jet().records.read(job.id) or {}
    assert record["config"]["arguments"] == ["--token", "***"]
    assert job.config.arguments == ["--token", "***"]

    def leaks() -> list[Path]:
        files = [p for p in Path(store_url).rglob("*") if p.is_file()]
        assert len(files) >= 3  # record, pipeline, stream chunks: something to scan
        leaked = []
        for path in files:
            with contextlib.suppress(FileNotFoundError):  # a record's temp file, renamed
                if canary.encode() in path.read_bytes():
                    leaked.append(path)
        return leaked

    assert (Path(store_url) / "jobs" / job.id / "pipeline.pkl").exists()
    assert leaks() == []
    job.cancel()
    with pytest.raises(JobCancelledError):
        job.join(timeout=10)
    assert leaks() == []


def test_a_replayed_stream_sink_batch_lands_with_its_first_split(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt appended partition 0 and died; the replay sees its items in
    another order (a shuffle's fetch order) and must still land every item once."""
    stream = StreamLog(store, "out")
    stream.create(2)
    original = StreamLog.append
    calls: list[int] = []

    def dies_after_one(self: StreamLog, partition: int, items: list[Any], token: str = "") -> int:
        if calls:
            raise OSError("driver killed mid-commit")
        calls.append(partition)
        return original(self, partition, items, token)

    monkeypatch.setattr(StreamLog, "append", dies_after_one)
    with pytest.raises(OSError, match="mid-commit"):
        stream.append_batch("job:sink", "job:sink:cp:7", [[0, 2], [1, 3]])
    monkeypatch.setattr(StreamLog, "append", original)
    stream.append_batch("job:sink", "job:sink:cp:7", [[1, 3], [0, 2]])  # another order
    assert stream.read(0, 0, stream.end_offset(0)) == [0, 2]
    assert stream.read(1, 0, stream.end_offset(1)) == [1, 3]
    stream.append_batch("job:sink", "job:sink:cp:7", [[9], [9]])  # a third, complete: no-op
    assert stream.end_offsets() == [2, 2]
    assert not any(n.endswith(".pending") for n in store.listdir(stream.paths.writers))


def test_append_buckets_is_once_per_token_and_plain_without_one(store: Store) -> None:
    """What a sink's commit calls: a micro-batch's token appends once; no token, every time."""
    stream = StreamLog(store, "out")
    stream.create(2)
    for _ in range(2):  # a replayed micro-batch
        stream.append_buckets([["a"], []], "job:sink", "job:sink:cp:7")
    assert stream.end_offsets() == [1, 0]
    for _ in range(2):  # a batch job (no micro-batch): plain appends, empty buckets skipped
        stream.append_buckets([["b"], []], "job:sink", None)
    assert stream.end_offsets() == [3, 0]
    assert stream.read(0, 0, 3) == ["a", "b", "b"]
    assert store.listdir(stream.paths.partition(1)) == []


def test_a_batch_appended_twice_by_racing_drivers_is_read_once(store: Store) -> None:
    """Two drivers both found no chunk of batch 7 and both appended one (the first,
    fenced off, was paused between its check and its append): the registered one counts."""
    old, new = StreamLog(store, "out"), StreamLog(Store(store.url), "out")
    old.create(1)
    new.append_batch("job:sink", "job:sink:cp:7", [["a", "b"]])
    old.append(0, ["a", "b"], "@job:sink:cp:7")  # the late driver's append, after its check
    assert old.register(0, "job:sink:cp:7", 2) == 0  # ...whose registration loses
    new.append_batch("job:sink", "job:sink:cp:8", [["c"]])
    assert old.end_offsets() == [5]  # offsets count every chunk
    for reader in (StreamLog(store, "out"), StreamLog(Store(store.url), "out")):
        assert reader.read(0, 0, 5) == ["a", "b", "c"]
        assert reader.read(0, 2, 5) == ["c"]  # a range starting at the skipped chunk


def test_a_batch_chunk_never_registered_is_registered_by_its_reader(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver died between appending batch 7's chunk and registering it."""
    monkeypatch.setattr("sparkjet.core.store.stream_registry.PENDING_WAIT_SECONDS", 0.2)
    stream = StreamLog(store, "out")
    stream.create(1)
    stream.append(0, ["a"], "@job:sink:cp:7")
    stream.append(0, ["x"])  # a plain publisher after it
    assert stream.read(0, 0, 2) == ["a", "x"]  # waited 0.2 s, then registered it
    assert stream.registered(0, "job:sink:cp:7") == 0
    stream.append_batch("job:sink", "job:sink:cp:7", [["a"]])  # the replay: lands nothing
    assert StreamLog(store, "out").read(0, 0, stream.end_offset(0)) == ["a", "x"]
    # A chunk written before batch chunks were registered (no "@") counts as it is.
    stream.append(0, ["old"], "job:sink:cp:6")
    assert StreamLog(store, "out").read(0, 2, 3) == ["old"]


# --- growth: a micro-batch's commit does not read the whole log ---------------------------


def test_commit_once_costs_the_same_however_long_the_log(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = store.list_log("long")
    for i in range(30):
        log.commit("append", [("items", [i])])  # other writers' history
    listed: list[str] = []
    original = Store.listdir

    def counting(self: Store, path: str) -> list[str]:
        listed.append(path)
        return original(self, path)

    monkeypatch.setattr(Store, "listdir", counting)
    assert log.commit_once("append", [("items", ["b0"])], token="t0", writer="w") == 31
    assert listed.count(log.paths.log) == 1  # the writer's first commit reads the log once
    listed.clear()
    log.commit("append", [("items", ["other"])], after=31)  # another writer, in between
    for batch in range(1, 4):
        seq = log.commit_once("append", [("items", [f"b{batch}"])], token=f"t{batch}", writer="w")
        assert seq == 32 + batch
    assert log.commit_once("append", [("items", ["b3"])], token="t3", writer="w") is None  # replay
    assert log.paths.log not in listed  # no listing of the log on the micro-batch path
    monkeypatch.setattr(Store, "listdir", original)
    items = [item for r in log.live_records() for item in log.payload(r)]
    assert items == [*range(30), "b0", "other", "b1", "b2", "b3"]


_OVER_MEMORY = r"""
import resource, sys
from sparkjet.aggregate import counting
from sparkjet.core.pipeline.graph import AggregateSpec
from sparkjet.core.pipeline.keyed import keyed_fold
from sparkjet.core.engine.tasks.state import StateTask
from sparkjet.core.state.files import RangeState, StatePaths
from sparkjet.core.store.fs import Store

store = Store(sys.argv[1])
paths = StatePaths(store, store.path("state"), key_groups=1)
values = {f"key-{i}": (f"key-{i}", i) for i in range(int(sys.argv[2]))}
paths.write("counts", 0, 1, 0, RangeState(values, {}, []), [], [], [])
del values
size = sum(v.size for v in paths.versions("counts"))
# As PySpark does with spark.executor.pyspark.memory: a cap on the address space.
with open("/proc/self/status") as fh:
    used = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (used + 2 * size, resource.RLIM_INFINITY))
fold = keyed_fold(AggregateSpec(counting()))
task = StateTask(fold, "counts", None, paths, 1, 0, 0, None, 1)
try:
    list(task(0, iter([])))
    list(task(0, iter([("key-1", (0, 1))])))
except Exception as exc:
    from sparkjet.core.pipeline.fusion import decode_failure
    stage, cause, _ = decode_failure(str(exc))
    print(type(exc).__name__, stage, type(cause).__name__, cause)
else:
    print("loaded", size)
"""


def test_state_over_a_workers_memory_is_a_clear_error(tmp_path: Path) -> None:
    """A worker capped as spark.executor.pyspark.memory caps it: the stage and the fix, named."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _OVER_MEMORY, str(tmp_path / "store"), "400000"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert "StageFailure" in out.stdout, out.stdout + out.stderr
    assert "counts" in out.stdout and "MemoryError" in out.stdout
    assert "key groups [0, 1) of 1 does not fit in this Python worker's memory" in out.stdout
    assert "spark.executor.pyspark.memory" in out.stdout
