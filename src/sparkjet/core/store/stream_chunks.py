"""One stream's files, its ``meta.json`` and a chunk's header: what every part of a stream shares.

:class:`StreamFiles` is the base of :class:`~sparkjet.core.store.stream_log.StreamLog`
and of the parts it is made of (following, reading, writing, trimming, waiting):
the store and the stream's paths, its partition count (``meta.json``, read
once per :data:`META_SECONDS` per store handle on S3 or GCS), which kind of
store it lies in, and the read of a chunk's header. The chunk format is
described in :mod:`~sparkjet.core.store.stream_log`.

It owns the read-ahead too: on S3 or GCS the look for a header fetches
:data:`HEAD_BYTES`, and a chunk that fits whole is kept on the store handle
(:func:`_read_ahead`) for the read of its items that follows (:func:`_kept`).
"""

from __future__ import annotations

import contextlib
import json
import struct
import time
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.store.protocol import StoreFiles

_HEADER = struct.Struct(">QH")
#: A micro-batch sink's chunk carries its batch token after this prefix; it
#: counts only at the offset the token's registration names.
_BATCH = "@"
_MAX_PARTITIONS = 4096
#: How long a store handle (a client's) trusts a stream's ``meta.json`` (its
#: partition count) before reading it again.
META_SECONDS = 60.0
#: How long a chunk kept by a header's read serves the read of its items: the
#: read a look is for comes within a micro-batch; a copy older than this (or
#: of another size than the newest listing says) is fetched again, as a stream
#: deleted and made anew by another process has new chunks under old names.
READ_AHEAD_SECONDS = 2.0
#: How much of a chunk the look for its header fetches (one ranged GET either
#: way): a chunk that fits is kept for the read of its items that follows.
HEAD_BYTES = 16 << 10


def _partitions_of(meta: Any) -> None:
    """Checks a stream's meta.json (``{"partitions": <int>, ...}``)."""
    if int(meta["partitions"]) < 1:
        raise ValueError(f"partitions must be at least 1, got {meta['partitions']!r}")


class StreamFiles:
    """One stream's files, its partition count and its chunks' headers; picklable."""

    def __init__(self, store: StoreFiles, name: str) -> None:
        self.store = store
        self.name = name
        #: Where the stream's files lie.
        self.paths = store.layout.stream_paths(name)
        self._partitions: int | None = None
        #: Registrations read or made here: (partition, token) -> offset.
        self._registry: dict[tuple[int, str], int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "name": self.name, "paths": self.paths,
                "_partitions": self._partitions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._registry = {}

    # --- metadata -------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the stream has been created."""
        return self.store.exists(self.paths.meta)

    def create(self, partitions: int) -> bool:
        """Create the stream with ``partitions`` partitions; False if it already exists."""
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not (
            1 <= partitions <= _MAX_PARTITIONS
        ):
            raise StoreError(
                f"stream {self.name!r}: partitions must be an int from 1 to {_MAX_PARTITIONS}, "
                f"got {partitions!r}"
            )
        meta = json.dumps({"format": 1, "partitions": partitions}).encode()
        self._meta_cache.pop(self.paths.meta, None)
        return self.store.create_exclusive(self.paths.meta, meta)

    @property
    def _meta_cache(self) -> dict[str, tuple[int, float]]:
        """The partition counts this store handle read, on S3 or GCS (elsewhere reads are free)."""
        cache = getattr(self.store, "stream_meta", None)
        return cache if isinstance(cache, dict) and self._where() == "remote" else {}

    @property
    def _ahead(self) -> dict[str, tuple[bytes, float]]:
        """Whole chunks a header's read fetched on S3 or GCS, kept on the store handle.

        See :data:`HEAD_BYTES`; elsewhere a read is free, and nothing is kept.
        """
        cache = getattr(self.store, "read_ahead", None)
        return cache if isinstance(cache, dict) and self._where() == "remote" else {}

    @property
    def partitions(self) -> int:
        """Number of partitions; StoreError naming the stream if it does not exist."""
        if self._partitions is None:
            known = self._meta_cache.get(self.paths.meta)
            if known is not None and time.monotonic() - known[1] < META_SECONDS:
                self._partitions = known[0]
                return known[0]
            try:
                meta = self.store.read_json(
                    self.paths.meta, f"stream {self.name!r}: meta", check=_partitions_of)
            except FileNotFoundError:
                raise StoreError(
                    f"stream {self.name!r} does not exist in store {self.store.shown_url!r}: "
                    "create it with client.get_stream(name, partitions=N) first"
                ) from None
            self._partitions = int(meta["partitions"])
            self._meta_cache[self.paths.meta] = (self._partitions, time.monotonic())
        return self._partitions

    def _partitions_now(self) -> int:
        """The partition count read afresh, for a write.

        A count cached by this handle or its store (:data:`META_SECONDS`) may
        be older than the stream: another process may have deleted it and
        made it anew with other partitions, and items split by the old count
        would land in folders no reader lists. A write pays one read.
        """
        self._meta_cache.pop(self.paths.meta, None)
        self._partitions = None
        return self.partitions

    def _where(self) -> str:
        """``"local"`` (a folder here), ``"memory"`` (this process's) or ``"remote"``."""
        fs = getattr(self.store, "fs", None)
        protocol = getattr(fs, "protocol", None)
        protocols = protocol if isinstance(protocol, tuple) else (protocol,)
        if "file" in protocols or "local" in protocols:
            return "local"
        if "memory" in protocols:
            return "memory"
        return "remote"

    def _corrupt(self, path: str, why: str) -> StoreError:
        return StoreError(self.store.redact(f"stream {self.name!r}: chunk {path!r} {why}"))

    def _header(self, partition: int, start: int) -> tuple[int, str]:
        path = self.paths.chunk(partition, start)
        remote = self._where() == "remote"
        head = self.store.read_range(path, 0, HEAD_BYTES if remote else _HEADER.size + 512)
        if remote and len(head) < HEAD_BYTES:  # the whole chunk: its read need not fetch it
            _read_ahead(self._ahead, path, head)
        if len(head) < _HEADER.size:
            raise self._corrupt(path, f"is truncated ({len(head)} bytes, no header)")
        count, token_len = _HEADER.unpack_from(head)
        if len(head) < _HEADER.size + token_len:
            raise self._corrupt(path, "is truncated (its writer token is cut off)")
        token = head[_HEADER.size : _HEADER.size + token_len].decode("utf-8", "replace")
        return count, token


#: How many whole chunks a store handle keeps for reads to come (the oldest go).
_READ_AHEAD_MOST = 256


def _read_ahead(cache: dict[str, tuple[bytes, float]], path: str, data: bytes) -> None:
    """Keep a whole chunk a header's read fetched, until its items are read once.

    Chunks never change once written; a trim removes only what readers passed.
    The loop and the tasks it runs in the driver share the cache: the oldest
    entry's eviction may meet another thread's pop, which is no harm.
    """
    if len(cache) >= _READ_AHEAD_MOST:
        with contextlib.suppress(RuntimeError, StopIteration):
            cache.pop(next(iter(cache)), None)
    cache[path] = (data, time.monotonic())


def _kept(cache: dict[str, tuple[bytes, float]], path: str, size: int | None) -> bytes | None:
    """The copy of ``path`` :func:`_read_ahead` kept, if it has ``size`` bytes and is recent."""
    kept = cache.pop(path, None)
    if kept is None or size is None:
        return None
    data, at = kept
    return data if len(data) == size and time.monotonic() - at < READ_AHEAD_SECONDS else None
