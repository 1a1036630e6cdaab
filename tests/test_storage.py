"""The store conformance suite of :mod:`sparkjet.testing` on every store location.

A local folder, memory, and real S3 and GCS servers on 127.0.0.1 (moto and
fake-gcs-server, started by the suite's fixtures).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkjet.testing import StoreConformance, StoreLocation


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
