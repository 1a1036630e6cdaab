"""Named streams in the store: append-only, partitioned logs with offsets.

A stream is a folder ``streams/<name>/`` with ``meta.json`` (partition count)
and one folder per partition holding *chunks*. A chunk is created with a
create-only write under the name of its first offset, so concurrent
publishers never overwrite or interleave: one who loses the race for an offset
looks again and takes the next one. A chunk file is::

    8 bytes   item count (big-endian)
    2 bytes   length of the writer token
    n bytes   writer token (utf-8; empty for plain publishers)
    rest      pickle of the list of items

The token lets an exactly-once writer (a sink replaying a micro-batch) find
out whether its chunk already landed; a plain publisher's token is a random
``~<hex>``, so no two publishers' chunks are ever byte-equal (a create that
the filesystem client retried is recognised by its content, see
:meth:`sparkjet.core.store.fs.Store.create_exclusive`). A micro-batch sink's
chunk carries ``@<batch token>`` and counts only where
``registry/p<partition>/<token>`` (created only if absent, holding an
offset) says: a second chunk of a batch, appended by a driver that was fenced
off but not yet aware, is skipped by every reader (see :meth:`StreamLog.register`).
Offsets still count its items, so ``size()`` may exceed what readers return.

Reading checks what the offsets promise: chunk ``n`` of a partition must
start where chunk ``n-1`` ends, and hold as many items as its header says.
A gap (a missing or overstated chunk) or a truncated chunk is an error naming
the file, never a silent loss. Where the files lie is
:class:`~sparkjet.core.store.layout.StreamPaths`.

Finding the end: on S3 or GCS a partition is listed (the listing carries the
chunks' sizes). On a local or in-memory store, where a listing costs a stat
per chunk, a partition this process has seen is *followed*: chunks are only
ever created at the end offset, so the header of the chunk named by the
known end says whether one came and where it ends (see
:meth:`StreamLog.end_offset`).

Retention (:meth:`StreamLog.trim`) removes a partition's oldest chunks, so
the partition starts later; offsets below its start are *trimmed*, and a read
of them is an error saying so. When every chunk goes, a start marker
``<offset>.start`` keeps the partition's end offset (offsets are never handed
out twice): a partition starts at its first chunk, or at its highest marker
when it has none.

:class:`StreamLog` is the one entry; it is made of parts, one module each:

- :mod:`.stream_chunks`: the stream's files, ``meta.json``, a chunk's
  header and the read-ahead of S3 and GCS (:class:`.StreamFiles`, the base);
- :mod:`.stream_follow`: listing and following a partition to its start and
  end offsets, and what this process saw of each (:class:`.StreamEnds`);
- :mod:`.stream_wait`: waiting for appends, and the backed-off polls of an
  object store (:class:`.StreamWaiting`, :class:`.PollSettings`);
- :mod:`.stream_registry`: which of a batch's chunks counts (:class:`.StreamRegistry`);
- :mod:`.stream_read`: reading a range of offsets, checked (:class:`.StreamReading`);
- :mod:`.stream_write`: appends, publishes and micro-batch sinks' batches
  (:class:`.StreamWriting`);
- :mod:`.stream_trim`: retention, a partition's chunks and their trim
  (:class:`.StreamTrimming`).

The names other modules and tests use are re-exported here; the per-process
caches are the same objects as in the module that owns them, so a test that
replaces one (rather than changing it) replaces it there.
"""

from __future__ import annotations

from sparkjet.core.store.stream_chunks import _BATCH as _BATCH
from sparkjet.core.store.stream_chunks import _HEADER as _HEADER
from sparkjet.core.store.stream_chunks import (
    HEAD_BYTES,
    META_SECONDS,
    READ_AHEAD_SECONDS,
    StreamFiles,
)
from sparkjet.core.store.stream_follow import _CHUNKS as _CHUNKS
from sparkjet.core.store.stream_follow import _LISTED as _LISTED
from sparkjet.core.store.stream_follow import _POLLED_AT as _POLLED_AT
from sparkjet.core.store.stream_follow import StreamEnds
from sparkjet.core.store.stream_read import StreamReading
from sparkjet.core.store.stream_registry import PENDING_WAIT_SECONDS, StreamRegistry
from sparkjet.core.store.stream_trim import StreamTrimming, trimmed_start
from sparkjet.core.store.stream_wait import _BACKOFF as _BACKOFF
from sparkjet.core.store.stream_wait import (
    BACKOFF_FACTOR,
    IDLE_POLL_MAX_SECONDS,
    LOCAL_STAT_SECONDS,
    REMOTE_POLL_SECONDS,
    PollSettings,
    StreamWaiting,
    poll_settings,
)
from sparkjet.core.store.stream_write import StreamWriting

__all__ = [
    "BACKOFF_FACTOR",
    "HEAD_BYTES",
    "IDLE_POLL_MAX_SECONDS",
    "LOCAL_STAT_SECONDS",
    "META_SECONDS",
    "PENDING_WAIT_SECONDS",
    "READ_AHEAD_SECONDS",
    "REMOTE_POLL_SECONDS",
    "PollSettings",
    "StreamEnds",
    "StreamFiles",
    "StreamLog",
    "StreamReading",
    "StreamRegistry",
    "StreamTrimming",
    "StreamWaiting",
    "StreamWriting",
    "poll_settings",
    "trimmed_start",
]


class StreamLog(StreamReading, StreamWriting, StreamTrimming, StreamWaiting):
    """One stream's files; picklable (executors read chunks directly).

    Everything a stream does, from its parts (see the module's docstring):
    its metadata and offsets, reads, appends, registrations, trims and waits.
    """
