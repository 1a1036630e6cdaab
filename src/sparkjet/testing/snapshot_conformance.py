"""The snapshot backend conformance suite, :class:`SnapshotBackendConformance`.

What every snapshot backend must do: its file operations, create-only writes
and retried creates, and snapshots written, listed, read, replaced by name,
checked for corruption, exported and listed by racing threads, and left
whole by an export that fails half-way. :func:`snapshot_fields` and
:func:`snapshot_files` make a test export's manifest and content. The suite
writes and reads snapshots through the public :class:`~sparkjet.job.SnapshotStore`
on the backend under test.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sparkjet.errors import (
    SnapshotCorruptedError,
    SnapshotNotFoundError,
    SnapshotReplacedError,
)
from sparkjet.job import (
    MANIFEST,
    ManifestFields,
    Snapshot,
    SnapshotStore,
    StageFields,
    snapshot_folder,
)
from sparkjet.plugin import SnapshotBackend
from sparkjet.testing.races import race


def snapshot_fields(job: str = "job-1", files: int = 3, stage: str = "counts") -> ManifestFields:
    """Manifest fields of a test export: one stage with ``files`` files, a source, a signature."""
    return ManifestFields(
        job_id=job,
        job_name=f"name-of-{job}",
        sparkjet_version="0.0.test",
        spark_version="4.x",
        pipeline_fingerprint=f"fingerprint-{job}",
        batch_id=7,
        sources={"from-stream(clicks)": [[0, 12], [1, 30]]},
        source_identities={
            "from-stream(clicks)": {"plugin": "stream", "reads": "clicks", "partitions": 2}},
        stages=[
            StageFields(
                name=stage, kind="aggregate", state_signature={"accumulator": "int"},
                key_count=files * 10, key_groups=128,
                files=[f"stages/{stage}/kg-{i:03d}.pkl" for i in range(files)],
            )
        ],
    )


def snapshot_files(fields: ManifestFields, size: int = 1000) -> dict[str, bytes]:
    """Distinct content for every file ``fields`` names (derived from the job id and path)."""
    out = {}
    for stage in fields.stages:
        for path in stage.files:
            seed = f"{fields.job_id}:{path}:".encode()
            out[path] = (seed * (size // len(seed) + 1))[:size]
    return out


def _chunked(data: bytes, size: int = 333) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


class _FailAfter(SnapshotBackend):
    """A backend that passes everything to ``inner`` but fails writes after ``writes`` of them."""

    kind = "fail-after"

    def __init__(self, inner: SnapshotBackend, writes: int) -> None:
        super().__init__(inner.url, {})
        self.inner, self.left = inner, writes

    def _spend(self) -> None:
        if self.left <= 0:
            raise OSError("injected: the storage went away half-way through the export")
        self.left -= 1

    def write_bytes(self, path: str, data: bytes) -> None:
        self._spend()
        self.inner.write_bytes(path, data)

    def write_chunks(self, path: str, chunks: Any) -> None:
        self._spend()
        self.inner.write_chunks(path, chunks)

    def read_bytes(self, path: str) -> bytes:
        return self.inner.read_bytes(path)

    def list_children(self, prefix: str) -> list[str]:
        return self.inner.list_children(prefix)

    def list(self, prefix: str) -> builtins.list[str]:
        return self.inner.list(prefix)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def delete(self, prefix: str) -> None:
        self.inner.delete(prefix)


class SnapshotBackendConformance:
    """What every snapshot backend must do; subclass it with a ``new_backend`` fixture.

    ``new_backend()`` returns a new client of one fresh, empty location (a
    separate client where the backend has one, as another process would).
    """

    @pytest.fixture
    def new_backend(self) -> Callable[[], SnapshotBackend]:
        """A factory of clients on a fresh location: override it."""
        raise NotImplementedError(
            "give the SnapshotBackendConformance subclass a 'new_backend' fixture"
        )

    @pytest.fixture
    def backend(self, new_backend: Callable[[], SnapshotBackend]) -> SnapshotBackend:
        """One client of the location under test."""
        return new_backend()

    @pytest.fixture
    def snapshots(self, backend: SnapshotBackend) -> SnapshotStore:
        """A snapshot store on :meth:`backend`."""
        return SnapshotStore(backend)

    @staticmethod
    def export(store: SnapshotStore, name: str, job: str, files: int = 3) -> Snapshot:
        """Write a test snapshot (half the files as chunk iterators); return it as read back."""
        fields = snapshot_fields(job, files)
        content = snapshot_files(fields)
        store.write(name, fields, [
            (path, _chunked(data) if i % 2 else data)
            for i, (path, data) in enumerate(content.items())
        ])
        return store.get(name)

    @staticmethod
    def assert_whole(snapshot: Snapshot, job: str) -> None:
        """The snapshot is the one ``job`` exported, every file intact."""
        assert snapshot.job_id == job
        snapshot.verify()
        fields = snapshot_fields(job, len(snapshot.manifest.all_files()))
        for path, data in snapshot_files(fields).items():
            assert snapshot.read_file(path) == data

    # --- the backend's file operations ----------------------------------------------------

    def test_files_round_trip(self, backend: SnapshotBackend) -> None:
        """Whole and chunked writes and reads, sizes, existence, listings and deletes."""
        backend.write_bytes("a/b/one", b"1")
        backend.write_chunks("a/b/sub/two", iter([b"tw", b"o"]))
        backend.write_bytes("a/bc/three", b"333")
        backend.write_bytes("a/b/one", b"one, replaced")
        assert backend.read_bytes("a/b/one") == b"one, replaced"
        assert b"".join(backend.read_chunks("a/b/sub/two", 1)) == b"two"
        assert backend.size("a/bc/three") == 3
        assert backend.exists("a/b/one")
        assert not backend.exists("a/b/none")
        assert backend.list("a/b") == ["a/b/one", "a/b/sub/two"]
        assert backend.list("") == ["a/b/one", "a/b/sub/two", "a/bc/three"]
        assert backend.list("nowhere") == []
        assert backend.list_children("a") == ["b", "bc"]
        assert backend.list_children("a/b") == ["one", "sub"]
        with pytest.raises(FileNotFoundError):
            backend.read_bytes("a/b/none")
        with pytest.raises(FileNotFoundError):
            backend.size("a/b/none")
        backend.delete("a/b")  # a folder, not its sibling a/bc
        assert backend.list("") == ["a/bc/three"]
        backend.delete("a/bc/three")  # a file
        backend.delete("a/gone")  # absent: fine
        assert backend.list("") == []

    def test_creates_are_create_only(self, backend: SnapshotBackend) -> None:
        """A second create of a path is refused and leaves the first content."""
        assert backend.create_only_enforced, f"{backend!r} does not enforce create-only writes"
        assert backend.create_exclusive("once/file", b"first") is True
        assert backend.create_exclusive("once/file", b"second") is False
        assert backend.read_bytes("once/file") == b"first"

    def test_a_retried_create_is_recognised_by_its_content(self, backend: SnapshotBackend) -> None:
        """A create whose first attempt landed counts as the caller's; a rival's does not."""
        backend.write_bytes("retried/file", b"payload-7d1c")  # the attempt whose answer was lost
        assert backend.create_exclusive("retried/file", b"payload-7d1c") is True
        assert backend.create_exclusive("retried/file", b"another writer's") is False
        assert backend.read_bytes("retried/file") == b"payload-7d1c"

    def test_another_clients_writes_are_seen_at_once(
        self, new_backend: Callable[[], SnapshotBackend]
    ) -> None:
        """Listings, sizes and reads never come from a stale cache."""
        mine, theirs = new_backend(), new_backend()
        mine.write_bytes("shared/a", b"a")
        assert theirs.list("shared") == ["shared/a"]
        assert mine.read_bytes("shared/a") == b"a"
        theirs.write_bytes("shared/b", b"b")
        theirs.write_bytes("shared/a", b"a, longer now")
        assert mine.list_children("shared") == ["a", "b"]
        assert mine.size("shared/a") == len(b"a, longer now")
        assert b"".join(mine.read_chunks("shared/a")) == b"a, longer now"
        theirs.delete("shared/b")
        assert not mine.exists("shared/b")
        assert mine.list("shared") == ["shared/a"]

    def test_large_files_stream_in_chunks(
        self, snapshots: SnapshotStore, backend: SnapshotBackend
    ) -> None:
        """A file larger than one upload part (multipart on S3, resumable on GCS) round-trips."""
        size, chunk = 12 * 1024 * 1024 + 7, 1024 * 1024
        fields = snapshot_fields("job-big", files=1)
        path = fields.stages[0].files[0]

        def content() -> Iterator[bytes]:
            for start in range(0, size, chunk):
                yield bytes([start // chunk]) * min(chunk, size - start)

        manifest = snapshots.write("big", fields, [(path, content())])
        assert manifest.payload_size == size
        snapshot = snapshots.get("big")
        snapshot.verify()
        assert backend.size(snapshot.path(path)) == size
        assert b"".join(snapshot.read_chunks(path)) == b"".join(content())

    # --- snapshots ----------------------------------------------------------------------------

    def test_write_list_read(self, snapshots: SnapshotStore, backend: SnapshotBackend) -> None:
        """A snapshot is listed with Jet's fields and reads back whole, as its manifest says."""
        assert snapshots.list() == []
        written = self.export(snapshots, "v1", "job-1")
        listed = snapshots.list()
        assert [s.name for s in listed] == ["v1"]
        snapshot = listed[0]
        assert (snapshot.job_id, snapshot.job_name) == ("job-1", "name-of-job-1")
        assert snapshot.creation_time == written.creation_time > 0
        assert snapshot.payload_size == 3000
        assert snapshot.manifest == written.manifest
        self.assert_whole(snapshot, "job-1")
        stage = snapshot.manifest.stages[0]
        assert (stage.name, stage.kind, stage.key_count, stage.key_groups, stage.bytes) == (
            "counts", "aggregate", 30, 128, 3000
        )
        assert snapshot.manifest.sources == {"from-stream(clicks)": [[0, 12], [1, 30]]}
        assert backend.list(snapshot.folder) == sorted(
            [snapshot.path(MANIFEST), *(snapshot.path(f.path) for f in stage.files)]
        )

    def test_overwrite_by_name(self, snapshots: SnapshotStore, backend: SnapshotBackend) -> None:
        """Exporting a name again replaces its snapshot; the old export's files go."""
        first = self.export(snapshots, "v1", "job-1")
        self.export(snapshots, "other", "job-9")
        second = self.export(snapshots, "v1", "job-2", files=2)
        assert second.attempt > first.attempt
        assert [s.name for s in snapshots.list()] == ["other", "v1"]
        self.assert_whole(snapshots.get("v1"), "job-2")
        self.assert_whole(snapshots.get("other"), "job-9")
        assert backend.list_children(snapshot_folder("v1")) == [second.attempt]
        with pytest.raises(SnapshotReplacedError, match="'v1'"):
            first.read_file(first.manifest.all_files()[0].path)

    def test_manifest_is_create_only(
        self, snapshots: SnapshotStore, backend: SnapshotBackend
    ) -> None:
        """A published manifest cannot be created again over the snapshot."""
        snapshot = self.export(snapshots, "v1", "job-1")
        manifest = snapshot.path(MANIFEST)
        original = backend.read_bytes(manifest)
        assert backend.create_exclusive(manifest, original.replace(b"job-1", b"job-X")) is False
        assert backend.read_bytes(manifest) == original
        self.assert_whole(snapshots.get("v1"), "job-1")

    @pytest.mark.parametrize("damage", ["flipped-byte", "truncated", "missing", "extra-file"])
    def test_corruption_is_detected(
        self, snapshots: SnapshotStore, backend: SnapshotBackend, damage: str
    ) -> None:
        """A damaged file is refused by name, by read_file and by verify, never read in part."""
        snapshot = self.export(snapshots, "v1", "job-1")
        victim = snapshot.manifest.all_files()[1].path
        data = backend.read_bytes(snapshot.path(victim))
        if damage == "flipped-byte":
            flipped = data[:10] + bytes([data[10] ^ 1]) + data[11:]
            backend.write_bytes(snapshot.path(victim), flipped)
            expected = "does not match its checksum"
        elif damage == "truncated":
            backend.write_bytes(snapshot.path(victim), data[:-1])
            expected = f"is truncated: {len(data) - 1} of {len(data)} bytes"
        elif damage == "missing":
            backend.delete(snapshot.path(victim))
            expected = "named by its manifest is missing"
        else:
            victim = "stages/counts/smuggled.pkl"
            backend.write_bytes(snapshot.path(victim), b"not in the manifest")
            expected = "is in its folder but not in its manifest"
        again = snapshots.get("v1")
        with pytest.raises(SnapshotCorruptedError, match=expected) as info:
            again.verify()
        assert info.value.snapshot == "v1"
        assert info.value.file == victim
        assert f"snapshot 'v1': file {victim!r}" in str(info.value)
        if damage == "extra-file":
            expected = "is not in its manifest"  # so it is never read either
        with pytest.raises(SnapshotCorruptedError, match=expected):
            again.read_file(victim)
        with pytest.raises(SnapshotCorruptedError, match="is not in its manifest"):
            again.read_file("stages/counts/never-written.pkl")

    def test_a_write_landing_beside_a_whole_snapshot_is_not_corruption(
        self, snapshots: SnapshotStore, backend: SnapshotBackend
    ) -> None:
        """A write landing this moment is not corruption.

        A local folder's create-only write links its temp file into place, then
        removes it: a check between the two sees ``MANIFEST.json.<32 hex>.tmp``
        beside the manifest.
        """
        snapshot = self.export(snapshots, "v1", "job-1")
        backend.write_bytes(snapshot.path(f"{MANIFEST}.{'ab' * 16}.tmp"), b"{}")
        snapshots.get("v1").verify()

    def test_a_damaged_manifest_is_refused(
        self, snapshots: SnapshotStore, backend: SnapshotBackend
    ) -> None:
        """A manifest changed by one character fails its own checksum; the listing skips it."""
        snapshot = self.export(snapshots, "v1", "job-1")
        raw = backend.read_bytes(snapshot.path(MANIFEST))
        damaged = raw.replace(b'"batch_id": 7', b'"batch_id": 8')
        assert damaged != raw
        backend.write_bytes(snapshot.path(MANIFEST), damaged)
        with pytest.raises(SnapshotCorruptedError, match="does not match its checksum") as info:
            snapshots.get("v1")
        assert info.value.snapshot == "v1"
        assert info.value.file == MANIFEST
        assert snapshots.list() == []

    def test_concurrent_exports_and_listings(
        self, new_backend: Callable[[], SnapshotBackend]
    ) -> None:
        """Racing exports of one name and a lister: one whole snapshot at a time, one at the end."""
        writers, exports = 3, 3
        done = threading.Event()
        seen: list[str] = []
        replaced: list[str] = []
        jobs = [f"writer-{w}-export-{e}" for w in range(writers) for e in range(exports)]

        def export(writer: int) -> None:
            store = SnapshotStore(new_backend())
            for e in range(exports):
                self.export(store, "raced", f"writer-{writer}-export-{e}", files=2)

        def watch(_: int) -> None:
            store = SnapshotStore(new_backend())
            # Looks while the exports race, and once more after they ended (a fast
            # backend may finish them all before the lister's first look).
            while True:
                last = done.is_set()
                listed = store.list()
                assert [s.name for s in listed] in ([], ["raced"])
                for snapshot in listed:
                    assert snapshot.job_id in jobs
                    try:
                        self.assert_whole(snapshot, snapshot.job_id)
                    except SnapshotReplacedError:
                        replaced.append(snapshot.job_id)  # replaced under our feet: allowed
                    else:
                        seen.append(snapshot.job_id)
                if last:
                    return

        watch_errors: list[BaseException] = []

        def watched() -> None:
            try:
                race(watch, 1)
            except BaseException as exc:  # failed in the watcher's thread: failed here, below
                watch_errors.append(exc)

        watcher = threading.Thread(target=watched)
        watcher.start()
        try:
            race(export, writers)
        finally:
            done.set()
            watcher.join(120)
        assert not watcher.is_alive()
        assert watch_errors == [], f"the lister failed: {watch_errors!r}"
        store = SnapshotStore(new_backend())
        final = store.get("raced")
        self.assert_whole(final, final.job_id)
        assert [s.name for s in store.list()] == ["raced"]
        assert store.backend.list_children(snapshot_folder("raced")) == [final.attempt]
        assert seen or replaced, "the lister never saw a snapshot"

    @pytest.mark.parametrize("failure", ["files-raise", "backend-fails"])
    def test_a_failed_export_leaves_the_old_snapshot(
        self, snapshots: SnapshotStore, backend: SnapshotBackend, failure: str
    ) -> None:
        """An export that fails after half its files leaves the old snapshot whole and alone."""
        old = self.export(snapshots, "v1", "job-old", files=4)
        fields = snapshot_fields("job-new", files=4)
        content = list(snapshot_files(fields).items())

        class Interrupted(Exception):
            pass

        def half_then_fail() -> Iterator[tuple[str, Any]]:
            yield from content[:2]
            raise Interrupted("the exporting job stopped")

        if failure == "files-raise":
            with pytest.raises(Interrupted):  # the caller's error, as it is
                snapshots.write("v1", fields, half_then_fail())
        else:
            failing = SnapshotStore(_FailAfter(backend, writes=2))
            with pytest.raises(Exception, match="half-way through the export"):
                failing.write("v1", fields, content)
        for store in (snapshots, SnapshotStore(backend)):
            assert [s.name for s in store.list()] == ["v1"]
            self.assert_whole(store.get("v1"), "job-old")
        assert store.get("v1").attempt == old.attempt
        assert backend.list_children(snapshot_folder("v1")) == [old.attempt]  # nothing left behind

    def test_incomplete_exports_are_invisible_and_collected(
        self, snapshots: SnapshotStore, backend: SnapshotBackend
    ) -> None:
        """Attempts without a manifest (killed exports) are never listed; gc removes old ones."""
        import secrets as _secrets

        def killed_export(name: str, age_seconds: float) -> str:
            started = int((time.time() - age_seconds) * 1000)
            attempt = f"{snapshot_folder(name)}/{started:015d}-{_secrets.token_hex(8)}"
            backend.write_bytes(f"{attempt}/stages/counts/kg-000.pkl", b"half an export")
            return attempt

        self.export(snapshots, "kept", "job-1")
        killed_new_name = killed_export("never-finished", 7200)
        killed_old_name = killed_export("kept", 7200)
        running = killed_export("running", 5)
        assert [s.name for s in snapshots.list()] == ["kept"]
        with pytest.raises(SnapshotNotFoundError, match="'never-finished'"):
            snapshots.get("never-finished")
        assert sorted(snapshots.gc(min_age_seconds=3600, dry_run=True)) == sorted(
            [killed_new_name, killed_old_name]
        )
        assert backend.exists(f"{killed_old_name}/stages/counts/kg-000.pkl")  # a dry run
        assert sorted(snapshots.gc(min_age_seconds=3600)) == sorted(
            [killed_new_name, killed_old_name]
        )
        assert backend.list(killed_new_name) == backend.list(killed_old_name) == []
        assert backend.list(running) != []  # too young: maybe still being written
        self.assert_whole(snapshots.get("kept"), "job-1")
