"""The kit's pytest fixtures: a session's S3, GCS and in-memory store locations.

``sparkjet.testing`` re-exports them, so ``pytest_plugins = ["sparkjet.testing"]``
registers them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from sparkjet.testing.locations import StoreLocation
from sparkjet.testing.servers import fake_gcs_server, moto_s3_server


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
