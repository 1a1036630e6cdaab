"""Restoring a snapshot: a new job's empty checkpoint seeded from it, to go on from batch 1.

A job submitted with ``initial_snapshot_name`` starts from that snapshot as
Jet's upgrade rules allow (:mod:`sparkjet.core.state.snapshots.upgrade`, checked
at submit); this module owns what follows: :func:`seed_checkpoint` writes
the new job's checkpoint from the snapshot's files and the rules' rows. What
the snapshot holds, and how a job's state got into it, is
:mod:`sparkjet.core.state.export`'.

Restoring seeds the new job's empty checkpoint: its meta.json with the
snapshot's number of key groups (state is carried by key group, so the new
job may run any number of tasks), each restored stage's files as full copies
of batch 0, and a commit record of batch 0 holding the sources' offsets and
the files that count. The job then goes on from batch 1 as if it had always
run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkjet.core.errors import SnapshotCorruptedError, StateIncompatibleError
from sparkjet.core.pipeline.planner import Plan
from sparkjet.core.state.checkpoint import Checkpoint, CommitRecord, RestoredFrom
from sparkjet.core.state.snapshots.format import parse_state_file
from sparkjet.core.state.snapshots.manifest import Manifest
from sparkjet.core.state.snapshots.reader import Snapshot
from sparkjet.core.state.snapshots.upgrade import (
    CheckedUpgrade,
    UpgradeOptions,
    UpgradeRow,
    require_compatible,
)
from sparkjet.core.state.versions import StateRange

__all__ = ["SourceOffsets", "seed_checkpoint"]


def seed_checkpoint(
    checkpoint: Checkpoint,
    plan: Plan,
    snapshot: Snapshot,
    offsets: SourceOffsets,
    key_groups: int,
    options: UpgradeOptions | None = None,
    *,
    upgrade: CheckedUpgrade | None = None,
) -> list[UpgradeRow]:
    """Seed the new job's empty checkpoint from ``snapshot`` (see the module docstring).

    Goes by ``upgrade``, the upgrade rules' rows as a submit checked them
    for ``plan`` and ``snapshot``
    (:func:`~sparkjet.core.state.snapshots.upgrade.require_compatible`),
    so they run once; without it the rules run here, with ``options``.
    Returns the rows.

    ``offsets`` tells a source's offsets now (where it would start, and its
    data's end): a source restored from the snapshot takes the snapshot's
    offsets, for the partitions it had (a partition it had that is gone is
    refused; a new one starts where the source starts); others start where
    ``options.source_starts`` says. The checkpoint takes the snapshot's number
    of key groups where a stage is restored (keys were assigned by it), else
    ``key_groups`` (the new job's own). Every file is checked against the
    manifest as it is copied; a bad one is an error naming it, and the
    checkpoint then holds no commit (the job starts from nothing only if
    restarted without the snapshot). Create-only at the commit record: a
    second driver seeding at once finds batch 0 committed and goes on from it.
    """
    manifest = snapshot.manifest
    if upgrade is None:
        upgrade = require_compatible(plan, manifest, options)
    elif options is not None:
        raise ValueError("seed_checkpoint takes options or a checked upgrade, not both")
    elif upgrade.plan.names != plan.names or upgrade.manifest != manifest:
        # (The job's plan is the submit's with its error policies applied: the
        # same stages, which is what the rules judged.)
        raise ValueError(
            f"snapshot {manifest.name!r}: the checked upgrade given is for another "
            "pipeline or snapshot"
        )
    options = upgrade.options
    rows = list(upgrade.rows)
    restored = {r.snapshot_name: r.stage for r in rows if r.kind == "state" and r.carried}
    groups = {s.key_groups for s in manifest.stages if s.name in restored}
    if len(groups) > 1:
        raise SnapshotCorruptedError(
            f"snapshot {manifest.name!r}: its stages are split into different numbers of key "
            f"groups ({sorted(groups)})"
        )
    ends = _seed_offsets(plan, manifest, rows, offsets, options)
    carried = groups.pop() if groups else None
    meta = checkpoint.meta()
    if meta is None:
        checkpoint.key_groups(carried or key_groups, list(plan.names.values()))
    elif carried is not None and checkpoint.written_key_groups() != carried:
        raise SnapshotCorruptedError(
            f"snapshot {manifest.name!r} holds {carried} key groups but checkpoint "
            f"{checkpoint.root!r} was started with {checkpoint.written_key_groups()}"
        )
    paths = checkpoint.state(checkpoint.written_key_groups() or 1)
    counted: dict[StateRange, str] = {}
    for stage in manifest.stages:
        if stage.name not in restored:
            continue
        into = restored[stage.name]
        for entry in stage.files:
            parsed = parse_state_file(entry.path)
            if parsed is None:
                raise SnapshotCorruptedError(
                    f"snapshot {manifest.name!r}: stage {stage.name!r} has a file "
                    f"{entry.path!r} this sparkjet cannot read"
                )
            lo, hi, keys = parsed
            data = snapshot.read_file(entry.path)  # checked against its sha256 and size
            version = paths.write_copy(into, lo, hi, 0, keys, data)
            counted[StateRange(into, lo, hi)] = version.name
    carried_time = snapshot.event_time()
    if carried_time is not None:
        carried_time = carried_time.renamed(
            {r.snapshot_name: r.stage for r in rows if r.carried})
        windows = {r.stage for r in rows if r.kind == "state" and r.carried and r.new_window}
        restored_sources = {r.stage for r in rows if r.kind == "source" and r.carried}
        carried_time = carried_time.restricted(restored_sources, windows)
    checkpoint.write_commit(CommitRecord(
        0, ends, int(time.time() * 1000), 0, counted,
        RestoredFrom(manifest.name, manifest.batch_id, manifest.job_id), carried_time,
    ))
    return rows


@dataclass(frozen=True)
class SourceOffsets:
    """A new job's sources' offsets now, by source stage name (called at most once each)."""

    #: Where the source starts without a snapshot (``Source.initial_offsets``).
    initial: Callable[[str], Any]
    #: The end of its data now (``Source.latest_offsets``).
    latest: Callable[[str], Any]
    #: The source's partitions at some offsets (``Source.watermark_partitions``).
    partitions: Callable[[str, Any], list[str]]


def _seed_offsets(
    plan: Plan, manifest: Manifest, rows: list[UpgradeRow], offsets: SourceOffsets,
    options: UpgradeOptions,
) -> dict[str, Any]:
    """Each source's offsets at the seeded batch 0 (see :func:`seed_checkpoint`)."""
    by_stage = {r.stage: r for r in rows if r.kind == "source"}
    ends: dict[str, Any] = {}
    for node in plan.sources():
        source = plan.name(node)
        row = by_stage[source]
        if not row.carried:
            start = options.start_of(source)
            ends[source] = offsets.latest(source) if start == "latest" else offsets.initial(
                source)
            continue
        restored = manifest.sources[row.snapshot_name]
        initial = offsets.initial(source)
        had = offsets.partitions(source, restored)
        has = offsets.partitions(source, initial)
        gone = [p for p in had if p not in has]
        start = options.start_of(source)
        if gone and start is not None:
            ends[source] = offsets.latest(source) if start == "latest" else initial
            continue
        if gone:
            new = [p for p in has if p not in had]
            raise StateIncompatibleError(
                f"cannot start from snapshot {manifest.name!r}: source {source!r}: "
                f"partition(s) {_names(gone)} are gone, so their offsets cannot be carried. "
                f"The snapshot's offsets {_short(restored)} name {len(had)} partition(s) "
                f"({_names(had)}); the source's initial offsets now, {_short(initial)}, name "
                f"{len(has)} ({_names(has)}" + (f"; new: {_names(new)}" if new else "") + "), "
                f"both by its watermark_partitions(offsets). If the data is still there, the "
                f"source's initial_offsets must name every partition it has (or its "
                f"watermark_partitions list them whatever the offsets); else say where it "
                f"starts with source_starts / --source-start {source}=initial or "
                f"{source}=latest",
                stages=[source])
        ends[source] = _with_new_partitions(restored, initial)
    return ends


def _names(partitions: list[str], most: int = 5) -> str:
    """``a, b, c`` (the first ``most``, then how many more), or ``none``."""
    if not partitions:
        return "none"
    more = len(partitions) - most
    return ", ".join(partitions[:most]) + (f" and {more} more" if more > 0 else "")


def _short(offsets: Any, most: int = 120) -> str:
    """``offsets`` as JSON, cut to ``most`` characters for a message."""
    text = json.dumps(offsets, sort_keys=True, default=repr)
    return text if len(text) <= most else text[: most - 3] + "..."


def _with_new_partitions(restored: Any, initial: Any) -> Any:
    """Restored offsets, with partitions that came since taking their initial offsets."""
    if isinstance(restored, list) and isinstance(initial, list) and len(initial) > len(restored):
        return [*restored, *initial[len(restored):]]
    if isinstance(restored, dict) and isinstance(initial, dict):
        return {**{k: v for k, v in initial.items() if k not in restored}, **restored}
    return restored
