"""Exporting a job's state: one committed batch of its checkpoint written as a snapshot.

This module owns the export: :func:`cut_export` pins the batch and lists its
state files (where no batch runs), :func:`export_state` writes them as
snapshot ``name`` while the job goes on, :func:`release_cut` lets them go.
The snapshot's format and storage are :mod:`sparkjet.core.state.snapshots`';
starting a new job from a snapshot is :mod:`sparkjet.core.state.restore`'s, by the
upgrade rules of :mod:`sparkjet.core.state.snapshots.upgrade`.

An exported snapshot is the state of one committed batch of the job's
checkpoint, by key group, plus its sources' offsets at that batch. Each
stateful stage's state is written as one file per range of key groups the
batch's state tasks owned, ``state/<stage>/<lo>-<hi>-<keys>.state``, holding
what a checkpoint's full copy holds (``{"values": {key: entry}, "touched":
{key: millis}}``, cloudpickled; see :mod:`sparkjet.core.state.checkpoint`).

Restoring a snapshot into a new checkpoint is :mod:`sparkjet.core.state.restore`'s.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle

from sparkjet.core.errors import JobStateError, StoreError
from sparkjet.core.model import DEFAULT_KEY_GROUPS
from sparkjet.core.pipeline.event_time import EventTime
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.state import compaction
from sparkjet.core.state.checkpoint import Checkpoint
from sparkjet.core.state.files import StatePaths
from sparkjet.core.state.keygroups import task_range
from sparkjet.core.state.snapshots.format import (
    EVENT_TIME_FILE,
    pipeline_fingerprint,
    source_identity,
    state_file_path,
    state_signature,
    stateful_stages,
)
from sparkjet.core.state.snapshots.manifest import Manifest, ManifestFields, StageFields
from sparkjet.core.state.snapshots.storage import SnapshotStore
from sparkjet.core.state.versions import Counted, StateVersion

__all__ = [
    "ExportCut",
    "cut_export",
    "export_state",
    "release_cut",
]


@dataclass(frozen=True)
class ExportCut:
    """The batch a snapshot export reads, pinned (see :meth:`Checkpoint.pin`)."""

    #: The batch (-1: before the job's first; its state is empty).
    batch: int
    #: The sources' offsets at the end of the batch.
    ends: dict[str, Any]
    #: The state tasks the batch ran (its ranges of key groups are the snapshot's files).
    tasks: int
    key_groups: int
    #: Per stateful stage, per range ``(lo, hi)``: the files its state as of
    #: the batch is made of, listed when the cut was taken.
    chains: dict[str, dict[tuple[int, int], list[StateVersion]]]
    #: Which state files count, as the commit records said at the cut.
    counted: Counted
    #: The pin's token, for :func:`release_cut` ("": nothing pinned).
    pin: str
    #: Event time as of the batch (None: the job has none).
    event_time: EventTime | None = None


def cut_export(
    checkpoint: Checkpoint,
    plan: Plan,
    name: str,
    job: str,
    before_first: Callable[[], dict[str, Any]] | None = None,
    key_groups: int = DEFAULT_KEY_GROUPS,
) -> ExportCut:
    """Pin the checkpoint's last committed batch for exporting snapshot ``name`` of ``job``.

    Called where no batch runs (between two, or with the job suspended): it
    lists the files each range's state is made of (one listing per stateful
    stage) and pins the batch, so no batch after it removes them and the job
    may go on while :func:`export_state` reads them. Release with
    :func:`release_cut`.

    A job that has not committed a batch yet has empty state: its cut is
    batch -1, at the offsets ``before_first()`` gives (where its first batch
    starts), with the checkpoint's key groups or ``key_groups``. Without
    ``before_first`` that is refused.
    """
    batch = checkpoint.last_commit()
    if batch < 0:
        if before_first is None:
            raise JobStateError(
                f"cannot export snapshot {name!r} of job {job}: it has not committed a "
                "micro-batch yet"
            )
        return ExportCut(-1, dict(before_first()), 1,
                         checkpoint.written_key_groups() or key_groups,
                         {stage: {} for stage in stateful_stages(plan)}, {}, "")
    record = checkpoint.commit_record(batch)
    groups = checkpoint.written_key_groups()
    assert groups is not None
    planned = checkpoint.planned(batch)
    tasks = max(1, min(planned.state_tasks(groups) if planned else groups, groups))
    counted = checkpoint.counted()
    paths = checkpoint.state(groups).with_counted(counted)
    ranges = [task_range(t, tasks, groups) for t in range(tasks)]
    chains = {}
    for stage in stateful_stages(plan):
        listed = paths.versions(stage)
        chains[stage] = {(lo, hi): StatePaths.chain(listed, batch, lo, hi) for lo, hi in ranges}
    pin = checkpoint.pin(batch)
    return ExportCut(batch, dict(record.ends), tasks, groups, chains, counted, pin,
                     record.event_time)


def release_cut(checkpoint: Checkpoint, cut: ExportCut) -> None:
    """The export of ``cut`` is done (or failed): its state files may go again."""
    if cut.pin:
        checkpoint.unpin(cut.pin)


def export_state(
    checkpoint: Checkpoint,
    cut: ExportCut,
    plan: Plan,
    snapshots: SnapshotStore,
    name: str,
    *,
    job_id: str,
    job_name: str | None,
    versions: tuple[str, str],
) -> Manifest:
    """Export the state of ``cut``'s batch as snapshot ``name``.

    The job may run meanwhile: the cut's pin keeps the files it listed.
    Reads each stage's state range by range (the ranges the batch's tasks
    owned), so the driver holds one range at a time. ``versions`` are
    sparkjet's and Spark's.
    """
    batch, groups = cut.batch, cut.key_groups
    paths: StatePaths = checkpoint.state(groups).with_counted(cut.counted).with_pin(batch)
    chains = _compacted(paths, cut)
    stages = []
    files: list[tuple[str, _Lazy]] = []
    for stage, node in stateful_stages(plan).items():
        stage_files = []
        total = 0
        for (lo, hi), chain in chains[stage].items():
            read = _Lazy(paths, stage, lo, hi, batch, chain)
            if chain and all((v.lo, v.hi) == (lo, hi) for v in chain):
                keys = chain[-1].keys  # the key count the range's newest file names
            else:  # files of other ranges (or none): count by reading
                keys = read.keys()
            path = state_file_path(stage, lo, hi, keys)
            files.append((path, read))
            stage_files.append(path)
            total += keys
        stages.append(StageFields(stage, node.op.value, state_signature(node), total, groups,
                                  stage_files))
    extra: list[str] = []
    if cut.event_time is not None and not cut.event_time.empty():
        encoded = json.dumps(cut.event_time.to_json(), sort_keys=True).encode()
        files.append((EVENT_TIME_FILE, [encoded]))  # type: ignore[arg-type]
        extra.append(EVENT_TIME_FILE)
    identities = {plan.name(n): source_identity(spec.source, cut.ends[plan.name(n)])
                  for n, spec in plan.sources().items() if plan.name(n) in cut.ends}
    fields = ManifestFields(
        job_id=job_id, job_name=job_name, sparkjet_version=versions[0],
        spark_version=versions[1], pipeline_fingerprint=pipeline_fingerprint(plan),
        batch_id=batch, sources=dict(cut.ends), stages=stages, files=extra,
        source_identities=identities,
    )
    return snapshots.write(name, fields, files)


def _folds(chain: list[StateVersion], lo: int, hi: int) -> bool:
    """Whether exporting the range's ``chain`` means folding changelogs into its full copy."""
    return any(not v.full for v in chain) and all((v.lo, v.hi) == (lo, hi) for v in chain)


def _compacted(
    paths: StatePaths, cut: ExportCut
) -> dict[str, dict[tuple[int, int], list[StateVersion]]]:
    """The cut's chains, those with changelogs folded first by compaction children at once.

    Folding unpickles and repickles a range's whole state: in this process,
    one range at a time under the GIL (about 20 MB/s of state), beside the
    job's own driver work. Child processes (:func:`compaction.compact_now`,
    one per core) fold the ranges at once and write each a full copy into
    the checkpoint, as background compaction does (the job's next batches
    read it too); the export then copies those files byte for byte. A range
    whose child failed keeps its chain, and is folded here. Stores other
    processes cannot see (``memory://``) fold here.
    """
    todo = [(stage, lo, hi) for stage, ranges in cut.chains.items()
            for (lo, hi), chain in ranges.items() if _folds(chain, lo, hi)]
    if not todo or not compaction.shared(paths):
        return cut.chains
    compaction.compact_now(paths, todo, cut.batch)
    chains = {stage: dict(ranges) for stage, ranges in cut.chains.items()}
    for stage in {stage for stage, _, _ in todo}:
        listed = paths.versions(stage)
        for (lo, hi), chain in chains[stage].items():
            if _folds(chain, lo, hi):
                # The copy a child wrote (a full copy at the batch of the chain's
                # newest file, which the cut's pin keeps), else the chain as it was.
                now = StatePaths.chain(listed, cut.batch, lo, hi)
                if len(now) == 1 and now[0].full and now[0].batch == chain[-1].batch:
                    chains[stage][(lo, hi)] = now
    return chains


class _Lazy:
    """One range's state file, made only when the snapshot store reads it.

    So the exporting driver holds one range of key groups at a time.
    """

    def __init__(
        self, paths: StatePaths, stage: str, lo: int, hi: int, batch: int,
        chain: list[StateVersion],
    ) -> None:
        self.paths, self.stage, self.lo, self.hi, self.batch = paths, stage, lo, hi, batch
        self.chain = chain

    def _state(self) -> tuple[int, bytes]:
        with self._gone():
            state = self.paths.read_chain(self.stage, self.lo, self.hi, self.chain)
        data = cloudpickle.dumps({"values": state.values, "touched": state.touched})
        return len(state.values), data

    @contextlib.contextmanager
    def _gone(self) -> Iterator[None]:
        """A chain's file missing: say which, and why it can be (never a bare ENOENT)."""
        try:
            yield
        except FileNotFoundError as exc:
            missing = next((self.paths.path(self.stage, v) for v in self.chain
                            if not self.paths.store.exists(self.paths.path(self.stage, v))),
                           str(exc))
            raise StoreError(self.paths.store.redact(
                f"stage {self.stage!r}: state file {missing!r} of batch {self.batch}'s state "
                "was removed while it was being exported (the checkpoint was deleted, or "
                "another driver took the job over); export the snapshot again"
            )) from None

    def keys(self) -> int:
        return self._state()[0]

    def __iter__(self) -> Iterator[bytes]:
        if len(self.chain) == 1 and self.chain[0].full and (
                self.chain[0].lo, self.chain[0].hi) == (self.lo, self.hi):
            # One full copy of exactly this range: the snapshot's file is that
            # file, byte for byte (the formats are the same); no unpickling.
            with self._gone():
                data = self.paths.store.read_bytes(self.paths.path(self.stage, self.chain[0]))
            yield data
            return
        yield self._state()[1]
