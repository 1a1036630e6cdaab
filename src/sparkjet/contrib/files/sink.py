"""The file sink, :class:`FileSink`, and the readers of what it committed.

A micro-batch's files, then its commit marker naming them;
:func:`committed_files` and :func:`read_committed` honour the markers.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import posixpath
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from sparkjet.contrib.files.common import _SINK_FORMATS, MARKERS, _open_fs, _pyarrow_parquet
from sparkjet.plugin import ALL_GUARANTEES, JobContext, Sink, TaskContext, open_file_store


def _batch_name(token: str, batch_id: int | None) -> str:
    digest = hashlib.sha1(token.encode()).hexdigest()[:12]
    return f"batch-{batch_id:08d}-{digest}" if batch_id is not None else f"job-{digest}"


class FileSink(Sink):
    """Writes the job's output as files in a folder or bucket prefix, batch by batch.

    ``url``: a local folder or an fsspec URL. ``format``: ``"jsonl"`` (any
    JSON-serialisable item) or ``"parquet"`` (dict items; pyarrow). Each
    micro-batch writes ``part-<batch>-<attempt>-<partition>.<format>`` files,
    then its commit marker ``_committed/<batch>.json`` naming them: a
    micro-batch whose marker is absent is not there for readers (see
    :func:`committed_files`). A micro-batch committed a second time after a
    failure finds its marker and writes nothing more, so the sink keeps every
    guarantee. ``<attempt>`` is new with every ``prepare``: a replay, or a
    fenced driver's late tasks, never overwrite files a marker names.
    """

    kind = "files"
    guarantees = ALL_GUARANTEES

    def __init__(
        self,
        url: str,
        format: str = "jsonl",
        *,
        storage_options: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        url = str(url)
        super().__init__(name or url)
        if format not in _SINK_FORMATS:
            raise ValueError(
                f"FileSink({url!r}): format must be one of {', '.join(_SINK_FORMATS)}; "
                f"got {format!r}"
            )
        self.url = url
        self.format = format
        self.storage_options = dict(storage_options or {})

    def describe(self) -> str:
        """``files:<name>``: the ``name`` given, else the url (stage names come from it)."""
        return f"files:{self.name}"

    def prepare(self, context: JobContext) -> Any:
        """Runs on the driver: the name of this micro-batch's files (from its commit token)."""
        token = context.commit_token or f"{context.job_id}.{uuid.uuid4().hex}"
        fs, root = _open_fs(self.url, self.storage_options)
        fs.makedirs(root, exist_ok=True)
        return {"batch": _batch_name(token, context.batch_id), "token": token,
                "batch_id": context.batch_id, "job_id": context.job_id,
                "attempt": uuid.uuid4().hex[:8]}

    def write(self, state: Any, items: Iterator[Any], context: TaskContext) -> Any:
        """Runs on an executor: this partition's file, under its final name; None if empty."""
        rows = list(items)
        if not rows:
            return None
        fs, root = _open_fs(self.url, self.storage_options)
        name = f"part-{state['batch']}-{state['attempt']}-{context.partition:05d}.{self.format}"
        if self.format == "jsonl":
            lines = []
            for i, item in enumerate(rows):
                try:
                    lines.append(json.dumps(item))
                except (TypeError, ValueError) as exc:
                    raise TypeError(
                        f"{self.describe()}: item {i} of partition {context.partition} is not "
                        f"JSON-serialisable: {exc}: {item!r:.80}"
                    ) from exc
            data = ("\n".join(lines) + "\n").encode()
        else:
            data = self._parquet_bytes(rows, context.partition)
        _put(fs, f"{root}/{name}", data)
        return {"file": name, "items": len(rows)}

    def _parquet_bytes(self, rows: list[Any], partition: int) -> bytes:
        pq = _pyarrow_parquet(self.describe())
        import pyarrow as pa  # type: ignore[import-untyped]

        for i, item in enumerate(rows):
            if not isinstance(item, dict):
                raise TypeError(
                    f"{self.describe()}: Parquet rows must be dicts; item {i} of partition "
                    f"{partition} is a {type(item).__name__}: {item!r:.80}"
                )
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise TypeError(
                f"{self.describe()}: partition {partition}'s rows do not make a Parquet table "
                f"(a column with mixed types?): {exc}"
            ) from exc
        out = io.BytesIO()
        pq.write_table(table, out)
        return out.getvalue()

    def commit(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: write the commit marker, once per micro-batch.

        The marker is created only if absent (the filesystem's conditional
        create where it has one): a commit replayed after a failure, or by a
        second driver, finds it there, removes its own files and is a no-op.
        """
        files = open_file_store(self.url, self.storage_options)
        written = [m for m in messages if m is not None]
        record = {
            "token": state["token"], "job_id": state["job_id"], "batch_id": state["batch_id"],
            "files": [m["file"] for m in written], "items": sum(m["items"] for m in written),
            "committed_ms": int(time.time() * 1000),
        }
        files.fs.makedirs(files.path(MARKERS), exist_ok=True)
        if not files.create_exclusive(
            files.path(MARKERS, f"{state['batch']}.json"), json.dumps(record, indent=1).encode()
        ):  # committed before, by another attempt: no marker names this attempt's files
            for name in record["files"]:
                with contextlib.suppress(FileNotFoundError):
                    files.remove(files.path(name))

    def abort(self, state: Any, messages: list[Any], context: JobContext) -> None:
        """Runs on the driver: remove this attempt's files, but those a commit marker names."""
        fs, root = _open_fs(self.url, self.storage_options)
        marker = f"{root}/{MARKERS}/{state['batch']}.json"
        committed: set[str] = set()
        if fs.exists(marker):
            with fs.open(marker, "rb") as fh:
                committed = set(json.loads(fh.read())["files"])
        for path in fs.glob(f"{root}/part-{state['batch']}-{state['attempt']}-*"):
            if posixpath.basename(path) not in committed:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(path)


def _put(fs: Any, path: str, data: bytes) -> None:
    """Write a whole file; on a local disk through a temporary name and a rename."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        folder, base = posixpath.split(path)
        staged = f"{folder}/.{base}.{uuid.uuid4().hex[:8]}.tmp"
        with fs.open(staged, "wb") as fh:
            fh.write(data)
        fs.mv(staged, path)
    else:
        with fs.open(path, "wb") as fh:
            fh.write(data)


def committed_files(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The full paths of the files a :class:`FileSink` committed at ``url``, batch by batch.

    Only files named by a commit marker count: the files of a micro-batch
    still being written, or of one that failed, are left out. Markers are
    taken in the order of their names (a job's micro-batches in order).
    """
    fs, root = _open_fs(url, storage_options or {})
    try:
        markers = sorted(fs.glob(f"{root}/{MARKERS}/*.json"))
    except FileNotFoundError:
        return []
    out: list[str] = []
    for marker in markers:
        with fs.open(marker, "rb") as fh:
            record = json.loads(fh.read())
        out.extend(f"{root}/{name}" for name in record["files"])
    return out


def read_committed(
    url: str, format: str = "jsonl",
    storage_options: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Every item a :class:`FileSink` committed at ``url``, in order of its commit markers."""
    if format not in _SINK_FORMATS:
        raise ValueError(f"read_committed({url!r}): format must be one of "
                         f"{', '.join(_SINK_FORMATS)}; got {format!r}")
    fs, _ = _open_fs(url, storage_options or {})
    items: list[Any] = []
    for path in committed_files(url, storage_options):
        if format == "jsonl":
            with fs.open(path, "rb") as fh:
                items.extend(json.loads(line) for line in fh.read().splitlines() if line.strip())
        else:
            pq = _pyarrow_parquet(f"read_committed({url!r})")
            with fs.open(path, "rb") as fh:
                items.extend(pq.read_table(fh).to_pylist())
    return items
