"""The store conformance suite of :mod:`sparkjet.testing` on every store location.

A local folder, memory, and real S3 and GCS servers on 127.0.0.1 (moto and
fake-gcs-server, started by the suite's fixtures).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sparkjet import testing
from sparkjet.testing import StoreConformance, StoreLocation, servers


class TestLocalFolder(StoreConformance):
    @pytest.fixture
    def location(self, tmp_path: Path) -> StoreLocation:
        return StoreLocation(str(tmp_path / "store"))


class TestMemory(StoreConformance):
    @pytest.fixture
    def location(self, memory_location: StoreLocation) -> StoreLocation:
        return memory_location.fresh()


@pytest.mark.storage
class TestS3(StoreConformance):
    @pytest.fixture
    def location(self, s3_location: StoreLocation) -> StoreLocation:
        return s3_location.fresh()


@pytest.mark.storage
class TestGCS(StoreConformance):
    @pytest.fixture
    def location(self, gcs_location: StoreLocation) -> StoreLocation:
        return gcs_location.fresh()


@pytest.mark.storage
@pytest.mark.parametrize("server", ["moto", "fake-gcs-server"])
def test_a_server_whose_port_was_taken_starts_on_another(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port found free is taken before the server binds it: the next port is tried."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    real_free_port = servers._free_port
    handed: list[int] = []

    def free_port() -> int:  # the taken port first, then truly free ones
        handed.append(real_free_port() if handed else taken_port)
        return handed[-1]

    monkeypatch.setattr(servers, "_free_port", free_port)
    start = testing.moto_s3_server if server == "moto" else testing.fake_gcs_server
    with taken, start(tmp_path) as location:
        assert handed[0] == taken_port and len(handed) == 2
        assert location.options["endpoint_url"] == f"http://127.0.0.1:{handed[1]}"
        store = location.store()
        store.write_bytes(store.path("probe"), b"1")
        assert store.read_bytes(store.path("probe")) == b"1"
