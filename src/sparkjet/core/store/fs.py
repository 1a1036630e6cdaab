"""The fsspec store: one URL's files read, written create-only and listed afresh.

Hazelcast keeps IList and IMap in the cluster; sparkjet keeps them in a folder
that every process (driver and executors) can reach: a local path on a laptop,
an S3 or GCS prefix on a cluster. :class:`Store` is that folder's file
operations (whole-file reads and writes, create-only writes, listings that
trust no cache, deletes that never leave the root) and the door to what it
holds: lists and maps (:mod:`~sparkjet.core.store.commit_log`), streams
(:mod:`~sparkjet.core.store.stream_log`); every path comes from its
:class:`~sparkjet.core.store.layout.StoreLayout`.

:class:`Store` is the one entry; its file operations come in parts, one
module each, each part built on the one before:

- :mod:`.fs_access`: the URL opened as an fsspec filesystem, its root and
  layout, the guard that keeps paths under the root (:class:`.FsAccess`);
- :mod:`.fs_reads`: whole-file, many-file and ranged reads, and decoding
  them (:class:`.FsReads`);
- :mod:`.fs_listing`: listings, stats and existence checks, asked afresh
  (:class:`.FsListing`, :func:`.file_modified`);
- :mod:`.fs_writes`: whole-file and create-only writes with their probe,
  deletes, moves, temp files and the store's clock (:class:`.FsWrites`).

The names other modules use are re-exported here.
"""

from __future__ import annotations

from sparkjet.core.store.commit_log import CommitLog
from sparkjet.core.store.fs_access import FsAccess
from sparkjet.core.store.fs_listing import FsListing, file_modified
from sparkjet.core.store.fs_reads import FsReads
from sparkjet.core.store.fs_writes import CLOCK_PROBE_SECONDS, FsWrites, is_temp_file
from sparkjet.core.store.stream_log import StreamLog

__all__ = [
    "CLOCK_PROBE_SECONDS",
    "FsAccess",
    "FsListing",
    "FsReads",
    "FsWrites",
    "Store",
    "file_modified",
    "is_temp_file",
]


class Store(FsWrites):
    """One fsspec location holding lists, maps, streams and job records.

    Picklable: executors rebuild the filesystem from the URL and options.
    Options may hold credentials; they are never included in ``repr``.
    """

    # --- data structures ---------------------------------------------------

    @property
    def files(self) -> Store:
        """The store's files: the store itself (what plugins reach as ``context.store.files``)."""
        return self

    def list_log(self, name: str) -> CommitLog:
        """The commit log of the list ``name``."""
        return CommitLog(self, self.layout.list_paths(name).folder, f"list {name!r}")

    def map_log(self, name: str) -> CommitLog:
        """The commit log of the map ``name``."""
        return CommitLog(self, self.layout.map_paths(name).folder, f"map {name!r}", "map")

    def stream_log(self, name: str) -> StreamLog:
        """The stream ``name``."""
        return StreamLog(self, name)

    def list_names(self) -> list[str]:
        """Names of the lists in the store."""
        return [self.layout.name_of(n) for n in self.listdir(self.layout.lists)]

    def map_names(self) -> list[str]:
        """Names of the maps in the store."""
        return [self.layout.name_of(n) for n in self.listdir(self.layout.maps)]
