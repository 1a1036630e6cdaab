"""Snapshot storage: the backend conformance suite everywhere, the format, and its faults.

The suite of :mod:`sparkjet.testing` runs on a local folder, memory, real S3
and GCS servers on 127.0.0.1 (moto and fake-gcs-server), and the example
third-party plugin's backend. Then the format on its own (signatures,
versions, what an export may hand over, copies, clocks), the configuration
resolver, the errors of backends that cannot be made or reached (no secret
in any of them), a third-party backend selected by name from its installed
distribution's entry point, and an export SIGKILLed half-way in a real
process. No Spark: nothing here starts a JVM.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sparkjet
from sparkjet.core.config import load_config
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.state.snapshots import (
    MANIFEST,
    ManifestFields,
    SnapshotStore,
    StageFields,
    canonical,
    make_backend,
    snapshot_folder,
    snapshot_name,
    snapshot_store,
)
from sparkjet.core.state.snapshots import storage as snapshot_storage
from sparkjet.errors import (
    ConfigError,
    SnapshotBackendError,
    SnapshotCorruptedError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotNotFoundError,
    SnapshotSignatureError,
)
from sparkjet.plugin import SnapshotBackend
from sparkjet.plugins.snapshots import (
    GCSSnapshotBackend,
    LocalSnapshotBackend,
    MemorySnapshotBackend,
    S3SnapshotBackend,
)
from sparkjet.testing import (
    SnapshotBackendConformance,
    StoreLocation,
    snapshot_fields,
    snapshot_files,
)

DIST = Path(__file__).parent / "plugin_dist" / "sparkjet-example-plugin"
SECRET = "s3cr3t-Value-9f2c"  # what must never show


# --- the conformance suite on every backend ------------------------------------------------


class TestLocalFolder(SnapshotBackendConformance):
    @pytest.fixture
    def new_backend(self, tmp_path: Path) -> Callable[[], SnapshotBackend]:
        return lambda: LocalSnapshotBackend(str(tmp_path / "snapshots"))


class TestMemory(SnapshotBackendConformance):
    @pytest.fixture
    def new_backend(self, memory_location: StoreLocation) -> Callable[[], SnapshotBackend]:
        location = memory_location.fresh()
        return lambda: location.snapshot_backend()


@pytest.mark.storage
class TestS3(SnapshotBackendConformance):
    @pytest.fixture
    def new_backend(self, s3_location: StoreLocation) -> Callable[[], SnapshotBackend]:
        location = s3_location.fresh()
        return lambda: location.snapshot_backend(separate_client=True)


@pytest.mark.storage
class TestGCS(SnapshotBackendConformance):
    @pytest.fixture
    def new_backend(self, gcs_location: StoreLocation) -> Callable[[], SnapshotBackend]:
        location = gcs_location.fresh()
        return lambda: location.snapshot_backend(separate_client=True)


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example third-party plugin, imported from its source folder."""
    monkeypatch.syspath_prepend(str(DIST / "src"))
    sys.modules.pop("sparkjet_example", None)
    yield importlib.import_module("sparkjet_example")
    sys.modules.pop("sparkjet_example", None)


class TestThirdPartyBackend(SnapshotBackendConformance):
    """The example plugin's plain-files backend passes the same suite (no fsspec in it)."""

    @pytest.fixture
    def new_backend(
        self, example: ModuleType, tmp_path: Path
    ) -> Callable[[], SnapshotBackend]:
        return lambda: example.DirectorySnapshotBackend(str(tmp_path / "example-snapshots"))

    def test_a_manifest_retired_the_moment_it_is_linked_was_still_created(
        self, example: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A newer export may remove the attempt (temp file and all) right after the link.

        Found by the racing-exports test in CI: the backend's own clean-up of
        its temporary file raised FileNotFoundError into a published export.
        """
        backend = example.DirectorySnapshotBackend(str(tmp_path / "example-snapshots"))
        link = os.link

        def link_then_retired(source: str, target: str) -> None:
            link(source, target)
            shutil.rmtree(os.path.dirname(target))  # as a newer export's retire does

        monkeypatch.setattr(os, "link", link_then_retired)
        assert backend.create_exclusive("snapshot-v1/attempt/manifest.json", b"{}") is True


# --- the format ---------------------------------------------------------------------------------


@pytest.fixture
def backend(memory_location: StoreLocation) -> SnapshotBackend:
    return memory_location.fresh().snapshot_backend()


def export(store: SnapshotStore, name: str = "v1", job: str = "job-1") -> None:
    fields = snapshot_fields(job)
    store.write(name, fields, snapshot_files(fields).items())


def rewrite_manifest(
    backend: SnapshotBackend,
    store: SnapshotStore,
    name: str,
    change: Callable[[dict[str, Any]], None],
) -> None:
    """Edit a published manifest as someone with write access could, checksum recomputed."""
    snapshot = store.get(name)
    path = snapshot.path(MANIFEST)
    document = json.loads(backend.read_bytes(path))
    change(document)
    body = {k: v for k, v in document.items() if k not in ("manifest_sha256", "signature")}
    document["manifest_sha256"] = hashlib.sha256(canonical(body)).hexdigest()
    backend.write_bytes(path, json.dumps(document).encode())


def test_manifest_holds_every_field(backend: SnapshotBackend) -> None:
    store = SnapshotStore(backend)
    fields = snapshot_fields("job-1", files=2)
    fields = ManifestFields(
        **{**fields.__dict__, "files": ["pipeline.json"], "creation_time": 1234}
    )
    content = {**snapshot_files(fields), "pipeline.json": b"{}"}
    manifest = store.write("v1", fields, content.items())
    document = json.loads(backend.read_bytes(store.get("v1").path(MANIFEST)))
    assert set(document) == {
        "format", "format_version", "name", "attempt", "creation_time", "job_id", "job_name",
        "sparkjet_version", "spark_version", "pipeline_fingerprint", "batch_id", "sources",
        "source_identities", "stages", "files", "payload_size", "manifest_sha256",
    }
    assert document["source_identities"] == {
        "from-stream(clicks)": {"plugin": "stream", "reads": "clicks", "partitions": 2}}
    assert document["format"] == "sparkjet-snapshot"
    assert document["format_version"] == 1
    assert document["creation_time"] == 1234
    assert document["attempt"] == manifest.attempt
    assert document["files"] == [{
        "path": "pipeline.json", "size": 2,
        "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
    }]
    stage = document["stages"][0]
    assert set(stage) == {
        "name", "kind", "state_signature", "key_count", "bytes", "key_groups", "files"
    }
    assert stage["bytes"] == 2000
    assert document["payload_size"] == 2002
    assert store.get("v1").manifest == manifest


def test_signed_manifests(backend: SnapshotBackend) -> None:
    signed = SnapshotStore(backend, signing_key="team-key")
    export(signed)
    snapshot = signed.get("v1")
    assert snapshot.manifest.signed
    snapshot.verify()
    document = json.loads(backend.read_bytes(snapshot.path(MANIFEST)))
    assert document["signature"]["algorithm"] == "HMAC-SHA256"

    with pytest.raises(SnapshotSignatureError, match="does not match the configured signing key"):
        SnapshotStore(backend, signing_key="another-key").get("v1")
    with pytest.raises(SnapshotSignatureError, match="'v1' is signed, but no signing key") as info:
        SnapshotStore(backend).get("v1")
    assert info.value.snapshot == "v1"
    assert info.value.file == MANIFEST

    unsigned = SnapshotStore(backend)
    export(unsigned, "plain")
    with pytest.raises(SnapshotSignatureError, match="'plain' is not signed"):
        signed.get("plain")
    assert [s.name for s in signed.list()] == ["v1"]  # the unsigned one is left out
    assert [s.name for s in unsigned.list()] == ["plain"]


def test_tampering_is_caught_only_with_a_key(backend: SnapshotBackend) -> None:
    def tamper(document: dict[str, Any]) -> None:
        document["stages"][0]["key_count"] = 1

    signed = SnapshotStore(backend, signing_key="team-key")
    export(signed)
    rewrite_manifest(backend, signed, "v1", tamper)
    with pytest.raises(SnapshotSignatureError, match="tampered with"):
        signed.get("v1")

    # Without a key, a consistent rewrite by someone who can write the backend passes:
    # checksums catch corruption, not tampering (the trust model in docs/snapshots.md).
    unsigned = SnapshotStore(backend)
    export(unsigned, "plain")
    rewrite_manifest(backend, unsigned, "plain", tamper)
    assert unsigned.get("plain").manifest.stages[0].key_count == 1


def test_unknown_format_version_is_refused(backend: SnapshotBackend) -> None:
    store = SnapshotStore(backend)
    export(store)
    rewrite_manifest(backend, store, "v1", lambda d: d.update(format_version=99))
    with pytest.raises(SnapshotFormatError, match="format version 99; this sparkjet reads "
                                                  "version 1") as info:
        store.get("v1")
    assert info.value.snapshot == "v1"
    assert store.list() == []


def test_a_manifest_moved_to_another_name_is_refused(backend: SnapshotBackend) -> None:
    store = SnapshotStore(backend)
    export(store, "v1")
    source = store.get("v1")
    for entry in [MANIFEST, *(f.path for f in source.manifest.all_files())]:
        target = f"{snapshot_folder('v2')}/{source.attempt}/{entry}"
        backend.write_bytes(target, backend.read_bytes(source.path(entry)))
    with pytest.raises(SnapshotCorruptedError, match="belongs to snapshot 'v1'"):
        store.get("v2")


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"../escape.pkl": b"x"}, "invalid file path '../escape.pkl'"),
        ({MANIFEST: b"x"}, "invalid file path 'MANIFEST.json'"),
        ({"stages/counts/kg-000.pkl": b"x"}, "'stages/counts/kg-001.pkl' is named but was not "
                                             "written"),
        ({"stray.pkl": b"x"}, "'stray.pkl' is not named by any stage"),
        ({"stages/counts/kg-000.pkl": "text"}, "data must be bytes or an iterable of bytes"),
        ({"stages/counts/kg-000.pkl": iter(["text"])}, "yielded a str, expected bytes"),
    ],
    ids=["dot-dot", "manifest-name", "not-written", "not-named", "str-data", "str-chunks"],
)
def test_a_bad_export_is_refused_and_publishes_nothing(
    backend: SnapshotBackend, files: dict[str, Any], error: str
) -> None:
    store = SnapshotStore(backend)
    export(store, "v1", "job-old")
    fields = snapshot_fields("job-new", files=2)
    if "../escape.pkl" in files or MANIFEST in files:
        fields = ManifestFields(**{**fields.__dict__, "files": list(files)})
    with pytest.raises(SnapshotError, match=error) as info:
        store.write("v1", fields, files.items())
    assert info.value.snapshot == "v1"
    assert store.get("v1").job_id == "job-old"
    assert backend.list_children(snapshot_folder("v1")) == [store.get("v1").attempt]


def test_file_lists_must_be_lists(backend: SnapshotBackend) -> None:
    stage = StageFields("s", "k", "sig", 0, 1, "stages/s/one.pkl")  # type: ignore[arg-type]
    fields = ManifestFields(**{**snapshot_fields().__dict__, "stages": [stage]})
    with pytest.raises(SnapshotError, match="files must be a list of paths, not one string"):
        SnapshotStore(backend).write("v1", fields, [("stages/s/one.pkl", b"1")])


def test_offsets_and_signatures_must_be_json(backend: SnapshotBackend) -> None:
    store = SnapshotStore(backend)
    fields = ManifestFields(**{**snapshot_fields().__dict__, "sources": {"src": {1, 2}}})
    with pytest.raises(SnapshotError, match="the offsets of source 'src' is not a JSON value"):
        store.write("v1", fields, snapshot_files(fields).items())
    stage = StageFields("s", "k", float("nan"), 0, 1, [])
    fields = ManifestFields(**{**snapshot_fields().__dict__, "stages": [stage]})
    with pytest.raises(SnapshotError, match="state signature of stage 's' is not a JSON value"):
        store.write("v1", fields, [])
    assert backend.list("") == []


def test_an_error_of_the_caller_propagates_as_it_is(backend: SnapshotBackend) -> None:
    store = SnapshotStore(backend)
    fields = snapshot_fields()

    def failing_chunks() -> Iterator[bytes]:
        yield b"some"
        raise KeyError("state shard 3 vanished")

    with pytest.raises(KeyError, match="state shard 3"):
        store.write("v1", fields, [("stages/counts/kg-000.pkl", failing_chunks())])
    assert backend.list("") == []  # the attempt was removed


@pytest.mark.parametrize(
    "name", ["v1", "a/b", "_probe", ".hidden", "snap shot", "ünïcode ❄", "%41", "..."]
)
def test_any_printable_name_is_a_folder_of_its_own(backend: SnapshotBackend, name: str) -> None:
    folder = snapshot_folder(name)
    assert "/" not in folder
    assert folder[0] not in "_."
    assert snapshot_name(folder) == name
    store = SnapshotStore(backend)
    export(store, name)
    assert [s.name for s in store.list()] == [name]
    assert store.get(name).job_id == "job-1"


@pytest.mark.parametrize("name", ["", "  ", "tab\there", "nl\n"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(SnapshotError, match="invalid snapshot name"):
        snapshot_folder(name)


def test_not_found_names_the_snapshot_and_backend(backend: SnapshotBackend) -> None:
    with pytest.raises(SnapshotNotFoundError, match="no snapshot named 'nope' in snapshot "
                                                    "backend 'memory' at memory://") as info:
        SnapshotStore(backend).get("nope")
    assert info.value.snapshot == "nope"


def test_a_listing_that_missed_every_attempt_is_taken_again(
    backend: SnapshotBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing walked while a newer export published and retired the one it found is empty.

    Found by the docs' backend in the racing-exports test: the name's folder
    held the old attempt when the listing began and the new one when it
    ended, yet the listing saw neither, and ``get`` said no such snapshot.
    """
    store = SnapshotStore(backend)
    export(store, "v1", "job-1")
    folder = snapshot_folder("v1")
    listings: list[list[str]] = []
    list_children = backend.list_children

    def unlucky_first(prefix: str) -> list[str]:
        found = list_children(prefix)
        if prefix == folder:
            listings.append(found)
            if len(listings) == 1:
                return []  # the first look at the name missed every attempt
        return found

    monkeypatch.setattr(backend, "list_children", unlucky_first)
    assert store.get("v1").job_id == "job-1"
    assert len(listings) == 2


def test_a_later_export_wins_even_when_the_clock_goes_back(
    backend: SnapshotBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(backend)
    export(store, "v1", "first")
    monkeypatch.setattr(snapshot_storage, "now_ms", lambda: 1_000)  # 1970, on a skewed machine
    export(store, "v1", "second")
    assert store.get("v1").job_id == "second"
    assert len(backend.list_children(snapshot_folder("v1"))) == 1


def test_delete_and_destroy(backend: SnapshotBackend) -> None:
    store = SnapshotStore(backend)
    export(store, "v1")
    export(store, "v2")
    assert store.exists("v1")
    assert store.delete("v1") is True
    assert not store.exists("v1")
    assert store.delete("v1") is False
    store.get("v2").destroy()
    assert store.list() == []
    assert backend.list("") == []
    with pytest.raises(SnapshotNotFoundError):
        store.get("v2")


def test_copy_between_backends_is_verified(
    backend: SnapshotBackend, tmp_path: Path
) -> None:
    source = SnapshotStore(backend, signing_key="source-key")
    export(source, "v1", "job-1")
    target_backend = LocalSnapshotBackend(str(tmp_path / "target"))
    target = SnapshotStore(target_backend, signing_key="target-key")
    export(target, "v1", "job-old")

    copied = source.copy_to(target, "v1")
    snapshot = target.get("v1")
    assert snapshot.manifest == copied
    assert (snapshot.job_id, snapshot.creation_time) == ("job-1", source.get("v1").creation_time)
    snapshot.verify()
    assert snapshot.read_file("stages/counts/kg-002.pkl") == source.get("v1").read_file(
        "stages/counts/kg-002.pkl"
    )
    source.copy_to(target, "v1", as_name="v1-backup")
    assert [s.name for s in target.list()] == ["v1", "v1-backup"]

    # A corrupt source file stops the copy before the target publishes anything.
    export(target, "v2", "job-kept")
    export(source, "v2", "job-corrupt")
    bad = source.get("v2")
    path = bad.path("stages/counts/kg-001.pkl")
    backend.write_bytes(path, backend.read_bytes(path)[:-3])
    with pytest.raises(SnapshotCorruptedError, match=r"'stages/counts/kg-001\.pkl' is truncated"):
        source.copy_to(target, "v2")
    assert target.get("v2").job_id == "job-kept"
    target.get("v2").verify()
    assert len(target_backend.list_children(snapshot_folder("v2"))) == 1


def test_an_empty_signing_key_is_refused(backend: SnapshotBackend) -> None:
    with pytest.raises(ConfigError, match="signing_key is empty"):
        SnapshotStore(backend, signing_key="")


# --- configuration: which backend, where ---------------------------------------------------------


def test_default_is_a_local_folder_in_the_store(tmp_path: Path) -> None:
    config = load_config({"store": {"url": str(tmp_path / "store")}})
    store = snapshot_store(config, PluginHost())
    assert isinstance(store.backend, LocalSnapshotBackend)
    assert store.backend.url == str(tmp_path / "store" / "snapshots")
    assert not store.signed
    export(store)
    assert (tmp_path / "store" / "snapshots" / "v1").is_dir()


def test_default_follows_the_store_onto_its_storage(memory_location: StoreLocation) -> None:
    location = memory_location.fresh()
    config = load_config({"store": {"url": location.url}})
    backend = make_backend(config, PluginHost())
    assert isinstance(backend, MemorySnapshotBackend)
    assert backend.url == f"{location.url}/snapshots"


def test_configured_backend_url_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SJ_TEST_SIGNING_KEY", SECRET)
    (tmp_path / "sparkjet.toml").write_text(textwrap.dedent(f"""\
        [snapshots]
        backend = "memory"
        url = "memory://configured-{os.getpid()}"
        signing_key = "${{env:SJ_TEST_SIGNING_KEY}}"
    """))
    config = load_config(path=tmp_path / "sparkjet.toml")
    store = snapshot_store(config, PluginHost())
    assert isinstance(store.backend, MemorySnapshotBackend)
    assert store.signed
    export(store)
    assert store.get("v1").manifest.signed
    assert SECRET not in repr(store)


def test_an_unknown_kind_lists_the_known_ones(tmp_path: Path) -> None:
    config = load_config({"snapshots": {"backend": "azure", "url": "abfs://x/y"}})
    with pytest.raises(ConfigError) as info:
        make_backend(config, PluginHost())
    assert 'no snapshot backend of kind "azure"' in str(info.value)
    assert "known: gcs, local, memory, s3" in str(info.value)


def test_a_remote_kind_needs_its_url(tmp_path: Path) -> None:
    config = load_config({"store": {"url": str(tmp_path)}, "snapshots": {"backend": "s3"}})
    with pytest.raises(ConfigError, match="backend = 's3' needs \\[snapshots\\] url"):
        make_backend(config, PluginHost())


# --- backends that cannot be made or reached ----------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "url", "error"),
    [
        (S3SnapshotBackend, "gs://bucket/x", 'the URL must be s3:// or s3a:// \\(for this URL use '
                                             'backend = "gcs"\\)'),
        (GCSSnapshotBackend, "/tmp/x", 'must be gs:// or gcs:// \\(for this URL use backend = '
                                       '"local"\\)'),
        (LocalSnapshotBackend, "memory://x", 'must be a local path or file:// or local://'),
        (MemorySnapshotBackend, "ftp://host/x", "must be memory://$"),
    ],
)
def test_a_url_of_the_wrong_kind_is_refused(
    cls: type[SnapshotBackend], url: str, error: str
) -> None:
    with pytest.raises(SnapshotBackendError, match=error) as info:
        cls(url)
    assert str(info.value).startswith(f"snapshot backend {cls.kind!r} at {url}: ")


@pytest.mark.parametrize(
    ("cls", "url", "option", "suggestion"),
    [
        (S3SnapshotBackend, "s3://bucket/x", "endpoint_urll", "endpoint_url"),
        (GCSSnapshotBackend, "gs://bucket/x", "endpoint_urll", "endpoint_url"),
        (GCSSnapshotBackend, "gs://bucket/x", "projekt", "project"),
        (LocalSnapshotBackend, "/tmp/x", "auto_mkdirs", "auto_mkdir"),
    ],
)
def test_an_unknown_option_is_refused_before_any_request(
    cls: type[SnapshotBackend], url: str, option: str, suggestion: str
) -> None:
    started = time.monotonic()
    with pytest.raises(SnapshotBackendError) as info:
        cls(url, {option: "x", "secret" if cls is S3SnapshotBackend else "token": SECRET})
    message = str(info.value)
    assert message.startswith(f"snapshot backend {cls.kind!r} at {url}: unknown option {option!r}")
    assert f"did you mean {suggestion!r}?" in message
    assert SECRET not in message
    assert time.monotonic() - started < 20  # no request was tried (gcsfs would stall a minute)


@pytest.mark.parametrize(("cls", "module", "extra"), [
    (S3SnapshotBackend, "s3fs", "sparkjet[s3]"), (GCSSnapshotBackend, "gcsfs", "sparkjet[gcs]"),
])
def test_a_missing_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, cls: type[SnapshotBackend], module: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    url = f"{cls.schemes[0]}://bucket/snapshots"  # type: ignore[attr-defined]
    with pytest.raises(SnapshotBackendError) as info:
        cls(url)
    assert str(info.value) == (
        f"snapshot backend {cls.kind!r} at {url}: needs the {module} package, which is not "
        f"installed: pip install '{extra}'"
    )


@pytest.mark.storage
def test_an_unreachable_endpoint_names_backend_and_url_never_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nobody answers there
    monkeypatch.setenv("SJ_TEST_SECRET", SECRET)
    config = load_config({"snapshots": {
        "backend": "s3",
        "url": "s3://team-bucket/snapshots",
        "options": {
            # A secret in the endpoint URL shows up in the client's own error message.
            "endpoint_url": f"http://127.0.0.1:{port}/proxy-${{env:SJ_TEST_SECRET}}",
            "key": "AKIA-EXAMPLE", "secret": "${env:SJ_TEST_SECRET}",
            "config_kwargs": {"retries": {"max_attempts": 1}},
        },
    }})
    store = snapshot_store(config, PluginHost())
    for call in (store.list, lambda: store.get("v1"), lambda: export(store)):
        with pytest.raises(SnapshotBackendError) as info:
            call()
        message = str(info.value)
        assert message.startswith("snapshot backend 's3' at s3://team-bucket/snapshots: "), message
        assert f"127.0.0.1:{port}/proxy-***" in message  # the endpoint, masked
        assert SECRET not in message


class Leaky(SnapshotBackend):
    """A careless third-party backend: its errors carry its credentials."""

    kind = "leaky"

    def _fail(self) -> None:
        raise RuntimeError(
            f"login {self.options['password']} refused for dsn {self.options['dsn']}"
        )

    def write_bytes(self, path: str, data: bytes) -> None:
        self._fail()

    def read_bytes(self, path: str) -> bytes:
        self._fail()
        return b""

    def list(self, prefix: str) -> list[str]:
        self._fail()
        return []

    def delete(self, prefix: str) -> None:
        self._fail()


class RegistersLeaky:
    @sparkjet.hookimpl
    def register_snapshot_backends(self, register: Callable[[Any], None]) -> None:
        register(Leaky)


def test_no_secret_reaches_an_error_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SJ_TEST_DSN", "dsn-" + SECRET)
    config = load_config({"snapshots": {
        "backend": "leaky",
        "url": "leaky://somewhere",
        "options": {"password": "pw-" + SECRET, "dsn": "${env:SJ_TEST_DSN}"},
    }})
    host = PluginHost()
    host.register(RegistersLeaky(), "leaky-plugin")
    store = snapshot_store(config, host)
    for call in (store.list, lambda: store.get("v1"), lambda: export(store)):
        with pytest.raises(SnapshotBackendError) as info:
            call()
        message = str(info.value)
        assert message.startswith("snapshot backend 'leaky' at leaky://somewhere: cannot ")
        assert "login *** refused for dsn ***" in message  # both masked: by name, by ${env:}
        assert SECRET not in message
    assert SECRET not in repr(store.backend)
    assert SECRET not in store.backend.describe()


# --- a third-party backend, installed, selected by name ------------------------------------------


def test_a_third_party_backend_is_selected_by_name(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What pip install leaves for importlib.metadata: a dist-info folder with the entry point.
    site = tmp_path / "site"
    info = site / "sparkjet_example_plugin-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sparkjet-example-plugin\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text("[sparkjet]\nexample = sparkjet_example\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    (tmp_path / "sparkjet.toml").write_text(textwrap.dedent(f"""\
        [store]
        url = "{tmp_path / 'store'}"
        [snapshots]
        backend = "example-dir"
        url = "{tmp_path / 'third-party'}"
    """))
    monkeypatch.setenv("SPARKJET_CONFIG", str(tmp_path / "sparkjet.toml"))

    client = sparkjet.connect()
    entry = client.plugins.lookup_kind("snapshot backend", "example-dir")
    assert entry.plugin == "example"
    assert client.plugins.plugins["example"].origin == "sparkjet-example-plugin 0.1.0 (entry point)"
    store = snapshot_store(client.config, client.plugins)
    assert type(store.backend) is example.DirectorySnapshotBackend
    export(store)
    assert [s.name for s in store.list()] == ["v1"]
    store.get("v1").verify()
    assert (tmp_path / "third-party" / "v1").is_dir()  # its own files, no fsspec


# --- an export SIGKILLed half-way -----------------------------------------------------------------

#: Exports ``name`` in a child process; with ``kill``, stops half-way in the middle of a file.
_EXPORTER = r"""
import json, sys, time
from sparkjet.core.host.manager import PluginHost
from sparkjet.core.state.snapshots import ManifestFields, SnapshotStore, StageFields

kind, url, options, name, job, files, mode = sys.argv[1:]
files, options = int(files), json.loads(options)
backend = PluginHost(autoload=False).lookup_kind("snapshot backend", kind).cls(url, options)
paths = [f"stages/big/kg-{i:03d}.pkl" for i in range(files)]
fields = ManifestFields(job, "big-job", "test", "4.x", "fp", 1, {"src": [files]},
                        [StageFields("big", "aggregate", "int", files, 128, paths)])
CHUNK = 64 * 1024

def content(i):
    for c in range(8):  # 512 KiB a file
        if mode == "kill" and i == files // 2 and c == 4:
            print("HALF", flush=True)
            time.sleep(600)  # SIGKILLed here, half-way through a file
        yield bytes([(i + c) % 251]) * CHUNK

SnapshotStore(backend).write(name, fields, ((p, content(i)) for i, p in enumerate(paths)))
print("DONE", flush=True)
"""


def run_exporter(
    location: StoreLocation, kind: str, name: str, job: str, files: int, mode: str
) -> None:
    args = [sys.executable, "-c", _EXPORTER, kind, location.url, json.dumps(location.options),
            name, job, str(files), mode]
    if mode != "kill":
        run = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "DONE" in run.stdout
        return
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "HALF\n", line + (child.stderr.read() if child.stderr else "")
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(60)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.storage)])
def test_an_export_killed_half_way_leaves_the_old_snapshot(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "local":
        location = StoreLocation(str(tmp_path / "snapshots"))
    else:
        location = request.getfixturevalue("s3_location").fresh()
    run_exporter(location, where, "big", "job-old", 32, "done")
    store = SnapshotStore(location.snapshot_backend(where))
    old = store.get("big")
    assert old.payload_size == 32 * 512 * 1024

    run_exporter(location, where, "big", "job-new", 32, "kill")
    run_exporter(location, where, "never-finished", "job-new", 32, "kill")

    store = SnapshotStore(location.snapshot_backend(where, separate_client=True))
    assert [s.name for s in store.list()] == ["big"]
    snapshot = store.get("big")
    assert (snapshot.job_id, snapshot.attempt) == ("job-old", old.attempt)
    snapshot.verify()
    with pytest.raises(SnapshotNotFoundError):
        store.get("never-finished")
    backend = store.backend
    killed = [a for a in backend.list_children(snapshot_folder("big")) if a != old.attempt]
    assert len(killed) == 1
    assert backend.list(f"{snapshot_folder('big')}/{killed[0]}")  # it did write half its files
    unfinished = backend.list_children(snapshot_folder("never-finished"))
    assert len(unfinished) == 1
    assert store.gc(min_age_seconds=3600) == []  # too young to be sure it is dead
    assert sorted(store.gc(min_age_seconds=0)) == [
        f"{snapshot_folder('big')}/{killed[0]}",
        f"{snapshot_folder('never-finished')}/{unfinished[0]}",
    ]
    assert backend.list_children(snapshot_folder("big")) == [old.attempt]
    assert backend.list(snapshot_folder("never-finished")) == []
    store.get("big").verify()
