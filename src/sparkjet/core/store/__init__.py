"""The store: lists, maps, streams and job records kept under one fsspec URL.

One concern per module, from the bottom up:

- :mod:`.layout`: where everything lies (every path in the store is built there);
- :mod:`.memoryfs`: fsspec's memory filesystem made safe between threads;
- :mod:`.files`: the file operations the logs need of a store (a protocol);
- :mod:`.commit_log`: lists' and maps' commit logs, made of
  :mod:`.commit_records` (the record format, records read back) and
  :mod:`.commit_segments` (the parts records carry);
- :mod:`.stream_log`: streams' partitioned, offset-checked logs, made of
  :mod:`.stream_chunks`, :mod:`.stream_follow`, :mod:`.stream_wait`,
  :mod:`.stream_registry`, :mod:`.stream_read`, :mod:`.stream_write` and
  :mod:`.stream_trim` (its docstring says which owns what);
- :mod:`.fs`: the fsspec :class:`Store` itself, the door to the above, made
  of :mod:`.fs_access`, :mod:`.fs_reads`, :mod:`.fs_listing` and :mod:`.fs_writes`;
- :mod:`.job_records`: job records, job-name locks and control requests;
- :mod:`.structures`: the client's handles, :class:`IList`, :class:`IMap`, :class:`IStream`.

The names below are re-exported for convenience (and so pickles that name
``sparkjet.core.store.Store`` or ``.CommitLog`` still load); sparkjet's own
modules import from the module that defines them.
"""

from __future__ import annotations

from sparkjet.core.store.commit_log import CommitLog, LogCursor, Record
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords
from sparkjet.core.store.layout import CommitLogPaths, StoreLayout, StreamPaths
from sparkjet.core.store.stream_log import StreamLog
from sparkjet.core.store.structures import IList, IMap, IStream

__all__ = [
    "CommitLog",
    "CommitLogPaths",
    "IList",
    "IMap",
    "IStream",
    "JobRecords",
    "LogCursor",
    "Record",
    "Store",
    "StoreLayout",
    "StreamLog",
    "StreamPaths",
]
