"""Exported snapshots of running jobs, and updated pipelines started from them (Jet's rules)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, ClassVar

import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.errors import (
    JobCancelledError,
    JobStateError,
    SnapshotCorruptedError,
    SnapshotNotFoundError,
    SnapshotSignatureError,
    StateIncompatibleError,
)
from sparkjet.job import JobConfig, JobStatus, ProcessingGuarantee
from sparkjet.pipeline import Pipeline, StreamSource
from sparkjet.plugin import ALL_GUARANTEES, StatefulTransform, hookimpl
from sparkjet.plugins.snapshots import LocalSnapshotBackend
from tests.conftest import TEST_SPARK
from tests.conftest import cancel_job as stop
from tests.conftest import wait_until as wait_for

EXACTLY_ONCE = ProcessingGuarantee.EXACTLY_ONCE


def start(
    client: Any, pipeline: Pipeline, name: str, snapshot: str | None = None, **options: Any
) -> Any:
    config = JobConfig(name=name, processing_guarantee=EXACTLY_ONCE,
                       snapshot_interval_millis=100, key_groups=16, **options)
    config.initial_snapshot_name = snapshot
    job = client.get_jet().submit(pipeline, config)
    wait_for(lambda: job.status is JobStatus.RUNNING, what=f"{name} to run")
    return job


def v1() -> Pipeline:
    p = Pipeline.create()
    events = p.read_from(StreamSource("clicks")).set_name("clicks")
    (events.group_by(lambda x: x % 10).aggregate(counting()).set_name("clicks-per-user")
     .write_to(Pipeline.to_map("counts")))
    events.distinct().set_name("uniq").write_to(Pipeline.to_list("firsts"))
    return p


def v2() -> Pipeline:
    """Adds a filter, a new stateful stage; drops ``uniq``; keeps ``clicks-per-user``."""
    p = Pipeline.create()
    events = p.read_from(StreamSource("clicks")).set_name("clicks")
    kept = events.filter(lambda x: x >= 0).set_name("non-negative")  # stateless: free to add
    (kept.group_by(lambda x: x % 10).aggregate(counting()).set_name("clicks-per-user")
     .write_to(Pipeline.to_map("counts")))
    (kept.group_by(lambda x: x % 2).aggregate(counting()).set_name("per-parity")
     .write_to(Pipeline.to_map("parity")))
    return p


def oracle(values: range | list[int], mod: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v % mod] = counts.get(v % mod, 0) + 1
    return counts


def test_export_then_upgrade_carries_state_by_stage_name(client: Any) -> None:
    stream = client.get_stream("clicks", partitions=2)
    job = start(client, v1(), "clicks")
    try:
        stream.publish_all(range(300))
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(300), 10),
                 what="v1's counts")
        snapshot = job.export_snapshot("v1")  # the job keeps running
        assert job.status is JobStatus.RUNNING
        assert (snapshot.name, snapshot.job_id, snapshot.job_name) == ("v1", job.id, "clicks")
        assert snapshot.payload_size > 0 and snapshot.creation_time > 0
        stages = {s.name: s for s in snapshot.manifest.stages}
        assert stages["clicks-per-user"].key_count == 10 and stages["uniq"].key_count == 300
        assert [s.name for s in client.get_jet().list_snapshots()] == ["v1"]
        stream.publish_all(range(300, 400))
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(400), 10),
                 what="v1 going on after the export")
        # Jet overwrites by name: the cut now holds all 400.
        replaced = job.cancel_and_export_snapshot("v1")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
        assert {s.name: s.key_count for s in replaced.manifest.stages}["uniq"] == 400
    finally:
        stop(job)
    # Published while no job ran: the upgraded job reads it from the snapshot's offsets.
    stream.publish_all(range(400, 450))
    with pytest.raises(StateIncompatibleError, match="'uniq', which this pipeline does not"):
        start(client, v2(), "clicks-v2", snapshot="v1")  # v2 has no 'uniq': refused by default
    job2 = start(client, v2(), "clicks-v2", snapshot="v1", allow_dropped_state=True)
    try:
        stream.publish_all(range(450, 500))
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(500), 10),
                 what="clicks-per-user going on from its restored counts")
        wait_for(lambda: dict(client.get_map("parity").entry_set()) == oracle(
            range(400, 500), 2), what="the new stage, started empty at the cut")
        restore = job2.get_metrics()["snapshotRestore"]
        assert restore["snapshot"] == "v1"
        assert restore["stages"] == {"clicks-per-user": "restored", "per-parity": "new",
                                     "uniq": "dropped"}
        assert restore["sources"] == {"clicks": "restored"}
    finally:
        stop(job2)


def test_upgrades_refused_at_submit_name_the_stage_or_file(client: Any) -> None:
    stream = client.get_stream("clicks", partitions=1)
    job = start(client, v1(), "clicks")
    try:
        stream.publish_all(range(50))
        wait_for(lambda: len(client.get_map("counts").entry_set()) == 10, what="counts")
        job.export_snapshot("good")
    finally:
        stop(job)
    jet = client.get_jet()
    # Another accumulator type under the same stage name.
    p = Pipeline.create()
    (p.read_from(StreamSource("clicks")).group_by(lambda x: x % 10)
     .aggregate(accumulator=lambda acc, x: [*acc, x], initial=[]).set_name("clicks-per-user")
     .write_to(Pipeline.to_map("lists")))
    config = JobConfig(name="bad", processing_guarantee=EXACTLY_ONCE)
    config.initial_snapshot_name = "good"
    with pytest.raises(StateIncompatibleError, match="clicks-per-user") as refused:
        jet.submit(p, config)
    assert "clicks-per-user" in refused.value.stages
    assert "keeps state" in str(refused.value)
    assert "'int'" in str(refused.value) or '"int"' in str(refused.value)
    config.allow_dropped_state = True  # v2 has no 'uniq'
    config.initial_snapshot_name = "missing"
    with pytest.raises(SnapshotNotFoundError, match="missing"):
        jet.submit(v2(), config)
    # A state file with a flipped byte: refused before anything starts.
    snapshot = jet.get_snapshot("good")
    entry = snapshot.manifest.stage("clicks-per-user").files[0]
    store = client.snapshots
    path = snapshot.path(entry.path)
    data = bytearray(store.backend.read_bytes(path))
    data[len(data) // 2] ^= 0xFF
    store.backend.write_bytes(path, bytes(data))
    config.initial_snapshot_name = "good"
    with pytest.raises(SnapshotCorruptedError, match=entry.path.rsplit("/", 1)[-1]):
        jet.submit(v2(), config)
    assert jet.get_job_by_name("bad") is None  # nothing was submitted
    # Nor was the name taken, nor a checkpoint left: mended, the same submit starts.
    data[len(data) // 2] ^= 0xFF
    store.backend.write_bytes(path, bytes(data))
    job = jet.submit(v2(), config)
    wait_for(lambda: job.status is JobStatus.RUNNING, what="the mended submit to run")
    stop(job)


def test_export_from_a_suspended_job_and_from_another_process(
    client: Any, store_url: str
) -> None:
    stream = client.get_stream("clicks", partitions=1)
    job = start(client, v1(), "clicks")
    try:
        stream.publish_all(range(30))
        wait_for(lambda: len(client.get_map("counts").entry_set()) == 10, what="counts")
        # A handle from another client acts through the job's control folder.
        other = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK)
        remote = other.get_jet().get_job(job.id)
        assert remote.export_snapshot("remote", timeout=120).job_id == job.id
        job.suspend()
        wait_for(lambda: job.status is JobStatus.SUSPENDED, what="suspended")
        seen: list[JobStatus] = []
        job.add_status_listener(lambda event: seen.append(event.new_status))
        assert job.export_snapshot("paused").manifest.batch_id >= 0
        assert JobStatus.SUSPENDED_EXPORTING_SNAPSHOT in seen
        assert job.status is JobStatus.SUSPENDED
        assert sorted(s.name for s in client.get_jet().list_snapshots()) == ["paused", "remote"]
    finally:
        stop(job)
    with pytest.raises(JobStateError, match="FAILED"):
        job.export_snapshot("too-late")


def test_check_upgrade_and_read_state_without_a_job(client: Any) -> None:
    stream = client.get_stream("clicks", partitions=2)
    job = start(client, v1(), "clicks")
    try:
        stream.publish_all(range(25))
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(25), 10),
                 what="counts")
        snapshot = job.export_snapshot("for-analysis")
    finally:
        stop(job)
    assert snapshot.read_state("clicks-per-user") == oracle(range(25), 10)
    assert snapshot.read_state("uniq") == dict.fromkeys(range(25), True)
    with pytest.raises(SnapshotNotFoundError, match=r"'nope'.*'clicks-per-user'"):
        snapshot.read_state("nope")
    rows = client.get_jet().check_upgrade(v2(), "for-analysis")
    assert {(r.stage, r.status, r.keys, bool(r.refusal)) for r in rows} == {
        ("clicks-per-user", "restored", 10, False), ("per-parity", "new", 0, False),
        ("uniq", "dropped", 25, True), ("clicks", "restored", 0, False)}
    accepted = client.get_jet().check_upgrade(
        v2(), "for-analysis", config=JobConfig(allow_dropped_state=True))
    assert [r.refusal for r in accepted] == ["", "", "", ""]
    assert client.get_jet().get_jobs()[0].name == "clicks"  # check_upgrade submitted nothing


def test_upgrade_round_trip_while_a_producer_keeps_publishing(client: Any) -> None:
    """EXACTLY_ONCE across export, cancel and restore: the counts equal the oracle."""
    stream = client.get_stream("clicks", partitions=2)
    published: list[int] = []
    stop_publishing = threading.Event()

    def produce() -> None:
        n = 0
        while not stop_publishing.is_set():
            batch = list(range(n, n + 7))
            stream.publish_all(batch)
            published.extend(batch)
            n += 7
            time.sleep(0.02)

    producer = threading.Thread(target=produce, daemon=True)
    job = start(client, v1(), "clicks")
    producer.start()
    try:
        wait_for(lambda: len(published) > 300, what="a stream of clicks")
        job.cancel_and_export_snapshot("live")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
        job2 = start(client, v2(), "clicks-v2", snapshot="live", allow_dropped_state=True)
        wait_for(lambda: len(published) > 900, what="more clicks")
    finally:
        stop_publishing.set()
        producer.join(timeout=30)
    try:
        total = list(published)
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(total, 10),
                 what="every click counted once across the upgrade")
    finally:
        stop(job2)


# Spark's workers cannot import this test module: ship its classes by value
# (PySpark serialises tasks with its own copy of cloudpickle).
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Highs(StatefulTransform):
    """Each key's running maximum."""

    kind = "highs"
    guarantees = ALL_GUARANTEES
    signature = "max:int"

    def create_state(self) -> Any:
        return None

    def process(self, state: Any, key: Any, items: list[Any]) -> tuple[Any, list[Any]]:
        state = max([*items, *([] if state is None else [state])])
        return state, [(key, state)]

    def state_signature(self) -> str:
        return self.signature


class HighsAsList(Highs):
    signature = "max:list"


class _Highs:
    @hookimpl
    def register_stateful_transforms(self, register):  # type: ignore[no-untyped-def]
        register(Highs)


def test_a_plugin_transform_declares_its_state_signature(client: Any) -> None:
    client.register_plugin(_Highs(), "highs")
    stream = client.get_stream("h", partitions=1)

    def pipeline(transform: StatefulTransform) -> Pipeline:
        p = Pipeline.create()
        (p.read_from(StreamSource("h")).group_by(lambda x: x % 2).apply(transform)
         .set_name("highs").write_to(Pipeline.to_map("highs")))
        return p

    job = start(client, pipeline(Highs()), "highs")
    try:
        stream.publish_all([1, 8, 3])
        wait_for(lambda: dict(client.get_map("highs").entry_set()) == {1: 3, 0: 8}, what="highs")
        snapshot = job.export_snapshot("highs")
    finally:
        stop(job)
    signature = snapshot.manifest.stage("highs").state_signature
    assert {k: v for k, v in signature.items() if k not in ("key", "upstream")} == {
        "op": "apply", "transform": "highs", "state": "max:int"}
    assert signature["key"].startswith("<lambda>#")  # the key function's identity
    config = JobConfig(name="highs-2", processing_guarantee=EXACTLY_ONCE)
    config.initial_snapshot_name = "highs"
    with pytest.raises(StateIncompatibleError, match="max:list"):
        client.get_jet().submit(pipeline(HighsAsList()), config)


@pytest.mark.spark
def test_a_signed_snapshot_is_refused_with_the_wrong_key(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOT_KEY", "s3cr3t-first-9f1")
    signed = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK,
                              snapshots={"signing_key": "${env:SNAPSHOT_KEY}"})
    stream = signed.get_stream("clicks", partitions=1)
    job = start(signed, v1(), "clicks")
    try:
        stream.publish_all(range(20))
        wait_for(lambda: len(signed.get_map("counts").entry_set()) == 10, what="counts")
        assert job.export_snapshot("signed").manifest.signed
    finally:
        stop(job)
    monkeypatch.setenv("SNAPSHOT_KEY", "s3cr3t-second-7c2")
    other = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK,
                             snapshots={"signing_key": "${env:SNAPSHOT_KEY}"})
    config = JobConfig(name="v2", processing_guarantee=EXACTLY_ONCE)
    config.initial_snapshot_name = "signed"
    with pytest.raises(SnapshotSignatureError, match="signed") as refused:
        other.get_jet().submit(v2(), config)
    message = str(refused.value)
    assert "s3cr3t-second-7c2" not in message and "s3cr3t-first-9f1" not in message


def a_restore_of_offsets_only(tmp_path: Any) -> tuple[Any, Any, Any, Any]:
    """A new checkpoint, v2's plan, snapshot ``old`` (offsets, no state) and sources' offsets."""
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.core.state.checkpoint import Checkpoint
    from sparkjet.core.state.restore import SourceOffsets
    from sparkjet.core.state.snapshots import ManifestFields, SnapshotStore
    from sparkjet.core.store.fs import Store
    from sparkjet.testing import StoreLocation

    snapshots = SnapshotStore(StoreLocation(str(tmp_path / "snapshots")).snapshot_backend())
    snapshots.write("old", ManifestFields(
        job_id="j", job_name="old", sparkjet_version="x", spark_version="y",
        pipeline_fingerprint="f", batch_id=3, sources={"clicks": [5, 7]}), [])
    store = Store(str(tmp_path / "store"))
    checkpoint = Checkpoint(store, store.path("jobs", "new", "checkpoint"))
    planned = plan(v2(), PluginHost(), EXACTLY_ONCE)
    offsets = SourceOffsets(lambda s: [0, 0], lambda s: [9, 9],
                            lambda s, at: [str(p) for p in range(len(at))])
    return checkpoint, planned, snapshots.get("old"), offsets


def test_a_restore_that_carries_no_state_keeps_the_jobs_own_key_groups(tmp_path: Any) -> None:
    """Every stateful stage new: the checkpoint gets the job's key_groups, not the snapshot's."""
    from sparkjet.core.state.restore import seed_checkpoint

    checkpoint, planned, snapshot, offsets = a_restore_of_offsets_only(tmp_path)
    rows = seed_checkpoint(checkpoint, planned, snapshot, offsets, 64)
    assert {(r.kind, r.status) for r in rows} == {("state", "new"), ("source", "restored")}
    assert checkpoint.written_key_groups() == 64
    assert checkpoint.commit_record(0).ends == {"clicks": [5, 7]}


def test_a_restore_goes_by_the_upgrade_checked_for_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeding by the submit's checked upgrade runs no rules; one of another plan is refused."""
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.core.state.restore import seed_checkpoint
    from sparkjet.core.state.snapshots import upgrade
    from sparkjet.core.state.snapshots.upgrade import UpgradeOptions, require_compatible

    checkpoint, planned, snapshot, offsets = a_restore_of_offsets_only(tmp_path)
    checked = require_compatible(planned, snapshot.manifest)

    def again(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the upgrade rules ran again")

    monkeypatch.setattr(upgrade, "check_upgrade", again)
    other = plan(v2(), PluginHost(), EXACTLY_ONCE)
    with pytest.raises(ValueError, match="another pipeline"):
        seed_checkpoint(checkpoint, other, snapshot, offsets, 64, upgrade=checked)
    with pytest.raises(ValueError, match="not both"):
        seed_checkpoint(checkpoint, planned, snapshot, offsets, 64, UpgradeOptions(),
                        upgrade=checked)
    assert checkpoint.meta() is None
    rows = seed_checkpoint(checkpoint, planned, snapshot, offsets, 64, upgrade=checked)
    assert rows == list(checked.rows)
    assert checkpoint.commit_record(0).ends == {"clicks": [5, 7]}


class GatedSnapshotBackend(LocalSnapshotBackend):
    """A local folder whose state-file writes wait for the test to open the gate.

    So an export is held mid-way, for as long as the test likes, on the real
    local backend.
    """

    kind = "gated"
    entered = threading.Event()
    gate = threading.Event()

    def _wait(self) -> None:
        type(self).entered.set()
        if not type(self).gate.wait(120):
            raise TimeoutError("the test never opened the gate")

    def write_bytes(self, path: str, data: bytes) -> None:
        self._wait()
        super().write_bytes(path, data)

    def write_chunks(self, path: str, chunks: Any) -> None:
        self._wait()
        super().write_chunks(path, chunks)


class RegistersGated:
    @hookimpl
    def register_snapshot_backends(self, register: Any) -> None:
        register(GatedSnapshotBackend)


@pytest.mark.spark
def test_a_running_job_goes_on_while_its_snapshot_is_exported(
    store_url: str, tmp_path: Any
) -> None:
    """The export reads the cut's state beside the loop; the pin keeps the files it reads.

    Every batch below changes every key, so each writes a full copy and its
    next batch removes the older files: without the pin, the cut's files
    would be gone before the held export reads them. And were the export
    run in the loop, no batch would commit while it is held.
    """
    client = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK,
                              snapshots={"backend": "gated", "url": str(tmp_path / "snaps")})
    client.plugins.register(RegistersGated(), "gated-plugin")
    GatedSnapshotBackend.entered.clear()
    GatedSnapshotBackend.gate.clear()
    stream = client.get_stream("clicks", partitions=1)
    p = Pipeline.create()
    (p.read_from(StreamSource("clicks")).set_name("clicks")
     .group_by(lambda x: x % 50).aggregate(counting()).set_name("per-key")
     .write_to(Pipeline.to_map("counts")))
    job = start(client, p, "live")
    result: dict[str, Any] = {}

    def export() -> None:
        try:
            result["snapshot"] = job.export_snapshot("live")
        except BaseException as exc:
            result["error"] = exc

    try:
        stream.publish_all(range(100))
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(100), 50),
                 what="the first counts")
        exporter = threading.Thread(target=export)
        exporter.start()
        assert GatedSnapshotBackend.entered.wait(60), "the export never began writing"
        checkpoint = client.store.path("jobs", job.id)
        pins = client.store.listdir(f"{checkpoint}/checkpoint/pins")
        assert len(pins) == 1
        for round_ in range(2, 6):  # each a batch of its own, while the export is held
            stream.publish_all(range(50))
            wait_for(lambda r=round_: dict(client.get_map("counts").entry_set()) == {
                k: r + 1 for k in range(50)}, what=f"batch {round_} during the export")
        assert job.status is JobStatus.RUNNING and "snapshot" not in result
        GatedSnapshotBackend.gate.set()
        exporter.join(60)
        assert "error" not in result, result.get("error")
        snapshot = result["snapshot"]
        # The state of the cut: the first 100 items, not what came during the export.
        assert snapshot.read_state("per-key") == oracle(range(100), 50)
        assert client.store.listdir(f"{checkpoint}/checkpoint/pins") == []
        stream.publish_all(range(50))  # unpinned: the next batches remove the old files
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == {
            k: 7 for k in range(50)}, what="a batch after the export")
    finally:
        GatedSnapshotBackend.gate.set()
        stop(job)


def test_a_state_file_gone_mid_export_is_named(tmp_path: Any) -> None:
    """A file of the cut removed under the export (a take-over): named, nothing published."""
    from sparkjet.core.errors import StoreError
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.core.state.checkpoint import BatchPlan, Checkpoint, CommitRecord
    from sparkjet.core.state.export import cut_export, export_state, release_cut
    from sparkjet.core.state.files import RangeState
    from sparkjet.core.state.snapshots import SnapshotStore
    from sparkjet.core.state.versions import StateRange
    from sparkjet.core.store.fs import Store
    from sparkjet.testing import StoreLocation

    store = Store(str(tmp_path / "store"))
    checkpoint = Checkpoint(store, store.path("jobs", "j", "checkpoint"))
    checkpoint.key_groups(4, ["clicks-per-user"])
    paths = checkpoint.state(4)
    written = paths.write("clicks-per-user", 0, 4, 0, RangeState({1: 1}, {}, []), [1], [], [])
    checkpoint.write_plan(BatchPlan(0, {}, {"clicks": [3]}, 0, 1))
    checkpoint.write_commit(CommitRecord(0, {"clicks": [3]}, state={
        StateRange("clicks-per-user", 0, 4): written.chain[-1].name}))
    snapshots = SnapshotStore(StoreLocation(str(tmp_path / "snapshots")).snapshot_backend())
    planned = plan(v1(), PluginHost(), EXACTLY_ONCE)
    cut = cut_export(checkpoint, planned, "gone", "'j'")
    store.remove(paths.path("clicks-per-user", written.chain[-1]))
    with pytest.raises(StoreError, match=written.chain[-1].name) as info:
        export_state(checkpoint, cut, planned, snapshots, "gone", job_id="j", job_name=None,
                     versions=("x", "y"))
    assert "removed while it was being exported" in str(info.value)
    assert not snapshots.exists("gone")
    release_cut(checkpoint, cut)
    assert checkpoint.pinned() == -1


def test_a_job_that_has_committed_no_batch_exports_its_empty_state(client: Any) -> None:
    """Like Jet, a RUNNING job exports at once; the snapshot starts where its first batch would."""
    stream = client.get_stream("clicks", partitions=2)
    job = start(client, v1(), "clicks")
    try:
        snapshot = job.cancel_and_export_snapshot("at-start")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
    finally:
        stop(job)
    assert snapshot.manifest.batch_id == -1
    assert {s.name: s.key_count for s in snapshot.manifest.stages} == {
        "clicks-per-user": 0, "uniq": 0}
    assert snapshot.manifest.sources == {"clicks": [0, 0]}
    stream.publish_all(range(40))  # after the cut: the job started from it reads them all
    job2 = start(client, v2(), "clicks-v2", snapshot="at-start", allow_dropped_state=True)
    try:
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(40), 10),
                 what="counts from the empty snapshot")
        assert job2.get_metrics()["snapshotRestore"]["stages"]["clicks-per-user"] == "restored"
    finally:
        stop(job2)


@pytest.mark.parametrize("where", ["folder", "memory"])
def test_an_export_folds_changelogs_in_compaction_children(where: str, tmp_path: Any) -> None:
    """Ranges with changelogs: folded by child processes into full copies the export copies.

    On a store other processes cannot see (memory://) the export folds them itself.
    """
    from sparkjet.core.host.manager import PluginHost
    from sparkjet.core.pipeline.planner import plan
    from sparkjet.core.state.checkpoint import BatchPlan, Checkpoint, CommitRecord
    from sparkjet.core.state.export import cut_export, export_state, release_cut
    from sparkjet.core.state.files import RangeState
    from sparkjet.core.state.snapshots import SnapshotStore
    from sparkjet.core.state.versions import StateRange
    from sparkjet.core.store.fs import Store
    from sparkjet.testing import StoreLocation

    url = str(tmp_path / "store") if where == "folder" else f"memory://fold-{tmp_path.name}"
    store = Store(url)
    checkpoint = Checkpoint(store, store.path("jobs", "j", "checkpoint"))
    checkpoint.key_groups(4, ["clicks-per-user"])
    paths = checkpoint.state(4)
    stage = "clicks-per-user"
    expected: dict[int, int] = {}
    for batch in range(3):  # batch 0 a full copy of each range, then a changelog each
        names = {}
        for lo, hi in ((0, 2), (2, 4)):
            versions = paths.versions(stage, lo, hi)
            state = paths.read_chain(stage, lo, hi, paths.chain(versions, batch - 1, lo, hi))
            keys = [k for k in range(40) if (k % 4) // 2 == lo // 2]
            changed = keys if batch == 0 else keys[:2]
            for key in changed:
                state.values[key] = state.values.get(key, 0) + 1
            written = paths.write(stage, lo, hi, batch, RangeState(
                state.values, state.touched, state.chain), changed, [], versions)
            names[StateRange(stage, lo, hi)] = written.chain[-1].name
            expected.update(state.values)
        checkpoint.write_plan(BatchPlan(batch, {}, {"clicks": [batch]}, 0, 2))
        checkpoint.write_commit(CommitRecord(batch, {"clicks": [batch]}, state=names))
    assert [v.full for v in paths.versions(stage, 0, 2)] == [True, False, False]
    snapshots = SnapshotStore(StoreLocation(str(tmp_path / "snapshots")).snapshot_backend())
    planned = plan(v1(), PluginHost(), EXACTLY_ONCE)
    cut = cut_export(checkpoint, planned, "folded", "'j'")
    try:
        manifest = export_state(checkpoint, cut, planned, snapshots, "folded", job_id="j",
                                job_name=None, versions=("x", "y"))
    finally:
        release_cut(checkpoint, cut)
    assert manifest.batch_id == 2
    assert snapshots.get("folded").read_state(stage) == expected
    assert {s.name: s.key_count for s in manifest.stages}[stage] == 40
    compacted = [v for v in paths.versions(stage) if v.attempt.startswith("z")]
    if where == "folder":  # each range's full copy as of batch 2, which the job reads too
        assert sorted((v.lo, v.hi, v.batch, v.keys) for v in compacted) == [
            (0, 2, 2, 20), (2, 4, 2, 20)]
        # ... and the snapshot's files are those copies, byte for byte.
        snapshot = snapshots.get("folded")
        entries = manifest.stage(stage).files  # type: ignore[union-attr]
        assert sorted(snapshot.read_file(e.path) for e in entries) == sorted(
            store.read_bytes(paths.path(stage, v)) for v in compacted)
    else:
        assert compacted == []


class CountingSnapshotBackend(LocalSnapshotBackend):
    """A local folder that counts the reads of each file (whole or in chunks)."""

    kind = "counting"
    reads: ClassVar[dict[str, int]] = {}

    def read_bytes(self, path: str) -> bytes:
        type(self).reads[path] = type(self).reads.get(path, 0) + 1
        return super().read_bytes(path)

    def read_chunks(self, path: str, chunk_size: int = 1 << 20) -> Any:
        type(self).reads[path] = type(self).reads.get(path, 0) + 1
        return super().read_chunks(path, chunk_size)


class RegistersCounting:
    @hookimpl
    def register_snapshot_backends(self, register: Any) -> None:
        register(CountingSnapshotBackend)


@pytest.mark.spark
def test_a_restore_reads_each_snapshot_file_once(store_url: str, tmp_path: Any) -> None:
    client = sparkjet.connect(store={"url": store_url}, spark=TEST_SPARK,
                              snapshots={"backend": "counting", "url": str(tmp_path / "snaps")})
    client.plugins.register(RegistersCounting(), "counting-plugin")
    stream = client.get_stream("clicks", partitions=2)
    job = start(client, v1(), "clicks")
    try:
        stream.publish_all(range(200))
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(200), 10),
                 what="v1's counts")
        snapshot = job.cancel_and_export_snapshot("v1")
        with pytest.raises(JobCancelledError):
            job.join(timeout=60)
    finally:
        stop(job)
    restored = {f.path for s in snapshot.manifest.stages if s.name == "clicks-per-user"
                for f in s.files}
    assert restored
    CountingSnapshotBackend.reads.clear()
    with pytest.raises(StateIncompatibleError, match="'uniq', which this pipeline does not"):
        start(client, v2(), "clicks-v2", snapshot="v1")  # v2 has no 'uniq': refused by default
    job2 = start(client, v2(), "clicks-v2", snapshot="v1", allow_dropped_state=True)
    try:
        wait_for(lambda: dict(client.get_map("counts").entry_set()) == oracle(range(200), 10),
                 what="the restored counts")
        reads = {path.split("/", 2)[-1]: n for path, n in CountingSnapshotBackend.reads.items()
                 if not path.endswith("MANIFEST.json")}
        # Each restored stage's file once (checked as it is copied); the dropped stage's none.
        assert reads == dict.fromkeys(restored, 1)
    finally:
        stop(job2)

