"""Jobs: configuration, processing guarantees, statuses, the job handle and snapshots.

Mirrors Hazelcast Jet's ``JobConfig`` (snake_case names, same defaults) and
``JobStatus``. :class:`Job` handles come from ``client.get_jet().submit(...)``
or ``get_job`` / ``get_job_by_name`` / ``get_jobs``; a streaming job's
:class:`PlannedBatch` list is ``job.get_planned_batches()``. :class:`Snapshot`
is an exported snapshot (``job.export_snapshot``, ``jet.get_snapshot``), kept
in a :class:`SnapshotStore` (``client.snapshots``), which writes one from
:class:`ManifestFields` (with a :class:`StageFields` per stage) and its files,
into the folder :func:`snapshot_folder` names, published by its
:data:`MANIFEST`; :class:`UpgradeRow` is one row of ``jet.check_upgrade``.
"""

from __future__ import annotations

from sparkjet.core.jobs import Job, JobStatusEvent
from sparkjet.core.model import JobConfig, JobStatus, PlannedBatch, ProcessingGuarantee
from sparkjet.core.state.snapshots import (
    MANIFEST,
    ManifestFields,
    Snapshot,
    SnapshotStore,
    StageFields,
    snapshot_folder,
)
from sparkjet.core.state.snapshots.upgrade import UpgradeRow

__all__ = [
    "MANIFEST",
    "Job",
    "JobConfig",
    "JobStatus",
    "JobStatusEvent",
    "ManifestFields",
    "PlannedBatch",
    "ProcessingGuarantee",
    "Snapshot",
    "SnapshotStore",
    "StageFields",
    "UpgradeRow",
    "snapshot_folder",
]
