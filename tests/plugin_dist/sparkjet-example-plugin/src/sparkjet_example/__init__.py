"""An example third-party sparkjet plugin (entry point ``example`` in group ``sparkjet``).

It uses only the public plugin API, :mod:`sparkjet.plugin`, and contributes:

- source ``range``: :class:`RangeSource`, the ints ``0 .. n-1`` split into a
  few contiguous ranges that executors read; it can replay, so it declares
  every guarantee;
- source ``ticker``: :class:`TickerSource`, an unbounded (streaming) source
  of ticks that cannot replay, so it declares NONE only;
- sink ``jsonl``: :class:`JsonLinesSink`, one JSON document per line, one
  file per commit in the folder ``<path>/<name>``: ``<job id>.jsonl`` for a
  batch job, ``<commit token>.jsonl`` for each micro-batch of a streaming
  job. Executors write their partition to a hidden temporary file there; the
  driver's commit concatenates them, in partition order, and links the result
  to its name, which is atomic and never replaces a file, so a replayed batch
  commits once: every guarantee (the sink conformance kit proves it).
  :func:`read_json_lines` reads what was committed;
- snapshot backend ``example-dir``: :class:`DirectorySnapshotBackend`,
  snapshots as plain files in a local folder, with ``os`` calls only (no
  fsspec), to show a backend that is not one of sparkjet's own.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from sparkjet.plugin import (
    ALL_GUARANTEES,
    JobContext,
    ProcessingGuarantee,
    Sink,
    SnapshotBackend,
    Source,
    TaskContext,
    hookimpl,
)

__all__ = [
    "DirectorySnapshotBackend", "JsonLinesSink", "RangeSource", "TickerSource", "read_json_lines",
]


class RangeSource(Source):
    """The ints ``0 .. n-1`` in order, read on executors as ``parts`` contiguous ranges."""

    kind = "range"
    guarantees = ALL_GUARANTEES

    def __init__(self, name: str, n: int, parts: int = 3) -> None:
        super().__init__(name)
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"RangeSource {name!r}: n must be a non-negative int, got {n!r}")
        if not isinstance(parts, int) or parts < 1:
            raise ValueError(f"RangeSource {name!r}: parts must be a positive int, got {parts!r}")
        self.n = n
        self.parts = parts

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: ``(start, stop)`` ranges, in order."""
        parts = max(1, min(self.parts, self.n))
        size, extra = divmod(self.n, parts)
        ranges, start = [], 0
        for i in range(parts):
            stop = start + size + (1 if i < extra else 0)
            ranges.append((start, stop))
            start = stop
        return ranges

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: the ints of one range."""
        start, stop = partition
        return range(start, stop)


class TickerSource(Source):
    """An unbounded stream of ``(partition, sequence)`` ticks, one per ``interval`` seconds.

    Declared ``streaming``, so a pipeline reading it is a streaming job. Its
    offsets count ticks since the source was created, so a range reads the
    same ticks again; it declares NONE only, to serve as a participant that
    cannot keep a guarantee. With ``limit`` each partition stops after that
    many ticks (handy for tests).
    """

    kind = "ticker"
    streaming = True
    guarantees = frozenset({ProcessingGuarantee.NONE})

    def __init__(
        self, name: str, interval: float = 0.1, partitions: int = 1, limit: int | None = None
    ) -> None:
        super().__init__(name)
        self.interval = interval
        self.count = partitions
        self.limit = limit
        self.started = time.time()

    def partitions(self, context: JobContext) -> Sequence[Any]:
        """A stream has no batch plan: streaming jobs call :meth:`plan_range`."""
        raise NotImplementedError("TickerSource is read by streaming jobs only")

    def initial_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: start at the first tick."""
        return [0] * self.count

    def latest_offsets(self, context: JobContext) -> Any:
        """Runs on the driver: ticks elapsed so far (capped by ``limit``)."""
        ticks = int((time.time() - self.started) / self.interval)
        if self.limit is not None:
            ticks = min(ticks, self.limit)
        return [ticks] * self.count

    def plan_range(self, start: Any, end: Any, context: JobContext) -> Sequence[Any]:
        """Runs on the driver: one descriptor per partition."""
        return [(p, s, e) for p, (s, e) in enumerate(zip(start, end, strict=True)) if e > s]

    def read(self, partition: Any, context: TaskContext) -> Iterable[Any]:
        """Runs on an executor: the ticks of one range."""
        p, start, end = partition
        return [(p, seq) for seq in range(start, end)]


class JsonLinesSink(Sink):
    """Writes items as JSON lines, one file per commit in the folder ``<path>/<name>``.

    A batch job's commit is ``<job id>.jsonl``; each micro-batch of a
    streaming job is ``<commit token>.jsonl``. Parts are staged as hidden
    temporary files in the same folder and published by a hard link, which
    never replaces a file: a commit whose file exists (a replayed batch, a
    driver that was replaced) changes nothing. So every guarantee holds.
    """

    kind = "jsonl"
    guarantees = ALL_GUARANTEES

    def __init__(self, name: str, path: str | os.PathLike[str]) -> None:
        super().__init__(name)
        self.folder = os.path.join(os.fspath(path), name)

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver: create the folder; the state is this run's temp-file prefix."""
        os.makedirs(self.folder, exist_ok=True)
        return f".{context.job_id}.{uuid.uuid4().hex}"

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: one temp file per task attempt; returns its path."""
        name = f"{state}.part-{context.partition:05d}.{uuid.uuid4().hex[:8]}.tmp"
        part = os.path.join(self.folder, name)
        with open(part, "w", encoding="utf-8") as fh:
            for item in items:
                fh.write(json.dumps(item) + "\n")
        return part

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: concatenate the parts in order, link the file into place once."""
        target = os.path.join(self.folder, f"{context.commit_token or context.job_id}.jsonl")
        staged = os.path.join(self.folder, f"{state}.jsonl.tmp")
        with open(staged, "wb") as out:
            for part in messages:
                with open(part, "rb") as fh:
                    shutil.copyfileobj(fh, out)
        try:
            os.link(staged, target)  # atomic, and unlike a rename it never replaces a file
        except FileExistsError:
            pass  # this batch was committed before: keep what is there
        finally:
            self.abort(state, [], context)  # remove the staged file and the parts

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: delete this run's temp files (also those no message names)."""
        for leftover in glob.glob(os.path.join(glob.escape(self.folder), f"{state}*.tmp")):
            _remove(leftover)


def read_json_lines(path: str | os.PathLike[str], name: str) -> list[Any]:
    """What :class:`JsonLinesSink` ``name`` committed under ``path``: every file, by name."""
    folder = glob.escape(os.path.join(os.fspath(path), name))
    items = []
    for committed in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):  # skips .tmp files
        with open(committed, encoding="utf-8") as fh:
            items.extend(json.loads(line) for line in fh)
    return items


class DirectorySnapshotBackend(SnapshotBackend):
    """Snapshots as plain files under the local folder ``url``, written with ``os`` calls.

    Whole-file writes go to a temporary file renamed into place; create-only
    writes link a complete temporary file to the target name, which fails if
    it exists (atomic), and read an existing file back to recognise a retry.
    """

    kind = "example-dir"

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, options)
        self.root = os.path.abspath(url)

    def _path(self, path: str) -> str:
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"refusing path {path!r}")
        return os.path.join(self.root, *parts)

    def _temp(self, target: str, data: Iterable[bytes]) -> str:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temp = f"{target}.{uuid.uuid4().hex}.tmp"
        with open(temp, "wb") as fh:
            for chunk in data:
                fh.write(chunk)
        return temp

    @property
    def create_only_enforced(self) -> bool:
        """A hard link never replaces an existing name."""
        return True

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Link a complete temporary file to ``path``; False if ``path`` holds other data."""
        target = self._path(path)
        temp = self._temp(target, [data])
        try:
            os.link(temp, target)
            return True
        except FileExistsError:
            return self.read_bytes(path) == data
        finally:
            # Once linked, a newer export may retire this attempt's whole folder
            # (temporary file included) before this line runs.
            _remove(temp)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a temporary file, then rename it over ``path``."""
        self.write_chunks(path, [data])

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        """Stream to a temporary file, then rename it over ``path``."""
        target = self._path(path)
        os.replace(self._temp(target, chunks), target)

    def read_bytes(self, path: str) -> bytes:
        """The whole file."""
        with open(self._path(path), "rb") as fh:
            return fh.read()

    def size(self, path: str) -> int:
        """``os.path.getsize``."""
        return os.path.getsize(self._path(path))

    def exists(self, path: str) -> bool:
        """A file at ``path``."""
        return os.path.isfile(self._path(path))

    def list(self, prefix: str) -> list[str]:
        """Walk the folder ``prefix``; temporary files are not listed."""
        top = self._path(prefix)
        found = []
        for folder, _, names in os.walk(top):
            for name in names:
                if not name.endswith(".tmp"):
                    relative = os.path.relpath(os.path.join(folder, name), self.root)
                    found.append(relative.replace(os.sep, "/"))
        return sorted(found)

    def list_children(self, prefix: str) -> list[str]:
        """``os.listdir`` of the folder ``prefix``."""
        try:
            return sorted(n for n in os.listdir(self._path(prefix)) if not n.endswith(".tmp"))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete(self, prefix: str) -> None:
        """Remove a file or a whole folder."""
        target = self._path(prefix)
        if target == self.root:
            raise ValueError("refusing to delete the whole root")
        if os.path.isdir(target):
            shutil.rmtree(target, ignore_errors=True)
        else:
            _remove(target)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@hookimpl
def register_sources(register: Any) -> None:
    """Register the range and ticker sources."""
    register(RangeSource)
    register(TickerSource)


@hookimpl
def register_sinks(register: Any) -> None:
    """Register the JSON-lines sink."""
    register(JsonLinesSink)


@hookimpl
def register_snapshot_backends(register: Any) -> None:
    """Register the plain-files snapshot backend."""
    register(DirectorySnapshotBackend)
