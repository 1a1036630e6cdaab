"""Stream retention: trimming a stream's oldest items, never what a job or snapshot needs.

A stream grows with every publish. Retention removes its oldest chunks by a
policy of limits per partition, as Kafka's: at most the newest N items, items
younger than T seconds, at most B bytes (an item goes once any limit says
so; whole chunks go, oldest first), applied by ``sparkjet trim``
and, for streams with ``[streams.<name>]`` retention in the configuration,
by ``sparkjet gc``.

What is needed is never trimmed, whatever the policy says:

- every job that is not COMPLETED or FAILED (a SUSPENDED one too) and reads
  the stream holds back each partition at the offset of its last committed
  micro-batch (what a replay or a resume reads from); one that has committed
  none holds back the whole stream;
- every snapshot whose sources include the stream holds back each partition at
  its recorded offset, since a job started from it reads from there.

A job's record names what each source stage reads (``"stream:clicks"``); a
snapshot names source stages only, so a stage called ``from-stream(<name>)``
reads that stream, and a renamed source stage whose offsets have the shape of
this stream's (one integer per partition) is counted as reading it too, to
be safe. A limit of 0 keeps nothing: a partition whose every chunk goes keeps
its end offset in a start marker, so offsets are never handed out twice and
readers from the oldest item find it empty, starting at that offset. The
report says, per partition, what was trimmed and
what held the rest back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sparkjet.core.errors import StoreError
from sparkjet.core.jobs.record import all_records, checkpoint_path
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.state.snapshots import SnapshotStore
from sparkjet.core.store.fs import Store
from sparkjet.core.store.job_records import JobRecords
from sparkjet.core.store.stream_log import trimmed_start

log = logging.getLogger("sparkjet.store")


@dataclass(frozen=True)
class Retention:
    """How much of each partition of a stream to keep; None: no limit of that kind."""

    #: Keep at most the newest this many items of each partition.
    keep_items: int | None = None
    #: Keep only items published less than this many seconds ago (by the store's clock).
    keep_seconds: float | None = None
    #: Keep at most this many bytes of each partition (whole chunks, newest first).
    keep_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("keep_items", "keep_seconds", "keep_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError(f"stream retention: {name} must be 0 or more, got {value!r}")
        if self.keep_items is None and self.keep_seconds is None and self.keep_bytes is None:
            raise ValueError(
                "stream retention needs keep_items, keep_seconds or keep_bytes"
            )

    def describe(self) -> str:
        """``keep 1,000 items, 3600 s`` for messages."""
        parts = []
        if self.keep_items is not None:
            parts.append(f"{self.keep_items:,} items")
        if self.keep_seconds is not None:
            parts.append(f"{self.keep_seconds:g} s")
        if self.keep_bytes is not None:
            parts.append(f"{self.keep_bytes:,} bytes")
        return "keep " + ", ".join(parts)


@dataclass
class PartitionTrim:
    """What trimming did (or would do) to one partition."""

    partition: int
    #: The first offset before, and after.
    start_before: int
    start_after: int
    #: The offset the policy would trim to, and the one what is needed allowed.
    wanted: int
    #: What held the partition back below ``wanted`` (a job, a snapshot), if anything,
    #: and the offset it needs.
    held_by: str | None = None
    held_at: int | None = None

    @property
    def trimmed(self) -> int:
        """How many items went."""
        return self.start_after - self.start_before


@dataclass
class TrimReport:
    """What :func:`trim_stream` removed, or would remove with ``dry_run``."""

    stream: str
    retention: Retention
    dry_run: bool
    partitions: list[PartitionTrim] = field(default_factory=list)

    @property
    def trimmed(self) -> int:
        """Items removed over every partition."""
        return sum(p.trimmed for p in self.partitions)


class Holders:
    """What live jobs and kept snapshots hold back, read once for any number of streams.

    Reading it costs a listing of the job records, a read of each live
    stream-reading job's last commit and of every snapshot's manifest: ``gc``
    reads it once and trims every configured stream with it. Read before the
    trims, it holds at least as much as a later read would: jobs only commit
    further.
    """

    def __init__(self, store: Store, snapshots: SnapshotStore | None) -> None:
        self._jobs = _live_jobs(store)
        self._snapshots = ([] if snapshots is None else
                           [(s.name, dict(s.manifest.sources)) for s in snapshots.list()])

    def needs(self, name: str, partitions: int) -> list[tuple[Any, str]]:
        """``(offsets, who)`` for every job stage and snapshot that may read stream ``name``.

        ``offsets`` None: the whole stream (a job that has committed nothing).
        StoreError naming the stream and the job if a job's last commit lacks
        a stage that reads the stream.
        """
        needs: list[tuple[Any, str]] = []
        for job in self._jobs:
            stages = [stage for stage, source in job.sources.items()
                      if source == f"stream:{name}"]
            if not job.sources:  # written before records named their sources
                stages = job.legacy_stages
            for stage in stages:
                if job.ends is None:
                    needs.append((None, f"job {job.label}, which has committed no micro-batch "
                                        f"yet (stage {stage!r})"))
                elif stage in job.ends:
                    needs.append((job.ends[stage], f"job {job.label} (stage {stage!r})"))
                elif job.sources:
                    raise StoreError(f"job {job.label}: its last commit has no offsets for "
                                     f"stage {stage!r}; not trimming stream {name!r}")
        for snapshot, sources in self._snapshots:
            for stage, offsets in sources.items():
                if _reads(stage, offsets, name, partitions):
                    needs.append((offsets, f"snapshot {snapshot!r} (stage {stage!r})"))
        return needs


def trim_stream(
    store: Store,
    snapshots: SnapshotStore | None,
    name: str,
    retention: Retention,
    *,
    dry_run: bool = False,
    holders: Holders | None = None,
) -> TrimReport:
    """Trim stream ``name`` by ``retention``, holding back what jobs and snapshots need.

    ``snapshots``: the snapshot store whose snapshots count (None: none).
    ``holders``: what jobs and snapshots need, read before (read now if None).
    StoreError naming the stream if it does not exist.
    """
    stream = store.stream_log(name)
    partitions = stream.partitions  # StoreError naming the stream if it does not exist
    floors: list[tuple[int, str | None]] = [(2**63, None)] * partitions
    if holders is None:
        holders = Holders(store, snapshots)
    for offsets, who in holders.needs(name, partitions):
        if isinstance(offsets, list) and len(offsets) == partitions and all(
                type(o) is int for o in offsets):
            for p, offset in enumerate(offsets):
                if offset < floors[p][0]:
                    floors[p] = (offset, who)
        else:  # none committed, or not offsets this stream's source writes: keep everything
            for p in range(partitions):
                floors[p] = (0, who)
    # (The store's clock costs a probe write: only when an age limit needs it.)
    now = store.now() if retention.keep_seconds is not None else None
    if retention.keep_seconds is not None and now is None:
        log.warning("stream %r: store %r keeps no modification times, so keep_seconds "
                    "cannot be applied; the other limits are", name, store.shown_url)
    report = TrimReport(name, retention, dry_run)
    for p in range(partitions):
        start, chunks = stream.chunks(p)
        end = chunks[-1][1] if chunks else start
        wanted = _wanted(chunks, retention, now)
        floor, holder = floors[p]
        target = min(wanted, floor)
        held_by = holder if floor < wanted else None
        if dry_run:  # from the listing just made, as trim would
            after = trimmed_start([chunk[0] for chunk in chunks], end, target)
        else:
            after = stream.trim(p, target)
        report.partitions.append(PartitionTrim(p, start, after, wanted, held_by,
                                               floor if held_by is not None else None))
    if report.trimmed and not dry_run:
        log.info("stream %r: trimmed %d items (%s)", name, report.trimmed, retention.describe())
    return report


def _wanted(
    chunks: list[tuple[int, int, int, float | None]], retention: Retention, now: float | None
) -> int:
    """The offset ``retention`` would trim a partition to: the strictest of its limits.

    As Kafka's retention: an item goes once any limit says so. A chunk whose
    age the store cannot tell counts as young.
    """
    if not chunks:
        return 0
    end = chunks[-1][1]
    wanted = chunks[0][0]
    if retention.keep_items is not None:
        wanted = max(wanted, end - retention.keep_items)
    if retention.keep_seconds is not None and now is not None:
        young = [start for start, _, _, written in chunks
                 if written is None or now - written < retention.keep_seconds]
        wanted = max(wanted, young[0] if young else end)
    if retention.keep_bytes is not None:
        kept = 0
        for _, stop, size, _ in reversed(chunks):
            kept += size
            if kept > retention.keep_bytes:
                wanted = max(wanted, stop)
                break
    return wanted


def _reads(stage: str, offsets: Any, name: str, partitions: int) -> bool:
    """Whether a snapshot's source stage may read stream ``name`` (see the module docstring)."""
    if stage == f"from-stream({name})":
        return True
    if stage.startswith("from-stream(") and stage.endswith(")"):
        return False  # another stream's default name
    return isinstance(offsets, list) and len(offsets) == partitions and all(
        type(o) is int for o in offsets)


@dataclass(frozen=True)
class _LiveJob:
    """A job that is not COMPLETED or FAILED, as retention sees it."""

    label: str
    #: Source stage -> what it reads (``"stream:clicks"``), from the job's record.
    sources: dict[str, str]
    #: The ``from-...`` stages of a record written before records named their sources.
    legacy_stages: list[str]
    #: The source offsets of its last committed micro-batch; None if none is committed.
    ends: dict[str, Any] | None


def _live_jobs(store: Store) -> list[_LiveJob]:
    """Every live job that may read a stream, with its last commit's offsets."""
    records = JobRecords(store)
    jobs = []
    for record in all_records(records):
        if record.status.is_terminal():
            continue
        if record.sources and not any(source.startswith("stream:")
                                      for source in record.sources.values()):
            continue
        legacy = [] if record.sources else [s for s in record.stages if s.startswith("from-")]
        if not record.sources and not legacy:
            continue
        path = checkpoint_path(records, record)
        ends = None
        if path is not None:
            checkpoint = Checkpoint(store, path)
            committed = checkpoint.last_commit()
            if committed >= 0:
                ends = dict(checkpoint.commit_record(committed).ends)
        jobs.append(_LiveJob(record.label, dict(record.sources), legacy, ends))
    return jobs
