"""Store requests: counted per job and by kind, checked against the servers, and few when idle.

The S3 and GCS tests reach moto and fake-gcs-server through a counting proxy
(:mod:`tests.request_proxy`), so the job's own counters are checked against
what the server was really asked. Nothing here depends on the machine's
speed: waits end when what they wait for happened (with a deadline), and
the idle window is measured in the job's own poll periods.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkjet.aggregate import counting
from sparkjet.cli.prometheus import exposition
from sparkjet.core.client import Client
from sparkjet.core.config import load_config
from sparkjet.core.engine.inprocess.engine import InProcessEngine
from sparkjet.core.jobs.record import lease_refresh_seconds, read_record
from sparkjet.core.store import requests, stream_chunks, stream_log
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords
from sparkjet.errors import JobCancelledError, StoreError
from sparkjet.job import JobConfig, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.testing import StoreLocation
from tests.request_proxy import CountingProxy
from tests.request_proxy import counting as through_proxy
from tests.test_cli_results import families

#: What one micro-batch of one event through a keyed count into a map may cost
#: under EXACTLY_ONCE on S3 and GCS, from the look that finds the event to the
#: commit point, fencing included (issue 32's budget; the twelve are listed in
#: docs/store.md; 32 to 50 at first).
BATCH_REQUESTS_MOST = 12


def test_requests_count_for_the_job_whose_thread_makes_them(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    path = store.path("a", "file")
    before = requests.by_kind("job-a")
    with requests.working_for("job-a"):
        store.write_bytes(path, b"1")
        store.read_bytes(path)
        store.listdir(store.path("a"))
        store.exists(path)
        assert not store.create_exclusive(path, b"2")  # a put, then a read: not ours
        store.remove(path)
        seen_on: list[str | None] = []
        thread = threading.Thread(target=requests.carried(
            lambda: seen_on.append(requests.current_job())))
        thread.start()
        thread.join()
    counted = Counter(requests.by_kind("job-a"))
    counted.subtract(before)
    assert dict(counted) == {"put": 2, "get": 2, "list": 1, "head": 1, "delete": 1}
    assert seen_on == ["job-a"]
    assert requests.as_metrics(requests.by_kind("nobody")) == {
        "total": 0, "byKind": dict.fromkeys(requests.KINDS, 0)}


def _client(location: StoreLocation) -> Client:
    config = load_config({"store": location.connect_overrides()})
    return Client(config, engine=InProcessEngine(2))


def _keyed_count(client: Client, name: str) -> Any:
    client.get_stream("clicks", partitions=2)
    pipeline = Pipeline.create()
    (pipeline.read_from(StreamSource("clicks", partitions=2))
     .group_by(lambda click: click["user"]).aggregate(counting()).set_name("per-user")
     .write_to(Pipeline.to_map("per-user")))
    return client.get_jet().submit(pipeline, JobConfig(
        name=name, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE,
        snapshot_interval_millis=10))


def _wait(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _stop(job: Any) -> None:
    """Cancel ``job`` and wait until it stopped (before its store's proxy goes)."""
    job.cancel()
    with contextlib.suppress(JobCancelledError):
        job.join(timeout=60)


def _committed(job: Any) -> int:
    return int(job.get_metrics()["lastCommittedBatch"])


def test_metrics_and_prometheus_show_the_jobs_requests_by_kind(tmp_path: Path) -> None:
    client = _client(StoreLocation(str(tmp_path / "store")))
    job = _keyed_count(client, "shown")
    try:
        client.get_stream("clicks").publish({"user": "a"})
        _wait(lambda: _committed(job) >= 0, 60, "the first micro-batch")
        shown = job.get_metrics()["storeRequests"]
        assert set(shown["byKind"]) == set(requests.KINDS)
        assert shown["total"] == sum(shown["byKind"].values()) > 0
        assert shown["byKind"]["put"] > 0 and shown["byKind"]["list"] > 0
        kind, samples = families(exposition([job]))["sparkjet_storeRequests"]
        assert kind == "counter"
        assert {dict(labels)["kind"] for name, labels in samples} == set(requests.KINDS)
        assert all(dict(labels)["job_id"] == job.id and name == "sparkjet_storeRequests_total"
                   for name, labels in samples)
        # Other processes read them from the job's record, written with its progress
        # right after the batch's commit (the metric above may be read before).
        def recorded() -> bool:
            record = read_record(JobRecords(client.store), job.id)
            return record is not None and record.progress.get(
                "storeRequests", {}).get("total", 0) > 0

        _wait(recorded, 30, "the job record to carry its requests")
    finally:
        _stop(job)


@pytest.mark.storage
def test_a_job_suspended_right_after_a_batch_leaves_that_batch_in_its_record(
        s3_location: StoreLocation) -> None:
    """On S3 progress waits for the heartbeat; a stop must not leave it behind in the record."""
    client = _client(s3_location.fresh())
    job = _keyed_count(client, "stopped")
    try:
        client.get_stream("clicks").publish({"user": "a"})
        _wait(lambda: _committed(job) >= 0, 60, "the first micro-batch")
        job.suspend()
        _wait(lambda: job.status.value == "SUSPENDED", 60, "the suspend")
        record = read_record(JobRecords(client.store), job.id)
        assert record is not None
        assert record.progress["lastCommittedBatch"] == _committed(job) >= 0
    finally:
        _stop(job)


# --- against the servers -----------------------------------------------------------------


@pytest.fixture(params=["s3", "gcs"])
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[StoreLocation, CountingProxy]]:
    """A fresh S3 or GCS folder reached through a counting proxy."""
    location: StoreLocation = request.getfixturevalue(f"{request.param}_location")
    with through_proxy(location) as (through, proxy):
        yield through.fresh(), proxy


@pytest.mark.storage
def test_the_stores_counts_match_what_the_server_was_asked(
        proxied: tuple[StoreLocation, CountingProxy]) -> None:
    location, proxy = proxied
    store = location.store(separate_client=True)
    folder = store.path("some", "folder")
    job = f"ops-{id(proxy)}"
    before_server = proxy.snapshot()
    with requests.working_for(job):
        store.write_bytes(f"{folder}/a", b"1")
        assert store.create_exclusive(f"{folder}/b", b"2")
        assert not store.create_exclusive(f"{folder}/b", b"3")  # a put, then a read
        assert store.read_bytes(f"{folder}/a") == b"1"
        with pytest.raises(FileNotFoundError):
            store.read_bytes(f"{folder}/missing")
        assert store.read_range(f"{folder}/a", 0, 1) == b"1"
        assert store.listdir(folder) == ["a", "b"]
        assert store.listdir(store.path("nothing", "here")) == []
        assert set(store.entries(folder)) == {"a", "b"}
        assert store.file_exists(f"{folder}/a") and not store.file_exists(f"{folder}/c")
        store.remove(f"{folder}/a")
        store.write_bytes(f"{folder}/c", b"4")
        store.write_bytes(f"{folder}/d", b"5")
        both = [f"{folder}/c", f"{folder}/d"]
        assert store.read_many(both) == {both[0]: b"4", both[1]: b"5"}  # one GET each, at once
        with pytest.raises(FileNotFoundError):
            store.read_many([both[0], f"{folder}/missing"])
        store.remove_many([*both, f"{folder}/gone-already"])
        assert store.listdir(folder) == ["b"]
        store.remove(folder, recursive=True)
    server = proxy.snapshot() - before_server
    counted = Counter({k: v for k, v in requests.by_kind(job).items() if v})
    assert counted == server, f"counted {dict(counted)}, the server saw {dict(server)}"


@pytest.mark.storage
def test_an_idle_job_makes_at_most_two_requests_a_second_and_still_sees_an_event(
        proxied: tuple[StoreLocation, CountingProxy]) -> None:
    """At the default settings, once its poll backed off; the server agrees with the counters.

    The window is one whole idle poll period (``idle_poll_max_seconds``),
    so it holds one look at the stream whatever the phase.
    """
    location, proxy = proxied
    client = _client(location)
    assert client.store.poll == stream_log.PollSettings()  # the defaults
    job = _keyed_count(client, "idle")
    stream = client.get_stream("clicks")
    most = stream_log.IDLE_POLL_MAX_SECONDS
    try:
        stream.publish({"user": "first"})
        _wait(lambda: _committed(job) >= 0, 60, "the first micro-batch")
        folder = client.store.layout.stream_paths("clicks").folder

        def backed_off() -> bool:  # the loop's poll of the stream reached its most
            return any(caller[0] == folder and interval >= most
                       for caller, (interval, _) in list(stream_log._BACKOFF.items()))

        _wait(backed_off, 60, "the idle poll to back off")
        job_before, server_before = Counter(requests.by_kind(job.id)), proxy.snapshot()
        began = time.monotonic()
        time.sleep(max(most, lease_refresh_seconds()))
        job_idle = Counter(requests.by_kind(job.id)) - job_before
        server_idle = proxy.snapshot() - server_before
        seconds = time.monotonic() - began
        per_second = max(sum(server_idle.values()), sum(job_idle.values())) / seconds
        print(f"idle: {per_second:.2f} requests/s over {seconds:.1f} s: server "
              f"{dict(server_idle)}, counted {dict(job_idle)}")
        # Nothing else asked the server meanwhile: the counts agree, but for a
        # request in flight at either end of the window (counted as it is sent).
        assert sum(abs(job_idle[k] - server_idle[k]) for k in requests.KINDS) <= 2, (
            dict(job_idle), dict(server_idle))
        assert per_second <= 2.0, (dict(server_idle), seconds)
        # Still noticed: an event published by another client (not this process's
        # wake-up) is found within the poll period.
        other = _client(location).get_stream("clicks")
        committed = _committed(job)
        other.publish({"user": "later"})
        _wait(lambda: _committed(job) > committed, most + 30, "the event to be noticed")
        assert client.get_map("per-user").get("later") == 1
    finally:
        _stop(job)


@pytest.mark.storage
def test_one_event_micro_batch_costs_at_most_twelve_requests(
        proxied: tuple[StoreLocation, CountingProxy], monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget, from the loop's own tally of each batch, which the server's count bounds.

    The loop tallies the requests its thread makes for a batch
    (``lastBatchStoreRequests``); the server's count over the same span adds
    only what the job's watcher asked meanwhile (its control look, its lease).
    """
    # The look that finds the event keeps the chunk it read for the batch's read
    # of it, for READ_AHEAD_SECONDS (2 s); on a loaded machine (a CI run on two
    # workers met it) the read came later and fetched the chunk again: one GET
    # more. The budget is the batch's, not the machine's speed.
    monkeypatch.setattr(stream_chunks, "READ_AHEAD_SECONDS", 600.0)
    location, proxy = proxied
    client = _client(location)
    job = _keyed_count(client, "batch")
    stream = client.get_stream("clicks")
    try:
        # State of 40 users first: a one-event batch then changes one key of its
        # range and writes a changelog (a batch that changes half a range's keys
        # writes a full copy, and removes the files it replaces: a DELETE more).
        stream.publish_all([{"user": f"user-{n}"} for n in range(40)])
        _wait(lambda: _committed(job) >= 0, 60, "the first micro-batch")
        runner = job._runner  # the job runs in this process
        assert runner is not None
        for user in ("user-1", "user-2", "fourth"):  # from the second on: the steady batch
            committed = _committed(job)
            server_before = proxy.snapshot()
            stream.publish({"user": user})  # in this process: wakes the loop at once
            _wait(lambda c=committed: _committed(job) > c, 60, "the micro-batch")
            server = proxy.snapshot() - server_before
            spent = dict(runner.stream.progress.batch_requests)
            print(f"one-event micro-batch: {sum(spent.values())} requests {spent}; the "
                  f"server saw {sum(server.values())} (publish and watcher included)")
            assert job.get_metrics()["lastBatchStoreRequests"] == sum(spent.values())
            assert sum(spent.values()) <= BATCH_REQUESTS_MOST, spent
            # The tally is the batch's: the server saw it all (and the publish's
            # own PUT, LIST and GET, the watcher's looks and lease, the idle looks).
            assert all(server[kind] >= n for kind, n in spent.items()), (spent, server)
        assert client.get_map("per-user").get("fourth") == 1
    finally:
        _stop(job)


@pytest.mark.storage
def test_a_long_partition_is_listed_from_its_newest_chunks(
        proxied: tuple[StoreLocation, CountingProxy]) -> None:
    """The look at a partition seen before lists what follows its second newest chunk.

    S3 and GCS list in name order, and chunk names sort as their offsets: the
    server is asked only for the newest few (``start-after``, ``startOffset``),
    not for every chunk the partition ever held.
    """
    location, proxy = proxied
    store = location.store(separate_client=True)
    log = store.stream_log("long")
    log.create(1)
    for n in range(30):
        log.append(0, [n])  # a chunk each
    assert log.end_offset(0) == 30  # listed whole: nothing seen yet
    log.append(0, [30])
    before = len(proxy.log)
    assert log.end_offset(0) == 31
    asked = [url for kind, _, url in proxy.log[before:] if kind == "list"]
    assert len(asked) == 1 and ("start-after=" in asked[0] or "startOffset=" in asked[0]), asked
    assert log.read(0, 28, 31) == [28, 29, 30]


# --- what the caches that save requests must not hide ------------------------------------


@pytest.fixture(params=["s3", "gcs"])
def remote(request: pytest.FixtureRequest) -> StoreLocation:
    """A fresh S3 or GCS folder (no proxy)."""
    location: StoreLocation = request.getfixturevalue(f"{request.param}_location")
    return location.fresh()


@contextlib.contextmanager
def _another_process(location: StoreLocation) -> Iterator[Store]:
    """A store handle as another process has: what it does leaves this process's caches alone.

    The stream log keeps what it saw of each partition per process
    (``_CHUNKS``, ``_LISTED``); they are put back as they were afterwards.
    """
    saved = dict(stream_log._CHUNKS), dict(stream_log._LISTED)
    try:
        yield location.store(separate_client=True)
    finally:
        for cache, before in zip((stream_log._CHUNKS, stream_log._LISTED), saved, strict=True):
            cache.clear()
            cache.update(before)


def _made_anew(location: StoreLocation, name: str, partitions: int, items: list[Any]) -> None:
    """Another process deletes stream ``name``, makes it anew and publishes ``items``."""
    with _another_process(location) as theirs:
        log = theirs.stream_log(name)
        theirs.remove(log.paths.folder, recursive=True)
        assert log.create(partitions)
        if items:
            theirs.stream_log(name).publish_all(items)


@pytest.mark.storage
def test_a_write_splits_by_the_partitions_a_stream_made_anew_has(remote: StoreLocation) -> None:
    ours = remote.store(separate_client=True)
    log = ours.stream_log("s")
    assert log.create(4)
    log.publish_all(["before"])  # this handle has read (and keeps) the count 4
    _made_anew(remote, "s", 2, [])
    ours.stream_log("s").publish_all(list(range(8)))
    with _another_process(remote) as theirs:
        fresh = theirs.stream_log("s")
        assert fresh.partitions == 2
        assert sorted(item for p in range(2) for item in fresh.read_held(p)) == list(range(8))
    with pytest.raises(StoreError, match="made anew with other partitions"):
        ours.stream_log("s").append_batch("w", "t", [[1], [2], [3], [4]])


@pytest.mark.storage
def test_a_chunk_kept_by_a_look_is_not_read_for_a_stream_made_anew(
        remote: StoreLocation, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_chunks, "READ_AHEAD_SECONDS", 0.2)
    ours = remote.store(separate_client=True)
    log = ours.stream_log("r")
    assert log.create(1)
    log.publish_all(["old-1", "old-2"])
    assert log.end_offsets() == [2]  # the look reads the chunk's header: it keeps the chunk
    _made_anew(remote, "r", 1, ["new-1", "new-2"])  # chunks of the same names and sizes
    time.sleep(0.3)  # past the kept copy's life (patched above)
    again = ours.stream_log("r")
    assert again.end_offsets() == [2]
    assert again.read(0, 0, 2) == ["new-1", "new-2"]
