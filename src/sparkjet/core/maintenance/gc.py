"""Garbage collection of the store: what no inline step removes, so months of jobs stay bounded.

Lists, maps, streams and running checkpoints clean up after themselves as
they go (a checkpoint keeps ten to twenty batches of log and one chain of
state per range of key groups; a list's or map's log is folded every 100
records). What is left behind by crashes and by jobs that ended is collected
here, by ``client.collect_garbage()`` or ``sparkjet gc``:

- segments of lists and maps that no base or committed record names (folded
  away, or left by a batch job or a task attempt that died before its
  commit), and abort markers;
- take-over claims older than a job's current epoch, quarantined control
  requests, files left by the store's probes, and temp files of local writes
  whose process was killed mid-write;
- scratch checkpoints a job's record does not name (NONE restarts), and
  state files of its checkpoint that no key group needs any more (a task
  removes its own older files as it goes; files written by another number of
  tasks, or a stray attempt's second copy of a batch, wait for this);
- folders of jobs that have no record: a submit that died between writing
  the pipeline (or a snapshot's state) and the record;
- whole folders of jobs that ended (COMPLETED or FAILED) longer ago than the
  retention (Jet forgets job results after 7 days too).

Only files older than the grace period are touched, so a batch job staging
its segments right now, or a driver mid-take-over, is never raced. Every
path is checked to lie inside the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from sparkjet.core.errors import StoreError
from sparkjet.core.jobs.record import JobRecord, checkpoint_path, read_record
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.store.commit_log import CommitLog
from sparkjet.core.store.fs import Store, file_modified
from sparkjet.core.store.job_records import JobRecords

log = logging.getLogger("sparkjet.store")

#: Files younger than this are never collected (seconds).
DEFAULT_GRACE_SECONDS = 3600.0
#: Jobs that ended longer ago than this are forgotten (seconds; Jet's default is 7 days).
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0


@dataclass
class GarbageReport:
    """What :func:`collect_garbage` removed (or would remove, with ``dry_run``), by kind."""

    dry_run: bool
    #: kind -> paths, in the order they were found.
    removed: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, path: str) -> None:
        """Note ``path`` as removed, under ``kind``."""
        self.removed.setdefault(kind, []).append(path)

    @property
    def total(self) -> int:
        """How many paths in all."""
        return sum(len(paths) for paths in self.removed.values())


class _Collector:
    def __init__(
        self, store: Store, grace: float, retention: float, dry_run: bool, now: float
    ) -> None:
        self.store = store
        self.layout = store.layout
        self.records = JobRecords(store)
        self.grace = grace
        self.retention = retention
        self.report = GarbageReport(dry_run)
        self.now = now

    def old(self, path: str) -> bool:
        """Whether ``path`` (a file; a folder by its newest file) is older than the grace."""
        try:
            info = self.store.info(path)
            if info.get("type") == "directory":
                found = self.store.find(path)
                times = [file_modified(i) for i in found.values()]
                if None in times:
                    return False
                written = max((t for t in times if t is not None), default=0.0)
            else:
                written = file_modified(info) or self.now
        except FileNotFoundError:
            return False
        return self.now - written > self.grace

    def remove(self, kind: str, path: str, recursive: bool = False) -> None:
        self.report.add(kind, path)
        if not self.report.dry_run:
            self.store.remove(path, recursive=recursive)

    def logs(self) -> Iterator[CommitLog]:
        yield from map(self.store.list_log, self.store.list_names())
        yield from map(self.store.map_log, self.store.map_names())

    def segments(self) -> None:
        for commit_log in self.logs():
            paths = commit_log.paths
            entries = self.store.listdir(paths.data)
            if not entries:
                continue
            named = {
                paths.file_name(value)
                for record in commit_log.records()
                for kind, value in record.parts if kind == "segment"
            }
            for entry in entries:
                path = paths.data_file(entry)
                if paths.is_abort_marker(entry):
                    if self.old(path):
                        self.remove("abort markers", path)
                elif entry not in named and self.old(path):
                    self.remove("orphan segments", path)

    def jobs(self) -> None:
        for job_id in self.records.ids():
            folder = self.layout.job(job_id)
            try:
                record = read_record(self.records, job_id)
            except StoreError as exc:
                log.warning("gc: leaving job folder %s alone: %s", folder, exc)
                continue
            if record is None:
                # A submit that died between its first write and its record (a
                # live one writes the record within seconds of the pipeline).
                if self.old(folder):
                    self.remove("job folders without a record", folder, recursive=True)
                continue
            ended = record.completion_time
            old = ended > 0 and self.now - ended / 1000 > self.retention
            if record.status.is_terminal() and old:
                self.remove("ended jobs", folder, recursive=True)
                if record.name and not self.report.dry_run:
                    # A name its ended job still holds (its driver could not free it)
                    # would make the next submit of that name wait for a record that
                    # is gone now.
                    self.records.release_name(record.name, job_id)
                continue
            self._job_leftovers(job_id, record)

    def _job_leftovers(self, job_id: str, record: JobRecord) -> None:
        entries = self.store.listdir(self.layout.job(job_id))
        epochs = sorted(e for e in map(self.layout.owner_epoch, entries) if e is not None)
        for epoch in epochs[:-1]:  # the newest claim names the current epoch
            path = self.layout.owner_claim(job_id, epoch)
            if self.old(path):
                self.remove("old take-over claims", path)
        current = record.checkpoint
        for entry in entries:
            if self.layout.is_scratch_checkpoint(entry) and entry != current:
                path = self.layout.checkpoint(job_id, entry)
                if self.old(path):
                    self.remove("unused checkpoints", path, recursive=True)
        self._superseded_state(record)
        for entry in self.store.listdir(self.layout.quarantine(job_id)):
            path = self.layout.quarantined(job_id, entry)
            if self.old(path):
                self.remove("quarantined control requests", path)

    def _superseded_state(self, record: JobRecord) -> None:
        try:
            root = checkpoint_path(self.records, record)
            if root is None:
                return
            checkpoint = Checkpoint(self.store, root)
            groups = checkpoint.written_key_groups()
            committed = checkpoint.last_commit()
        except (StoreError, ValueError) as exc:
            log.warning("gc: leaving job %s's checkpoint alone: %s", record.id, exc)
            return
        if groups is None or committed < 0:
            return
        # A snapshot export reading a batch's state pins it: none of its files go.
        paths = checkpoint.state(groups).with_pin(checkpoint.pinned())
        for stage in paths.stages():
            for version in paths.superseded(stage, committed):
                path = paths.path(stage, version)
                if self.old(path):
                    self.remove("superseded state files", path)

    def probes(self) -> None:
        for entry in self.store.listdir(self.layout.probes):
            path = self.layout.probe(entry)
            if self.old(path):
                self.remove("probe files", path)

    def temp_files(self) -> None:
        for path in self.store.temp_files():
            if self.old(path):
                self.remove("temp files of unfinished writes", path)


def collect_garbage(
    store: Store,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    dry_run: bool = False,
) -> GarbageReport:
    """Remove what the store no longer needs (see the module docstring); returns what went."""
    if grace_seconds < 0 or retention_seconds < 0:
        raise ValueError("grace_seconds and retention_seconds must not be negative")
    now = store.now()  # files are dated by the store's clock: compare with that
    collector = _Collector(
        store, grace_seconds, retention_seconds, dry_run, time.time() if now is None else now
    )
    collector.segments()
    collector.jobs()
    collector.probes()
    collector.temp_files()
    return collector.report
